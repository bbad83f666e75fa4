"""From absl flags to a finished run: configuration, validation, output files, comparison.

The path of a parameter: flag (``define_flags``) -> ``RunConfig`` field (``config_from_flags``,
which validates it and names the flag when it is wrong) -> ``hparams`` dict / static
``EngineConfig`` / ``timeline.DelayConfig`` -> ``engine.run_chunk``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import algorithms
from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import client as client_lib
from fedjax_async import engine
from fedjax_async import interrupts
from fedjax_async import sharding
from fedjax_async import timeline as timeline_lib
from fedjax_async.algorithms import fedadmm

# SIGINT / SIGTERM handling, shared by every driver (here for their ``experiment.`` calls)
Interrupted = interrupts.Interrupted
check_interrupted = interrupts.check_interrupted
handle_interrupts = interrupts.handle_interrupts
exit_on_interrupt = interrupts.exit_on_interrupt

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
  output_dir: Optional[str] = None  # None: nothing written (the CLI's default: runs/latest)
  secure_aggregation: str = "none"
  ckks_preset: str = "secure"  # or "insecure_test" (small ring, tests only)
  ckks_min_depth: int = 10  # d, iterations of Cheon et al.'s Min (Alg. 1)
  ckks_min_scale: float = 1.0  # c, the Min's input scale (cheon.cheon_min; 1 = Alg. 1)
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
  check(cfg.local_epochs >= 1, "local_epochs", f"must be >= 1, got {cfg.local_epochs}")
  check(cfg.local_steps >= 0, "local_steps", f"must be >= 0 (0: E epochs), got "
        f"{cfg.local_steps}")
  check(cfg.batch_size >= 1, "batch_size", f"must be >= 1, got {cfg.batch_size}")
  check(cfg.lr > 0, "lr", f"must be > 0, got {cfg.lr}")
  check(0.0 <= cfg.momentum < 1.0, "momentum", f"must be in [0, 1), got {cfg.momentum}")
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
  check(1 <= cfg.ckks_min_depth <= 30, "ckks_min_depth",
        f"must be in 1..30, got {cfg.ckks_min_depth}")
  if cfg.secure_aggregation == "ckks":
    from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
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


# ---------------------------------------------------------------------------- flags


def define_flags():
  """Defines the run flags (call once, from the experiment script)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  d = RunConfig()
  f = flags
  f.DEFINE_string("algorithm", d.algorithm,
                  f"Algorithm or comma-separated list; choices: {', '.join(algorithms.names('rounds'))}.")
  f.DEFINE_string("dataset", d.dataset, "synthetic | synthetic_iid | fashion_mnist | mnist | "
                  "cifar10 | cifar100 | any tensorflow-datasets name.")
  f.DEFINE_string("model", d.model, "logreg | mlp | cnn | cifar10_cnn | cifar100_cnn | "
                  "simple_cnn | auto (by data set).")
  f.DEFINE_integer("num_clients", d.num_clients, "N, number of clients.")
  f.DEFINE_string("partition", d.partition, "iid | shards | dirichlet (image data sets).")
  f.DEFINE_float("dirichlet_alpha", d.dirichlet_alpha, "Dirichlet concentration.")
  f.DEFINE_integer("shards_per_client", d.shards_per_client, "Label shards per client.")
  f.DEFINE_string("data_dir", None, "IDX directory or tensorflow-datasets data_dir.")
  f.DEFINE_string("data_source", d.data_source, "auto | idx | tfds.")
  f.DEFINE_float("participation", d.participation, "sigma, fraction sampled per round.")
  f.DEFINE_float("delay_fraction", d.delay.fraction, "delta, fraction of sampled clients "
                 "that are delayed (the library default is 0; the main job uses 0.3).")
  f.DEFINE_string("delay_distribution", d.delay.distribution, "fixed | uniform | geometric.")
  f.DEFINE_integer("max_delay", d.delay.max_delay, "Dmax (uniform) or k (fixed), rounds.")
  f.DEFINE_float("delay_mean", d.delay.mean, "Mean delay for geometric delays, rounds.")
  f.DEFINE_integer("buffer_size", 0, "R, past global models kept (0: Dmax + 1).")
  f.DEFINE_integer("rounds", d.rounds, "T, communication rounds.")
  f.DEFINE_integer("local_epochs", d.local_epochs, "E, local epochs.")
  f.DEFINE_boolean("random_local_epochs", False, "E_i ~ U{1..E} per client and round.")
  f.DEFINE_integer("local_steps", d.local_steps, "> 0: at most this many minibatch steps "
                   "per client and round, within the E epochs' shuffles; 0: E epochs.")
  f.DEFINE_integer("batch_size", d.batch_size, "B, local minibatch size.")
  f.DEFINE_float("lr", d.lr, "Local learning rate.")
  f.DEFINE_float("momentum", d.momentum, "Local SGD momentum.")
  f.DEFINE_float("rho", d.rho, "ADMM penalty rho (FedADMM, PAFed).")
  f.DEFINE_string("admm_upload", d.admm_upload, "FedADMM / PAFed upload (Eq. 16): "
                  "received = (w_end - model received) + dy/rho, as Gong et al.'s code; "
                  "last_local = (w_end - client's last local model) + dy/rho, the equation "
                  "as printed (the global model's scale can diverge: docs/design.md).")
  f.DEFINE_float("mu", d.mu, "FedProx proximal coefficient mu.")
  by_dataset = "default: 0.4 on the synthetic data sets, 0.8 (the paper's) on the others"
  f.DEFINE_float("alpha0", None, f"PAFed Eq. 17 weight of the online mean; {by_dataset}.")
  f.DEFINE_float("alpha1", None, f"PAFed Eq. 17 weight of the non-conflicting delayed "
                 f"mean; {by_dataset}.")
  f.DEFINE_float("alpha2", None, f"PAFed Eq. 17 weight of the projected conflicting "
                 f"mean; {by_dataset}.")
  f.DEFINE_float("server_lr", d.server_lr,
                 "Server learning rate eta (FedAvg, FedProx, FedNova, FedADMM).")
  f.DEFINE_float("server_lr2", -1.0, "eta_2 from --server_lr_switch_round on (<0: eta).")
  f.DEFINE_integer("server_lr_switch_round", -1, "Round where eta_2 starts (-1: never).")
  f.DEFINE_integer("seed", d.seed, "Seed of data, timeline, initialisation and clients.")
  f.DEFINE_integer("eval_every", d.eval_every, "Evaluate every k rounds (and the last 10).")
  f.DEFINE_integer("rounds_per_call", d.rounds_per_call,
                   "Rounds fused into one jitted scan between host visits.")
  f.DEFINE_integer("client_chunk", d.client_chunk, "Train a round's clients as a lax.scan over "
                   "chunks of this many vmapped clients (0: one vmap over all; -1: auto, "
                   "1 for models of >= 100k parameters on CPU, else 0).")
  f.DEFINE_integer("devices", d.devices, "D: split each round's clients over the first D "
                   "devices JAX sees (0: all of them; 1: no sharding); sweeps split their "
                   "runs over them instead.")
  f.DEFINE_integer("cpu_devices", 0, "CPU only: make this many XLA host devices "
                   "(jax_num_cpu_devices) so that --devices can split the clients over the "
                   "cores; 0: JAX's default (one).")
  f.DEFINE_string("output_dir", "runs/latest", "Where metrics and summaries go.")
  f.DEFINE_string("secure_aggregation", d.secure_aggregation,
                  "none | ckks (PAFed's server under OpenFHE CKKS).")
  f.DEFINE_string("ckks_preset", d.ckks_preset, "secure (128-bit, HEStd_128_classic) | "
                  "insecure_test (ring 2^11, NOT secure: tests and quick looks only).")
  f.DEFINE_boolean("allow_insecure_ckks", d.allow_insecure_ckks, "Run "
                   "--ckks_preset=insecure_test, which is NOT secure (the run warns and its "
                   "summary and tables are marked INSECURE).")
  f.DEFINE_integer("ckks_min_depth", d.ckks_min_depth, "d, iterations of Cheon et al.'s "
                   "Min polynomial; the context depth is 2d + 8.")
  f.DEFINE_float("ckks_min_scale", d.ckks_min_scale, "c in (0, 4]: the Min's input "
                 "y = cos / 4 times c, so Wilkes' iteration sees (c y)^2 in [0, 1]; 4 cuts "
                 "the class weights' error 4x at no depth (1 = Alg. 1 as printed).")
  f.DEFINE_integer("checkpoint_every", d.checkpoint_every,
                   "Checkpoint the simulation every k rounds (at the first chunk boundary "
                   "at or past each multiple of k, and at the end) under "
                   "<output_dir>/checkpoints; 0 = off.")
  f.DEFINE_integer("keep_checkpoints", d.keep_checkpoints, "Checkpoints kept (max_to_keep).")
  f.DEFINE_boolean("resume", d.resume, "Continue from the latest checkpoint in the output "
                   "directory (fresh start when there is none).")
  f.DEFINE_boolean("overwrite", d.overwrite, "Delete the previous run's outputs in the "
                   "output directory (metrics.jsonl, summary.json, checkpoints, tb, "
                   "comparison and curves) and start over; without it (or --resume) a run "
                   "refuses a directory that holds one.")
  f.DEFINE_boolean("tensorboard", d.tensorboard, "Write TensorBoard scalars under "
                   "<output_dir>/tb.")
  f.DEFINE_integer("log_every", d.log_every, "A console line every k rounds, and one at "
                   "least every ~10 s (0: about ten lines per run; metrics.jsonl has every "
                   "round).")
  f.DEFINE_boolean("quiet", d.quiet, "No per-round lines: each run's result and the "
                   "comparison table only.")


def config_from_flags(FLAGS) -> RunConfig:
  delay = None
  try:
    delay = timeline_lib.DelayConfig(FLAGS.delay_fraction, FLAGS.delay_distribution,
                                     FLAGS.max_delay, FLAGS.delay_mean, FLAGS.buffer_size)
  except ValueError as e:
    raise ValueError(str(e)) from None
  cfg = RunConfig(
      algorithm=FLAGS.algorithm, dataset=FLAGS.dataset, model=FLAGS.model,
      num_clients=FLAGS.num_clients, partition=FLAGS.partition,
      dirichlet_alpha=FLAGS.dirichlet_alpha, shards_per_client=FLAGS.shards_per_client,
      data_dir=FLAGS.data_dir, data_source=FLAGS.data_source,
      participation=FLAGS.participation, delay=delay, rounds=FLAGS.rounds,
      local_epochs=FLAGS.local_epochs, random_local_epochs=FLAGS.random_local_epochs,
      local_steps=FLAGS.local_steps,
      batch_size=FLAGS.batch_size, lr=FLAGS.lr, momentum=FLAGS.momentum, rho=FLAGS.rho,
      admm_upload=FLAGS.admm_upload, mu=FLAGS.mu, alpha0=FLAGS.alpha0,
      alpha1=FLAGS.alpha1, alpha2=FLAGS.alpha2,
      server_lr=FLAGS.server_lr, server_lr2=FLAGS.server_lr2,
      server_lr_switch_round=FLAGS.server_lr_switch_round, seed=FLAGS.seed,
      eval_every=FLAGS.eval_every, rounds_per_call=FLAGS.rounds_per_call,
      client_chunk=FLAGS.client_chunk, devices=FLAGS.devices,
      output_dir=FLAGS.output_dir, secure_aggregation=FLAGS.secure_aggregation,
      ckks_preset=FLAGS.ckks_preset, ckks_min_depth=FLAGS.ckks_min_depth,
      ckks_min_scale=FLAGS.ckks_min_scale, allow_insecure_ckks=FLAGS.allow_insecure_ckks,
      checkpoint_every=FLAGS.checkpoint_every, keep_checkpoints=FLAGS.keep_checkpoints,
      resume=FLAGS.resume, overwrite=FLAGS.overwrite, tensorboard=FLAGS.tensorboard,
      log_every=FLAGS.log_every, quiet=FLAGS.quiet)
  validate(cfg)
  return cfg


# ---------------------------------------------------------------------------- runs


def load_data(cfg: RunConfig):
  from fedjax_async import data as data_lib  # pylint: disable=g-import-not-at-top
  return data_lib.load(cfg.dataset, partition=cfg.partition, num_clients=cfg.num_clients,
                       alpha=cfg.dirichlet_alpha, shards_per_client=cfg.shards_per_client,
                       seed=cfg.seed, data_dir=cfg.data_dir, data_source=cfg.data_source)


def build_model(cfg: RunConfig, fed_data):
  """(name, flat initial weights, apply); a ValueError names --model."""
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  input_shape = tuple(fed_data.x.shape[2:])
  try:
    name = models.default_model_for(cfg.dataset) if cfg.model == "auto" else cfg.model
    model = models.get_model(name, fed_data.num_classes, input_shape)
  except ValueError as e:
    raise ValueError(f"--model: {e} (--dataset={cfg.dataset})") from None
  w0, apply_flat = models.flat_model(model, input_shape, jax.random.PRNGKey(cfg.seed))
  return name, w0, apply_flat


class Overall:
  """The rounds still to run over the algorithms of one invocation, for an ETA over all of
  them: the current run's ETA plus the later runs' rounds at the rate of every round run
  so far (their compilations included, as the later algorithms compile too)."""

  def __init__(self, count: int, rounds: int):
    self.count, self.left, self.done = count, count * rounds, 0
    self.t0 = time.perf_counter()

  def skip(self, rounds: int):
    """Rounds a resumed run does not run again."""
    self.left -= rounds

  def advance(self, rounds: int):
    self.done += rounds
    self.left -= rounds

  def eta(self, current_eta: float, current_left: int) -> float:
    rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
    return current_eta + max(self.left - current_left, 0) / max(rate, 1e-9)


def log_interval(log_every: int, rounds: int) -> int:
  """Rounds between console lines: ``log_every``, or for 0 about ten lines per run."""
  return log_every if log_every > 0 else max(1, -(-rounds // 10))


class Progress:
  """A console line every ``every`` rounds, at the last round, and for the last round of
  a chunk that comes back ``max_silence`` seconds or more after the previous line:
  accuracy, arrivals, staleness, rounds/s and the ETA (measured when the chunk came
  back). With ``position`` = (i, n), i.e. algorithm i of n in one invocation, the lines
  say so and, with ``overall``, the ETA of all n runs follows this run's."""

  def __init__(self, name: str, total: int, start: int = 0, stream=sys.stdout,
               position: Optional[tuple] = None, overall: Optional[Overall] = None,
               every: int = 1, max_silence: float = 10.0):
    self.name, self.total, self.stream = name, total, stream
    self.t0, self.start = time.perf_counter(), start
    self.position, self.overall = position, overall
    self.last = start
    self.every, self.max_silence = max(1, int(every)), max_silence
    self.last_line = self.t0

  def tick(self, rounds_done):
    """From inside a compiled chunk (``EngineConfig.progress``): a line when none came for
    ``max_silence`` seconds, so a long chunk of rounds shows that it runs."""
    now = time.perf_counter()
    if now - self.last_line < self.max_silence:
      return
    done = int(rounds_done)
    rate = (done - self.start) / max(now - self.t0, 1e-9)
    print(f"[{self.name}] round {done:4d}/{self.total} done (inside a compiled chunk of "
          f"rounds) | {rate:.2f} rounds/s ETA {(self.total - done) / max(rate, 1e-9):.0f}s",
          file=self.stream, flush=True)
    self.last_line = now

  def __call__(self, rows: List[dict]):
    done = rows[-1]["round"] + 1
    now = time.perf_counter()
    rate = (done - self.start) / max(now - self.t0, 1e-9)
    eta = (self.total - done) / max(rate, 1e-9)
    where = ""
    if self.position is not None and self.position[1] > 1:
      where = f" algorithm {self.position[0]}/{self.position[1]}"
    tail = ""
    if self.overall is not None:
      self.overall.advance(done - self.last)
      if self.overall.count > 1:
        tail = (f", all {self.overall.count} algorithms "
                f"{self.overall.eta(eta, self.total - done):.0f}s")
    self.last = done
    due = [r for i, r in enumerate(rows)
           if (r["round"] + 1) % self.every == 0 or r["round"] + 1 == self.total or (
               i == len(rows) - 1 and now - self.last_line >= self.max_silence)]
    for i, r in enumerate(due):
      acc = "  -   " if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
      # The rate and ETA on the chunk's last line: its earlier rounds were not timed.
      timing = (f" | {rate:.2f} rounds/s ETA {eta:.0f}s{tail}" if i == len(due) - 1
                else "")
      print(f"[{self.name}]{where} round {r['round'] + 1:4d}/{self.total} acc {acc} "
            f"train_loss {r['train_loss']:.4f} online {r['online']} delayed {r['delayed']} "
            f"dropped {r['dropped']} staleness {r['mean_staleness']:.2f}{timing}",
            file=self.stream)
      self.last_line = now
    self.stream.flush()


# Config fields that may differ between a run and its resumption. (With another --devices
# the continuation equals the uninterrupted run to float rounding, not bit for bit: the
# upload sums are split differently.)
RESUME_FREE_FIELDS = ("output_dir", "resume", "overwrite", "checkpoint_every",
                      "keep_checkpoints", "tensorboard", "devices", "allow_insecure_ckks",
                      "log_every", "quiet")


def run_config_for(cfg: RunConfig, name: str) -> dict:
  """The configuration of one algorithm's run, as stored in summaries and checkpoints."""
  d = config_dict(cfg)
  d["algorithm"] = name
  return d


# What a config stored before a field existed ran with, where that is not the field's
# default: runs without ``admm_upload`` read Eq. 16 with the last local model.
STORED_BEFORE = {"admm_upload": "last_local", "num_arrivals": 0}


def config_mismatch(saved: dict, current: dict) -> List[str]:
  """Fields (flag names) whose values differ, ignoring the resume-free ones. A field that
  ``saved`` lacks (stored before the field existed) counts as what such runs ran with:
  ``STORED_BEFORE``, else its ``RunConfig`` default."""
  keys = (set(saved) | set(current)) - set(RESUME_FREE_FIELDS)
  defaults = dict(config_dict(RunConfig()), **STORED_BEFORE)
  return sorted(k for k in keys if saved.get(k, defaults.get(k)) != current.get(k))


def json_row(row: dict) -> str:
  return json.dumps(checkpoint_lib.to_json_ready(row))


class TensorBoard:
  """Per-round scalars under ``<out_dir>/tb`` (tensorboardX's event files); a no-op when
  disabled.

  Written synchronously (tensorboardX's ``EventsWriter``, not ``SummaryWriter``, whose
  ``flush`` leaves the events still queued for its writer thread behind: a killed run lost
  its last rounds). ``purge_step``: the file starts with a session restart at that step,
  which makes TensorBoard discard the steps >= it of the earlier files (a resumed run
  writes them again).
  """

  _files = itertools.count(1)  # event file names have 1 s resolution: a suffix each

  def __init__(self, out_dir: str, enabled: bool, purge_step: Optional[int] = None):
    self.directory = os.path.join(out_dir, "tb") if enabled else None
    self.purge_step, self.writer = purge_step, None

  def _open(self):
    from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    os.makedirs(self.directory, exist_ok=True)
    self.writer = event_file_writer.EventsWriter(
        os.path.join(self.directory, "events"), f".{os.getpid()}.{next(self._files)}")
    if self.purge_step is not None:
      self.writer.write_event(event_pb2.Event(
          wall_time=time.time(), step=self.purge_step,
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write(self, rows: List[dict]):
    """Appends the rows' numeric fields (step = the 0-based round) and syncs the file."""
    if self.directory is None or not rows:
      return
    from tensorboardX import summary  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    if self.writer is None:
      self._open()
    now = time.time()
    for r in rows:
      for k, v in r.items():
        if k != "round" and isinstance(v, (int, float)) and v is not None:
          self.writer.write_event(event_pb2.Event(
              wall_time=now, step=int(r["round"]), summary=summary.scalar(k, float(v))))
    self.sync()

  def sync(self):
    """Puts every scalar written so far on disk (flush and fsync)."""
    if self.writer is not None:
      self.writer.flush()

  def close(self):
    if self.writer is not None:
      self.writer.close()
      self.writer = None


# What a run writes in its directory (``--overwrite`` deletes these and nothing else);
# a multi-algorithm run also writes COMPARISON_OUTPUTS in --output_dir.
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", "tb", "curves.png")
COMPARISON_OUTPUTS = ("comparison.md", "comparison.csv", "curves.png")


def previous_outputs(directory: str, outputs=RUN_OUTPUTS) -> List[str]:
  return [n for n in outputs if os.path.lexists(os.path.join(directory, n))]


def check_writable(directory: str, flag: str = "--output_dir"):
  """Creates ``directory`` and writes (then removes) a file in it; a ValueError of one line
  naming ``flag``, the path and the cause (not a directory, permission, read-only or full
  disk) when it cannot."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
      pass
  except OSError as e:
    where = e.filename or directory
    raise ValueError(f"{flag}={directory}: cannot write there ({e.strerror or e}: {where}); "
                     f"give a writable {flag}") from None


def prepare_output_dir(directory: str, resume: bool, overwrite: bool,
                       outputs=RUN_OUTPUTS):
  """Refuses (ValueError naming --output_dir) a directory that cannot be written, or one
  that holds a previous run unless ``resume``; with ``overwrite`` deletes that run's
  outputs first."""
  found = previous_outputs(directory, outputs)
  if found and not (resume or overwrite):
    raise ValueError(f"--output_dir: {directory} already holds a run ({', '.join(found)}): "
                     "pass --resume to continue it, --overwrite to start over, or another "
                     "--output_dir")
  check_writable(directory)  # after the refusal above: a refused folder is not touched
  if not found or resume:
    return
  for n in found:
    path = os.path.join(directory, n)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


class CompileTimer:
  """``runner`` (a jitted chunk) compiled ahead of its first call for each new argument
  shape, saying so: the first chunk of a run is mostly compilation and would otherwise be
  silent for seconds to minutes. The compiled program is the one ``jit`` would run."""

  def __init__(self, runner, name: str, stream=sys.stdout):
    self.runner, self.name, self.stream = runner, name, stream
    self.compiled = {}

  def __call__(self, *args):
    key = jax.tree_util.tree_structure(args), tuple(
        (np.shape(x), str(getattr(x, "dtype", type(x))), getattr(x, "sharding", None))
        for x in jax.tree_util.tree_leaves(args))
    fn = self.compiled.get(key)
    if fn is None:
      rounds = np.shape(args[2])[0]  # the chunk's eval schedule: one entry per round
      print(f"[{self.name}] compiling the round program ({rounds} rounds per call) ...",
            file=self.stream, flush=True)
      t0 = time.perf_counter()
      fn = self.compiled[key] = self.runner.lower(*args).compile()
      print(f"[{self.name}] compiled in {time.perf_counter() - t0:.1f} s", file=self.stream,
            flush=True)
    return fn(*args)


@dataclasses.dataclass
class Run:
  """One algorithm's run: ``summary`` (summary.json), ``rows`` (metrics.jsonl, one dict per
  round), the final ``engine.SimState`` (``state.w`` the global model) and ``model``
  (name, initial flat weights, ``apply_flat(w, x) -> logits``)."""
  summary: dict
  rows: List[dict]
  state: Any
  model: tuple


def run_one(cfg: RunConfig, name: str, fed_data=None, model=None, out_dir=None,
            quiet: bool = False, position: Optional[tuple] = None,
            overall: Optional[Overall] = None) -> dict:
  """``run(...).summary``."""
  return run(cfg, name, fed_data, model, out_dir, quiet, position, overall).summary


def run(cfg: RunConfig, name: str, fed_data=None, model=None, out_dir=None,
        quiet: bool = False, position: Optional[tuple] = None,
        overall: Optional[Overall] = None) -> Run:
  """Runs algorithm ``name`` under ``cfg``; writes metrics.jsonl, summary.json, TensorBoard
  scalars and (``cfg.checkpoint_every``) checkpoints under ``<out_dir>/checkpoints``
  (``out_dir`` defaults to ``<cfg.output_dir>/<name>``; with neither, nothing is written
  and the ``Run`` holds it all).

  A directory that holds a previous run is refused (ValueError naming --output_dir) unless
  ``cfg.resume`` or ``cfg.overwrite`` (which deletes that run's outputs first). With
  ``cfg.resume`` it continues from the latest checkpoint: the restored state and
  metrics rows make the rest of the run, ``metrics.jsonl`` (rewritten from the restored
  rows, then appended) and the final state identical to an uninterrupted run's. Raises
  ``engine.Diverged`` naming the round, the algorithm and the last good checkpoint, and
  ``Interrupted`` (SIGINT, or SIGTERM once ``main_from_flags`` handles it) naming the
  round and the checkpoint to resume from. ``position`` (i, n) and ``overall``: see
  ``Progress``.
  """
  if out_dir is None and cfg.output_dir is not None:
    out_dir = os.path.join(cfg.output_dir, name)
  quiet = quiet or cfg.quiet
  if out_dir is not None:
    prepare_output_dir(out_dir, cfg.resume, cfg.overwrite)
  fed_data = load_data(cfg) if fed_data is None else fed_data
  model = build_model(cfg, fed_data) if model is None else model
  model_name, w0, apply_flat = model
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
  algorithm = algorithms.get(name, cfg.admm_upload)
  tl = timeline_lib.build(fed_data.num_clients, cfg.rounds, cfg.participation, cfg.delay,
                          cfg.seed)
  ecfg = engine.EngineConfig(
      client_lib.LocalConfig(cfg.batch_size, cfg.local_epochs, fed_data.max_examples,
                             cfg.random_local_epochs, momentum=cfg.momentum > 0,
                             local_steps=cfg.local_steps),
      cfg.delay.ring_size,
      client_chunk=(engine.auto_client_chunk(int(np.size(w0))) if cfg.client_chunk < 0
                    else cfg.client_chunk or None))
  data = engine.DeviceData.from_federated(fed_data)
  def initial_state():
    return engine.init_state(algorithm, w0, fed_data.num_clients, ecfg.ring_size, cfg.seed)

  state = initial_state()
  run_cfg = run_config_for(cfg, name)
  ckpt = None
  if out_dir is not None and (cfg.checkpoint_every > 0 or cfg.resume):
    ckpt = checkpoint_lib.Checkpointer(os.path.join(out_dir, "checkpoints"),
                                       cfg.keep_checkpoints)
  rows_so_far: List[dict] = []
  wall_before = 0.0
  last_ckpt: List[Optional[int]] = [None]  # the round of the newest complete checkpoint
  if cfg.resume and ckpt.latest_round() is not None:
    try:  # the flags first: another algorithm's state does not fit the template
      saved_config = ckpt.restore_meta()["config"]
      bad = config_mismatch(saved_config, run_cfg)
      # A larger --rounds extends the run: its timeline's first rounds are the same draws.
      extends = bad == ["rounds"] and int(saved_config["rounds"]) < cfg.rounds
      bad = [] if extends else bad
      restored = None if bad else ckpt.restore(state)
    except checkpoint_lib.CheckpointError as e:
      ckpt.close()
      earlier = [r for r in ckpt.all_rounds() if r < ckpt.latest_round()]
      raise ValueError(f"--resume: {e}; delete that folder to resume from "
                       + (f"the checkpoint of round {max(earlier)}" if earlier else
                          "round 0") + ", or pass --overwrite to start over") from None
    if bad:
      ckpt.close()
      raise ValueError("--resume: the checkpoint under " + ckpt.directory + " was made "
                       "with different flags: " + ", ".join(
                           f"--{k}={saved_config.get(k)!r} (now {run_cfg.get(k)!r})"
                           for k in bad))
    state = jax.tree.map(jnp.asarray, restored.state)
    rows_so_far = restored.rows
    wall_before = float(restored.extra.get("wall_time_s", 0.0))
    last_ckpt[0] = restored.round
    if not quiet:
      more = (f", extending its {saved_config['rounds']} rounds to {cfg.rounds}"
              if extends else "")
      print(f"[{name}] resuming from the checkpoint of round {restored.round} "
            f"({ckpt.directory}){more}", flush=True)
  elif cfg.resume and not quiet:
    print(f"[{name}] --resume: no checkpoint under {ckpt.directory}, starting fresh",
          flush=True)
  start_round = int(state.round)
  if overall is not None:
    overall.skip(start_round)
  # The engine's view: clients split over the devices (K padded to a multiple of their
  # number); ``tl`` stays the unpadded timeline for the summary.
  devices = sharding.select_devices(cfg.devices)
  run_ecfg, run_tl, state, data = sharding.shard_clients(ecfg, tl, state, data, devices)
  progress = Progress(name, cfg.rounds, start_round, position=position, overall=overall,
                      every=log_interval(cfg.log_every, cfg.rounds))
  if not quiet:  # a line from inside a long compiled chunk of rounds
    run_ecfg = dataclasses.replace(run_ecfg, progress=progress.tick)
  # A resumed run rewrites TensorBoard like metrics.jsonl: every step of the earlier
  # event files is purged (session restart at step 0), the restored rows written again.
  tb = TensorBoard(out_dir, cfg.tensorboard and out_dir is not None,
                   purge_step=0 if cfg.resume else None)
  last_saved = [start_round]
  t0 = time.perf_counter()
  metrics_file = (open(os.path.join(out_dir, "metrics.jsonl"), "w") if out_dir is not None
                  else contextlib.nullcontext(io.StringIO()))
  with metrics_file as mf:
    for r in rows_so_far:  # rewritten from the checkpoint: drops rows after it
      mf.write(json_row(r) + "\n")
    mf.flush()
    tb.write(rows_so_far)

    def save(state):
      tb.sync()  # the checkpoint's rounds are on disk in TensorBoard before it exists
      with interrupts.deferred():  # a signal during the save: after it, and named
        ckpt.save(int(state.round), state, rows_so_far, run_cfg,
                  {"wall_time_s": wall_before + time.perf_counter() - t0})
        last_saved[0] = last_ckpt[0] = int(state.round)

    def write_rows(rows):
      rows_so_far.extend(rows)
      for r in rows:
        mf.write(json_row(r) + "\n")
      mf.flush()
      tb.write(rows)

    def on_chunk(state, rows):
      write_rows(rows)
      if ckpt is not None and (checkpoint_lib.should_save(
          last_saved[0], int(state.round), cfg.checkpoint_every, cfg.rounds) or (
              interrupts.pending() and last_saved[0] < int(state.round))):
        save(state)  # on a signal: the state this chunk ends with
      if not quiet:
        progress(rows)
      check_interrupted()

    # With a checkpoint to write, the first SIGINT / SIGTERM stops the run at the end of
    # the chunk of rounds it arrives in, saving that state; a second one stops at once.
    stop_softly = (interrupts.graceful(
        f"[{name}] stopping at the end of this chunk of rounds to save it (a second "
        "Ctrl-C / SIGTERM stops at once)") if ckpt is not None else contextlib.nullcontext())
    try:
      with stop_softly:
        if cfg.secure_aggregation == "ckks":
          from fedjax_async.crypto import secure_engine  # pylint: disable=g-import-not-at-top
          state, _, _ = secure_engine.simulate(
              apply_flat, algorithm, run_ecfg, state, run_tl, cfg.hparams(), data,
              preset=cfg.ckks_preset, min_depth=cfg.ckks_min_depth,
              min_scale=cfg.ckks_min_scale, on_chunk=on_chunk,
              eval_every=cfg.eval_every,
              stream=io.StringIO() if quiet else sys.stdout)
        else:
          runner = engine.make_runner(apply_flat, algorithm, run_ecfg)
          if not quiet and start_round < cfg.rounds:
            runner = CompileTimer(runner, name)
          state, _ = engine.simulate(runner, state, run_tl, cfg.hparams(), data,
                                     eval_every=cfg.eval_every,
                                     rounds_per_call=cfg.rounds_per_call, on_chunk=on_chunk)
    except engine.Diverged as e:
      write_rows(e.rows)  # the finite rounds of the chunk that diverged
      if (ckpt is not None and cfg.secure_aggregation == "none" and e.round is not None
          and e.round - 1 > last_saved[0]):
        # The last finite state (after round e.round - 1): the newest checkpoint's state,
        # or the initial one, run on to it (its chunk's state was donated to XLA).
        start = initial_state()
        if last_ckpt[0] is not None:
          start = jax.tree.map(jnp.asarray, ckpt.restore(start, last_ckpt[0]).state)
        start = sharding.shard_clients(ecfg, tl, start, data, devices)[2]
        finite, _ = engine.simulate(runner, start, run_tl, cfg.hparams(), data,
                                    eval_every=cfg.eval_every, stop_round=e.round - 1,
                                    rounds_per_call=cfg.rounds_per_call)
        save(finite)
      last = last_ckpt[0]
      where = (f"; metrics.jsonl holds rounds 1-{len(rows_so_far)}" if rows_so_far else "")
      where += (f"; last finite checkpoint: round {last} under {ckpt.directory}"
                if last is not None else "; no checkpoint was written")
      raise engine.Diverged(f"algorithm {name}: {e}{where}; a smaller --lr or "
                            "--server_lr (PAFed: --alpha0/1/2) usually avoids it",
                            e.round) from None
    except KeyboardInterrupt as e:
      signum = getattr(e, "signum", signal.SIGINT)
      at = f"[{name}] interrupted at round {len(rows_so_far) + 1}/{cfg.rounds}"
      if last_ckpt[0] is not None:
        how = (f"the last checkpoint is round {last_ckpt[0]} in {ckpt.directory}: rerun "
               "the same command with --resume to continue")
      elif cfg.checkpoint_every > 0:
        how = (f"no checkpoint yet (one every {cfg.checkpoint_every} rounds): rerun the "
               "same command with --resume to start it again")
      else:
        how = ("no checkpoint (--checkpoint_every=0): rerun the same command with "
               "--resume to start it again")
      raise Interrupted(f"{at}; {how}", signum) from None
    finally:
      tb.close()
      if ckpt is not None:
        ckpt.close()
  wall = wall_before + time.perf_counter() - t0
  rows = rows_so_far
  summary = summarize(rows, tl, name=name, dataset=fed_data.name, model=model_name,
                      num_params=int(np.size(w0)), rounds=cfg.rounds, wall=wall,
                      config=config_dict(cfg))
  if cfg.secure_aggregation == "ckks":
    summary["ckks_security"] = ckks_security(cfg.ckks_preset)
  if out_dir is not None:
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return Run(summary, rows, state, model)


def summarize(rows: List[dict], tl: timeline_lib.Timeline, *, name: str, dataset: str,
              model: str, num_params: int, rounds: int, wall: float, config: dict) -> dict:
  """summary.json of one run from its metrics rows and timeline."""
  accs = [r["test_accuracy"] for r in rows]
  final = next((a for a in reversed(accs) if a is not None), float("nan"))
  delayed_mask = tl.valid & ~tl.online
  return {
      "algorithm": name, "dataset": dataset, "model": model,
      "num_params": num_params, "rounds": rounds,
      "average_best_accuracy": engine.average_best_accuracy(accs),
      "final_accuracy": final, "wall_time_s": wall,
      "updates_dropped": int(tl.dropped.sum()), "updates_in_flight_at_end": tl.in_flight_at_end,
      "delayed_updates": int(sum(r["delayed"] for r in rows)),
      "mean_staleness_of_delayed": float(np.mean(tl.staleness()[delayed_mask]))
      if np.any(delayed_mask) else 0.0,
      "config": config,
  }


INSECURE_CKKS = "INSECURE (--ckks_preset=insecure_test: ring 2^11, no security level)"


def ckks_security(preset: str) -> str:
  """summary.json's ``ckks_security`` of a --secure_aggregation=ckks run."""
  return INSECURE_CKKS if preset == "insecure_test" else "128-bit (HEStd_128_classic)"


def algorithm_label(summary: dict) -> str:
  """The algorithm's name in tables, marked when its CKKS preset is not secure."""
  insecure = summary.get("ckks_security", "").startswith("INSECURE")
  return summary["algorithm"] + (" [INSECURE CKKS]" if insecure else "")


def config_dict(cfg: RunConfig) -> dict:
  d = dataclasses.asdict(cfg)
  return d


def comparison_table(summaries: List[dict]) -> str:
  lines = ["| algorithm | average best accuracy | final accuracy | wall time (s) |",
           "|---|---|---|---|"]
  for s in summaries:
    lines.append(f"| {algorithm_label(s)} | {s['average_best_accuracy']:.4f} | "
                 f"{s['final_accuracy']:.4f} | {s['wall_time_s']:.1f} |")
  return "\n".join(lines)


def write_comparison(summaries: List[dict], out_dir: str) -> str:
  table = comparison_table(summaries)
  with open(os.path.join(out_dir, "comparison.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(out_dir, "comparison.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["algorithm", "average_best_accuracy", "final_accuracy", "wall_time_s"])
    for s in summaries:
      w.writerow([algorithm_label(s), s["average_best_accuracy"], s["final_accuracy"],
                  s["wall_time_s"]])
  return table


def read_metrics(run_dir: str) -> List[dict]:
  """The rows of ``run_dir/metrics.jsonl``."""
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(runs: Dict[str, List[dict]], path: str, x_key: str = "round",
                loss_window: int = 1, title: str = "") -> int:
  """``path`` (PNG): test accuracy (where evaluated) and train loss against ``x_key``
  (the 1-based round, or the virtual clock's ``virtual_time``), one line per run of
  ``runs`` (name -> its metrics.jsonl rows); the loss as a running mean over
  ``loss_window`` rows (one arrival's loss is noisy). Returns the number of lines drawn."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10.0, 3.8))
  FigureCanvasAgg(fig)
  lines = 0
  for i, (key, label) in enumerate((("test_accuracy", "test accuracy"),
                                    ("train_loss", "train loss"))):
    ax = fig.add_subplot(1, 2, i + 1)
    for name, rows in runs.items():
      xy = [(r[x_key] + (x_key == "round"), r[key]) for r in rows
            if r.get(key) is not None and np.isfinite(r[key])]
      if key == "train_loss" and loss_window > 1:  # a running mean; none if too few rows
        ys = [y for _, y in xy]
        xy = [] if len(ys) < loss_window else list(zip(
            [x for x, _ in xy][loss_window - 1:],
            np.convolve(ys, np.ones(loss_window) / loss_window, "valid")))
      if xy:
        ax.plot(*zip(*xy), marker="." if len(xy) < 40 else None, label=name)
        lines += 1
    if key == "train_loss" and ax.lines and all(
        min(line.get_ydata()) > 0 for line in ax.lines):
      ax.set_yscale("log")  # FedADMM's loss can grow by orders of magnitude
    ax.set_xlabel(x_key.replace("_", " "))
    ax.set_ylabel(label if key != "train_loss" or loss_window == 1
                  else f"{label} (mean of {loss_window})")
    ax.grid(True, alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return lines


def quiet_library_logs(FLAGS):
  """orbax logs every checkpoint step at INFO through absl; keep the progress lines
  readable unless the user asked for a --verbosity."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  if "verbosity" not in FLAGS or not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def main_from_flags(FLAGS):
  quiet_library_logs(FLAGS)
  try:
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    cfg = config_from_flags(FLAGS)
    devices = sharding.select_devices(cfg.devices)
  except ValueError as e:
    sys.exit(f"error: {e}")
  # SIGTERM and Ctrl-C stop the run with one line naming the checkpoint to resume from
  # (no traceback) and exit status 143 / 130.
  try:
    with handle_interrupts():
      _main(cfg, devices)
  except KeyboardInterrupt as e:  # Interrupted from run_one says where; else no round ran
    e = e if isinstance(e, Interrupted) else Interrupted("", signal.SIGINT)
    print(str(e) or f"interrupted ({signal.Signals(e.signum).name}) while no round was "
          "running", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)


def _main(cfg: RunConfig, devices):
  del devices  # selected again by simulate
  from fedjax_async import api  # pylint: disable=g-import-not-at-top
  try:
    result = api.simulate(cfg)
  except engine.Diverged as e:
    sys.exit(f"error: diverged: {e}")
  except (ValueError, OSError, RuntimeError) as e:
    if isinstance(e, jax.errors.JaxRuntimeError):  # XLA's own: the traceback says where
      raise
    sys.exit(f"error: {e}")
  print(f"figure: {result.figure}")
  if len(result.runs) > 1:  # last, where the eye lands when the run ends
    print(result.table())


def figure_title(cfg: RunConfig, dataset: str, model: str, names: List[str]) -> str:
  """The data set, partition, model, delays and algorithms of a run's figure."""
  d = cfg.delay
  law = f"mean {d.mean:g}" if d.distribution == "geometric" else f"max {d.max_delay}"
  delays = f"δ = {d.fraction:g}, {d.distribution} delays ({law})" if d.fraction else "δ = 0"
  return (f"{dataset} ({cfg.partition}, N = {cfg.num_clients}), {model}; {delays}; "
          f"{', '.join(names)}")
