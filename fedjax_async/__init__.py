"""fedjax_async: a vectorised JAX/Flax simulator of privacy-preserving asynchronous FL.

  import fedjax_async as fa
  result = fa.simulate(algorithm="pafed,fedavg", rounds=20)   # docs/api.md
  print(result.table())

Public names: ``simulate``, ``Result``, ``RunConfig`` and its parts, ``AsyncRunConfig``
(the virtual clock: ``simulate(AsyncRunConfig(...))``), ``FedEDSRunConfig`` (FedEDS),
``Callback`` (after every compiled chunk), ``Interrupted``, ``algorithms`` (the
registry), ``data``, ``distributed`` (several processes). Imported on first use: ``import fedjax_async`` does not load JAX.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "simulate": ("fedjax_async.api", "simulate"),
    "load": ("fedjax_async.api", "load"),
    "Result": ("fedjax_async.results", "Result"),
    "RunConfig": ("fedjax_async.config", "RunConfig"),
    "AlgorithmConfig": ("fedjax_async.config", "AlgorithmConfig"),
    "DataConfig": ("fedjax_async.config", "DataConfig"),
    "ModelConfig": ("fedjax_async.config", "ModelConfig"),
    "LocalTraining": ("fedjax_async.config", "LocalTraining"),
    "DelayConfig": ("fedjax_async.core.timeline", "DelayConfig"),
    "CryptoConfig": ("fedjax_async.config", "CryptoConfig"),
    "RunOptions": ("fedjax_async.config", "RunOptions"),
    "OutputConfig": ("fedjax_async.config", "OutputConfig"),
    "AsyncRunConfig": ("fedjax_async.asynchronous.config", "AsyncRunConfig"),
    "FedEDSRunConfig": ("fedjax_async.fededs.config", "FedEDSRunConfig"),
    "Callback": ("fedjax_async.loop", "Callback"),
    "Interrupted": ("fedjax_async.interrupts", "Interrupted"),
    "algorithms": ("fedjax_async.algorithms", None),
    "data": ("fedjax_async.data", None),
    "distributed": ("fedjax_async.distributed", None),
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'fedjax_async' has no attribute {name!r}")
  module, attr = _EXPORTS[name]
  value = importlib.import_module(module)
  return value if attr is None else getattr(value, attr)


def __dir__():
  return sorted(__all__)
