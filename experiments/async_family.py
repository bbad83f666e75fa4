r"""Runs the fully asynchronous family on the virtual clock and compares the runs.

  python experiments/async_family.py --algorithm=fedasync,fedbuff --dataset=synthetic \
      --num_clients=30 --concurrency=10 --num_updates=300
  python experiments/async_family.py --flagfile=experiments/flags/privaasyncfed_fmnist_eps5.flags

Algorithms: fedasync | fedbuff | double_compensation | privaasyncfed | dp_fedasync
(comma list). ``--mix_alpha`` takes a comma list too; FedAsync-type algorithms then run once
per value (``fedasync_a0.4`` ...), as in Guo et al.'s FedAsync-hinge baselines.
Each run writes ``<output_dir>/<run>/metrics.jsonl`` (one row per kept arrival; test
accuracy where evaluated) and ``summary.json`` (final accuracy, staleness histogram,
updates per virtual second, wall time, and for DP runs the epsilon spent); several runs end
with ``comparison.md``; ``curves.png`` plots test accuracy and train loss (a running mean
of 10 arrivals) against the virtual clock.

Each run is checkpointed every ``--checkpoint_every`` calls of ``--groups_per_call``
groups (``<run>/checkpoints``: the state, the rows so far and the flags). After Ctrl-C,
SIGTERM or a crash, the same command with ``--resume`` reads back the finished runs and
continues the others from their latest checkpoint, to the result of an uninterrupted run
(tested); flags that change the results must be the same (else it says which differ). A
folder that holds a run is refused before any work unless ``--resume`` or ``--overwrite``
(which deletes this driver's outputs there, and nothing else, first).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from fedjax_async import outputs
from fedjax_async import interrupts
from fedjax_async import config as config_lib
from fedjax_async import algorithms
from fedjax_async.asynchronous import engine as async_engine
from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import client as client_lib
from fedjax_async.rounds import engine
from fedjax_async import cli
from fedjax_async import loop
from fedjax_async import privacy
from fedjax_async import sharding
from fedjax_async.asynchronous import config as async_config
from fedjax_async.asynchronous import virtual_clock as vc

ALGORITHMS = algorithms.names("virtual_clock")
STALENESS = {"constant": 0, "polynomial": 1, "hinge": 2}

# The flags: one per field of the virtual clock's configuration (AsyncRunConfig).
cli.define_config_flags(async_config.AsyncRunConfig)
# Flags that change neither a run's model nor its metrics rows: a checkpoint or summary
# made with other values of these is still the same run (--eval_every is not among them:
# it decides which rows carry a test accuracy).
RESUME_FREE_FLAGS = ("output_dir", "resume", "overwrite", "checkpoint_every",
                     "groups_per_call", "seeds")
# What a run writes in its folder, and the command in --output_dir.
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints")
COMMAND_OUTPUTS = ("curves.png", "comparison.md")
FLAGS = flags.FLAGS


check = cli.check_flag  # ValueError "--flag: message"


def parse_floats(text, flag):
  try:
    return [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"--{flag}: expected comma-separated numbers, got {text!r}") from None


def parse_seeds(fl):
  """The seeds of --seeds (or [--seed]); ValueError naming --seeds."""
  if not fl.seeds.strip():
    return [fl.seed]
  try:
    seeds = [int(v) for v in fl.seeds.split(",")]
  except ValueError:
    raise ValueError(f"--seeds: expected comma-separated integers, got {fl.seeds!r}") from None
  check(all(v >= 0 for v in seeds), "seeds", f"must be >= 0, got {fl.seeds!r}")
  check(len(set(seeds)) == len(seeds), "seeds", f"repeats a seed: {fl.seeds!r}")
  return seeds


def validate(fl):
  """Raises ValueError naming the offending flag."""
  names = fl.algorithm.split(",")
  for n in names:
    check(n in ALGORITHMS, "algorithm", f"unknown {n!r}; choices: {', '.join(ALGORITHMS)}")
  parse_seeds(fl)
  check(fl.num_clients >= 1, "num_clients", f"must be >= 1, got {fl.num_clients}")
  check(1 <= fl.concurrency <= fl.num_clients, "concurrency",
        f"must be in [1, --num_clients={fl.num_clients}], got {fl.concurrency}")
  check(fl.num_updates >= 1, "num_updates", f"must be >= 1, got {fl.num_updates}")
  check(fl.num_arrivals >= 0, "num_arrivals", f"must be >= 0 (0: off), got "
        f"{fl.num_arrivals}")
  check(not (fl.num_arrivals and fl["num_updates"].present), "num_arrivals",
        "replaces --num_updates: give one of them")
  if fl.num_arrivals and "fedbuff" in names:
    check(fl.num_arrivals % fl.buffer_k == 0, "num_arrivals",
          f"must be a multiple of --buffer_k={fl.buffer_k} (FedBuff's arrivals per "
          f"server update), got {fl.num_arrivals}")
  check(fl.buffer_k >= 1, "buffer_k", f"must be >= 1, got {fl.buffer_k}")
  check(fl.group_size >= 0, "group_size", f"must be >= 0, got {fl.group_size}")
  check(fl.ring_size >= 0, "ring_size", f"must be >= 0, got {fl.ring_size}")
  config_lib.validate_local(fl, check, prefix="")
  check(fl.mu >= 0, "mu", f"must be >= 0, got {fl.mu}")
  for a in parse_floats(fl.mix_alpha, "mix_alpha"):
    check(0 < a <= 1, "mix_alpha", f"must be in (0, 1], got {a}")
  check(fl.staleness_fn in STALENESS, "staleness_fn",
        f"must be one of {', '.join(STALENESS)}, got {fl.staleness_fn!r}")
  check(fl.hinge_a > 0, "hinge_a", f"must be > 0, got {fl.hinge_a}")
  check(fl.hinge_b >= 0, "hinge_b", f"must be >= 0, got {fl.hinge_b}")
  check(fl.server_lr > 0, "server_lr", f"must be > 0, got {fl.server_lr}")
  check(0 <= fl.server_momentum < 1, "server_momentum",
        f"must be in [0, 1), got {fl.server_momentum}")
  check(fl.rho >= 0, "rho", f"must be >= 0, got {fl.rho}")
  check(0 <= fl.dc_lambda_t <= 1, "dc_lambda_t", f"must be in [0, 1], got {fl.dc_lambda_t}")
  check(0 < fl.beta <= 1, "beta", f"must be in (0, 1], got {fl.beta}")
  scales = parse_floats(fl.scales, "scales")
  check(scales and all(0 < s <= 1 for s in scales), "scales",
        f"need values in (0, 1], got {fl.scales!r}")
  privacy.validate(fl.dp_epsilon, fl.dp_delta, fl.dp_clip)
  check(fl.dp_clip_mode in ("example", "batch"), "dp_clip_mode",
        f"must be example or batch, got {fl.dp_clip_mode!r}")
  check(fl.dp_noise in ("alg1", "calibrated"), "dp_noise",
        f"must be alg1 or calibrated, got {fl.dp_noise!r}")
  if any(n in ("privaasyncfed", "dp_fedasync") for n in names) and math.isfinite(
      fl.dp_epsilon):
    check(fl.momentum == 0, "momentum", "must be 0 for DP runs (the accountant composes "
          "Gaussian steps of plain SGD)")
  check(fl.eval_every >= 1, "eval_every", f"must be >= 1, got {fl.eval_every}")
  check(fl.groups_per_call >= 1, "groups_per_call", f"must be >= 1, got {fl.groups_per_call}")
  check(fl.checkpoint_every >= 0, "checkpoint_every",
        f"must be >= 0 (0: off), got {fl.checkpoint_every}")
  classes = (vc.PRIVAASYNCFED_CLASSES if fl.device_classes == "privaasyncfed"
             else vc.parse_device_classes(fl.device_classes))
  if "privaasyncfed" in names:
    check(all(c.scale_index < len(scales) for c in classes), "device_classes",
          f"scale index beyond --scales ({len(scales)} entries)")
  clock = vc.ClockConfig(
      concurrency=fl.concurrency, num_updates=fl.num_arrivals or fl.num_updates, buffer_k=1,
      epochs=fl.local_epochs, local_steps=fl.local_steps, batch_size=fl.batch_size,
      compute=vc.Distribution.parse(fl.compute_time, "clock.compute_time"),
      comm=vc.Distribution.parse(fl.comm_time, "clock.comm_time"), device_classes=classes,
      ring_size=fl.ring_size)
  return names, scales, clock


def hparams(fl, mix_alpha):
  return {"lr": fl.lr, "momentum": fl.momentum, "mu": fl.mu, "mix_alpha": mix_alpha,
          "staleness_fn": float(STALENESS[fl.staleness_fn]), "poly_a": fl.poly_a,
          "hinge_a": fl.hinge_a, "hinge_b": fl.hinge_b, "server_lr": fl.server_lr,
          "server_momentum": fl.server_momentum,
          "fedbuff_staleness": float(fl.fedbuff_staleness), "rho": fl.rho,
          "dc_lambda": fl.dc_lambda, "dc_lambda_t": fl.dc_lambda_t,
          "loss_threshold": fl.loss_threshold, "beta": fl.beta, "dp_epsilon": fl.dp_epsilon,
          "dp_clip": fl.dp_clip, "dp_delta": fl.dp_delta, "dp_noise_multiplier": 0.0}


def run_config(fl, run_name: str) -> dict:
  """What a run's checkpoints and summary.json store to compare with on --resume: the
  fields of ``AsyncRunConfig`` that change the results (not RESUME_FREE_FLAGS), by flag
  name, and the run's name."""
  names = sorted(n for n in config_lib.flag_specs(async_config.AsyncRunConfig)
                 if n not in RESUME_FREE_FLAGS)
  return {"run": run_name, **{n: fl[n].value for n in names}}


def load(fl, pruned: bool = False):
  """The data, the model (name, w0, apply_flat, params) and, when ``pruned``
  (PrivaAsyncFed), its layers in call order for the sub-model masks."""
  from fedjax_async import data as data_lib  # pylint: disable=g-import-not-at-top
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  try:  # messages name the flag or the file
    fed = data_lib.load(fl.dataset, partition=fl.partition, num_clients=fl.num_clients,
                        alpha=fl.dirichlet_alpha, shards_per_client=fl.shards_per_client,
                        seed=fl.seed, data_dir=fl.data_dir, data_source=fl.data_source)
  except (OSError, RuntimeError) as e:
    raise ValueError(str(e)) from None
  name = models.default_model_for(fl.dataset) if fl.model == "auto" else fl.model
  input_shape = tuple(fed.x.shape[2:])
  try:
    model = models.get_model(name, fed.num_classes, input_shape)
  except (ValueError, KeyError) as e:
    msg = str(e).strip("'\"")
    raise ValueError(msg if msg.startswith("--") else f"--model={fl.model}: {msg}") from None
  key = jax.random.PRNGKey(fl.seed)
  w0, apply_flat = models.flat_model(model, input_shape, key)
  params = models.init_params(model, input_shape, key)
  order = None
  if pruned:
    from fedjax_async.algorithms import privaasyncfed  # pylint: disable=g-import-not-at-top
    order = privaasyncfed.call_order(model, input_shape)
  return fed, name, w0, apply_flat, params, order


class ArrivalProgress:
  """A console line per compiled call: server version, arrivals, the last accuracy seen,
  loss, staleness, arrivals per second and the ETA from the versions still to come."""

  def __init__(self, run_name: str, num_updates: int, rows_before):
    self.name, self.num_updates = run_name, num_updates
    self.before = len(rows_before)
    self.first = rows_before[-1]["arrival_version"] + 1 if rows_before else 0
    self.done, self.last_acc = self.before, float("nan")
    self.t0 = time.perf_counter()

  def __call__(self, rows):
    self.done += len(rows)
    acc = [r["test_accuracy"] for r in rows
           if r["test_accuracy"] is not None and np.isfinite(r["test_accuracy"])]
    if acc:
      self.last_acc = acc[-1]
    elapsed = max(time.perf_counter() - self.t0, 1e-9)
    rate = (self.done - self.before) / elapsed
    version = rows[-1]["arrival_version"] + 1
    eta = (self.num_updates - version) * elapsed / max(version - self.first, 1)
    print(f"[{self.name}] version {version}/{self.num_updates}"
          f" arrivals {self.done} acc {self.last_acc:.4f} "
          f"loss {np.mean([r['train_loss'] for r in rows]):.4f} "
          f"staleness {np.mean([r['staleness'] for r in rows]):.2f} | {rate:.1f} "
          f"arrivals/s ETA {eta:.0f}s", flush=True)


def run_one(fl, run_name, algo_name, hp, clock, scales, fed, model, out_dir):
  algorithm = algorithms.get(algo_name)
  model_name, w0, apply_flat, params, order = model
  counts = np.asarray(fed.counts)
  if algorithm.buffered:  # K arrivals per server update
    clock = dataclasses.replace(clock, buffer_k=fl.buffer_k, num_updates=(
        fl.num_arrivals // fl.buffer_k if fl.num_arrivals else clock.num_updates))
  if algorithm.pruned and fl.prune_speedup:
    clock = dataclasses.replace(clock, pruned_scales=tuple(scales))
  schedule = vc.simulate(clock, counts, fl.seed)
  local = client_lib.LocalConfig(fl.batch_size, fl.local_epochs, int(fed.x.shape[1]),
                                 momentum=fl.momentum > 0, local_steps=fl.local_steps)
  # 0: the whole concurrency on accelerators; 1 on CPU, where vmapping per-client weights
  # measured slower than one client per scan step (docs/async.md).
  group_size = fl.group_size or (1 if jax.default_backend() == "cpu" else fl.concurrency)
  devices = sharding.select_devices(fl.devices)
  mesh = sharding.client_mesh(devices) if len(devices) > 1 else None
  if mesh is not None:  # every device trains G / D members of each group
    group_size = sharding.padded_size(group_size, mesh.size)
  cfg = async_engine.AsyncConfig(
      local, schedule.ring_size, group_size, fl.dp_clip_mode,
      client_sharding=sharding.client_sharding(mesh) if mesh is not None else None)
  if algorithm.pruned:
    from fedjax_async.algorithms import privaasyncfed  # pylint: disable=g-import-not-at-top
    masks = privaasyncfed.scale_masks(params, order, scales)
    scale_index = schedule.clients.scale_index
  else:
    masks, scale_index = async_engine.full_masks(w0), np.zeros(len(counts), np.int64)
  steps = async_engine.client_steps(schedule, counts, local)
  dp_on = algorithm.dp and math.isfinite(fl.dp_epsilon)
  if dp_on and fl.dp_noise == "calibrated":
    hp = dict(hp, dp_noise_multiplier=privacy.calibrate_noise_multiplier(
        fl.dp_epsilon, fl.dp_delta, int(steps.max())))
  groups = async_engine.group_arrays(schedule, group_size)
  data = engine.DeviceData.from_federated(fed)
  state = async_engine.init_state(algorithm, w0, cfg.ring_size, fl.seed)
  if mesh is not None:
    # (waited for: see sharding.shard_clients)
    state, data, masks = jax.block_until_ready(sharding.replicate((state, data, masks), mesh))
  runner = async_engine.make_runner(apply_flat, algorithm, cfg)
  os.makedirs(out_dir, exist_ok=True)
  config = run_config(fl, run_name)
  num_groups = groups["valid"].shape[0]
  ckpt = loop.Checkpoints(os.path.join(out_dir, "checkpoints"), config,
                          every=fl.checkpoint_every * fl.groups_per_call, total=num_groups,
                          resume=fl.resume, mismatch=config_lib.mismatch_flags, unit="group")
  resumed = ckpt.restore(state)
  start_group, rows_before = (resumed.position, resumed.rows) if resumed else (0, [])
  if resumed is not None:
    state = jax.tree.map(jnp.asarray, resumed.state)
    if mesh is not None:
      state = jax.block_until_ready(sharding.replicate(state, mesh))
    print(f"[{run_name}] resuming from the checkpoint of group {start_group} of "
          f"{num_groups} ({ckpt.directory}, {len(rows_before)} arrivals done)", flush=True)
  progress = ArrivalProgress(run_name, schedule.num_updates, rows_before)
  metrics = loop.MetricsFile(os.path.join(out_dir, "metrics.jsonl"), rows_before)
  group_end = [start_group]
  host = loop.HostLoop(metrics, ckpt, lambda _: group_end[0], progress,
                       resumed.wall_before if resumed else 0.0)

  def on_chunk(new_state, rows):
    group_end[0] = min(group_end[0] + fl.groups_per_call, num_groups)
    host(new_state, rows)

  privacy_report = dp_report(fl, steps, counts, hp) if algorithm.dp else None
  try:
    state, _ = async_engine.simulate(runner, state, schedule, groups, hp, data, masks,
                                     scale_index, eval_every=fl.eval_every,
                                     groups_per_call=fl.groups_per_call,
                                     on_chunk=on_chunk, start_group=start_group)
  finally:
    metrics.close()
    ckpt.close()
  summary = run_summary(fl, run_name, algo_name, fed, model_name, int(np.size(w0)), hp,
                        metrics.rows, host.wall(), schedule, groups, group_size, config,
                        privacy_report)
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2, default=str)
  return summary


def dp_report(fl, steps, counts, hp):
  """The DP accounting of a run of a DP algorithm (``privacy.report``; no noise at an
  infinite --dp_epsilon)."""
  if not math.isfinite(fl.dp_epsilon):
    return {"epsilon_spent_max": math.inf, "seed_per_step_epsilon": math.inf}
  return privacy.report(steps, counts, lr=fl.lr, clip=fl.dp_clip, epsilon=fl.dp_epsilon,
                        delta=fl.dp_delta, batch_size=fl.batch_size,
                        clip_mode=fl.dp_clip_mode,
                        noise_multiplier=hp["dp_noise_multiplier"])


def run_summary(fl, run_name, algo_name, fed, model_name, num_params, hp, rows, wall,
                schedule, groups, group_size, config, privacy_report):
  """summary.json of one run (``privacy_report``: its DP accounting, or None)."""
  accs = [r["test_accuracy"] for r in rows if r["test_accuracy"] is not None]
  summary = {
      "run": run_name, "algorithm": algo_name, "dataset": getattr(fed, "name", fl.dataset),
      "model": model_name, "num_params": num_params,
      "local_work": {"local_epochs": fl.local_epochs, "local_steps": fl.local_steps,
                     "batch_size": fl.batch_size},
      "final_accuracy": accs[-1] if accs else float("nan"),
      "best_accuracy": max(accs) if accs else float("nan"),
      "accuracy_curve": [(r["arrival_version"] + 1, r["test_accuracy"]) for r in rows
                         if r["test_accuracy"] is not None],
      "wall_time_s": wall, "kept_arrivals_per_wall_second": len(rows) / max(wall, 1e-9),
      "groups": int(groups["valid"].shape[0]), "group_size": group_size,
      "hparams": {k: float(v) for k, v in hp.items()},
      "config": config,
  }
  summary.update(schedule.summary())
  if privacy_report is not None:
    summary["privacy"] = privacy_report
  return summary


def finished_run(fl, run_name: str, out_dir: str):
  """The summary of a finished run under ``out_dir`` made with the same flags, else None
  (--resume then continues it from its checkpoint, or runs it)."""
  try:
    with open(os.path.join(out_dir, "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None
  saved = summary.get("config")
  if not isinstance(saved, dict) or config_lib.config_mismatch(
      saved, checkpoint_lib.to_json_ready(run_config(fl, run_name))):
    return None
  return summary


def main(argv):
  """Ctrl-C / SIGTERM: one line naming --resume, exit status 130 / 143."""
  interrupts.exit_on_interrupt(
      lambda: _main(argv), f"the runs under {FLAGS.output_dir} are checkpointed every "
      f"--checkpoint_every={FLAGS.checkpoint_every} call(s) of --groups_per_call groups: "
      "rerun the same command with --resume to continue them")


def run_list(names):
  """(run name, algorithm, FedAsync's a) of each run: one per --mix_alpha value for
  fedasync / dp_fedasync (named <algorithm>_a<a> when there are several)."""
  runs = []
  for n in names:
    if n in ("fedasync", "dp_fedasync"):
      alphas = parse_floats(FLAGS.mix_alpha, "mix_alpha")
      for a in alphas:
        runs.append((n if len(alphas) == 1 else f"{n}_a{a:g}", n, a))
    else:
      runs.append((n, n, parse_floats(FLAGS.mix_alpha, "mix_alpha")[0]))
  return runs


def _main(argv):
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(FLAGS)  # no INFO lines from JAX's backend probing
  try:
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    names, scales, clock = validate(FLAGS)
    devices = sharding.select_devices(FLAGS.devices)
    check(not (FLAGS.resume and FLAGS.overwrite), "overwrite", "cannot be combined with "
          "--resume (--resume continues the runs in --output_dir, --overwrite deletes them)")
    runs = run_list(names)
    seeds = parse_seeds(FLAGS)
    # before any work: a folder holding a run is refused, or cleared with --overwrite
    run_outputs = COMMAND_OUTPUTS + (RUN_OUTPUTS if len(runs) == 1 else tuple(
        os.path.join(r, n) for r, _, _ in runs for n in RUN_OUTPUTS))
    owned = run_outputs if len(seeds) == 1 else COMMAND_OUTPUTS + tuple(
        os.path.join(f"seed{sd}", n) for sd in seeds for n in run_outputs)
    outputs.prepare_output_dir(FLAGS.output_dir, FLAGS.resume, FLAGS.overwrite, owned)
  except ValueError as e:
    sys.exit(f"error: {cli.as_flags(str(e))}")
  by_seed = {}
  for seed in seeds:
    FLAGS.seed = seed
    out_dir = FLAGS.output_dir if len(seeds) == 1 else os.path.join(FLAGS.output_dir,
                                                                    f"seed{seed}")
    by_seed[seed] = run_seed(names, runs, devices, scales, clock, out_dir)
  if len(seeds) > 1:
    table = seed_table(by_seed)
    with open(os.path.join(FLAGS.output_dir, "comparison.md"), "w") as f:
      f.write(table + "\n")
    print(table)


def run_seed(names, runs, devices, scales, clock, out_dir):
  """Every run of ``runs`` at FLAGS.seed under ``out_dir``; their summaries."""
  print(f"loading {FLAGS.dataset} (seed {FLAGS.seed}) ...", flush=True)
  try:
    fed, model_name, w0, apply_flat, params, order = load(FLAGS, "privaasyncfed" in names)
  except ValueError as e:
    sys.exit(f"error: {cli.as_flags(str(e))}")
  model = (model_name, w0, apply_flat, params, order)
  print(f"data: {len(fed.counts)} clients, {int(np.sum(fed.counts))} examples; model "
        f"{model_name} with {np.size(w0)} parameters; devices {jax.devices()}", flush=True)
  if len(devices) > 1:
    print(f"each group's members split over {len(devices)} devices (--devices)", flush=True)
  summaries, curves = [], {}
  for run_name, algo, alpha in runs:
    out = out_dir if len(runs) == 1 else os.path.join(out_dir, run_name)
    s = finished_run(FLAGS, run_name, out) if FLAGS.resume else None
    try:
      if s is None:
        s = run_one(FLAGS, run_name, algo, hparams(FLAGS, alpha), clock, scales, fed,
                    model, out)
      else:
        print(f"[{run_name}] read back from {out} (finished, same flags)", flush=True)
    except engine.Diverged as e:
      print(f"[{run_name}] diverged: {e}", flush=True)
      continue
    except ValueError as e:  # --resume over a run made with other flags, or unreadable
      sys.exit(f"error: {cli.as_flags(str(e))}")
    summaries.append(s)
    curves[run_name] = outputs.read_metrics(out)
    eps = s.get("privacy", {}).get("epsilon_spent_max")
    print(f"[{run_name}] final accuracy {s['final_accuracy']:.4f}, "
          f"{s['updates_per_virtual_second']:.3f} updates per virtual s, mean staleness "
          f"{s['mean_staleness']:.2f}, {s['wall_time_s']:.1f}s wall"
          + (f", epsilon spent {eps:.3g}" if eps is not None else ""), flush=True)
  if curves:  # accuracy and loss against the virtual clock, one line per run
    figure = os.path.join(out_dir, "curves.png")
    outputs.plot_curves(
        curves, figure, x_key="virtual_time", loss_window=10,
        title=f"{getattr(fed, 'name', FLAGS.dataset)}, {model_name}; virtual clock, "
              f"concurrency {FLAGS.concurrency}; {', '.join(curves)}")
    print(f"figure: {figure}")
  if len(summaries) > 1:
    lines = ["| run | final acc | best acc | arrivals | server updates | mean staleness | "
             "upd/virtual s | eps spent | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
      eps = s.get("privacy", {}).get("epsilon_spent_max", "")
      lines.append(f"| {s['run']} | {s['final_accuracy']:.4f} | {s['best_accuracy']:.4f} | "
                   f"{s['arrivals']} | {s['server_updates']} | "
                   f"{s['mean_staleness']:.2f} | {s['updates_per_virtual_second']:.3f} | "
                   f"{eps if eps == '' else f'{eps:.3g}'} | {s['wall_time_s']:.1f} |")
    note = arrivals_note(summaries)
    table = "\n".join(lines) + (f"\n\n{note}" if note else "")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "comparison.md"), "w") as f:
      f.write(table + "\n")
    print(table)
  return summaries


def arrivals_note(summaries) -> str:
  """A line saying so when the runs of a comparison took different numbers of client
  arrivals (FedBuff takes --buffer_k per server update), else ''."""
  arrivals = {s["run"]: s["arrivals"] for s in summaries}
  if len(set(arrivals.values())) <= 1:
    return ""
  each = ", ".join(f"{r} {a}" for r, a in arrivals.items())
  return (f"Note: the runs took different numbers of client arrivals ({each}): "
          "--num_updates counts server updates; --num_arrivals=N gives every run N.")


def seed_table(by_seed):
  """Markdown: per run, the final and best accuracy as mean +- standard deviation (ddof 1)
  over the seeds, and each seed's final accuracy."""
  seeds = list(by_seed)
  names = list(dict.fromkeys(s["run"] for runs in by_seed.values() for s in runs))
  lines = [f"Mean +- standard deviation over seeds {', '.join(map(str, seeds))}.", "",
           "| run | final acc | best acc | mean staleness | "
           + " | ".join(f"final, seed {sd}" for sd in seeds) + " |",
           "|---|---|---|---|" + "---|" * len(seeds)]
  for name in names:
    got = {sd: next((s for s in by_seed[sd] if s["run"] == name), None) for sd in seeds}
    done = [s for s in got.values() if s is not None]

    def stat(key):
      v = np.array([s[key] for s in done], float)
      return f"{v.mean():.4f} ± {v.std(ddof=1) if v.size > 1 else 0.0:.4f}"

    lines.append(f"| {name} | {stat('final_accuracy')} | {stat('best_accuracy')} | "
                 f"{np.mean([s['mean_staleness'] for s in done]):.2f} | "
                 + " | ".join("diverged" if got[sd] is None else
                              f"{got[sd]['final_accuracy']:.4f}" for sd in seeds) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
