"""Stub of Flower: ``start_simulation`` runs the rounds in this process, each client's fit
called in turn and followed by a 25 ms sleep (tests/stub_peers/README.md)."""

from flwr import client  # noqa: F401
from flwr import common  # noqa: F401
from flwr import server  # noqa: F401
from flwr import simulation  # noqa: F401

__version__ = "0+stub"
