"""Stub of pfl-research (tests/stub_peers/README.md)."""

__version__ = "0+stub"
