"""Stub of the ``multiprocess`` distribution (a dependency of pfl): tests/stub_peers."""

STUB = True
__version__ = "0+stub"
