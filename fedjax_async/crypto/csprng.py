"""S0's randomness: masks and blinds from the operating system's CSPRNG (``os.urandom``).

Never seeded, never derived from the experiment's seed: every round, every process and
every resume draws fresh values, so nothing S1 (or anyone) can read from a run's
configuration regenerates them. The model stays reproducible because every mask and
blind cancels exactly (docs/crypto.md, "Leakage").
"""

from __future__ import annotations

import os

import numpy as np


def _unit(size: int) -> np.ndarray:
  """``size`` floats uniform on [0, 1): 53 random bits each, from os.urandom."""
  bits = np.frombuffer(os.urandom(8 * int(size)), dtype=np.uint64) >> np.uint64(11)
  return bits.astype(np.float64) * 2.0 ** -53


def uniform(low: float, high: float, size: int) -> np.ndarray:
  """Uniform on [low, high), vectorised (2^16 values in well under a millisecond)."""
  return low + (high - low) * _unit(size)


def signs(size: int) -> np.ndarray:
  """Independent +-1, each with probability 1/2."""
  return np.where(np.frombuffer(os.urandom(int(size)), dtype=np.uint8) & 1, 1.0, -1.0)


def blind(log2_range: float, signed: bool = True) -> float:
  """A multiplicative blind r = +-2^u, u uniform on [-R, R] (the sign uniform when
  ``signed``): |r n| is |n| shifted by a uniform amount on a log scale."""
  r = float(2.0 ** uniform(-log2_range, log2_range, 1)[0])
  return r * float(signs(1)[0]) if signed else r


def normal(size: int) -> np.ndarray:
  """Independent standard normal draws (Box-Muller on ``_unit``'s os.urandom uniforms):
  S0's noise flood (``secure_ducc.AggregationServer.flood``)."""
  radius = np.sqrt(-2.0 * np.log1p(-_unit(size)))  # 1 - U on (0, 1]: a finite radius
  return radius * np.cos(2.0 * np.pi * _unit(size))
