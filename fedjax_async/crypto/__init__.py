"""CKKS (OpenFHE) implementation of PAFed's privacy layer (Miao et al., TIFS 2024).

* ``ckks``: presets (``SECURE_PRESET``, ``INSECURE_TEST_PRESET``), depth accounting,
  packing, the level-checking ``Evaluator``.
* ``cheon``: Cheon et al.'s Min (Alg. 1), plaintext (a ``min_fn`` for ``pafed.ducc``) and
  homomorphic.
* ``entities``: KDC, Client, HelperServer (S1).
* ``secure_ducc``: AggregationServer (S0), encrypted DUCC (Alg. 4) + Eq. 17 + key
  transformation (Alg. 5), ``make_protocol`` and ``secure_pafed_step`` for the engine.
* ``streamed_ducc``: the same round for paper-size models (vectors at depth 2, scalars
  in a deep context), ``make_streamed_protocol`` and ``streamed_pafed_step``.
"""

from fedjax_async.crypto.cheon import cheon_min, make_cheon_min
from fedjax_async.crypto.ckks import (DepthError, INSECURE_TEST_PRESET, SECURE_PRESET,
                                      ducc_depth)
from fedjax_async.crypto.secure_ducc import make_protocol, secure_pafed_step
from fedjax_async.crypto.streamed_ducc import make_streamed_protocol, streamed_pafed_step

__all__ = ["DepthError", "INSECURE_TEST_PRESET", "SECURE_PRESET", "ducc_depth",
           "cheon_min", "make_cheon_min", "make_protocol", "secure_pafed_step",
           "make_streamed_protocol", "streamed_pafed_step"]
