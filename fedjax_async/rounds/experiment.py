"""One algorithm's run on the round engine: data and model from a ``RunConfig``, and
``lifecycle.run`` of a ``_Rounds`` around ``engine.run_rounds`` (checkpoints,
``output.resume``, divergence, interrupts, metrics rows, TensorBoard, progress lines) and
its summary.

The path of a parameter: flag (``cli.define_run_flags``) -> ``RunConfig`` field
(``cli.config_from_flags``, validated by ``config.validate``) -> ``hparams`` dict / static
``EngineConfig`` / ``timeline.DelayConfig`` -> ``engine.run_chunk``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import signal
import sys
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import algorithms
from fedjax_async import console
from fedjax_async import cost
from fedjax_async import distributed
from fedjax_async import interrupts
from fedjax_async import lifecycle
from fedjax_async import loop
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async import results
from fedjax_async import sharding
from fedjax_async.algorithms import dp_fedavg
from fedjax_async.algorithms import server_optimizers
from fedjax_async.config import (RunConfig, config_dict, mismatch_flags, own_columns,
                                 run_config_for)
from fedjax_async.core import divergence
from fedjax_async.core import streaming
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.core.building import build_model, load_data, local_config
from fedjax_async.core.progress import (CompileTimer, HealthWatch, Overall, Progress,
                                        log_interval)
from fedjax_async.interrupts import Interrupted
from fedjax_async.outputs import TensorBoard, ckks_security, prepare_output_dir
from fedjax_async.rounds import engine
from fedjax_async.rounds import host_server


Run = results.Run  # (summary, rows, state, model)


def run(cfg: RunConfig, name: str, fed_data=None, model=None, out_dir=None,
        quiet: bool = False, position: Optional[tuple] = None,
        overall: Optional[Overall] = None, callbacks: Sequence = ()) -> Run:
  """Runs algorithm ``name`` under ``cfg``; writes metrics.jsonl, summary.json, TensorBoard
  scalars and (``cfg.output.checkpoint_every``) checkpoints under ``<out_dir>/checkpoints``
  (``out_dir`` defaults to ``<cfg.output.output_dir>/<name>``; with neither, nothing is written
  and the ``Run`` holds it all).

  A directory that holds a previous run is refused (ValueError naming output.output_dir) unless
  ``cfg.output.resume`` or ``cfg.output.overwrite`` (which deletes that run's outputs first). With
  ``cfg.output.resume`` it continues from the latest checkpoint: the restored state and
  metrics rows make the rest of the run, ``metrics.jsonl`` (rewritten from the restored
  rows, then appended) and the final state identical to an uninterrupted run's. Raises
  ``engine.Diverged`` naming the round, the algorithm and the last good checkpoint, and
  ``Interrupted`` (SIGINT, or SIGTERM once ``main_from_flags`` handles it) naming the
  round and the checkpoint to resume from. ``position`` (i, n) and ``overall``: see
  ``Progress``. ``callbacks``: ``loop.Callback``s run after every chunk of rounds.

  Args:
    cfg: the run's configuration.
    name: the algorithm's name.
    fed_data: the federated data (None: ``load_data(cfg)``).
    model: ``(name, w0, apply_flat)`` (None: ``build_model(cfg, fed_data)``).
    out_dir: where the run's files go (None: ``<output_dir>/<name>``, or nowhere).
    quiet: no progress lines (also ``cfg.output.quiet``).
    position: (i, n), this run's place among several (``Progress``).
    overall: the progress of all the runs (``Progress``).
    callbacks: ``loop.Callback``s run after every chunk of rounds.
  """
  quiet = quiet or cfg.output.quiet
  with console.silenced(quiet):
    return _run(cfg, name, fed_data, model, out_dir, quiet, position, overall, callbacks)


def _run(cfg: RunConfig, name: str, fed_data, model, out_dir, quiet: bool, position,
         overall, callbacks) -> Run:
  """``run``'s work (its arguments)."""
  if out_dir is None and cfg.output.output_dir is not None:
    out_dir = os.path.join(cfg.output.output_dir, name)
  if out_dir is not None:
    prepare_output_dir(out_dir, cfg.output.resume, cfg.output.overwrite)
  fed_data = load_data(cfg) if fed_data is None else fed_data
  model = build_model(cfg, fed_data) if model is None else model
  setup = _setup(cfg, name, fed_data, model)
  files = out_dir if out_dir is not None and distributed.is_main() else None
  return lifecycle.run(_Rounds(cfg, name, fed_data, model, setup, quiet, position, overall,
                               files), out_dir, callbacks)


class _Rounds:
  """The round engine's part of a run (``lifecycle.Engine``): its arguments are ``_run``'s,
  ``setup`` built and ``files`` its folder on process 0 (None: nothing written)."""
  smaller = cost.ROUND_ENGINE_SMALLER

  def __init__(self, cfg: RunConfig, name: str, fed_data, model, setup: "_Setup",
               quiet: bool, among: Optional[tuple], overall: Optional[Overall],
               files: Optional[str]):
    self.cfg, self.name, self.fed_data, self.model, self.setup = (cfg, name, fed_data, model,
                                                                  setup)
    self.quiet, self.among, self.overall, self.files = quiet, among, overall, files
    self.total, self.most, self.initial = cfg.run.rounds, cfg.run.rounds_per_call, setup.state
    o = cfg.output
    # (the encrypted server hands over every round)
    self.checkpointing = lifecycle.Checkpointing(
        run_config_for(cfg, name), o.checkpoint_every, o.resume, mismatch_flags,
        keep=o.keep_checkpoints, extends=self._extends,
        grid=1 if cfg.crypto.secure_aggregation == "ckks" else cfg.run.rounds_per_call,
    ) if o.checkpoint_every > 0 or o.resume else None
    self.message = metrics_lib.message_bytes(setup.state.w)
    self.ecfg, self.runner = setup.run_ecfg, None  # (``begin``'s)

  @staticmethod
  def position(state) -> int:
    return int(state.round)

  def _extends(self, saved: dict, bad: List[str]) -> bool:
    """A larger run.rounds extends the run: its timeline's first rounds are the same draws."""
    return ([b.split("=")[0] for b in bad] == ["run.rounds"]
            and int(saved["rounds"]) < self.cfg.run.rounds)

  def resumed(self, ckpt, resumed):
    name, cfg = self.name, self.cfg
    if resumed is None:
      if cfg.output.resume and not self.quiet:
        console.say(outputs.name_fields(f"[{name}] output.resume: no checkpoint under "
                                        f"{ckpt.directory}, starting fresh"))
      return self.setup.state
    if not self.quiet:
      more = (f", extending its {resumed.config['rounds']} rounds to {cfg.run.rounds}"
              if int(resumed.config["rounds"]) < cfg.run.rounds else "")
      console.say(f"[{name}] resuming from the checkpoint of round {resumed.position} "
                  f"({ckpt.directory}){more}")
    return self.setup.place(jax.tree.map(jnp.asarray, resumed.state))[2]

  def estimate(self, start: int):
    if start < self.total and distributed.is_main():
      return cost.round_engine(self.cfg, self.fed_data, self.model)
    return None

  def begin(self, start: int, rows):
    """The DP notice, the progress lines and the runner (timing its compilation)."""
    cfg, setup, name = self.cfg, self.setup, self.name
    if dp_fedavg.is_private(setup.algorithm) and distributed.is_main():
      outputs.warn(dp_fedavg.notice(name, dp_fedavg.report(
          setup.hp, self.fed_data.num_clients, cfg.run.rounds), cfg.run.rounds))
    if self.overall is not None:
      self.overall.skip(start)
    self.ecfg, progress = _progress(cfg, name, setup, self.quiet, start, self.among,
                                    self.overall)
    self.runner = engine.make_runner(setup.apply_flat, setup.algorithm, self.ecfg)
    if not self.quiet and start < cfg.run.rounds:
      self.runner = CompileTimer(self.runner, name)
    return None if self.quiet else progress

  def annotate(self, rows):
    tl = self.setup.tl
    metrics_lib.add_round_bytes(rows, tl.valid.sum(1), tl.sampled, self.message)

  def tensorboard(self, files):
    # A resumed run rewrites TensorBoard like metrics.jsonl: every step of the earlier
    # event files is purged (session restart at step 0), the restored rows written again.
    return TensorBoard(files, self.cfg.output.tensorboard and files is not None,
                       purge_step=0 if self.cfg.output.resume else None)

  @contextlib.contextmanager
  def signals(self, ckpt):
    """With a checkpoint to write, the first SIGINT / SIGTERM stops the run at the end of
    the chunk of rounds it arrives in, saving that state; a second one stops at once."""
    stop_softly = (interrupts.graceful(
        f"[{self.name}] stopping at the end of this chunk of rounds to save it (a second "
        "Ctrl-C / SIGTERM stops at once)") if ckpt is not None else contextlib.nullcontext())
    with interrupts.handle_interrupts(), stop_softly:
      yield

  def run(self, state, host, lengths):
    return _simulate(self.cfg, self.setup, self.ecfg, self.runner, state, host, self.quiet,
                     lengths)

  def diverged(self, e, host, ckpt):
    return _diverged(e, self.cfg, self.name, self.setup, self.runner, host, ckpt)

  def interrupted(self, e, state, host, ckpt):
    """A callback's stop: the result so far; a signal: ``Interrupted`` naming the
    checkpoint, raised after the summary when the run had done its last round."""
    cfg, name, done = self.cfg, self.name, len(host.rows)
    if isinstance(e, loop.EarlyStop):
      if not self.quiet:
        console.say(f"[{name}] stopped by a callback after round {int(e.state.round)}/"
                    f"{cfg.run.rounds}")
      return lifecycle.Ending(e.state, stopped_early=True)
    if done < cfg.run.rounds:
      raise _interrupted(e, cfg, name, done, ckpt) from None
    # in its last chunk: the run is complete, and its summary is written
    return lifecycle.Ending(state, error=_interrupted(e, cfg, name, done, ckpt, self.among,
                                                      self.files))

  def summary(self, rows, wall, state, stopped_early_at):
    return _summary(self.cfg, self.name, self.fed_data, self.model, self.setup, rows, wall,
                    stopped_early_at)


def _progress(cfg: RunConfig, name: str, setup, quiet: bool, start_round: int, position,
              overall):
  """(engine config with the progress tick, ``Progress``) of a run."""
  progress = Progress(name, cfg.run.rounds, start_round, position=position, overall=overall,
                      every=log_interval(cfg.output.log_every, cfg.run.rounds),
                      health=HealthWatch(name, setup.algorithm.name))
  ecfg = setup.run_ecfg
  # A line from inside a compiled chunk only where chunks may run long (fixed lengths:
  # several processes). A program without that host callback is kept in JAX's
  # persistent compilation cache (one with it is not): a second run compiles nothing.
  if not quiet and not loop.chunks_timed():
    ecfg = dataclasses.replace(ecfg, progress=progress.tick)
  return ecfg, progress


def _summary(cfg: RunConfig, name: str, fed_data, model, setup, rows, wall: float,
             stopped_early_at: Optional[int]) -> dict:
  """The run's summary (summary.json).

  Args:
    cfg: the run's configuration.
    name: the algorithm's name.
    fed_data: its data.
    model: ``(name, w0, apply_flat)``.
    setup: the run's ``_Setup``.
    rows: its metrics rows.
    wall: its wall time (s).
    stopped_early_at: the round a callback stopped it at (None: it ran to the end).
  """
  summary = summarize(rows, setup.tl, name=name, dataset=fed_data.name, model=model[0],
                      num_params=int(np.size(model[1])), rounds=cfg.run.rounds, wall=wall,
                      config=dict(config_dict(cfg), **own_columns(cfg, name)),
                      target=cfg.run.target_accuracy)
  if stopped_early_at is not None:
    summary["stopped_early_at_round"] = stopped_early_at
  if cfg.crypto.secure_aggregation == "ckks":
    from fedjax_async.crypto import secure_engine  # pylint: disable=g-import-not-at-top
    summary["ckks_security"] = ckks_security(cfg.crypto.ckks_preset)
    summary["bytes_measured"] = "on the wire (OpenFHE's binary serialisation)"
    summary["server_views"] = secure_engine.server_views(cfg.crypto.ckks_design)
  summary.update(privacy_fields(setup.algorithm, setup.hp, fed_data.num_clients, rows))
  return summary



def privacy_fields(algorithm, hp: dict, num_clients: int, rows: Sequence[dict]) -> dict:
  """``{"privacy": ...}``, the (epsilon, delta) a DP-FedAvg run spent over its ``rows``'
  rounds (``dp_fedavg.report``), for its summary; ``{}`` for a non-private ``algorithm``."""
  if not dp_fedavg.is_private(algorithm):
    return {}
  return {"privacy": dp_fedavg.report(hp, num_clients, len(rows))}


class _Setup(NamedTuple):
  """One algorithm's run, built: its timeline, engine configuration and placed state."""
  algorithm: Any
  apply_flat: Callable
  tl: timeline_lib.Timeline  # unpadded, for the summary
  run_tl: timeline_lib.Timeline  # padded to the devices
  run_ecfg: engine.EngineConfig
  data: engine.DeviceData
  hp: dict  # the traced hyper-parameters (``RunConfig.hparams``)
  state: engine.SimState  # the initial state, placed
  place: Callable  # state -> (ecfg, tl, placed state, data): sharding.shard_clients
  initial: Callable[[], engine.SimState]  # a fresh initial state, placed


def _setup(cfg: RunConfig, name: str, fed_data, model) -> _Setup:
  _, w0, apply_flat = model
  algorithm = server_optimizers.configured(algorithms.get(name, cfg.algorithm.admm_upload),
                                           cfg.algorithm)
  tl = timeline_lib.build(fed_data.num_clients, cfg.run.rounds, cfg.run.participation, cfg.delay,
                          cfg.run.seed)
  ecfg = engine.EngineConfig(
      local_config(cfg, fed_data),
      cfg.delay.ring_size,
      drop_nonfinite=cfg.algorithm.drop_nonfinite_uploads,
      client_chunk=(engine.auto_client_chunk(int(np.size(w0))) if cfg.run.client_chunk < 0
                    else cfg.run.client_chunk or None))
  # The engine's view: clients split over the devices (K padded to a multiple of their
  # number; with several, each device gets only its slices of the host arrays).
  devices = sharding.select_devices(cfg.run.devices)
  # a natural data set on one device: each chunk of rounds' own clients (core.streaming)
  streamed = (len(devices) == 1 and cfg.crypto.secure_aggregation == "none"
              and streaming.streams(fed_data))
  data = (streaming.StreamedData(fed_data) if streamed else
          engine.DeviceData.from_federated(fed_data) if len(devices) == 1 else
          engine.DeviceData(*(np.asarray(a) for a in (fed_data.x, fed_data.y, fed_data.counts,
                                                      fed_data.test_x, fed_data.test_y))))
  place = lambda s: sharding.shard_clients(ecfg, tl, s, data, devices, cfg.run.client_data)
  initial = lambda: engine.init_state(algorithm, w0, fed_data.num_clients, ecfg.ring_size,
                                      cfg.run.seed)
  run_ecfg, run_tl, state, data = place(initial())  # (place then reuses the placed data)
  hp = cfg.hparams(algorithm, fed_data.num_clients)
  return _Setup(algorithm, apply_flat, tl, run_tl, run_ecfg, data, hp, state, place,
                lambda: place(initial())[2])


def _simulate(cfg: RunConfig, setup: _Setup, ecfg, runner, state, host, quiet: bool,
              lengths: Optional[loop.ChunkLengths] = None):
  """The rounds from ``state`` on: the round engine (``runner``, chunks of ``lengths``),
  or the encrypted server's loop."""
  if cfg.crypto.secure_aggregation == "ckks":
    return host_server.run_encrypted_rounds(
        setup.apply_flat, setup.algorithm, ecfg, state, setup.run_tl,
        setup.hp,
        setup.data, preset=cfg.crypto.ckks_preset, min_depth=cfg.crypto.ckks_min_depth,
        min_scale=cfg.crypto.ckks_min_scale, design=cfg.crypto.ckks_design, on_chunk=host,
        eval_every=cfg.run.eval_every,
        stream=io.StringIO() if quiet else sys.stdout)[0]
  return engine.run_rounds(runner, state, setup.run_tl, setup.hp,
                         setup.data,
                         eval_every=cfg.run.eval_every, rounds_per_call=cfg.run.rounds_per_call,
                         on_chunk=host, lengths=lengths)[0]


def _diverged(e: engine.Diverged, cfg: RunConfig, name: str, setup: _Setup, runner, host,
              ckpt):
  """Checkpoints the last finite state (the host loop wrote the finite rows of the chunk
  that diverged); the ``engine.Diverged`` to raise, naming the round, the algorithm and that
  checkpoint."""
  if (ckpt is not None and cfg.crypto.secure_aggregation == "none" and e.round is not None
      and e.round - 1 > ckpt.last_saved):
    # The last finite state (after round e.round - 1): the newest checkpoint's state, or
    # the initial one, run on to it (its chunk's state was donated to XLA).
    start = setup.initial()
    if ckpt.latest is not None:
      start = setup.place(jax.tree.map(
          jnp.asarray, ckpt.manager.restore(start, ckpt.latest).state))[2]
    finite, _ = engine.run_rounds(runner, start, setup.run_tl, setup.hp,
                                setup.data,
                                eval_every=cfg.run.eval_every, stop_round=e.round - 1,
                                rounds_per_call=cfg.run.rounds_per_call)
    host.save(finite)
  rows = host.metrics.rows
  last = ckpt.latest if ckpt is not None else None
  where = f"; metrics.jsonl holds rounds 1-{len(rows)}" if rows else ""
  where += (f"; last finite checkpoint: round {last} under {ckpt.directory}"
            if last is not None else "; no checkpoint was written")
  history = list(rows) + ([e.row] if e.row is not None else [])
  return engine.Diverged(f"algorithm {name}: {e}{where}; "
                         f"{divergence.advice(setup.data, history)}",
                         e.round, kind=e.kind, row=e.row)


def _interrupted(e: KeyboardInterrupt, cfg: RunConfig, name: str, rounds_done: int,
                 ckpt, position: Optional[tuple] = None,
                 out_dir: Optional[str] = None) -> Interrupted:
  """The ``Interrupted`` of a stopped run, naming the round and the checkpoint to resume
  from; of a run stopped after its last round (complete, summary written), saying so."""
  signum = getattr(e, "signum", signal.SIGINT)
  if rounds_done >= cfg.run.rounds:
    where = (f" ({os.path.join(out_dir, 'summary.json')} written)" if out_dir is not None
             else "")
    rest = ("; rerun the same command with output.resume to run the algorithms after it"
            if position is not None and position[0] < position[1] else "")
    return Interrupted(f"[{name}] interrupted after its last round "
                       f"({cfg.run.rounds}/{cfg.run.rounds}): the run is complete{where}"
                       f"{rest}", signum)
  at = f"[{name}] interrupted at round {rounds_done + 1}/{cfg.run.rounds}"
  if ckpt is not None and ckpt.latest is not None:
    how = (f"the last checkpoint is round {ckpt.latest} in {ckpt.directory}: rerun the "
           "same command with output.resume to continue")
  elif cfg.output.checkpoint_every > 0:
    how = (f"no checkpoint yet (one every {cfg.output.checkpoint_every} rounds): rerun the same "
           "command with output.resume to start it again")
  else:
    how = ("no checkpoint (output.checkpoint_every=0): rerun the same command with output.resume "
           "to start it again")
  return Interrupted(f"{at}; {how}", signum)


def summarize(rows: List[dict], tl: timeline_lib.Timeline, *, name: str, dataset: str,
              model: str, num_params: int, rounds: int, wall: float, config: dict,
              target: float = 0.0) -> dict:
  """summary.json of one run from its metrics rows and timeline; the rows without their
  bytes up and down get them (float32 messages of ``num_params``: ``metrics.add_round_bytes``)
  and the summary their totals.

  Args:
    rows: the run's metrics rows.
    tl: its timeline.
    name: the algorithm's name.
    dataset: the data set's name.
    model: the model's name.
    num_params: the model's parameter count.
    rounds: the rounds run.
    wall: the run's wall time, seconds.
    config: the run's configuration, as a dict.
    target: run.target_accuracy (0: none): the rounds to it (``metrics.rounds_to_target``).
  """
  accs = [r["test_accuracy"] for r in rows]
  delayed_mask = tl.valid & ~tl.online
  metrics_lib.add_round_bytes(rows, tl.valid.sum(1), tl.sampled, num_params * 4)
  return {
      "algorithm": name, "seed": config.get("seed"),
      "data_seed": outputs.data_seed_of({"config": config}),
      "dataset": dataset, "model": model, "num_params": num_params, "rounds": rounds,
      **metrics_lib.accuracy_summary(accs), "wall_time_s": wall,
      "updates_dropped": int(tl.dropped.sum()), "updates_in_flight_at_end": tl.in_flight_at_end,
      "delayed_updates": int(sum(r["delayed"] for r in rows)),
      "mean_staleness_of_delayed": float(np.mean(tl.staleness()[delayed_mask]))
      if np.any(delayed_mask) else 0.0,
      "config": config, **metrics_lib.rounds_to_target(rows, target),
      **metrics_lib.bytes_totals(rows),
  }


