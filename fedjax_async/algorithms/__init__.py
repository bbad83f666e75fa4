"""Algorithm registry: one module per algorithm, each exporting ``ALGORITHM``, a
``base.Algorithm`` (the one contract).

Two engines run them: the round engine (clients sampled per round, delayed ones arriving
rounds later) runs those with a round rule (``server_update``); the virtual clock (every
arrival updates the server, staleness from simulated compute and communication times)
runs those with a per-arrival rule (``server_step``), and a round rule as rounds of one.

  names()                   # all built in, then any registered
  names("rounds")           # fedavg fedprox fednova fedadmm pafed scaffold feddyn dp_fedavg
  names("virtual_clock")    # fedasync, fedbuff, double_compensation, privaasyncfed, dp_fedasync
  engine_of("fedbuff,fedavg")  # "virtual_clock": the engine simulate and the CLI pick
  get("pafed")              # its base.Algorithm
  register(my_algorithm)    # a base.Algorithm of your own, by its name
  declared("rounds")        # {hyper-parameter: [(algorithm, base.HParam), ...]}
"""

from __future__ import annotations

import importlib
from typing import Optional, Tuple

from fedjax_async import flatkeys
from fedjax_async.algorithms import base
from fedjax_async.algorithms import dp_fedavg

ENGINES = ("rounds", "virtual_clock")

# name -> (engine, module). Adding an algorithm: its module, and one line here (the engine
# is the one its server rule names, ``Algorithm.engine``; a test checks them).
_REGISTRY = {
    "fedavg": ("rounds", "fedjax_async.algorithms.fedavg"),
    "fedprox": ("rounds", "fedjax_async.algorithms.fedprox"),
    "fednova": ("rounds", "fedjax_async.algorithms.fednova"),
    "fedadmm": ("rounds", "fedjax_async.algorithms.fedadmm"),
    "pafed": ("rounds", "fedjax_async.algorithms.pafed"),
    "scaffold": ("rounds", "fedjax_async.algorithms.scaffold"),
    "feddyn": ("rounds", "fedjax_async.algorithms.feddyn"),
    "dp_fedavg": ("rounds", "fedjax_async.algorithms.dp_fedavg"),
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

# Names an algorithm's own hyper-parameter may not take: the configurations' common fields
# (``lr``, ``rounds``, ...), reserved by the configurations that define them (``reserve``).
_RESERVED = {}


def reserve(names, owner: str):
  """Reserves ``names`` (a configuration's common fields, ``owner`` naming it) against the
  hyper-parameters of algorithms registered later."""
  for n in names:
    _RESERVED.setdefault(n, owner)


def _check_hparams(algorithm):
  """A ``register``ed algorithm's hyper-parameters: none named as a common field, and each
  name declared elsewhere of the same kind."""
  for h in algorithm.hparams:
    if h.name in _RESERVED:
      raise ValueError(f"register: {algorithm.name}'s hyper-parameter {h.name!r} clashes "
                       f"with the common field {h.name} of {_RESERVED[h.name]}; give it "
                       f"another name (e.g. {algorithm.name}_{h.name})")
    for other, theirs in declared().get(h.name, ()):
      if other != algorithm.name and theirs.kind != h.kind:
        raise ValueError(f"register: {algorithm.name}'s hyper-parameter {h.name!r} is a "
                         f"{h.kind}, {other}'s of that name a {theirs.kind}; rename it")


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
  _check_hparams(algorithm)
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
  rule whose clients keep no state and read none of the server's (each arrival applied
  as a round of one update), but DP-FedAvg's (its accountant counts sampled rounds)."""
  own = names(engine)
  if engine != "virtual_clock":
    return own
  return own + tuple(n for n in names("rounds")
                     if not get(n).client_state_keys and not get(n).client_reads_server
                     and not dp_fedavg.is_private(get(n)))


def declared(engine: Optional[str] = None, built_in: bool = False):
  """``{name: [(algorithm, base.HParam), ...]}``: the hyper-parameters the algorithms
  declare (those ``engine`` runs, ``names_on``; only the built-in ones with
  ``built_in``), each name in the order it first appears."""
  algos = names_on(engine) if engine else names()
  out = {}
  for a in algos:
    if built_in and a not in _REGISTRY:
      continue
    for h in get(a).hparams:
      out.setdefault(h.name, []).append((a, h))
  return out


def hparams_table() -> str:
  """docs/api.md's table of the built-in algorithms' hyper-parameters, made from their
  declarations (``base.HParam``; tests/test_own_hparams.py keeps the doc equal to it)."""
  rows = ["| flag | algorithms: default | bounds | meaning |", "|---|---|---|---|"]
  for name, pairs in declared(built_in=True).items():
    by_default = {}
    for a, h in pairs:
      text = (f"{h.by_dataset('synthetic'):g} (synthetic), {h.default:g}" if h.by_dataset else
          ("true" if h.default else "false") if h.kind == "bool" else f"{h.default:g}")
      by_default.setdefault(text, []).append(a)
    defaults = "; ".join(f"{', '.join(a)} {d}" for d, a in by_default.items())
    h = pairs[0][1]
    rows.append(f"| `--{name}` | {defaults} | {'' if h.kind == 'bool' else h.bounds} | "
                f"{h.help.replace('|', '&#124;')} |")
  return "\n".join(rows)


def engine_of(algorithm: str) -> str:
  """``"rounds"`` or ``"virtual_clock"``: the engine that runs ``algorithm``, a name or a
  comma list (``simulate(algorithm=...)`` and ``experiments/run.py --algorithm`` both
  ask here): the virtual clock when one of them is its own (``fedbuff``) and it runs the
  others (``names_on``: ``fedavg``), else the round engine. ``flatkeys.ConfigError``
  naming ``algorithm`` for an unknown name (the close ones, both engines' choices) and
  for a list no one engine runs."""
  listed = [n for n in algorithm.split(",") if n]
  known, on_clock = names(), names("virtual_clock")
  unknown = [n for n in listed if n not in known]
  if unknown:
    raise flatkeys.ConfigError("algorithm", f"unknown algorithm "
                               f"{', '.join(map(repr, unknown))}"
                               f"{flatkeys.did_you_mean(unknown[0], known)} (on rounds: "
                               f"{', '.join(names('rounds'))}; on the virtual clock: "
                               f"{', '.join(on_clock)})")
  clock = [n for n in listed if n in on_clock]
  if not clock:
    return "rounds"
  rounds = [n for n in listed if n not in names_on("virtual_clock")]
  if rounds:
    raise flatkeys.ConfigError("algorithm", f"{', '.join(clock)} "
                               f"{'runs' if len(clock) == 1 else 'run'} on the virtual "
                               f"clock, {', '.join(rounds)} on the round engine only: run "
                               "them separately")
  return "virtual_clock"


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
