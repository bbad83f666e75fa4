"""The virtual clock's runs from a configuration: ``fedjax_async.simulate`` with an
``AsyncRunConfig`` (``experiments/async_family.py`` is its command line).

  import fedjax_async as fa
  result = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync,fedbuff", num_updates=100)
  print(result.table())
  result.runs["fedbuff"].rows[-1]        # one row per kept arrival
  result.runs["fedbuff"].state.w         # the global model

Each algorithm (and each FedAsync ``a`` of ``algorithm.mix_alpha``) is one run, once per
seed of ``run.seeds``. With ``output.output_dir`` a run writes ``metrics.jsonl``,
``summary.json`` and its checkpoints under ``<run>/`` (``seed<s>/<run>/`` with several
seeds), and the invocation ``curves.png`` and ``comparison.md``; ``output.resume``
continues each run from its latest checkpoint and reads back the finished ones. A run is
``lifecycle.run`` (metrics, checkpoints, the caller's callbacks, progress, signals,
summary) of a ``_Clock`` around ``asynchronous.engine.run_arrivals``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import algorithms
from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import config as config_lib
from fedjax_async import console
from fedjax_async import cost
from fedjax_async import lifecycle
from fedjax_async import loop
from fedjax_async import metrics as metrics_lib
from fedjax_async import models
from fedjax_async import outputs
from fedjax_async import privacy
from fedjax_async import results
from fedjax_async import sharding
from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedasync
from fedjax_async.algorithms import privaasyncfed
from fedjax_async.asynchronous import engine as async_engine
from fedjax_async.asynchronous import report
from fedjax_async.asynchronous import virtual_clock as vc
from fedjax_async.asynchronous.config import AsyncRunConfig, parse_floats, seeds_of, validate
from fedjax_async.config import check
from fedjax_async.core import building
from fedjax_async.core import device
from fedjax_async.core import divergence
from fedjax_async.core import progress
from fedjax_async.core import tokens


# Fields that change neither a run's model nor its metrics rows: a checkpoint or summary
# made with other values of these is still the same run (run.eval_every is not among them:
# it decides which rows carry a test accuracy).
RESUME_FREE_FIELDS = ("output_dir", "resume", "overwrite", "checkpoint_every",
                      "groups_per_call", "seeds", "quiet", "target_accuracy")
# What a run writes in its folder, and the invocation in output.output_dir.
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", outputs.FINAL_MODEL)
COMMAND_OUTPUTS = ("curves.png", "comparison.md")


Run = results.Run  # (summary, rows: one per kept arrival, final AsyncState, model)
Result = results.Result  # by_seed[seed][run name] with several seeds


def table_of(result: Result) -> str:
  """Markdown: the runs compared (one seed), or mean +- std over the seeds."""
  if len(result.by_seed) > 1:
    return report.seed_table({s: [r.summary for r in runs.values()]
                              for s, runs in result.by_seed.items()})
  return report.clock_table([r.summary for r in result.runs.values()])


def privaasyncfed_defaults(cfg: AsyncRunConfig) -> AsyncRunConfig:
  """PrivaAsyncFed's paper setting (``privaasyncfed.paper_defaults``) for what an
  invocation that runs it leaves unset, in every run (its comparisons use one
  configuration, Sec. IV-B.3), said on the console."""
  if "privaasyncfed" not in cfg.algorithm.names.split(","):
    return cfg

  def auto_model():
    try:
      return models.default_model_for(cfg.data.dataset)
    except ValueError:  # (named when the data loads)
      return None

  set_ = privaasyncfed.paper_defaults(cfg.clock.device_classes, cfg.model.name, auto_model)
  if set_:
    console.say(outputs.name_fields(
              "PrivaAsyncFed's defaults, for every run: " + ", ".join(
                  f"{'.'.join(AsyncRunConfig.keys()[k])}={v}" for k, v in set_.items())
              + f" ({privaasyncfed.PAPER_SETTING}); "
              "clock.device_classes=none for identical unpruned clients"))
  return cfg.replace(**set_)


def run_list(cfg: AsyncRunConfig, names: Sequence[str]):
  """(run name, algorithm, FedAsync's a) of each run: one per algorithm.mix_alpha value
  for fedasync / dp_fedasync (named <algorithm>_a<a> when there are several)."""
  alphas = parse_floats(cfg.algorithm.mix_alpha, "algorithm.mix_alpha")
  runs = []
  for n in names:
    if n in ("fedasync", "dp_fedasync"):
      runs.extend((n if len(alphas) == 1 else f"{n}_a{a:g}", n, a) for a in alphas)
    else:
      runs.append((n, n, alphas[0]))
  return runs


def hparams(cfg: AsyncRunConfig, mix_alpha: float, algorithm=None) -> Dict[str, float]:
  """The traced scalar hyperparameters of a run: the common ones (a round rule's server
  entries too, ``base.server_hparams``: no schedule, its own weighting), then the
  algorithms' (``config.resolved_hparams``: ``algorithm``'s own defaults where none is
  given)."""
  a, p = cfg.algorithm, cfg.privacy
  rule = algorithm is not None and algorithm.server_update is not None
  return {"lr": cfg.local.lr, "momentum": cfg.local.momentum,
          "mix_alpha": mix_alpha, "staleness_fn": fedasync.STALENESS_FN.code(a.staleness_fn),
          "example_weight": fedasync.EXAMPLE_WEIGHT.code(a.example_weight),
          **(base.server_hparams(a.server_lr) if rule else {"server_lr": a.server_lr}),
          **config_lib.resolved_hparams(a, "virtual_clock", algorithm, cfg.data.dataset),
          "dp_epsilon": p.dp_epsilon, "dp_clip": p.dp_clip, "dp_delta": p.dp_delta,
          "dp_noise_multiplier": 0.0}


def run_config(cfg: AsyncRunConfig, run_name: str, algo_name: Optional[str] = None) -> dict:
  """What a run's checkpoints and summary.json store to compare with on resumption: the
  fields that change the results (not RESUME_FREE_FIELDS) by flat key, a hyper-parameter
  left None at the value ``algo_name``'s run uses (``config.resolved_hparams``), and the
  run's name."""
  flat = cfg.flat()
  flat["hp"] = dict(cfg.algorithm.hp)
  algorithm = algorithms.get(algo_name) if algo_name else None
  used = config_lib.resolved_hparams(cfg.algorithm, "virtual_clock", algorithm,
                                     cfg.data.dataset)
  flat.update({k: used[k] for k, v in flat.items() if v is None and k in used})
  return {"run": run_name, **{k: flat[k] for k in sorted(flat) if k not in RESUME_FREE_FIELDS}}


def load(cfg: AsyncRunConfig, pruned: bool = False, fed=None, module=None, input_shape=None):
  """The data and the model (name, w0, apply_flat, params, and when ``pruned``
  (PrivaAsyncFed) its layers in call order for the sub-model masks); ``fed`` / ``module``
  (a flax module on ``input_shape``, default the data's): the caller's own.

  Args:
    cfg: the ``AsyncRunConfig``.
    pruned: PrivaAsyncFed's sub-models: also the layers in call order.
    fed: the caller's federated data (None: the configured data set).
    module: the caller's flax module (None: the configured model).
    input_shape: the shape ``module`` is built for (None: the data's).
  """
  if fed is None:
    try:
      fed = building.load_data(cfg)
    except (OSError, RuntimeError) as e:  # their messages name the field or the file
      raise ValueError(str(e)) from None
  input_shape = tuple(input_shape or fed.x.shape[2:])
  if module is not None:
    try:
      name, w0, apply_flat = models.user_model(module, input_shape, cfg.run.seed,
                                               fed.num_classes, fed.x.shape[2:])
    except ValueError as e:
      raise config_lib.ConfigError("model", str(e).removeprefix("model: ")) from None
    model = module
  else:
    name, w0, apply_flat = building.build_model(cfg, fed)
    model = models.get_model(name, fed.num_classes, input_shape)
  params = apply_flat.params(w0) if hasattr(apply_flat, "params") else None
  order = None
  if pruned:
    if module is not None or apply_flat.collections:
      raise config_lib.ConfigError("model", "PrivaAsyncFed's sub-models need one of the "
                                   "project's models (--model), not a user module")
    order = privaasyncfed.call_order(model, input_shape)
  return fed, (name, w0, apply_flat, params, order)


def _clock_of(cfg: AsyncRunConfig, algorithm, clock, scales):
  """The clock of one algorithm: FedBuff's K arrivals per server update; PrivaAsyncFed's
  pruned sub-models' faster tasks (clock.prune_speedup)."""
  c = cfg.clock
  if algorithm.buffered:
    clock = dataclasses.replace(clock, buffer_k=c.buffer_k, num_updates=(
        c.num_arrivals // c.buffer_k if c.num_arrivals else clock.num_updates))
  if algorithm.pruned and c.prune_speedup:
    clock = dataclasses.replace(clock, pruned_scales=tuple(scales))
  return clock


def _engine_config(cfg: AsyncRunConfig, local, ring_size: int):
  """(AsyncConfig, mesh or None): the group size G and its devices."""
  # 0: the whole concurrency on accelerators; 1 on CPU, where vmapping per-client weights
  # measured slower than one client per scan step (docs/async.md).
  group_size = cfg.clock.group_size or (1 if jax.default_backend() == "cpu"
                                        else cfg.clock.concurrency)
  devices = sharding.select_devices(cfg.run.devices)
  mesh = sharding.client_mesh(devices) if len(devices) > 1 else None
  if mesh is not None:  # every device trains G / D members of each group
    group_size = sharding.padded_size(group_size, mesh.size)
  return async_engine.AsyncConfig(
      local, ring_size, group_size, cfg.privacy.dp_clip_mode,
      client_sharding=sharding.client_sharding(mesh) if mesh is not None else None), mesh


def run_one(cfg: AsyncRunConfig, run_name: str, algo_name: str, hp: dict, clock, scales,
            fed, model, out_dir: Optional[str], callbacks: Sequence[loop.Callback] = ()
            ) -> Run:
  """One run on the virtual clock; files under ``out_dir`` (None: none).

  Args:
    cfg: the ``AsyncRunConfig``.
    run_name: the run's name.
    algo_name: the algorithm's name.
    hp: the run's hyper-parameters.
    clock: the ``vc.ClockConfig`` (``validate``).
    scales: PrivaAsyncFed's pruning scales.
    fed: the federated data.
    model: ``load``'s (name, w0, apply_flat, params, order).
    out_dir: where the run's files go (None: none).
    callbacks: ``loop.Callback``s after every compiled chunk.
  """
  return lifecycle.run(_clock_run(cfg, run_name, algo_name, hp, clock, scales, fed, model),
                       out_dir, callbacks)


def _clock_run(cfg: AsyncRunConfig, run_name: str, algo_name: str, hp: dict, clock, scales,
               fed, model) -> "_Clock":
  """``run_one``'s run built: its schedule, engine and state (``run_one``'s arguments)."""
  algorithm = algorithms.get(algo_name)
  model_name, w0, apply_flat, params, order = model
  counts = np.asarray(fed.counts)
  schedule = vc.draw_schedule(_clock_of(cfg, algorithm, clock, scales), counts, cfg.run.seed)
  if cfg.clock.time_budget and not schedule.stopped_at_budget:
    outputs.warn(f"[{run_name}] ends at virtual second {schedule.time[-1]:.4g}, before "
                 f"clock.time_budget={cfg.clock.time_budget:g}: its {schedule.num_updates} "
                 "server updates (clock.num_updates / clock.num_arrivals) come first")
  local = building.local_config(cfg, fed)
  ecfg, mesh = _engine_config(cfg, local, schedule.ring_size)
  if algorithm.pruned:
    masks = privaasyncfed.scale_masks(params, order, scales)
    scale_index = schedule.clients.scale_index
  else:
    masks, scale_index = async_engine.full_masks(w0), np.zeros(len(counts), np.int64)
  # each client's message: the parameters of its (sub-)model
  client_bytes = np.array([metrics_lib.message_bytes(w0, k) for k in
                           np.asarray(masks).sum(axis=1)[np.asarray(scale_index)]])
  steps = async_engine.client_steps(schedule, counts, local)
  groups = async_engine.group_arrays(schedule, ecfg.group_size)
  num_groups = int(groups["valid"].shape[0])
  estimate = cost.virtual_clock(cfg, fed, model[:3], steps, schedule.num_updates,
                                ecfg.group_size, schedule.ring_size, num_groups=num_groups)
  p = cfg.privacy
  if algorithm.dp and math.isfinite(p.dp_epsilon) and p.dp_noise == "calibrated":
    hp = dict(hp, dp_noise_multiplier=privacy.calibrate_noise_multiplier(
        p.dp_epsilon, p.dp_delta, int(steps.max())))
  data = device.DeviceData.from_federated(fed)
  state = async_engine.init_state(algorithm, w0, ecfg.ring_size, cfg.run.seed)
  if mesh is not None:
    # (waited for: see sharding.shard_clients)
    state, data, masks = jax.block_until_ready(sharding.replicate((state, data, masks), mesh))
  config = run_config(cfg, run_name, algo_name)
  checkpointing = lifecycle.Checkpointing(
      config, cfg.output.checkpoint_every * cfg.run.groups_per_call, cfg.output.resume,
      lambda saved, now: config_lib.mismatch_flags(renamed(saved), now), unit="group",
      grid=cfg.run.groups_per_call)
  return _Clock(run_name, num_groups, cfg.run.groups_per_call, (model_name, w0, apply_flat),
                state, checkpointing, cfg, algo_name, algorithm, hp, fed, counts, schedule,
                groups, data, masks, scale_index, mesh,
                async_engine.make_runner(apply_flat, algorithm, ecfg), estimate, steps,
                client_bytes, ecfg.group_size, config)


@dataclasses.dataclass(frozen=True)
class _Clock:
  """The virtual clock's part of a run (``lifecycle.Engine``; positions count groups)."""
  name: str
  total: int
  most: int
  model: tuple
  initial: Any
  checkpointing: lifecycle.Checkpointing
  cfg: AsyncRunConfig
  algo_name: str
  algorithm: Any
  hp: dict
  fed: Any
  counts: np.ndarray  # [N] the clients' examples
  schedule: vc.Schedule
  groups: dict
  data: device.DeviceData
  masks: Any
  scale_index: np.ndarray
  mesh: Any
  runner: Any
  estimated: Any  # its ``cost.Cost``
  steps: np.ndarray  # each client's local steps
  client_bytes: np.ndarray  # each client's message
  group_size: int
  config: dict  # ``run_config``
  smaller = cost.VIRTUAL_CLOCK_SMALLER
  position = None  # (counted by chunks)

  def resumed(self, ckpt, resumed):
    if resumed is None:
      return self.initial
    state = jax.tree.map(jnp.asarray, resumed.state)
    if self.mesh is not None:
      state = jax.block_until_ready(sharding.replicate(state, self.mesh))
    console.say(f"[{self.name}] resuming from the checkpoint of group {resumed.position} of "
                f"{self.total} ({ckpt.directory}, {len(resumed.rows)} arrivals done)")
    return state

  def estimate(self, start):
    return self.estimated

  def begin(self, start, rows):
    """The epsilon it will spend, up front; the progress lines."""
    cfg = self.cfg
    if self.algorithm.dp and math.isfinite(cfg.privacy.dp_epsilon):
      outputs.warn(report.dp_notice(self.name, cfg, report.dp_report(
          cfg, self.steps, self.counts, self.hp)))
    return None if cfg.output.quiet else report.ArrivalProgress(
        self.name, self.schedule.num_updates, rows,
        health=progress.HealthWatch(self.name, self.algo_name))

  def annotate(self, rows):
    metrics_lib.add_arrival_bytes(rows, self.client_bytes)

  def tensorboard(self, files):
    return None

  def signals(self, ckpt):
    return contextlib.nullcontext()

  def run(self, state, host, lengths):
    return async_engine.run_arrivals(
        self.runner, state, self.schedule, self.groups, self.hp, self.data, self.masks,
        self.scale_index, eval_every=self.cfg.run.eval_every,
        groups_per_call=self.cfg.run.groups_per_call, on_chunk=host,
        start_group=host.position(state), lengths=lengths)[0]

  def diverged(self, e, host, ckpt):
    """``e`` with what the clients' health says went wrong."""
    group = [r for r in host.chunk if r["group"] == (e.row or {}).get("group")]
    return divergence.Diverged(f"{e}; {divergence.advice(self.data, host.rows + group)}",
                               e.round, e.rows, e.kind, e.row)

  def interrupted(self, e, state, host, ckpt):
    return None  # (raised, after its chunk's checkpoint)

  def summary(self, rows, wall, state, stopped_early_at):
    cfg, schedule = self.cfg, self.schedule
    summary = report.run_summary(
        cfg, self.name, self.algo_name, self.fed, self.model[0], int(np.size(self.model[1])),
        self.hp, rows, wall, schedule, self.total, self.group_size, self.config,
        report.dp_report(cfg, self.steps, self.counts, self.hp) if self.algorithm.dp
        else None)
    # the models sent that no row counts: to the dropped arrivals and those still in flight
    unrowed = np.concatenate([schedule.client[schedule.dropped], schedule.in_flight])
    summary.update(metrics_lib.bytes_totals(rows, self.client_bytes[unrowed].sum()))
    return summary


def finished_run(cfg: AsyncRunConfig, run_name: str, out_dir: str,
                 algo_name: Optional[str] = None) -> Optional[Run]:
  """A finished run under ``out_dir`` made with the same configuration, else None
  (resumption then continues it from its checkpoint, or runs it); its summary's target
  keys are run.target_accuracy's (rewritten where another one made them)."""
  path = os.path.join(out_dir, "summary.json")
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None
  saved = summary.get("config")
  if not isinstance(saved, dict) or config_lib.config_mismatch(
      renamed(saved), checkpoint_lib.to_json_ready(run_config(cfg, run_name, algo_name))):
    return None
  rows = outputs.read_metrics(out_dir)
  targeted = report.retarget(summary, rows, cfg.run.target_accuracy)
  if targeted != summary:
    with open(path, "w") as f:
      json.dump(targeted, f, indent=2, default=str)
  return Run(targeted, rows, None)


# Flat keys renamed since runs were stored: old -> new (double compensation's rho).
RENAMED = {"rho": "dc_rho"}


def renamed(saved: dict) -> dict:
  """A stored configuration under the current flat keys; one stored without
  ``data_seed`` drew its data from its own ``seed``."""
  out = {RENAMED.get(k, k) if RENAMED.get(k) not in saved else k: v
         for k, v in saved.items()}
  if "data_seed" not in out and "seed" in out:
    out["data_seed"] = out["seed"]
  return out


def prepare(cfg: AsyncRunConfig, runs, seeds):
  """Before any work: an output_dir holding a run (of any layout) is refused, or cleared
  with output.overwrite (the outputs of runs there, nothing else)."""
  o = cfg.output
  check(not (o.resume and o.overwrite), "output.overwrite", "cannot be combined with "
        "output.resume (output.resume continues the runs in output.output_dir, "
        "output.overwrite deletes them)")
  check(not o.resume or o.output_dir is not None, "output.resume",
        "continues the runs in output.output_dir, and none is given")
  if o.output_dir is None:
    return
  run_outputs = COMMAND_OUTPUTS + tuple(os.path.join(r, n) for r, _, _ in runs
                                        for n in RUN_OUTPUTS)
  owned = run_outputs if len(seeds) == 1 else COMMAND_OUTPUTS + tuple(
      os.path.join(f"seed{sd}", n) for sd in seeds for n in run_outputs)
  keeps = COMMAND_OUTPUTS + (tuple(r for r, _, _ in runs) if len(seeds) == 1
                             else tuple(f"seed{sd}" for sd in seeds))
  outputs.lock_output_dir(o.output_dir)  # (a folder in use: refused before it is read)
  outputs.clear_stale(o.output_dir, keeps, o.resume, o.overwrite)
  outputs.prepare_output_dir(o.output_dir, o.resume, o.overwrite, owned)


def run_virtual_clock(config: Optional[AsyncRunConfig] = None, callbacks: Sequence = (),
             fed_data=None, module=None, input_shape=None, **fields) -> Result:
  """Runs ``config.algorithm.names`` (a comma list) on the virtual clock, once per seed.

  ``fields`` replace fields by their flat keys (``num_updates=50``). Raises
  ``config.ConfigError`` naming the field at fault and ``interrupts.Interrupted`` on
  Ctrl-C / SIGTERM (with ``output_dir``, after a checkpoint); a run that diverges is left
  out (``Result.diverged``). ``callbacks``: ``loop.Callback``s after every compiled chunk
  of every run. ``fed_data`` (a ``FederatedData``) and ``module`` (a flax module,
  ``input_shape`` defaulting to the data's) replace the configured data set and model.

  Args:
    config: the configuration (None: the defaults).
    callbacks: ``loop.Callback``s after every compiled chunk of every run.
    fed_data: a ``FederatedData`` to run on (None: the configured data set).
    module: a flax module to train (None: the configured model).
    input_shape: the shape ``module`` is built for (None: the data's).
    **fields: fields replaced by their flat keys.
  """
  cfg = (config or AsyncRunConfig()).replace(**fields)
  with console.silenced(cfg.output.quiet), outputs.run_scope():
    return _run_virtual_clock(cfg, callbacks, fed_data, module, input_shape)


def _run_virtual_clock(cfg: AsyncRunConfig, callbacks, fed_data, module, input_shape
                       ) -> Result:
  """``run_virtual_clock`` of the configuration made."""
  config_lib.check_types(cfg)  # (before privaasyncfed_defaults reads algorithm.names)
  cfg = privaasyncfed_defaults(cfg)
  names, scales, clock = validate(cfg)
  sharding.select_devices(cfg.run.devices)
  runs, seeds = run_list(cfg, names), seeds_of(cfg)
  prepare(cfg, runs, seeds)
  result = Result(cfg, {}, tabulate=table_of)
  for seed in seeds:
    out_dir = cfg.output.output_dir
    if out_dir is not None and len(seeds) > 1:
      out_dir = os.path.join(out_dir, f"seed{seed}")
    seed_cfg = config_lib.with_seed(cfg, seed)  # the data from one data seed
    result.by_seed[seed] = run_seed(seed_cfg, runs, "privaasyncfed" in names, scales, clock,
                                    out_dir, callbacks, result, (fed_data, module, input_shape))
    if len(result.by_seed) == 1:
      result.runs = result.by_seed[seed]
  first = next((r.summary for done in result.by_seed.values() for r in done.values()), None)
  if first is not None:  # Result.plot's title
    result.title = report.curves_title(cfg, first["dataset"], first["model"],
                                       [r for r, _, _ in runs], seeds)
  if len(seeds) > 1 and cfg.output.output_dir is not None:
    with open(os.path.join(cfg.output.output_dir, "comparison.md"), "w") as f:
      f.write(result.table() + "\n")
    plot_seeds(cfg, result)
  return result


def plot_seeds(cfg: AsyncRunConfig, result: Result):
  """``output_dir/curves.png`` of several seeds: per run the mean over the seeds with a
  +-1 std band (ddof 1, as the table), on virtual time."""
  runs: Dict[str, list] = {}
  for done in result.by_seed.values():
    for name, run in done.items():
      runs.setdefault(name, []).append(run.rows)
  if not runs:
    return
  first = next(r.summary for done in result.by_seed.values() for r in done.values())
  result.figure = os.path.join(cfg.output.output_dir, "curves.png")
  outputs.plot_curves(runs, result.figure, x_key="virtual_time", ddof=1,
                      title=report.curves_title(cfg, first["dataset"], first["model"],
                                                list(runs), list(result.by_seed)))
  console.say(f"figure: {result.figure}", console.RESULT)


def run_seed(cfg: AsyncRunConfig, runs, pruned: bool, scales, clock, out_dir, callbacks,
             result: Result, own=(None, None, None)) -> Dict[str, Run]:
  """Every run of ``runs`` at run.seed (files under ``out_dir``, None: none); ``own``:
  the caller's (data, flax module, input shape), None for the configured ones.

  Args:
    cfg: the ``AsyncRunConfig`` at one seed.
    runs: ``run_list``'s (run name, algorithm, FedAsync's a) of each run.
    pruned: PrivaAsyncFed is among them (its layers' call order is loaded).
    scales: PrivaAsyncFed's pruning scales.
    clock: the ``vc.ClockConfig``.
    out_dir: where the runs' files go (None: none).
    callbacks: ``loop.Callback``s after every compiled chunk.
    result: the ``Result``; a diverged run is noted in it.
    own: the caller's (data, flax module, input shape), None for the configured ones.
  """
  console.say(f"loading {cfg.data.dataset} (data seed {building.data_seed_of(cfg)}, seed "
              f"{cfg.run.seed}) ...")
  fed, model = load(cfg, pruned, *own)
  console.say(f"data: {len(fed.counts)} clients, {int(np.sum(fed.counts))} examples; model "
              f"{model[0]} with {np.size(model[1])} parameters; devices {jax.devices()}"
              f"{tokens.accuracy_note(fed)}")
  devices = sharding.select_devices(cfg.run.devices)
  if len(devices) > 1:
    console.say(outputs.name_fields(f"each group's members split over {len(devices)} devices "
                                    "(run.devices)"))
  done: Dict[str, Run] = {}
  lost: Dict[str, str] = {}  # the runs that diverged: why
  for run_name, algo, alpha in runs:
    out = None if out_dir is None else os.path.join(out_dir, run_name)
    run = (finished_run(cfg, run_name, out, algo) if out is not None and cfg.output.resume
           else None)
    if run is not None:
      console.say(f"[{run_name}] read back from {out} (finished, same configuration)")
    else:
      try:
        run = run_one(cfg, run_name, algo, hparams(cfg, alpha, algorithms.get(algo)), clock,
                      scales, fed, model, out, callbacks)
      except divergence.Diverged as e:
        console.say(outputs.name_fields(f"[{run_name}] diverged: {e}"), console.RESULT)
        result.diverged[f"{run_name} (seed {cfg.run.seed})"] = lost[run_name] = str(e)
        continue
    done[run_name] = run
    console.say(report.result_line(run.summary), console.RESULT)
  if out_dir is not None and done:  # accuracy and loss against the virtual clock
    result.figure = os.path.join(out_dir, "curves.png")
    outputs.plot_curves(
        {n: r.rows for n, r in done.items()}, result.figure, x_key="virtual_time",
        title=report.curves_title(cfg, getattr(fed, "name", cfg.data.dataset), model[0],
                                  list(done)))
    console.say(f"figure: {result.figure}", console.RESULT)
  table = report.clock_table([r.summary for r in done.values()], lost)  # (diverged: a line)
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "comparison.md"), "w") as f:
      f.write(table + "\n")
  if len(done) + len(lost) > 1:
    console.say(table, console.RESULT)
  return done
