"""Stub of pfl.data.sampling (tests/stub_peers/README.md)."""

import itertools


def get_user_sampler(sample_type, user_ids):
  if sample_type not in ("random", "minimize_reuse"):
    raise ValueError(f"sample_type {sample_type!r}")
  users = itertools.cycle(list(user_ids))
  return lambda: next(users)
