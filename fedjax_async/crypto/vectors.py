"""Unit vectors at prescribed cosines: DUCC inputs for tests and benchmarks."""

from __future__ import annotations

import numpy as np


def unit(x):
  """Rows of ``x`` scaled to unit length."""
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def with_cos(direction, cosines, dim, rng):
  """Unit vectors with prescribed cosines to the unit vector ``direction`` ([len, dim])."""
  out = []
  for c in cosines:
    v = rng.normal(size=dim)
    v -= (v @ direction) * direction
    out.append(c * direction + np.sqrt(1 - c * c) * v / np.linalg.norm(v))
  return np.stack(out)
