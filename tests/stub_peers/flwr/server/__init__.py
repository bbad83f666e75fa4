"""Stub of flwr.server (tests/stub_peers/README.md)."""

import dataclasses

from flwr.server import strategy  # noqa: F401


@dataclasses.dataclass
class ServerConfig:
  num_rounds: int
