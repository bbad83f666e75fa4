"""Stub of pfl.metrics (tests/stub_peers/README.md)."""

import dataclasses


@dataclasses.dataclass
class Weighted:
  value: float
  weight: float
