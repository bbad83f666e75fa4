"""A run's configuration: ``RunConfig`` (one frozen dataclass, whose defaults the run
flags are made from: ``cli.define_run_flags``), its validation (a ValueError naming the
field as its flag, ``--name``) and what ``--resume`` compares a stored run on.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from fedjax_async import algorithms
from fedjax_async import timeline as timeline_lib
from fedjax_async.algorithms import fedadmm


MAIN_JOB_ALGORITHMS = "pafed,fedadmm,fedavg,fedprox"


def dataset_defaults(dataset: str) -> Dict[str, float]:
  """Defaults that depend on the data set (``RunConfig`` fields left ``None``).

  PAFed's Eq. 17 adds alpha times unit vectors, a step of fixed length whatever the
  model's size: the paper's alpha = 0.8 suits its 1.66M-parameter CNN, but on the
  610-parameter logistic regression of the synthetic data sets the model then keeps
  jumping by ~0.8 around its optimum (main job, 3 seeds: final accuracy 0.65 +- 0.10 at
  0.8, 0.80 +- 0.01 at 0.4; docs/design.md)."""
  alpha = 0.4 if dataset.lower().startswith("synthetic") else 0.8
  return {"alpha0": alpha, "alpha1": alpha, "alpha2": alpha}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  algorithm: str = MAIN_JOB_ALGORITHMS
  dataset: str = "synthetic"
  model: str = "auto"
  num_clients: int = 30
  partition: str = "shards"
  dirichlet_alpha: float = 0.5
  shards_per_client: int = 2
  data_dir: Optional[str] = None
  data_source: str = "auto"
  participation: float = 0.33
  delay: timeline_lib.DelayConfig = timeline_lib.DelayConfig(0.3, "uniform", 3)
  rounds: int = 100
  local_epochs: int = 2
  random_local_epochs: bool = False
  local_steps: int = 0  # > 0: at most this many minibatch steps per round (within E epochs)
  batch_size: int = 50
  lr: float = 0.1
  momentum: float = 0.5
  rho: float = 0.01
  admm_upload: str = "received"  # Eq. 16's w_i^{tau_r}: received model | last_local
  mu: float = 0.01
  alpha0: Optional[float] = None  # None: by data set (dataset_defaults)
  alpha1: Optional[float] = None
  alpha2: Optional[float] = None
  server_lr: float = 1.0
  server_lr2: float = -1.0
  server_lr_switch_round: int = -1
  seed: int = 0
  eval_every: int = 1
  rounds_per_call: int = 10
  client_chunk: int = -1  # G: a round's clients in lax.scan chunks of G; 0 one vmap; -1 auto
  devices: int = 0  # D: a round's clients split over the first D devices; 0 = all of them
  client_data: str = "auto"  # clients' data and state per device: sharding.data_placement
  output_dir: Optional[str] = None  # None: nothing written (the CLI's default: runs/latest)
  secure_aggregation: str = "none"
  ckks_preset: str = "secure"  # or "insecure_test" (small ring, tests only)
  ckks_min_depth: int = 10  # d, iterations of Cheon et al.'s Min (Alg. 1)
  ckks_min_scale: float = 1.0  # c, the Min's input scale (cheon.cheon_min; 1 = Alg. 1)
  # one_context: secure_ducc (Alg. 4 as printed, every product at the Min's depth);
  # streamed: streamed_ducc (vectors at depth 2, scalars refreshed by S1; CNN size)
  ckks_design: str = "one_context"
  allow_insecure_ckks: bool = False  # run --ckks_preset=insecure_test (not secure)
  checkpoint_every: int = 10  # rounds between checkpoints (at chunk boundaries); 0 = off
  keep_checkpoints: int = 2
  resume: bool = False
  overwrite: bool = False  # delete the output directory's previous run first
  tensorboard: bool = True
  log_every: int = 0  # a console line every k rounds; 0 = about ten lines per run
  quiet: bool = False  # no per-round lines, only each run's result and the table

  def __post_init__(self):
    for k, v in dataset_defaults(self.dataset).items():
      if getattr(self, k) is None:
        object.__setattr__(self, k, v)

  def hparams(self) -> Dict[str, float]:
    """The traced scalar hyperparameters (sweepable with vmap)."""
    hp = {"lr": self.lr, "momentum": self.momentum, "rho": self.rho, "mu": self.mu,
          "alpha0": self.alpha0, "alpha1": self.alpha1, "alpha2": self.alpha2,
          "server_lr": self.server_lr,
          "server_lr2": self.server_lr if self.server_lr2 < 0 else self.server_lr2,
          "server_lr_switch_round": self.server_lr_switch_round}
    return hp


def check(condition: bool, flag: str, message: str):
  if not condition:
    raise ValueError(f"--{flag}: {message}")


def validate_local(c, check_fn=check):
  """The local-training fields both engines' configurations share (``c`` has
  ``local_epochs``, ``local_steps``, ``batch_size``, ``lr``, ``momentum``)."""
  check_fn(c.local_epochs >= 1, "local_epochs", f"must be >= 1, got {c.local_epochs}")
  check_fn(c.local_steps >= 0, "local_steps", f"must be >= 0 (0: E epochs), got "
           f"{c.local_steps}")
  check_fn(c.batch_size >= 1, "batch_size", f"must be >= 1, got {c.batch_size}")
  check_fn(c.lr > 0, "lr", f"must be > 0, got {c.lr}")
  check_fn(0.0 <= c.momentum < 1.0, "momentum", f"must be in [0, 1), got {c.momentum}")


def validate(cfg: RunConfig):
  """Raises ValueError naming the offending flag."""
  names = cfg.algorithm.split(",")
  for name in names:
    check(name in algorithms.names("rounds"), "algorithm",
          f"unknown algorithm {name!r}; choices: {', '.join(algorithms.names('rounds'))}")
  check(len(set(names)) == len(names), "algorithm",  # one output directory per name
        f"lists {', '.join(sorted({n for n in names if names.count(n) > 1}))} more than "
        f"once, got {cfg.algorithm!r}")
  check(cfg.seed >= 0, "seed", f"must be >= 0, got {cfg.seed}")
  check(cfg.shards_per_client >= 1, "shards_per_client",
        f"must be >= 1, got {cfg.shards_per_client}")
  check(cfg.num_clients >= 1, "num_clients", f"must be >= 1, got {cfg.num_clients}")
  check(0.0 < cfg.participation <= 1.0, "participation",
        f"must be in (0, 1], got {cfg.participation}")
  check(cfg.rounds >= 1, "rounds", f"must be >= 1, got {cfg.rounds}")
  validate_local(cfg)
  check(cfg.rho > 0, "rho", f"must be > 0, got {cfg.rho}")
  check(cfg.admm_upload in fedadmm.UPLOADS, "admm_upload",
        f"must be one of {', '.join(fedadmm.UPLOADS)}, got {cfg.admm_upload!r}")
  check(cfg.mu >= 0, "mu", f"must be >= 0, got {cfg.mu}")
  for k in ("alpha0", "alpha1", "alpha2"):  # PAFed's non-negative weights (Eq. 17)
    check(getattr(cfg, k) >= 0, k, f"must be >= 0 (a weight of PAFed's Eq. 17), got "
          f"{getattr(cfg, k)}")
  check(cfg.server_lr > 0, "server_lr", f"must be > 0, got {cfg.server_lr}")
  check(cfg.server_lr_switch_round == -1 or 0 <= cfg.server_lr_switch_round < cfg.rounds,
        "server_lr_switch_round", f"must be -1 (never) or a round in 0..{cfg.rounds - 1} "
        f"(--rounds={cfg.rounds}), got {cfg.server_lr_switch_round}")
  check(cfg.dirichlet_alpha > 0, "dirichlet_alpha", f"must be > 0, got {cfg.dirichlet_alpha}")
  check(cfg.eval_every >= 1, "eval_every", f"must be >= 1, got {cfg.eval_every}")
  check(cfg.log_every >= 0, "log_every", f"must be >= 0 (0: about ten lines per run), "
        f"got {cfg.log_every}")
  check(cfg.rounds_per_call >= 1, "rounds_per_call",
        f"must be >= 1, got {cfg.rounds_per_call}")
  check(cfg.client_chunk >= -1, "client_chunk",
        f"must be >= -1 (-1 = auto, 0 = all clients of a round in one vmap), got "
        f"{cfg.client_chunk}")
  check(cfg.devices >= 0, "devices",
        f"must be >= 0 (0 = all devices JAX sees), got {cfg.devices}")
  check(cfg.client_data in ("auto", "replicated", "sharded"), "client_data",
        f"must be auto, replicated or sharded, got {cfg.client_data!r}")
  check(cfg.checkpoint_every >= 0, "checkpoint_every",
        f"must be >= 0 (0 = off), got {cfg.checkpoint_every}")
  check(cfg.keep_checkpoints >= 1, "keep_checkpoints",
        f"must be >= 1, got {cfg.keep_checkpoints}")
  check(cfg.secure_aggregation in ("none", "ckks"), "secure_aggregation",
        f"must be 'none' or 'ckks', got {cfg.secure_aggregation!r}")
  if cfg.secure_aggregation == "ckks":
    check(cfg.algorithm == "pafed", "secure_aggregation",
          "ckks secure aggregation is PAFed's (use --algorithm=pafed)")
  check(cfg.ckks_preset in ("secure", "insecure_test"), "ckks_preset",
        f"must be 'secure' or 'insecure_test', got {cfg.ckks_preset!r}")
  check(cfg.secure_aggregation != "ckks" or cfg.ckks_preset != "insecure_test"
        or cfg.allow_insecure_ckks, "ckks_preset",
        "insecure_test is NOT secure (ring 2^11, no security level); use "
        "--ckks_preset=secure, or pass --allow_insecure_ckks to run it anyway")
  check(cfg.ckks_design in ("one_context", "streamed"), "ckks_design",
        f"must be 'one_context' or 'streamed', got {cfg.ckks_design!r}")
  check(1 <= cfg.ckks_min_depth <= 30, "ckks_min_depth",
        f"must be in 1..30, got {cfg.ckks_min_depth}")
  if cfg.secure_aggregation == "ckks":
    try:
      from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
    except ImportError as e:  # openfhe missing, or its wheel does not load here (BUILD.md)
      raise ValueError(f"--secure_aggregation=ckks needs OpenFHE (openfhe), which does not "
                       f"load here: {e}") from e
    cheon.check_ducc_scale(cfg.ckks_min_scale)
  else:
    check(cfg.ckks_min_scale == 1.0, "ckks_min_scale",
          "only used with --secure_aggregation=ckks")
  check(not (cfg.resume and cfg.overwrite), "overwrite",
        "cannot be combined with --resume (--resume continues the run in --output_dir, "
        "--overwrite deletes it)")
  check(not cfg.resume or cfg.output_dir is not None, "resume",
        "continues the run in output_dir, and none is given")
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  check(cfg.model == "auto" or cfg.model in models.MODEL_NAMES, "model",
        f"unknown model {cfg.model!r}; choices: auto, {', '.join(models.MODEL_NAMES)}")


def config_dict(cfg: RunConfig) -> dict:
  d = dataclasses.asdict(cfg)
  return d


# Config fields that may differ between a run and its resumption. (With another --devices
# the continuation equals the uninterrupted run to float rounding, not bit for bit: the
# upload sums are split differently.)
RESUME_FREE_FIELDS = ("output_dir", "resume", "overwrite", "checkpoint_every",
                      "keep_checkpoints", "tensorboard", "devices", "client_data",
                      "allow_insecure_ckks",
                      "log_every", "quiet")


def run_config_for(cfg: RunConfig, name: str) -> dict:
  """The configuration of one algorithm's run, as stored in summaries and checkpoints."""
  d = config_dict(cfg)
  d["algorithm"] = name
  return d


# What a config stored before a field existed ran with, where that is not the field's
# default: runs without ``admm_upload`` read Eq. 16 with the last local model.
STORED_BEFORE = {"admm_upload": "last_local", "num_arrivals": 0}


def mismatch_flags(saved: dict, current: dict) -> List[str]:
  """``config_mismatch`` as ``["--flag=saved (now current)", ...]``, for the messages."""
  return [f"--{k}={saved.get(k)!r} (now {current.get(k)!r})"
          for k in config_mismatch(saved, current)]


def config_mismatch(saved: dict, current: dict) -> List[str]:
  """Fields (flag names) whose values differ, ignoring the resume-free ones. A field that
  ``saved`` lacks (stored before the field existed) counts as what such runs ran with:
  ``STORED_BEFORE``, else its ``RunConfig`` default."""
  keys = (set(saved) | set(current)) - set(RESUME_FREE_FIELDS)
  defaults = dict(config_dict(RunConfig()), **STORED_BEFORE)
  return sorted(k for k in keys if saved.get(k, defaults.get(k)) != current.get(k))
