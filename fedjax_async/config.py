"""A run's configuration: ``RunConfig``, one frozen dataclass a part of the run (data,
model, local training, delays, algorithm, encryption, run, outputs), its validation and
what ``--resume`` compares a stored run on.

  cfg = RunConfig(data=DataConfig(dataset="fashion_mnist"), local=LocalTraining(lr=0.05))
  cfg = RunConfig().replace(dataset="fashion_mnist", lr=0.05)   # the same, by flat key
  cfg.local.lr                                                    # 0.05

Every field has a flat key, its flag's name (``lr``, ``delay_fraction``): ``replace``,
``simulate(**fields)``, the stored configuration (``config_dict``) and the CLI use it.
The run flags are made from these fields, their defaults and their help
(``flag_specs``, ``cli.define_run_flags``). A wrong value raises ``ConfigError`` naming
the field by its path (``local.lr: must be > 0, got -1``); the CLI names its flag instead
(``--lr: ...``).
DP-FedAvg's hyper-parameters are its own (``algorithms.dp_fedavg``); the virtual clock's
DP-FedAsync and PrivaAsyncFed read the same --dp_epsilon, --dp_delta and --dp_clip
(docs/async.md).
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Dict, List, Optional

from fedjax_async import algorithms
from fedjax_async import models
from fedjax_async.algorithms import dp_fedavg
from fedjax_async.algorithms import pafed
from fedjax_async.algorithms.base import CLIENT_WEIGHTINGS, server_hparams
from fedjax_async.algorithms.server_optimizers import BIAS_CORRECTIONS, SERVER_OPTIMIZERS
from fedjax_async.core.building import data_seed_of  # the seed of the data, any engine's
from fedjax_async.core.client import PRECISIONS  # LocalTraining.precision
from fedjax_async.core.timeline import DelayConfig
from fedjax_async.flatkeys import (  # flag_specs, FlagSpec: read through config too
    ConfigError, FlagSpec, FlatKeys, check, check_types, flag_specs, option, parse_hp)

MAIN_JOB_ALGORITHMS = "pafed,fedadmm,fedavg,fedprox"
DP_ALGORITHMS = ("privaasyncfed", "dp_fedasync")


def _momentum(cfg) -> float:
  """0.5; 0 for a DP run of the virtual clock (its accountant composes plain SGD steps)."""
  dp = math.isfinite(cfg.privacy.dp_epsilon) and any(
      n in DP_ALGORITHMS for n in cfg.algorithm.names.split(","))
  return 0.0 if dp else 0.5


# The shared fields whose default depends on the engine (the flag's default is None, each
# engine's configuration fills it in, ``resolve_parts``), and why.
ENGINE_DEFAULTS = {
    # each engine's own algorithms: the README's main job, FedAsync
    "algorithm": {"rounds": MAIN_JOB_ALGORITHMS, "virtual_clock": "fedasync"},
    # the virtual clock's unit is one server update (a round of one arrival): evaluating
    # every one would cost more than the training
    "eval_every": {"rounds": 1, "virtual_clock": 20},
    # rounds on the round engine, calls of --groups_per_call groups on the virtual clock
    "checkpoint_every": {"rounds": 10, "virtual_clock": 1},
    # DP runs need plain SGD (privacy.py's accountant)
    "momentum": {"rounds": 0.5, "virtual_clock": _momentum},
}


def engine_default(cfg, key: str, engine: str):
  """``ENGINE_DEFAULTS[key]`` of ``engine`` for ``cfg``."""
  value = ENGINE_DEFAULTS[key][engine]
  return value(cfg) if callable(value) else value


def replace_keeping_defaults(cfg, engine: str, flat: dict):
  """``FlatKeys.replace(cfg, **flat)`` where a field left at its default follows the new
  values: ``ENGINE_DEFAULTS`` (the momentum of a run made DP) and the hyper-parameters'
  defaults by data set (PAFed's alphas after a new ``dataset``)."""
  new = FlatKeys.replace(cfg, **flat)
  stale = {k: None for k in ENGINE_DEFAULTS if k not in flat
           and cfg.get(k) == engine_default(cfg, k, engine) != engine_default(new, k, engine)}
  if "dataset" in flat:
    old, now = engine_defaults(engine, cfg.data.dataset), engine_defaults(engine,
                                                                           new.data.dataset)
    stale.update({k: now[k] for k, v in old.items()
                  if new.get(k) == v and k not in flat and now.get(k) != v})
  return FlatKeys.replace(new, **stale) if stale else new


def resolve_parts(config_class, parts: dict, engine: str) -> dict:
  """The parts ``{name: part}`` of a configuration of ``engine`` (``config_class``) as
  built from those given (``FlatKeys.resolve_parts``): its ``ENGINE_DEFAULTS`` fields that
  are None at ``engine``'s (in that order: the momentum's rule reads the algorithm), its
  None hyper-parameter fields where ``engine_defaults`` has one (on ``data.dataset``), and
  ``algorithm.hp`` (an algorithm's own, not a field) as a sorted tuple of (name, float)
  pairs. New parts where one changes (``dataclasses.replace``), none changed."""
  parts, keys = dict(parts), config_class.keys()
  view = types.SimpleNamespace(**parts)  # what the rules read: the parts filled so far
  view.get = lambda key: getattr(getattr(view, keys[key][0]), keys[key][1])
  for key in ENGINE_DEFAULTS:
    if view.get(key) is None:
      part, name = keys[key]
      parts[part] = dataclasses.replace(parts[part], **{name: engine_default(view, key,
                                                                           engine)})
      setattr(view, part, parts[part])
  a = parts["algorithm"]
  optional = {f.name for f in dataclasses.fields(a) if str(f.type).startswith("Optional")}
  missing = {k: v for k, v in engine_defaults(engine, parts["data"].dataset).items()
             if k in optional and getattr(a, k) is None}
  hp = tuple(sorted(parse_hp(a.hp).items()))
  if missing or hp != a.hp:
    parts["algorithm"] = dataclasses.replace(a, hp=hp, **missing)
  return parts


# Help of the fields both engines share whose default depends on the engine.
SHARED_HELP = {
    "algorithm": "Algorithm or comma list (default: the round engine's "
                 f"{MAIN_JOB_ALGORITHMS}; the virtual clock's fedasync).",
    "eval_every": "Evaluate every k rounds, on the virtual clock every k server updates "
                  "(and at the end; default: 1 round, 20 updates).",
    "checkpoint_every": "Checkpoint every k rounds, on the virtual clock every k calls of "
                        "--groups_per_call groups (and at the end; 0: off; default: 10 "
                        "rounds, 1 call).",
    "momentum": "Local SGD momentum (default: 0.5; 0 in DP runs).",
}
# ... and of those whose default is the same, where the two engines' wording would differ.
SHARED_HELP.update({
    "seed": "Seed of timeline (clock), model init and clients (data: --data_seed).",
    "seeds": "Comma list: each run per seed (<output_dir>/seed<s>/), then mean ± std.",
    "devices": "D: split each round's (group's) clients over the first D devices (0: all; 1: "
               "no sharding); sweeps split their runs over them instead.",
    "cpu_devices": "CPU only: make this many XLA host devices (jax_num_cpu_devices) for "
                   "--devices; 0: JAX's default (one).",
    "output_dir": "Where metrics, summaries, checkpoints, tables and figures go (from "
                  "Python, None: nowhere).",
    "resume": "Continue from the latest checkpoints in --output_dir; runs finished with the "
              "same flags are read back.",
    "overwrite": "Delete this driver's outputs in --output_dir and start over; without it "
                 "(or --resume) a folder holding a run is refused.",
    "quiet": "Only each run's result and the table (from Python: nothing printed).",
    "target_accuracy": "Target test accuracy: rounds (clock: time) to it (0: none).",
    "server_lr": "Server step size eta (SCAFFOLD's eta_g, FedBuff's eta_s, double "
                 "compensation's eta; FedDyn: none).",
})


def hparam_fields(engine: str) -> List[tuple]:
  """``dataclasses.make_dataclass`` fields, one per hyper-parameter that the built-in
  algorithms ``engine`` runs declare (``base.HParam``, in their files): its flag, help,
  bounds and default come from there. A name whose declarations disagree on the default
  (``mu``: FedProx 0.01, FedAsync 0) or whose default follows the data set (PAFed's
  alphas) defaults to None, each algorithm's own (``resolved_hparams``)."""
  everywhere = algorithms.declared(built_in=True)
  out = []
  for name, pairs in algorithms.declared(engine, built_in=True).items():
    first = everywhere[name][0][1]  # (the same help on every engine)
    defaults = {h.default for _, h in everywhere[name]}
    by_algorithm = ", ".join(dict.fromkeys(a for a, _ in pairs))
    if len(defaults) == 1 and not any(h.by_dataset for _, h in everywhere[name]):
      default, kind, note = first.default, first.kind, ""
    else:  # (the help of a default by data set says it)
      default, kind = None, f"Optional[{first.kind}]"
      note = "" if first.by_dataset else " Default: each algorithm's (" + ", ".join(
          f"{a} {h.default:g}" for a, h in everywhere[name]) + ")."
    if first.kind == "bool" and default is not None:
      default = bool(default)
    bounds = "" if first.kind == "bool" or first.bounds == "(-inf, inf)" else (
        f"; {first.bounds}")
    out.append((name, kind, option(default, f"{first.help} [{by_algorithm}{bounds}]{note}")))
  return out


def engine_defaults(engine: str, dataset: str) -> Dict[str, float]:
  """The defaults of ``engine``'s hyper-parameter fields on which every algorithm it runs
  agrees (on ``dataset``): what a field left None becomes in its configuration."""
  out = {}
  for name, pairs in algorithms.declared(engine, built_in=True).items():
    values = {h.default_for(dataset) for _, h in pairs}
    if len(values) == 1:
      out[name] = bool(values.pop()) if pairs[0][1].kind == "bool" else values.pop()
  return out


def resolved_hparams(part, engine: str, algorithm, dataset: str) -> Dict[str, float]:
  """The hyper-parameters ``algorithm`` (a ``base.Algorithm``, or None) runs with: every
  field of ``part`` (the ``algorithm`` part) from ``hparam_fields``, a None one at
  ``algorithm``'s default (or the first declaring algorithm's: a run's column of a name its
  algorithm does not read), then ``algorithm``'s own that are no field, from
  ``part.hp``."""
  out = {}
  for name, pairs in algorithms.declared(engine, built_in=True).items():
    value = getattr(part, name)
    if value is None:
      h = (algorithm.hparam(name) if algorithm is not None else None) or pairs[0][1]
      value = h.default_for(dataset)
    out[name] = float(value)
  given = parse_hp(part.hp)
  for h in getattr(algorithm, "hparams", ()):
    if h.name not in out:
      out[h.name] = float(given.get(h.name, h.default_for(dataset)))
  return out


def check_hparams(part, engine: str, names: List[str]) -> None:
  """``ConfigError`` naming ``algorithm.<name>`` for a hyper-parameter field outside the
  bounds any algorithm of ``engine`` declares for it, or an ``algorithm.hp`` entry that
  none of ``names`` declares or out of its bounds."""
  for name, pairs in algorithms.declared(engine, built_in=True).items():
    value = getattr(part, name)
    for a, h in pairs if value is not None else ():
      problem = h.check(value)
      check(problem is None, f"algorithm.{name}", f"{problem} ({a}'s {h.name})")
  own = {h.name: h for n in names if n in algorithms.names() for h in algorithms.get(n).hparams}
  for k, v in parse_hp(part.hp).items():
    check(k in own, "algorithm.hp", f"{k}: not a hyper-parameter of {', '.join(names)} "
          f"(declared: {', '.join(sorted(own)) or 'none'})")
    problem = own[k].check(v)
    check(problem is None, f"algorithm.hp.{k}", str(problem))


def option_fields(options) -> List[tuple]:
  """``dataclasses.make_dataclass`` fields of algorithms' ``base.Option``s (declared in
  their files): name, default, help and an enum's choices from there."""
  return [(o.name, "str", option(o.default, o.help, choices=o.choices if o.enum else None))
          for o in options]


def check_options(part, options) -> None:
  """``ConfigError`` naming ``algorithm.<name>`` for a value an option does not allow."""
  for o in options:
    problem = o.problem(getattr(part, o.name))
    check(problem is None, f"algorithm.{o.name}", str(problem))


HP_HELP = ("The algorithms' own hyper-parameters that are no field (a registered "
            "algorithm's): {name: value} (simulate(name=value) or hp={...}; on the CLI each "
            "is a flag --name).")


def _name_list(self) -> List[str]:
  return self.names.split(",")


AlgorithmConfig = dataclasses.make_dataclass("AlgorithmConfig", [
    ("names", "Optional[str]", option(None, SHARED_HELP["algorithm"], flag="algorithm")),
    *option_fields(pafed.OPTIONS),  # admm_upload, ducc_projection
    ("server_lr", "float", option(1.0, SHARED_HELP["server_lr"])),
    ("server_lr2", "float", option(-1.0, "eta_2 from --server_lr_switch_round on (<0: eta).")),
    ("server_lr_switch_round", "int", option(-1, "Round where eta_2 starts (-1: never).")),
    ("server_optimizer", "str", option(
        "sgd", "Server optimiser of the round's step (Reddi et al. 2021), step size "
        "--server_lr: sgd | momentum (FedAvgM) | adam (FedAdam) | yogi (FedYogi) | adagrad "
        "(FedAdagrad).", choices=SERVER_OPTIMIZERS)),
    ("server_beta1", "float", option(0.9, "beta_1 of the server optimiser (momentum's "
                                     "decay).")),
    ("server_beta2", "float", option(0.99, "beta_2 of the adam / yogi server optimisers.")),
    ("server_tau", "float", option(1e-3, "adam / yogi / adagrad's tau, outside the root "
                                   "(optax's eps).")),
    ("server_eps_root", "float", option(0.0, "Inside adam / yogi / adagrad's root (TFF "
                                        "Adagrad's eps).")),
    ("server_accumulator", "Optional[float]", option(
        None, "v_0 of adam / yogi / adagrad (default: yogi 1e-6, adam and adagrad 0).")),
    ("server_bias_correction", "str", option(
        "moments", "adam / yogi: moments (optax) | step (TFF, Flower) | none (Reddi et al.).",
        choices=BIAS_CORRECTIONS)),
    ("drop_nonfinite_uploads", "bool", option(
        False, "The server drops an arrival whose upload, client state or local loss is "
        "NaN/Inf (rows' dropped_nonfinite), the client's state kept (no paper's server "
        "does: experiments/results/README.md, Client health).")),
    ("client_weighting", "str", option(
        "auto", "Arrivals' weights: auto (n_k; FedADMM, PAFed, SCAFFOLD, FedDyn: 1) | examples | uniform.",
        choices=CLIENT_WEIGHTINGS)),
    ("hp", "tuple", option((), HP_HELP)),
    *hparam_fields("rounds"),
], frozen=True, namespace={"name_list": _name_list, "__doc__": (
    "Which algorithms run, the server's options, and the algorithms' hyper-parameters: a "
    "field per ``base.HParam`` the round engine's algorithms declare (``hparam_fields``).")})
AlgorithmConfig.__module__ = __name__


@dataclasses.dataclass(frozen=True)
class DataConfig:
  dataset: str = option("synthetic", "synthetic | synthetic_iid | fashion_mnist | mnist | "
                        "cifar10 | cifar100 | any tensorflow-datasets name | a natural split "
                        "from data_dir (fedjax_*, tff_*, leaf_*: docs/api.md).")
  num_clients: int = option(30, "N, number of clients.")
  partition: str = option("shards", "iid | shards | dirichlet (image data sets).")
  dirichlet_alpha: float = option(0.5, "Dirichlet concentration.")
  shards_per_client: int = option(2, "Label shards per client.")
  data_seed: Optional[int] = option(None, "Seed of data and partition, shared by all --seeds "
                                    "(default: --seed).")
  data_dir: Optional[str] = option(None, "IDX directory, tensorflow-datasets data_dir, or "
                                   "the natural data set's files (fedjax's / TFF's SQLite, "
                                   "LEAF's data/ folder).")
  data_source: str = option("auto", "auto | idx | tfds.")
  normalize: str = option("none", "Image inputs in [0, 1]: none | fedadmm ((x - 0.1307) / "
                          "0.3081, Gong et al.'s code) | cifar (fedjax's per channel).",
                          choices=("none", "fedadmm", "cifar"))
  max_client_examples: int = option(0, "Natural data sets: each client's first k examples "
                                    "at most (0: all).")
  max_test_examples: int = option(0, "Natural data sets: the first k test examples at most "
                                  "(0: all).")
  token_loss: str = option(
      "per_token", "Sequence loss: per_token | per_sequence (fedjax Stack Overflow's) | "
      "per_position (fedjax Shakespeare's; docs/api.md).",
      choices=("per_token", "per_sequence", "per_position"))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  name: str = option("auto", "logreg | mlp | cnn | cnn_fedadmm | cifar10_cnn | cifar100_cnn | "
                     "simple_cnn | resnet18 | shakespeare_lstm | stackoverflow_lstm | "
                     "leaf_shakespeare_lstm | sent140_lstm | auto (by data set).", flag="model")


@dataclasses.dataclass(frozen=True)
class LocalTraining:
  """A client's local training (both engines: ``client.LocalConfig`` is its static part)."""
  local_epochs: int = option(2, "E, local epochs.")
  random_local_epochs: bool = option(False, "E_i ~ U{1..E} per client and round.")
  local_steps: int = option(0, "> 0: at most this many minibatch steps per client and "
                            "task (PrivaAsyncFed Alg. 1's H), within the E epochs' shuffles; "
                            "0: E epochs.")
  batch_size: int = option(50, "B, local minibatch size.")
  lr: float = option(0.1, "Local learning rate.")
  momentum: Optional[float] = option(None, SHARED_HELP["momentum"])
  precision: str = option(
      "float32", "Local forward/backward arithmetic: float32 (as written; JAX's default "
      "matmul precision: TF32 on new NVIDIA GPUs) | tf32 (dots, convolutions in TF32) | "
      "bf16 (parameters, inputs in bfloat16); weights, optimiser, server: float32.",
      choices=PRECISIONS)
  augment: str = option("none", "Jitted local image augmentation: none | crop_flip "
                        "(random crop of the 4-pixel-padded image, horizontal flip; per "
                        "example, per-client keys).",
                        choices=("none", "crop_flip"))
  client_grad_clip: float = option(
      0.0, "> 0: local gradients (penalty in) clipped to this global L2 norm (0: off; "
      "optax.clip_by_global_norm; none of the papers': experiments/results/README.md).")


@dataclasses.dataclass(frozen=True)
class CryptoConfig:
  """PAFed's server under CKKS (docs/crypto.md)."""
  secure_aggregation: str = option("none", "none | ckks (PAFed's server under OpenFHE CKKS).")
  ckks_preset: str = option("secure", "secure (128-bit, HEStd_128_classic) | insecure_test "
                            "(ring 2^11, NOT secure: tests and quick looks only).")
  ckks_min_depth: int = option(10, "d, iterations of Cheon et al.'s Min polynomial; the "
                               "context depth is 2d + 8.")
  ckks_min_scale: float = option(1.0, "c in (0, 4]: the Min's input y = cos / 4 times c; 4 "
                                 "cuts the class weights' error 4x at no depth (1: Alg. 1).")
  ckks_design: str = option("one_context", "one_context (Alg. 4 as printed, every product at "
                            "the Min's depth) | streamed (model-size vectors at depth 2, the "
                            "scalars moved to a deep context by S1; fits the CNN, "
                            "docs/crypto.md).")
  allow_insecure_ckks: bool = option(False, "Run --ckks_preset=insecure_test, which is NOT "
                                     "secure (the run warns and its summary and tables are "
                                     "marked INSECURE).")


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How many rounds, who takes part, and how the rounds execute."""
  rounds: int = option(100, "T, communication rounds.")
  participation: float = option(0.33, "sigma, fraction sampled per round.")
  seed: int = option(0, SHARED_HELP["seed"])
  seeds: str = option("", SHARED_HELP["seeds"])
  eval_every: Optional[int] = option(None, SHARED_HELP["eval_every"])
  target_accuracy: float = option(0.0, SHARED_HELP["target_accuracy"])
  rounds_per_call: int = option(10, "Rounds fused into one jitted scan between host visits.")
  client_chunk: int = option(-1, "Train a round's clients as a lax.scan over chunks of this "
                             "many vmapped clients (0: one vmap over all; -1: auto, 1 for "
                             "models of >= 100k parameters on CPU, else 0).")
  devices: int = option(0, SHARED_HELP["devices"])
  client_data: str = option("auto", "Clients' data and state on the devices: replicated, "
                            "or sharded (each device and process holds its own clients); "
                            "auto: sharded across processes, replicated within one.",
                            choices=("auto", "replicated", "sharded"))


@dataclasses.dataclass(frozen=True)
class OutputConfig:
  """What a run writes (nothing without ``output_dir``), its checkpoints and console."""
  output_dir: Optional[str] = option(None, SHARED_HELP["output_dir"],
                                     cli_default="runs/latest")
  checkpoint_every: Optional[int] = option(None, SHARED_HELP["checkpoint_every"])
  keep_checkpoints: int = option(2, "Checkpoints kept (max_to_keep).")
  resume: bool = option(False, SHARED_HELP["resume"])
  overwrite: bool = option(False, SHARED_HELP["overwrite"])
  tensorboard: bool = option(True, "Write TensorBoard scalars under <output_dir>/tb.")
  log_every: int = option(0, "A console line every k rounds, and one at least every ~10 s "
                          "(0: about ten lines per run; metrics.jsonl has every round).")
  quiet: bool = option(False, SHARED_HELP["quiet"])


def part_of(name: str, source, keep, own=(), doc: str = "", module: str = __name__):
  """A frozen dataclass ``name`` of ``module``: the fields ``keep`` of the part ``source``
  (the same flags, defaults and help: defined once), then ``own`` (``(name, type,
  option)``).

  Args:
    name: the class's name.
    source: the part (a config dataclass) the fields come from.
    keep: the names of ``source``'s fields to keep.
    own: extra fields, ``(name, type, option)`` each.
    doc: the class's docstring.
    module: the module the class is filed under.
  """
  fields = [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
            for f in dataclasses.fields(source) if f.name in keep]
  cls = dataclasses.make_dataclass(name, fields + list(own), frozen=True,
                                   namespace={"__doc__": doc})
  cls.__module__ = module
  return cls


@dataclasses.dataclass(frozen=True)
class RunConfig(FlatKeys):
  """One invocation of the round engine: its parts, each a frozen dataclass. The defaults
  are the README's main job and the CLI's (PAFed, FedADMM, FedAvg and FedProx on
  Synthetic(1,1), 30% of the sampled clients delayed 1-3 rounds)."""
  algorithm: AlgorithmConfig = AlgorithmConfig()
  data: DataConfig = DataConfig()
  model: ModelConfig = ModelConfig()
  local: LocalTraining = LocalTraining()
  delay: DelayConfig = DelayConfig()
  crypto: CryptoConfig = CryptoConfig()
  run: RunOptions = RunOptions()
  output: OutputConfig = OutputConfig()

  @classmethod
  def resolve_parts(cls, parts: dict) -> dict:
    """``config.resolve_parts`` of the round engine: the defaults by engine and data set."""
    return resolve_parts(cls, parts, "rounds")

  def replace(self, **flat) -> "RunConfig":
    """``FlatKeys.replace``; fields left at their default follow the new values
    (``replace_keeping_defaults``: PAFed's alphas a new ``dataset``)."""
    return replace_keeping_defaults(self, "rounds", flat)

  @classmethod
  def from_flat(cls, flat: dict) -> "RunConfig":
    """The configuration of flat keys (a stored ``config_dict``, the parsed flags)."""
    flat = dict(flat)
    delay = flat.pop("delay", None)
    if isinstance(delay, dict):
      flat["delay"] = DelayConfig(**delay)
    elif delay is not None:
      flat["delay"] = delay
    return cls().replace(**flat)

  def hparams(self, algorithm=None, num_clients: Optional[int] = None) -> Dict[str, float]:
    """The traced scalar hyperparameters (sweepable with vmap): the common ones, then the
    algorithms' (``resolved_hparams``: ``algorithm``'s own defaults where none is given);
    for DP-FedAvg those a run derives over ``num_clients`` (default data.num_clients;
    ``dp_fedavg.run_hparams``)."""
    hp = self._hparams(algorithm)
    if not dp_fedavg.is_private(algorithm):
      return hp
    n = self.data.num_clients if num_clients is None else num_clients
    return dp_fedavg.run_hparams(hp, n, self.run.participation, self.run.rounds,
                                 self.run.seed)

  def _hparams(self, algorithm) -> Dict[str, float]:
    a, loc = self.algorithm, self.local
    return {"lr": loc.lr, "momentum": loc.momentum,
            **resolved_hparams(a, "rounds", algorithm, self.data.dataset),
            "ducc_project_conflicting": float(a.ducc_projection == "conflicting"),
            **server_hparams(a.server_lr, a.server_lr2, a.server_lr_switch_round,
                             a.client_weighting)}


_KEYS = RunConfig.keys()
# The common fields: no algorithm registered later may name a hyper-parameter so.
algorithms.reserve([k for k in _KEYS if k not in algorithms.declared(built_in=True)],
                   "the round engine's RunConfig")


def path(key: str) -> str:
  """The path of the field whose flat key (flag name) is ``key``: ``lr`` -> ``local.lr``."""
  return ".".join(_KEYS[key])


def seeds_of(cfg) -> List[int]:
  """The seeds of ``run.seeds`` (a comma list; '': ``[run.seed]``) of either engine's
  configuration; ``ConfigError`` naming run.seeds."""
  r = cfg.run
  if not r.seeds.strip():
    return [r.seed]
  try:
    seeds = [int(v) for v in r.seeds.split(",")]
  except ValueError:
    raise ConfigError("run.seeds", f"expected comma-separated integers, got {r.seeds!r}"
                      ) from None
  check(all(v >= 0 for v in seeds), "run.seeds", f"must be >= 0, got {r.seeds!r}")
  check(len(set(seeds)) == len(seeds), "run.seeds", f"repeats a seed: {r.seeds!r}")
  return seeds


def with_seed(cfg, seed: int, **flat):
  """``cfg`` (either engine's) at ``seed``, its data still from its own data seed
  (``data_seed_of``), ``run.seeds`` cleared, and the fields ``flat``."""
  return cfg.replace(seed=int(seed), data_seed=data_seed_of(cfg), seeds="", **flat)


def validate_local(c, check_fn=check, prefix: str = "local."):
  """The local-training fields both engines' configurations share (``c`` has
  ``local_epochs``, ``local_steps``, ``batch_size``, ``lr``, ``momentum``); the errors
  name ``prefix + field``."""
  p = prefix
  check_fn(c.local_epochs >= 1, p + "local_epochs", f"must be >= 1, got {c.local_epochs}")
  check_fn(c.local_steps >= 0, p + "local_steps", f"must be >= 0 (0: E epochs), got "
           f"{c.local_steps}")
  check_fn(c.batch_size >= 1, p + "batch_size", f"must be >= 1, got {c.batch_size}")
  check_fn(c.lr > 0, p + "lr", f"must be > 0, got {c.lr}")
  check_fn(0.0 <= c.momentum < 1.0, p + "momentum", f"must be in [0, 1), got {c.momentum}")
  check_fn(c.client_grad_clip >= 0, p + "client_grad_clip",
           f"must be >= 0 (0: off), got {c.client_grad_clip}")


def check_finite(cfg, allow=()):
  """Every float field of ``cfg`` (a ``FlatKeys`` configuration) but those whose flat keys
  are in ``allow`` is finite: ``ConfigError`` naming it (``local.lr: must be a finite
  number, got inf``)."""
  for key, spec in flag_specs(type(cfg)).items():
    value = cfg.get(key)
    if spec.kind == "float" and key not in allow and value is not None and not (
        math.isfinite(value)):
      raise ConfigError(spec.path, f"must be a finite number, got {value}")


def validate(cfg: RunConfig):
  """Raises ``ConfigError`` naming the field at fault by its path."""
  check_types(cfg)
  check_finite(cfg, allow=("dp_epsilon",))  # inf: no target
  _validate_algorithm(cfg)
  _validate_data_and_run(cfg)
  validate_local(cfg.local)
  check(cfg.local.precision in PRECISIONS, "local.precision",
        f"must be one of {', '.join(PRECISIONS)}, got {cfg.local.precision!r}")
  check(cfg.local.augment in ("none", "crop_flip"), "local.augment",
        f"must be none or crop_flip, got {cfg.local.augment!r}")
  _validate_crypto(cfg.crypto, cfg.algorithm)
  _validate_output(cfg.output)
  check(cfg.model.name == "auto" or cfg.model.name in models.MODEL_NAMES, "model.name",
        f"unknown model {cfg.model.name!r}; choices: auto, {', '.join(models.MODEL_NAMES)}")


def _validate_algorithm(cfg: RunConfig):
  a = cfg.algorithm
  names = a.name_list()
  for name in names:
    check(name not in algorithms.names("virtual_clock"), "algorithm.names",
          f"{name} runs on the virtual clock, not the round engine: "
          f"simulate(fa.AsyncRunConfig(), algorithm={name!r}), or simulate(algorithm="
          f"{name!r}) without a RunConfig (CLI: experiments/async_family.py)")
    check(name in algorithms.names("rounds"), "algorithm.names",
          f"unknown algorithm {name!r}; choices: {', '.join(algorithms.names('rounds'))}")
  check(len(set(names)) == len(names), "algorithm.names",  # one output directory per name
        f"lists {', '.join(sorted({n for n in names if names.count(n) > 1}))} more than "
        f"once, got {a.names!r}")
  check_options(a, pafed.OPTIONS)
  check_hparams(a, "rounds", names)
  check(a.server_optimizer in SERVER_OPTIMIZERS,
        "algorithm.server_optimizer", f"must be one of {', '.join(SERVER_OPTIMIZERS)}, got "
        f"{a.server_optimizer!r}")
  for k in ("server_beta1", "server_beta2"):
    check(0 <= getattr(a, k) < 1, f"algorithm.{k}", f"must be in [0, 1), got {getattr(a, k)}")
  check(a.server_tau > 0, "algorithm.server_tau", f"must be > 0, got {a.server_tau}")
  check(a.server_eps_root >= 0, "algorithm.server_eps_root",
        f"must be >= 0, got {a.server_eps_root}")
  check(a.server_accumulator is None or a.server_accumulator >= 0,
        "algorithm.server_accumulator", f"must be >= 0, got {a.server_accumulator}")
  check(a.server_bias_correction in BIAS_CORRECTIONS, "algorithm.server_bias_correction",
        f"must be one of {', '.join(BIAS_CORRECTIONS)}, got {a.server_bias_correction!r}")
  check(a.client_weighting in CLIENT_WEIGHTINGS, "algorithm.client_weighting",
        f"must be one of {', '.join(CLIENT_WEIGHTINGS)}, got {a.client_weighting!r}")
  check(a.server_lr > 0, "algorithm.server_lr", f"must be > 0, got {a.server_lr}")
  check(not (a.dp_noise_multiplier and math.isfinite(a.dp_epsilon)),
        "algorithm.dp_noise_multiplier", f"give it or a finite algorithm.dp_epsilon, not "
        f"both (got {a.dp_noise_multiplier:g} and {a.dp_epsilon:g})")
  rounds = cfg.run.rounds
  check(a.server_lr_switch_round == -1 or 0 <= a.server_lr_switch_round < rounds,
        "algorithm.server_lr_switch_round", f"must be -1 (never) or a round in "
        f"0..{rounds - 1} (run.rounds={rounds}), got {a.server_lr_switch_round}")


def check_target(target: float):
  """run.target_accuracy: a fraction, 0 for none."""
  check(0 <= target <= 1, "run.target_accuracy",
        f"must be in [0, 1] (0: none), got {target}")


def _validate_data_and_run(cfg: RunConfig):
  d, r = cfg.data, cfg.run
  check(d.shards_per_client >= 1, "data.shards_per_client",
        f"must be >= 1, got {d.shards_per_client}")
  check(d.num_clients >= 1, "data.num_clients", f"must be >= 1, got {d.num_clients}")
  check(d.dirichlet_alpha > 0, "data.dirichlet_alpha",
        f"must be > 0, got {d.dirichlet_alpha}")
  check(d.normalize in ("none", "fedadmm", "cifar"), "data.normalize",
        f"must be none, fedadmm or cifar, got {d.normalize!r}")
  for k in ("max_client_examples", "max_test_examples"):
    check(getattr(d, k) >= 0, f"data.{k}", f"must be >= 0 (0: all), got {getattr(d, k)}")
  check(r.seed >= 0, "run.seed", f"must be >= 0, got {r.seed}")
  check(d.data_seed is None or d.data_seed >= 0, "data.data_seed",
        f"must be >= 0, got {d.data_seed}")
  seeds_of(cfg)
  check(0.0 < r.participation <= 1.0, "run.participation",
        f"must be in (0, 1], got {r.participation}")
  check(r.rounds >= 1, "run.rounds", f"must be >= 1, got {r.rounds}")
  check(r.eval_every >= 1, "run.eval_every", f"must be >= 1, got {r.eval_every}")
  check_target(r.target_accuracy)
  check(r.rounds_per_call >= 1, "run.rounds_per_call",
        f"must be >= 1, got {r.rounds_per_call}")
  check(r.client_chunk >= -1, "run.client_chunk",
        f"must be >= -1 (-1 = auto, 0 = all clients of a round in one vmap), got "
        f"{r.client_chunk}")
  check(r.devices >= 0, "run.devices", f"must be >= 0 (0 = all devices JAX sees), got "
        f"{r.devices}")
  check(r.client_data in ("auto", "replicated", "sharded"), "run.client_data",
        f"must be auto, replicated or sharded, got {r.client_data!r}")


def _validate_crypto(c: CryptoConfig, a: AlgorithmConfig):
  check(c.secure_aggregation in ("none", "ckks"), "crypto.secure_aggregation",
        f"must be 'none' or 'ckks', got {c.secure_aggregation!r}")
  if c.secure_aggregation == "ckks":
    check(a.names == "pafed", "crypto.secure_aggregation",
          "ckks secure aggregation is PAFed's (use algorithm.names='pafed')")
    check(a.ducc_projection == "conflicting" and a.alpha_decay == 1.0
          and a.server_optimizer == "sgd" and a.client_weighting != "examples",
          "algorithm.ducc_projection" if a.ducc_projection != "conflicting"
          else "algorithm.alpha_decay" if a.alpha_decay != 1.0
          else "algorithm.server_optimizer" if a.server_optimizer != "sgd"
          else "algorithm.client_weighting", "the CKKS server runs Alg. 4 and Eq. 17 as printed "
          "(conflicting class projected, constant alphas); use the plaintext server "
          "(crypto.secure_aggregation='none') for this option")
  check(c.ckks_preset in ("secure", "insecure_test"), "crypto.ckks_preset",
        f"must be 'secure' or 'insecure_test', got {c.ckks_preset!r}")
  check(c.secure_aggregation != "ckks" or c.ckks_preset != "insecure_test"
        or c.allow_insecure_ckks, "crypto.ckks_preset",
        "insecure_test is NOT secure (ring 2^11, no security level); use "
        "crypto.ckks_preset='secure', or set crypto.allow_insecure_ckks to run it anyway")
  check(c.ckks_design in ("one_context", "streamed"), "crypto.ckks_design",
        f"must be 'one_context' or 'streamed', got {c.ckks_design!r}")
  check(1 <= c.ckks_min_depth <= 30, "crypto.ckks_min_depth",
        f"must be in 1..30, got {c.ckks_min_depth}")
  if c.secure_aggregation == "ckks":
    try:
      import openfhe  # pylint: disable=g-import-not-at-top
      del openfhe  # it loads: the encrypted server can run
    except ImportError as e:  # openfhe missing, or its wheel does not load here (BUILD.md)
      raise ConfigError("crypto.secure_aggregation", f"ckks needs OpenFHE (openfhe), which "
                        f"does not load here: {e}") from e
    pafed.check_ducc_scale(c.ckks_min_scale)
  else:
    check(c.ckks_min_scale == 1.0, "crypto.ckks_min_scale",
          "only used with crypto.secure_aggregation='ckks'")


def _validate_output(o: OutputConfig):
  check(o.log_every >= 0, "output.log_every", f"must be >= 0 (0: about ten lines per run), "
        f"got {o.log_every}")
  check(o.checkpoint_every >= 0, "output.checkpoint_every",
        f"must be >= 0 (0 = off), got {o.checkpoint_every}")
  check(o.keep_checkpoints >= 1, "output.keep_checkpoints",
        f"must be >= 1, got {o.keep_checkpoints}")
  check(not (o.resume and o.overwrite), "output.overwrite",
        "cannot be combined with output.resume (output.resume continues the run in "
        "output.output_dir, output.overwrite deletes it)")
  check(not o.resume or o.output_dir is not None, "output.resume",
        "continues the run in output.output_dir, and none is given")


def config_dict(cfg: RunConfig) -> dict:
  """The flat view (flag names; ``delay`` as one dict), as summaries and checkpoints store
  it."""
  out = {}
  for key, (part, _) in _KEYS.items():
    if part != "delay":
      out[key] = cfg.get(key)
  out["hp"] = dict(cfg.algorithm.hp)
  out["delay"] = dataclasses.asdict(cfg.delay)
  return out


# Config fields that may differ between a run and its resumption. (With another --devices
# the continuation equals the uninterrupted run to float rounding, not bit for bit: the
# upload sums are split differently.)
RESUME_FREE_FIELDS = ("output_dir", "resume", "overwrite", "checkpoint_every",
                      "keep_checkpoints", "tensorboard", "devices", "client_data",
                      "allow_insecure_ckks",
                      "log_every", "quiet", "target_accuracy", "seeds")


def run_config_for(cfg: RunConfig, name: str) -> dict:
  """The configuration of one algorithm's run, as stored in summaries and checkpoints;
  its own hyper-parameters that are no field (a registered algorithm's) as columns too,
  at the values it runs with."""
  d = config_dict(cfg)
  d["algorithm"] = name
  return dict(own_columns(cfg, name), **d)


def own_columns(cfg: RunConfig, name: str) -> Dict[str, float]:
  """``name``'s own hyper-parameters that are no field, at the values it runs with."""
  if name not in algorithms.names():
    return {}
  used = resolved_hparams(cfg.algorithm, "rounds", algorithms.get(name), cfg.data.dataset)
  return {k: v for k, v in used.items() if k not in _KEYS}


# What a config stored before a field existed ran with, where that is not the field's
# default: runs without ``admm_upload`` read Eq. 16 with the last local model.
STORED_BEFORE = {"admm_upload": "last_local", "num_arrivals": 0, "time_budget": 0.0}
# ... and where it is what the current configuration has: a round-engine run stored
# without ``data_seed`` drew its data from the base seed, the field's default.
STORED_AS_NOW = ("data_seed",)


def flat_stored(config: dict) -> dict:
  """A stored configuration (``config_dict``) with the delay's fields under their flat keys
  (``delay_fraction``, ``train_dropped``), so that a field added to ``DelayConfig`` later
  is missing from older configurations like any other field; a ``data_seed`` of None as
  the ``seed`` it stands for."""
  delay = config.get("delay")
  if config.get("data_seed", 0) is None:  # the run's seed's, compared as its value
    config = dict(config, data_seed=config.get("seed"))
  if "hp" in config:  # "" (before it was a mapping) or {} or pairs: one form
    config = dict(config, hp=parse_hp(config["hp"] or {}))
  if not isinstance(delay, dict):
    return dict(config)
  flat = {k: v for k, v in config.items() if k != "delay"}
  flags = {f.name: f.metadata.get("flag", f.name) for f in dataclasses.fields(DelayConfig)}
  flat.update({flags.get(k, k): v for k, v in delay.items()})
  return flat


def mismatch_flags(saved: dict, current: dict) -> List[str]:
  """``config_mismatch`` as ``["run.rounds=3 (now 5)", ...]`` (a key that is no
  ``RunConfig`` field, e.g. a virtual-clock driver's, as ``--key=...``), for the
  messages."""
  saved, current = flat_stored(saved), flat_stored(current)
  return [f"{path(k) if k in _KEYS else '--' + k}={saved.get(k)!r} (now {current.get(k)!r})"
          for k in config_mismatch(saved, current)]


def config_mismatch(saved: dict, current: dict) -> List[str]:
  """Fields (flag names) whose values differ, ignoring the resume-free ones. A field that
  ``saved`` lacks (stored before the field existed) counts as what such runs ran with:
  ``STORED_BEFORE``, ``current``'s for ``STORED_AS_NOW``, else its ``RunConfig``
  default."""
  saved, current = flat_stored(saved), flat_stored(current)
  keys = (set(saved) | set(current)) - set(RESUME_FREE_FIELDS)
  defaults = dict(flat_stored(config_dict(RunConfig())), **STORED_BEFORE,
                  **{k: current.get(k) for k in STORED_AS_NOW})
  return sorted(k for k in keys if saved.get(k, defaults.get(k)) != current.get(k))
