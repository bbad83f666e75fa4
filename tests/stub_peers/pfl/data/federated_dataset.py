"""Stub of pfl.data.federated_dataset. It imports ``multiprocess`` as pfl's module does, and
refuses any module of that name but the stub's: one found first on the child's path (a
project module of that name in the peer script's folder) broke pfl (tests/stub_peers)."""

import multiprocess as mp

if not getattr(mp, "STUB", False):
  raise ImportError(f"`import multiprocess` found {getattr(mp, '__file__', mp)}, not the "
                    "stub peers' package: a folder on the peer child's sys.path shadows "
                    "pfl's dependency")


class FederatedDataset:

  def __init__(self, make_dataset_fn, user_sampler):
    self.make_dataset_fn = make_dataset_fn
    self.user_sampler = user_sampler
