"""Algorithm registry: one module per algorithm, each exporting ``ALGORITHM``."""

from __future__ import annotations

import importlib

# name -> module (round-based algorithms run on the round engine; the asynchronous
# family of the virtual-clock issue registers itself here too).
_MODULES = {
    "fedavg": "fedjax_async.algorithms.fedavg",
    "fedprox": "fedjax_async.algorithms.fedprox",
    "fednova": "fedjax_async.algorithms.fednova",
    "fedadmm": "fedjax_async.algorithms.fedadmm",
    "pafed": "fedjax_async.algorithms.pafed",
}

# The algorithms with FedADMM's client, whose Eq. 16 has two readings (``fedadmm.UPLOADS``).
ADMM = ("fedadmm", "pafed")


def names():
  return tuple(_MODULES)


def get(name: str, admm_upload: str = "received"):
  """The ``Algorithm`` registered as ``name`` (ValueError listing the choices);
  ``admm_upload`` selects the reading of Eq. 16 for the ADMM clients (others ignore it)."""
  if name not in _MODULES:
    raise ValueError(f"unknown algorithm {name!r}; choices: {', '.join(_MODULES)}")
  module = importlib.import_module(_MODULES[name])
  if name in ADMM and admm_upload != "received":
    return module.make_algorithm(upload=admm_upload)
  return module.ALGORITHM
