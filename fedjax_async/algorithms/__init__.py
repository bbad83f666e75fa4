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


def names():
  return tuple(_MODULES)


def get(name: str):
  """The ``Algorithm`` registered as ``name`` (ValueError listing the choices)."""
  if name not in _MODULES:
    raise ValueError(f"unknown algorithm {name!r}; choices: {', '.join(_MODULES)}")
  return importlib.import_module(_MODULES[name]).ALGORITHM
