"""Algorithm registry: one module per algorithm, each exporting ``ALGORITHM``, a
``base.Algorithm`` (the one contract).

Two engines run them: the round engine (clients sampled per round, delayed ones arriving
rounds later) runs those with a round rule (``server_update``); the virtual clock (every
arrival updates the server, staleness from simulated compute and communication times)
runs those with a per-arrival rule (``server_step``), and a round rule as rounds of one.

  names()                   # all built in, then any registered
  names("rounds")           # fedavg, fedprox, fednova, fedadmm, pafed
  names("virtual_clock")    # fedasync, fedbuff, double_compensation, privaasyncfed, dp_fedasync
  engine_of("fedbuff")      # "virtual_clock"
  get("pafed")              # its base.Algorithm
  register(my_algorithm)    # a base.Algorithm of your own, by its name
"""

from __future__ import annotations

import importlib
from typing import Optional, Tuple

from fedjax_async.algorithms import base

ENGINES = ("rounds", "virtual_clock")

# name -> (engine, module). Adding an algorithm: its module, and one line here (the engine
# is the one its server rule names, ``Algorithm.engine``; a test checks them).
_REGISTRY = {
    "fedavg": ("rounds", "fedjax_async.algorithms.fedavg"),
    "fedprox": ("rounds", "fedjax_async.algorithms.fedprox"),
    "fednova": ("rounds", "fedjax_async.algorithms.fednova"),
    "fedadmm": ("rounds", "fedjax_async.algorithms.fedadmm"),
    "pafed": ("rounds", "fedjax_async.algorithms.pafed"),
    "fedasync": ("virtual_clock", "fedjax_async.algorithms.fedasync"),
    "fedbuff": ("virtual_clock", "fedjax_async.algorithms.fedbuff"),
    "double_compensation": ("virtual_clock", "fedjax_async.algorithms.double_compensation"),
    "privaasyncfed": ("virtual_clock", "fedjax_async.algorithms.privaasyncfed"),
    "dp_fedasync": ("virtual_clock", "fedjax_async.algorithms.dp_fedasync"),
}

# The algorithms with FedADMM's client, whose Eq. 16 has two readings (``fedadmm.UPLOADS``).
ADMM = ("fedadmm", "pafed")


# Algorithms registered from Python (``register``): name -> base.Algorithm.
_REGISTERED = {}


def register(algorithm, replace: bool = False):
  """Registers a ``base.Algorithm`` under its ``name`` for every entry point of this
  process (``simulate(algorithm=name)``, validation, the CLI when registered before its
  flags are parsed); its engine is its rule's (``Algorithm.engine``). A name already
  taken is refused unless ``replace`` (a built-in name never is). Returns ``algorithm``."""
  if not isinstance(algorithm, base.Algorithm):
    raise TypeError(f"register: expected a fedjax_async.algorithms.base.Algorithm, got "
                    f"{type(algorithm).__name__}")
  name = algorithm.name
  if not name or "," in name:
    raise ValueError(f"register: the algorithm's name must be non-empty without commas, "
                     f"got {name!r}")
  if name in _REGISTRY or (name in _REGISTERED and not replace
                           and _REGISTERED[name] is not algorithm):
    raise ValueError(f"register: the name {name!r} is taken (replace=True replaces a "
                     "registered one; built-in names cannot be)")
  _REGISTERED[name] = algorithm
  return algorithm


def names(engine: Optional[str] = None) -> Tuple[str, ...]:
  """The registered algorithms, all of them or those of one engine (``ENGINES``)."""
  if engine is not None and engine not in ENGINES:
    raise ValueError(f"unknown engine {engine!r}; choices: {', '.join(ENGINES)}")
  built_in = tuple(n for n, (e, _) in _REGISTRY.items() if engine in (None, e))
  return built_in + tuple(n for n, a in _REGISTERED.items() if engine in (None, a.engine))


def names_on(engine: str) -> Tuple[str, ...]:
  """The algorithms an engine runs: its own, and on the virtual clock also every round
  rule whose clients keep no state (each arrival applied as a round of one update)."""
  own = names(engine)
  if engine != "virtual_clock":
    return own
  return own + tuple(n for n in names("rounds") if not get(n).client_state_keys)


def engine_of(name: str) -> str:
  """``"rounds"`` or ``"virtual_clock"``: the engine that runs ``name``."""
  _check(name)
  return _REGISTRY[name][0] if name in _REGISTRY else _REGISTERED[name].engine


def _check(name: str):
  if name not in _REGISTRY and name not in _REGISTERED:
    raise ValueError(f"unknown algorithm {name!r}; choices: {', '.join(names())}")


def get(name: str, admm_upload: str = "received"):
  """The ``base.Algorithm`` registered as ``name`` (ValueError listing the choices).
  ``admm_upload`` selects the reading of Eq. 16 for the ADMM clients
  (the others ignore it)."""
  _check(name)
  if name in _REGISTERED:
    return _REGISTERED[name]
  module = importlib.import_module(_REGISTRY[name][1])
  if name in ADMM and admm_upload != "received":
    return module.make_algorithm(upload=admm_upload)
  return module.ALGORITHM
