"""CKKS context, parameter presets, depth accounting and packing helpers (OpenFHE).

PAFed (Miao et al., IEEE TIFS 2024) runs Alg. 3 / Alg. 4 over CKKS ciphertexts. This
module holds everything that is scheme plumbing rather than protocol:

* ``Preset``: named parameter sets. ``SECURE_PRESET`` is 128-bit classical security
  (``HEStd_128_classic``; OpenFHE picks the smallest secure ring for the depth).
  ``INSECURE_TEST_PRESET`` (``HEStd_NotSet``, ring 2^11) exists only for the test suite.
* ``ducc_depth``: the multiplicative depth the encrypted DUCC (Alg. 4) + Eq. 17 consume,
  counted operation by operation (see ``docs/crypto.md``); the context is sized from it.
* ``Evaluator``: thin wrapper over a ``CryptoContext`` whose multiplications check the
  remaining levels first and raise ``DepthError`` naming the depth that would be needed.
* ``chunk`` / ``unchunk``: a [d] vector <-> ceil(d / (N/2)) slot vectors (N/2 slots each).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

# OpenFHE parallelises with OpenMP; on a small shared machine oversubscribed OpenMP threads
# make every operation ~20x slower (measured: EvalMult 8 ms with 1 thread vs 180 ms with
# the default). Default to one thread unless the caller chose; must precede the import.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import openfhe  # pylint: disable=g-import-not-at-top


class DepthError(RuntimeError):
  """An operation needs more multiplicative levels than the CKKS context provides."""


@dataclasses.dataclass(frozen=True)
class Preset:
  """CKKS parameters. ``ring_dim=None`` lets OpenFHE choose the smallest secure ring."""

  name: str
  security_level: object
  ring_dim: Optional[int]
  scaling_mod_size: int = 40
  first_mod_size: int = 60


SECURE_PRESET = Preset("secure", openfhe.HEStd_128_classic, None)
# NOT SECURE: HEStd_NotSet with a 2^11 ring, for fast unit tests only.
INSECURE_TEST_PRESET = Preset("insecure_test", openfhe.HEStd_NotSet, 2 ** 11)
PRESETS = {"secure": SECURE_PRESET, "insecure_test": INSECURE_TEST_PRESET}


def get_preset(preset) -> Preset:
  if isinstance(preset, Preset):
    return preset
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
  return PRESETS[preset]


# ----------------------------------------------------------------------------- depth


def cheon_min_depth(iterations: int) -> int:
  """Levels Alg. 1 consumes from fresh inputs with the scaled recurrence of ``cheon``.

  z = (a - b) / (2 sqrt 2) costs 1, z^2 costs 1, and each of the d iterations costs 2
  (the cubic N_{i+1} = N_i^2 (N_i - 3/2) is the critical path; M_{i+1} = M_i (1 - N_i)
  runs beside it), the last N never being needed: 1 + 1 + 2(d - 1) + 1 = 2d + 1.
  """
  if iterations < 0:
    raise ValueError("iterations must be >= 0")
  return 2 * iterations + 1 if iterations > 0 else 2


def ducc_depth_breakdown(min_iterations: int) -> Dict[str, int]:
  """Per-stage levels of the encrypted DUCC (Alg. 4) followed by Eq. 17.

  Stages on the critical path (fresh client ciphertexts at depth 0):
    inner_product: sum_c m_c * u_jc (Alg. 4 line 5, m . u_j), then EvalSum (free).
    pack: each replicated inner product times a one-hot mask (1/(4 sqrt 2) folded in).
    normalise: the packed inner products times Enc(1 / ||m||) from S1 (the paper
      normalises the online mean before the Min, Sec. V-A).
    min: z^2 then 2 per Cheon iteration (Alg. 1 lines 2-6), the last n_d unused.
    broadcast: w_j's slot times a one-hot mask (r * alpha folded in), EvalSum (free).
    weight: W_j * u_j (Alg. 4 lines 5, 7).
    inverse: times Enc(1 / (r n)) returned by S1 (Alg. 4 line 11).
    projection: (m2 . m) / (n2 ||m||^2) then times m (Eq. 12 / Alg. 4 line 12).
  Eq. 17 itself is additions only (alpha's are folded into masks). Off the critical
  path: the empty-class tests (1 level after the Min); S0 picks S1's inverse for a
  non-empty class by additions (no level).
  """
  d = int(min_iterations)
  return {"inner_product": 1, "pack": 1, "normalise": 1, "min": 2 * d if d > 0 else 1,
          "broadcast": 1, "weight": 1, "inverse": 1, "projection": 2}


def ducc_depth(min_iterations: int) -> int:
  """Total multiplicative depth of encrypted DUCC + Eq. 17: 2d + 8 for d Min iterations."""
  return sum(ducc_depth_breakdown(min_iterations).values())


def depth_used(ct) -> int:
  """Levels already consumed by ``ct`` (FLEXIBLEAUTO rescales lazily: level + pending)."""
  return ct.GetLevel() + ct.GetNoiseScaleDeg() - 1


# --------------------------------------------------------------------------- context


def make_context(depth: int, preset="secure", ring_dim: Optional[int] = None,
                 batch_size: Optional[int] = None):
  """A CKKS ``CryptoContext`` with ``depth`` levels and N/2 slots (the full batch), or
  ``batch_size`` slots (a power of two <= N/2: sparse packing, whose EvalSum needs
  log2(batch_size) rotation keys instead of log2(N/2))."""
  preset = get_preset(preset)
  params = openfhe.CCParamsCKKSRNS()
  params.SetSecurityLevel(preset.security_level)
  rd = ring_dim or preset.ring_dim
  if rd is not None:
    params.SetRingDim(int(rd))
    params.SetBatchSize(int(rd) // 2)
  if batch_size is not None:
    params.SetBatchSize(int(batch_size))
  params.SetMultiplicativeDepth(int(depth))
  params.SetScalingModSize(preset.scaling_mod_size)
  params.SetFirstModSize(preset.first_mod_size)
  params.SetScalingTechnique(openfhe.FLEXIBLEAUTO)
  # Complex slots: S0's noise flood reaches the imaginary parts (``secure_ducc.flood``);
  # with real ones OpenFHE drops them and its decoder reports the error it estimates
  # there (``GetLogError``), the blinded value's own, to the decrypting party.
  params.SetCKKSDataType(openfhe.CKKSDataType.COMPLEX)
  try:
    cc = openfhe.GenCryptoContext(params)
  except RuntimeError as e:  # OpenFHE refuses a ring too small for the security level
    if rd is None or "ring dimension" not in str(e):
      raise
    need = re.findall(r"\((\d+)\)", str(e))
    raise ValueError(f"ring dimension {rd} is too small for the {preset.name!r} preset "
                     f"({preset.security_level}) at depth {depth}: OpenFHE needs "
                     f"{need[-1] if need else 'a larger one'}") from None
  for feature in (openfhe.PKE, openfhe.KEYSWITCH, openfhe.LEVELEDSHE, openfhe.ADVANCEDSHE):
    cc.Enable(feature)
  return cc


def num_slots(cc) -> int:
  """The context's slots: its batch size (N/2 unless packed sparsely)."""
  return int(cc.GetBatchSize()) or cc.GetRingDimension() // 2


# The CKKS error of a value S0 computed, as the slot-to-slot spread of its decryption
# shows it (OpenFHE's decoder adds noise of the error's size), is at most ERROR_BOUND
# N / Delta times a bound on the values it was computed from (N the ring dimension, Delta
# the scaling factor 2^40). Measured with every blind at 1: at most 8.3 N / Delta in every
# value S1 decrypts, both designs, 128-bit and test rings, d = 3 .. 10, n, k up to 10
# (docs/crypto.md, "Noise flooding").
ERROR_BOUND = 64.0


def error_bound(cc, magnitude: float) -> float:
  """A bound on the CKKS error per slot of a value of ``cc`` computed from values bounded
  by ``magnitude`` (``ERROR_BOUND``): what S0's noise flood is sized from."""
  scale = 2.0 ** int(cc.GetEncodingParams().GetPlaintextModulus())
  return ERROR_BOUND * cc.GetRingDimension() / scale * float(magnitude)


# --------------------------------------------------------------------------- packing


def num_chunks(dim: int, slots: int) -> int:
  return max(1, math.ceil(dim / slots))


def chunk(vec: np.ndarray, slots: int) -> List[np.ndarray]:
  """Split a [d] vector into ceil(d / slots) zero-padded [slots] blocks."""
  vec = np.asarray(vec, np.float64).reshape(-1)
  c = num_chunks(vec.size, slots)
  padded = np.zeros(c * slots)
  padded[:vec.size] = vec
  return list(padded.reshape(c, slots))


def unchunk(blocks: Sequence[np.ndarray], dim: int) -> np.ndarray:
  return np.concatenate([np.asarray(b, np.float64) for b in blocks])[:dim]


def one_hot(slots: int, index: int, value: float = 1.0) -> np.ndarray:
  v = np.zeros(slots)
  v[index] = value
  return v


# ------------------------------------------------------------------------- evaluator


class Evaluator:
  """Public-key-only homomorphic operations with level checks (used by S0 and benchmarks).

  Holds the context only: it can encrypt (with a public key passed in), add, multiply and
  rotate, never decrypt. Every multiplication checks that the result stays within the
  context's depth and raises ``DepthError`` naming the depth the computation would need.
  """

  def __init__(self, cc):
    self.cc = cc
    self.depth = cc.GetMultiplicativeDepth()
    self.slots = num_slots(cc)

  def check_levels(self, *cts, what="multiplication", extra=1):
    """Raise ``DepthError`` unless ``extra`` more levels on ``cts`` fit the depth."""
    need = max(depth_used(c) for c in cts) + extra
    if need > self.depth:
      raise DepthError(
          f"{what} needs multiplicative depth {need} but the CKKS context has depth "
          f"{self.depth}; rebuild the context with depth >= {need}")

  def encode(self, values) -> object:
    values = np.asarray(values, np.float64).reshape(-1)
    return self.cc.MakeCKKSPackedPlaintext(values.tolist())

  def encrypt(self, public_key, values):
    return self.cc.Encrypt(public_key, self.encode(values))

  def add(self, a, b):
    return self.cc.EvalAdd(a, b)

  def sub(self, a, b):
    return self.cc.EvalSub(a, b)

  def add_many(self, cts):
    cts = list(cts)
    return cts[0] if len(cts) == 1 else self.cc.EvalAddMany(cts)

  def add_const(self, a, c: float):
    return self.cc.EvalAdd(a, float(c))

  def const_sub(self, c: float, a):
    """c - a (no level)."""
    return self.cc.EvalAdd(self.cc.EvalNegate(a), float(c))

  def mult(self, a, b, what="multiplication"):
    """ct * ct (relinearised); one level."""
    self.check_levels(a, b, what=what)
    return self.cc.EvalMult(a, b)

  def square(self, a, what="square"):
    self.check_levels(a, what=what)
    return self.cc.EvalSquare(a)

  def mult_const(self, a, c: float, what="constant multiplication"):
    self.check_levels(a, what=what)
    return self.cc.EvalMult(a, float(c))

  def mult_plain(self, a, values, what="plaintext multiplication"):
    self.check_levels(a, what=what)
    return self.cc.EvalMult(a, self.encode(values))

  def eval_sum(self, a):
    """Sum of all N/2 slots, replicated in every slot (rotations only, no level)."""
    return self.cc.EvalSum(a, self.slots)
