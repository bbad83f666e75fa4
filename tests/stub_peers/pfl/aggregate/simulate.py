"""Stub of pfl.aggregate.simulate (tests/stub_peers/README.md)."""


class SimulatedBackend:

  def __init__(self, training_data, val_data):
    self.training_data = training_data
    self.val_data = val_data
