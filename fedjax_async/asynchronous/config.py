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
from typing import Optional

from fedjax_async import algorithms
from fedjax_async.config import DataConfig, ModelConfig
from fedjax_async.flatkeys import FlatKeys, option


@dataclasses.dataclass(frozen=True)
class AsyncAlgorithmConfig:
  """Which algorithms run, and the servers' hyperparameters (docs/async.md)."""
  names: str = option("fedasync", "Comma list of "
                      + ", ".join(algorithms.names("virtual_clock")) + ", or a round rule "
                      "whose clients keep no state (fedavg, fedprox, fednova: each arrival a "
                      "round of one).", flag="algorithm")
  hp: str = option("", "The algorithms' own hyper-parameters (Algorithm.hparams), "
                   "name=value,... (simulate(hp={...}) takes a dict).")
  mu: float = option(0.0, "FedAsync / FedBuff proximal coefficient mu.")
  mix_alpha: str = option("0.6", "FedAsync's a (comma list to sweep).")
  staleness_fn: str = option("hinge", "constant | polynomial | hinge (FedAsync).")
  poly_a: float = option(0.5, "Polynomial staleness exponent.")
  hinge_a: float = option(10.0, "Hinge staleness slope a.")
  hinge_b: float = option(4.0, "Hinge staleness threshold b.")
  server_lr: float = option(1.0, "FedBuff eta_s / double compensation eta.")
  server_momentum: float = option(0.0, "FedBuff server momentum.")
  fedbuff_staleness: bool = option(True, "FedBuff 1/sqrt(1+staleness) weights.")
  dc_rho: float = option(1.0, "Double compensation's FedProx weight rho (Guo et al.; the "
                         "round engine's --rho is FedADMM's penalty).")
  dc_lambda: float = option(1.0, "Double compensation lambda.")
  dc_lambda_t: float = option(1.0, "Double compensation lambda_t in [0, 1].")
  loss_threshold: float = option(0.0, "Double compensation loss threshold v.")
  beta: float = option(0.6, "PrivaAsyncFed beta (Eq. 15).")


@dataclasses.dataclass(frozen=True)
class ClockOptions:
  """The virtual clock: clients in flight, server versions, task durations, devices."""
  concurrency: int = option(5, "C, clients in flight.")
  num_updates: int = option(200, "Server updates (model versions). FedBuff takes "
                            "--buffer_k arrivals per update: see --num_arrivals.")
  num_arrivals: int = option(0, "If > 0: every run stops after this many client arrivals "
                             "(FedBuff: num_arrivals / buffer_k server updates), so that a "
                             "comparison gives each algorithm the same client work; "
                             "replaces --num_updates.")
  buffer_k: int = option(5, "FedBuff's K (arrivals per server step).")
  compute_time: str = option("lognormal:0.001,0.5", "Seconds per example: constant:a | "
                             "uniform:a,b | exponential:mean | lognormal:median,sigma.")
  comm_time: str = option("constant:0.5", "Seconds of communication per task (same forms).")
  device_classes: str = option("", "'' (privaasyncfed when --algorithm runs it, else none) "
                               "| none | privaasyncfed | p:slowdown[:scale_index],...")
  scales: str = option("1,0.75,0.5,0.25", "PrivaAsyncFed's scale table S (Eq. 10).")
  prune_speedup: bool = option(
      False, "PrivaAsyncFed: a sub-model of scale S[p] takes S[p]^2 of the compute and "
      "communication time (Eq. 11). Off by default: with the paper's slow-downs 1/2/4/8 it "
      "would make the slowest class the fastest (8 x 0.25^2 = 0.5), against the paper's "
      "premise that low-compute clients send the stalest updates (Fig. 2).")
  ring_size: int = option(0, "R past models kept (0: enough that nothing is dropped).")
  group_size: int = option(0, "G, arrivals trained in one vmap (0: --concurrency on "
                           "GPU/TPU, 1 on CPU); rounded up to a multiple of the --devices.")


@dataclasses.dataclass(frozen=True)
class ClockLocalTraining:
  """A task's local training (``client.LocalConfig`` is its static part)."""
  local_epochs: int = option(1, "E, local epochs (the step budget).")
  local_steps: int = option(0, "> 0: at most this many minibatch steps per task, within the "
                            "E epochs (PrivaAsyncFed Alg. 1's H, Table II's 'Local Steps': 1 "
                            "for MNIST, 5 for CIFAR-10); 0: the E epochs' steps.")
  batch_size: int = option(50, "B, local minibatch size.")
  lr: float = option(0.05, "Local learning rate.")
  momentum: float = option(0.0, "Local SGD momentum (must be 0 for DP runs).")


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
  """Client-side DP of PrivaAsyncFed and DP-FedAsync (``privacy.py``)."""
  dp_epsilon: float = option(math.inf, "Epsilon (inf: no noise).")
  dp_delta: float = option(1e-5, "Delta of the reported (epsilon, delta).")
  dp_clip: float = option(2.0, "Clipping bound C.")
  dp_clip_mode: str = option("example", "example (Eq. 17) | batch (Alg. 1 line 20).")
  dp_noise: str = option("calibrated", "calibrated (sigma such that every client spends at "
                         "most --dp_epsilon over all its steps) | alg1 (the paper's sigma = "
                         "lr 2C/(|D_k| eps) per step; spends far more, printed at the start).")


@dataclasses.dataclass(frozen=True)
class AsyncRunOptions:
  seed: int = option(0, "Seed of data, clock, initialisation and clients.")
  seeds: str = option("", "Comma list of seeds: every run once per seed, under "
                      "<output_dir>/seed<s>/, and comparison.md with the mean and standard "
                      "deviation over the seeds ('': --seed only).")
  eval_every: int = option(20, "Evaluate every k server updates (and at the end).")
  groups_per_call: int = option(50, "Groups fused into one jitted scan.")
  devices: int = option(0, "D: split each group's members over the first D devices (0: all "
                        "of them; 1: no sharding).")
  cpu_devices: int = option(0, "CPU only: make this many XLA host devices "
                            "(jax_num_cpu_devices) for --devices; 0: JAX's default (one).")


@dataclasses.dataclass(frozen=True)
class AsyncOutputConfig:
  output_dir: Optional[str] = option(None, "Where metrics and summaries go (nothing is "
                                     "written without it).", cli_default="runs/async")
  checkpoint_every: int = option(1, "Checkpoint a run every k calls of --groups_per_call "
                                 "groups (under <run>/checkpoints; 0: off).")
  resume: bool = option(False, "Continue each run from its latest checkpoint (a run whose "
                        "summary.json was made with the same flags is read back, not run).")
  overwrite: bool = option(False, "Delete this driver's outputs in --output_dir (the runs' "
                           "metrics, summaries and checkpoints, curves.png, comparison.md) "
                           "and start over; without it (or --resume) a folder holding a run "
                           "is refused.")


@dataclasses.dataclass(frozen=True)
class AsyncRunConfig(FlatKeys):
  """One invocation of the virtual clock (``experiments/async_family.py``'s defaults):
  ``AsyncRunConfig().replace(algorithm="fedbuff", num_updates=50)`` by flat keys, as
  ``RunConfig``."""
  algorithm: AsyncAlgorithmConfig = AsyncAlgorithmConfig()
  clock: ClockOptions = ClockOptions()
  data: DataConfig = DataConfig(num_clients=10, partition="iid")
  model: ModelConfig = ModelConfig()
  local: ClockLocalTraining = ClockLocalTraining()
  privacy: PrivacyConfig = PrivacyConfig()
  run: AsyncRunOptions = AsyncRunOptions()
  output: AsyncOutputConfig = AsyncOutputConfig()
