"""Stub of pfl.data.dataset (tests/stub_peers/README.md)."""


class Dataset:

  def __init__(self, raw_data, user_id=None):
    self.raw_data = raw_data
    self.user_id = user_id
