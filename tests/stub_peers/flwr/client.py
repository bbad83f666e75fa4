"""Stub of flwr.client (tests/stub_peers/README.md)."""


class NumPyClient:

  def to_client(self):
    return self
