"""The virtual clock's configuration: ``AsyncRunConfig``, one frozen dataclass a part
(algorithm and server hyperparameters, clock, data, local training, privacy, run,
outputs), the flags of ``experiments/async_family.py`` made from its fields
(``cli.define_config_flags``), as the round engine's are from ``config.RunConfig``.

Each field's flat key is its flag's name (``concurrency``, ``dp_epsilon``);
``config.flag_specs(AsyncRunConfig)`` lists them with their defaults and help.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional  # noqa: F401  (the generated parts' annotations)

from fedjax_async import algorithms
from fedjax_async import config as config_lib
from fedjax_async import privacy
from fedjax_async.algorithms import fedasync
from fedjax_async.algorithms import privaasyncfed
from fedjax_async.asynchronous import virtual_clock as vc
from fedjax_async.config import DataConfig, ModelConfig, check_finite, validate_local
from fedjax_async.flatkeys import ConfigError, FlatKeys, check, check_types, option


AsyncAlgorithmConfig = dataclasses.make_dataclass("AsyncAlgorithmConfig", [
    # (also a round rule whose clients keep no state: each arrival a round of one)
    ("names", "Optional[str]", option(None, config_lib.SHARED_HELP["algorithm"],
                                      flag="algorithm")),
    ("hp", "tuple", option((), config_lib.HP_HELP)),
    *config_lib.option_fields(fedasync.OPTIONS),  # mix_alpha, staleness_fn, example_weight
    ("server_lr", "float", option(1.0, config_lib.SHARED_HELP["server_lr"])),
    *config_lib.hparam_fields("virtual_clock"),
], frozen=True, namespace={"__doc__": (
    "Which algorithms run, and the servers' hyperparameters (docs/async.md): a field per "
    "``base.HParam`` the virtual clock's algorithms declare (``hparam_fields``).")})
AsyncAlgorithmConfig.__module__ = __name__


@dataclasses.dataclass(frozen=True)
class ClockOptions:
  """The virtual clock: clients in flight, server versions, task durations, devices."""
  concurrency: int = option(5, "C, clients in flight.")
  num_updates: int = option(200, "Server updates (model versions). FedBuff takes "
                            "--buffer_k arrivals per update: see --num_arrivals.")
  num_arrivals: int = option(0, "> 0: every run stops after this many client arrivals "
                             "(the same client work for every algorithm; FedBuff: / buffer_k "
                             "server updates), instead of --num_updates.")
  time_budget: float = option(0.0, "T > 0: every run stops at simulated second T; "
                              "the accuracy at T.")
  buffer_k: int = option(5, "FedBuff's K (arrivals per server step).")
  compute_time: str = option("lognormal:0.001,0.5", "Seconds per example: constant:a | "
                             "uniform:a,b | exponential:mean | lognormal:median,sigma.")
  comm_time: str = option("constant:0.5", "Seconds of communication per task (same forms).")
  device_classes: str = option("", "'' (privaasyncfed when --algorithm runs it, else none) "
                               "| none | privaasyncfed | p:slowdown[:scale_index],...")
  scales: str = option(",".join(f"{s:g}" for s in privaasyncfed.SCALES),
                       "PrivaAsyncFed's scale table S (Eq. 10).")
  # Off by default: with the paper's slow-downs 1/2/4/8 it would make the slowest class the
  # fastest (8 x 0.25^2 = 0.5), against the paper's premise that low-compute clients send
  # the stalest updates (Fig. 2; docs/async.md).
  prune_speedup: bool = option(
      False, "PrivaAsyncFed: a sub-model of scale S[p] takes S[p]^2 of the compute and "
      "communication time (Eq. 11; off: docs/async.md).")
  ring_size: int = option(0, "R past models kept (0: enough that nothing is dropped).")
  group_size: int = option(0, "G, arrivals trained in one vmap (0: --concurrency on "
                           "GPU/TPU, 1 on CPU); rounded up to a multiple of the --devices.")


# A task's local training: the round engine's fields (the same flags, defaults and help)
# but E_i ~ U{1..E} and the arithmetic, which the DP accountant's step count and the
# clipped steps do not follow.
ClockLocalTraining = config_lib.part_of(
    "ClockLocalTraining", config_lib.LocalTraining,
    ("local_epochs", "local_steps", "batch_size", "lr", "momentum", "augment",
     "client_grad_clip"),
    doc="A task's local training (``client.LocalConfig`` is its static part).",
    module=__name__)


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
  """Client-side DP of PrivaAsyncFed and DP-FedAsync (``privacy.py``)."""
  dp_epsilon: float = option(math.inf, "Epsilon (inf: no noise).")
  dp_delta: float = option(1e-5, "Delta of the reported (epsilon, delta).")
  dp_clip: float = option(2.0, "Clipping bound C.")
  dp_clip_mode: str = option("example", "example (Eq. 17) | batch (Alg. 1 line 20).")
  dp_noise: str = option("calibrated", "calibrated (each client spends <= --dp_epsilon over "
                         "its steps) | alg1 (the paper's sigma = lr 2C/(|D_k| eps) a step; "
                         "spends far more, said at start).")


# The run and output parts: the round engine's fields where the meaning is the same (their
# flags, defaults and help defined once, in config.py), and the clock's own.
AsyncRunOptions = config_lib.part_of("AsyncRunOptions", config_lib.RunOptions, (
    "seed", "seeds", "eval_every", "target_accuracy", "devices"), own=[
        ("groups_per_call", "int", option(50, "Groups fused into one jitted scan.")),
        ("cpu_devices", "int", option(0, config_lib.SHARED_HELP["cpu_devices"]))],
    module=__name__)
AsyncOutputConfig = config_lib.part_of("AsyncOutputConfig", config_lib.OutputConfig, (
    "output_dir", "checkpoint_every", "resume", "overwrite", "quiet"), module=__name__)


@dataclasses.dataclass(frozen=True)
class AsyncRunConfig(FlatKeys):
  """One invocation of the virtual clock (``experiments/async_family.py``'s defaults):
  ``AsyncRunConfig().replace(algorithm="fedbuff", num_updates=50)`` by flat keys, as
  ``RunConfig``."""
  algorithm: AsyncAlgorithmConfig = AsyncAlgorithmConfig()
  clock: ClockOptions = ClockOptions()
  data: DataConfig = DataConfig()
  model: ModelConfig = ModelConfig()
  local: ClockLocalTraining = ClockLocalTraining()
  privacy: PrivacyConfig = PrivacyConfig()
  run: AsyncRunOptions = AsyncRunOptions()
  output: AsyncOutputConfig = AsyncOutputConfig()

  @classmethod
  def resolve_parts(cls, parts: dict) -> dict:
    """``config.resolve_parts`` of the virtual clock: the defaults by engine and data set."""
    return config_lib.resolve_parts(cls, parts, "virtual_clock")

  def replace(self, **flat) -> "AsyncRunConfig":
    """``FlatKeys.replace``; fields left at their default follow the new values
    (``config.replace_keeping_defaults``: the momentum of a run made DP)."""
    return config_lib.replace_keeping_defaults(self, "virtual_clock", flat)


algorithms.reserve([k for k in AsyncRunConfig.keys()
                    if k not in algorithms.declared("virtual_clock", built_in=True)],
                   "the virtual clock's AsyncRunConfig")


# ------------------------------------------------------------------- validation

# s(t - tau) by name: its hp["staleness_fn"]
STALENESS = {n: i for i, n in enumerate(fedasync.STALENESS_FNS)}


def parse_floats(text: str, field: str) -> List[float]:
  try:
    return [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise ConfigError(field, f"expected comma-separated numbers, got {text!r}"
                                 ) from None


seeds_of = config_lib.seeds_of  # the seeds of run.seeds (or [run.seed])


def validate(cfg: AsyncRunConfig):
  """(algorithm names, PrivaAsyncFed's scales, ``vc.ClockConfig``); ``ConfigError`` naming
  the field at fault."""
  check_types(cfg)
  check_finite(cfg, allow=("dp_epsilon",))  # inf: no noise
  a, c, p, r = cfg.algorithm, cfg.clock, cfg.privacy, cfg.run
  names = a.names.split(",")
  choices = algorithms.names_on("virtual_clock")
  for n in names:
    check(n in choices, "algorithm.names", f"unknown {n!r}; choices: {', '.join(choices)}")
  config_lib.check_hparams(a, "virtual_clock", names)
  check(len(set(names)) == len(names), "algorithm.names",
        f"lists an algorithm more than once: {a.names!r}")
  seeds_of(cfg)
  check(cfg.data.data_seed is None or cfg.data.data_seed >= 0, "data.data_seed",
        f"must be >= 0, got {cfg.data.data_seed}")
  n_clients = cfg.data.num_clients
  check(n_clients >= 1, "data.num_clients", f"must be >= 1, got {n_clients}")
  check(1 <= c.concurrency <= n_clients, "clock.concurrency",
        f"must be in [1, data.num_clients={n_clients}], got {c.concurrency}")
  check(c.num_updates >= 1, "clock.num_updates", f"must be >= 1, got {c.num_updates}")
  check(c.num_arrivals >= 0, "clock.num_arrivals", f"must be >= 0 (0: off), got "
        f"{c.num_arrivals}")
  check(c.buffer_k >= 1, "clock.buffer_k", f"must be >= 1, got {c.buffer_k}")
  if c.num_arrivals and "fedbuff" in names:
    check(c.num_arrivals % c.buffer_k == 0, "clock.num_arrivals",
          f"must be a multiple of clock.buffer_k={c.buffer_k} (FedBuff's arrivals per "
          f"server update), got {c.num_arrivals}")
  check(c.group_size >= 0, "clock.group_size", f"must be >= 0, got {c.group_size}")
  check(c.ring_size >= 0, "clock.ring_size", f"must be >= 0, got {c.ring_size}")
  validate_local(cfg.local)
  _validate_servers(a)
  scales = parse_floats(c.scales, "clock.scales")
  check(scales and all(0 < s <= 1 for s in scales), "clock.scales",
        f"need values in (0, 1], got {c.scales!r}")
  privacy.validate(p.dp_epsilon, p.dp_delta, p.dp_clip)
  check(p.dp_clip_mode in ("example", "batch"), "privacy.dp_clip_mode",
        f"must be example or batch, got {p.dp_clip_mode!r}")
  check(p.dp_noise in ("alg1", "calibrated"), "privacy.dp_noise",
        f"must be alg1 or calibrated, got {p.dp_noise!r}")
  if any(n in ("privaasyncfed", "dp_fedasync") for n in names) and math.isfinite(
      p.dp_epsilon):
    check(cfg.local.momentum == 0, "local.momentum", "must be 0 for DP runs (the accountant "
          "composes Gaussian steps of plain SGD)")
  check(r.eval_every >= 1, "run.eval_every", f"must be >= 1, got {r.eval_every}")
  config_lib.check_target(r.target_accuracy)
  check(c.time_budget >= 0, "clock.time_budget", f"must be >= 0 (0: none), got "
        f"{c.time_budget}")
  check(r.groups_per_call >= 1, "run.groups_per_call",
        f"must be >= 1, got {r.groups_per_call}")
  check(cfg.output.checkpoint_every >= 0, "output.checkpoint_every",
        f"must be >= 0 (0: off), got {cfg.output.checkpoint_every}")
  classes = (vc.PRIVAASYNCFED_CLASSES if c.device_classes == "privaasyncfed"
             else () if c.device_classes == "none"
             else vc.parse_device_classes(c.device_classes))
  if "privaasyncfed" in names:
    check(all(k.scale_index < len(scales) for k in classes), "clock.device_classes",
          f"scale index beyond clock.scales ({len(scales)} entries)")
  loc = cfg.local
  clock = vc.ClockConfig(
      concurrency=c.concurrency, num_updates=c.num_arrivals or c.num_updates, buffer_k=1,
      epochs=loc.local_epochs, local_steps=loc.local_steps, batch_size=loc.batch_size,
      compute=vc.Distribution.parse(c.compute_time, "clock.compute_time"),
      comm=vc.Distribution.parse(c.comm_time, "clock.comm_time"), device_classes=classes,
      ring_size=c.ring_size, time_budget=c.time_budget)
  return names, scales, clock


def _validate_servers(a):
  config_lib.check_options(a, fedasync.OPTIONS)
  check(a.server_lr > 0, "algorithm.server_lr", f"must be > 0, got {a.server_lr}")
