"""One algorithm's run on the round engine: data and model from a ``RunConfig``, the host
loop around ``engine.simulate`` (checkpoints, ``output.resume``, divergence, interrupts,
metrics rows, TensorBoard, progress lines) and its summary.

The path of a parameter: flag (``cli.define_run_flags``) -> ``RunConfig`` field
(``cli.config_from_flags``, validated by ``config.validate``) -> ``hparams`` dict / static
``EngineConfig`` / ``timeline.DelayConfig`` -> ``engine.run_chunk``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import sys
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import algorithms
from fedjax_async.algorithms import server_optimizers
from fedjax_async import client as client_lib
from fedjax_async.rounds import engine
from fedjax_async import interrupts
from fedjax_async import loop
from fedjax_async import metrics as metrics_lib
from fedjax_async import results
from fedjax_async import distributed
from fedjax_async import sharding
from fedjax_async.rounds import timeline as timeline_lib

from fedjax_async.config import RunConfig, config_dict, mismatch_flags, run_config_for
from fedjax_async.interrupts import Interrupted
from fedjax_async import outputs
from fedjax_async.outputs import TensorBoard, ckks_security, prepare_output_dir


def load_data(cfg: RunConfig):
  from fedjax_async import data as data_lib  # pylint: disable=g-import-not-at-top
  d = cfg.data
  return data_lib.load(d.dataset, partition=d.partition, num_clients=d.num_clients,
                       alpha=d.dirichlet_alpha, shards_per_client=d.shards_per_client,
                       seed=cfg.run.seed, data_dir=d.data_dir, data_source=d.data_source,
                       normalize=d.normalize)


def build_model(cfg: RunConfig, fed_data):
  """(name, flat initial weights, apply); a ValueError names model.name."""
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  input_shape = tuple(fed_data.x.shape[2:])
  try:
    name = (models.default_model_for(cfg.data.dataset) if cfg.model.name == "auto"
            else cfg.model.name)
    model = models.get_model(name, fed_data.num_classes, input_shape)
  except ValueError as e:
    raise ValueError(f"model.name: {e} (data.dataset={cfg.data.dataset})") from None
  w0, apply_flat = models.flat_model(model, input_shape, jax.random.PRNGKey(cfg.run.seed))
  # the same apply for the same model: later runs reuse its compiled rounds (make_runner)
  apply_flat = _APPLY.setdefault((name, fed_data.num_classes, input_shape), apply_flat)
  return name, w0, apply_flat


_APPLY = {}


class Overall:
  """The rounds still to run over the algorithms of one invocation, for an ETA over all of
  them: the current run's ETA, plus the later runs' rounds at the current run's steady
  seconds per round, plus for each later run the start-up (compilation, first chunk) that
  the runs so far took beyond their steady rounds."""

  def __init__(self, count: int, rounds: int):
    self.count, self.rounds, self.left = count, rounds, count * rounds
    self.startups: List[float] = []

  def skip(self, rounds: int):
    """Rounds a resumed run does not run again."""
    self.left -= rounds

  def advance(self, rounds: int):
    self.left -= rounds

  def startup(self, seconds: float):
    """A run's first chunk took ``seconds`` more than its rounds at the steady rate."""
    self.startups.append(max(seconds, 0.0))

  def eta(self, current_eta: float, current_left: int, per_round: float) -> float:
    later = max(self.left - current_left, 0)
    startup = sum(self.startups) / len(self.startups) if self.startups else 0.0
    return current_eta + later * per_round + -(-later // max(self.rounds, 1)) * startup


def log_interval(log_every: int, rounds: int) -> int:
  """Rounds between console lines: ``log_every``, or for 0 about ten lines per run."""
  return log_every if log_every > 0 else max(1, -(-rounds // 10))


class Progress:
  """A console line every ``every`` rounds, at the last round, and for the last round of
  a chunk that comes back ``max_silence`` seconds or more after the previous line:
  accuracy, arrivals, staleness, and on a chunk's last line the steady rounds/s and ETA.

  The first chunk's time holds the compilation, so the rate is measured from the end of
  the first chunk on (remaining rounds x seconds per round of the chunks since); until a
  second chunk is back the line says "ETA after the first steady chunk". With
  ``position`` = (i, n), i.e. algorithm i of n in one invocation, the lines say so and,
  with ``overall``, the ETA of all n runs follows this run's. ``clock``: the time in
  seconds (tests pass a fake one)."""

  MAX_SILENCE = 10.0  # seconds without a line before one from inside a chunk

  def __init__(self, name: str, total: int, start: int = 0, stream=None,
               position: Optional[tuple] = None, overall: Optional[Overall] = None,
               every: int = 1, max_silence: Optional[float] = None,
               clock: Optional[Callable[[], float]] = None):
    self.name, self.total, self.stream = name, total, stream
    self.clock = clock or time.perf_counter
    self.t0, self.start = self.clock(), start
    self.position, self.overall = position, overall
    self.last = start
    self.every = max(1, int(every))
    self.max_silence = self.MAX_SILENCE if max_silence is None else max_silence
    self.last_line = self.t0
    self.steady = None  # (time, rounds done) when the first chunk came back
    self.first_chunk = None  # (seconds, rounds) of the first chunk

  def _print(self, line: str):
    print(line, file=self.stream or sys.stdout)

  def per_round(self, done: int, now: float) -> Optional[float]:
    """Seconds per round over the chunks after the first; None before one is back."""
    if self.steady is None or done <= self.steady[1]:
      return None
    return (now - self.steady[0]) / (done - self.steady[1])

  def tick(self, rounds_done):
    """From inside a compiled chunk (``EngineConfig.progress``): a line when none came for
    ``max_silence`` seconds, so a long chunk of rounds shows that it runs. It names the
    chunk's first round, as its rounds' own lines follow when the chunk returns."""
    now = self.clock()
    if now - self.last_line < self.max_silence:
      return
    done = int(rounds_done)
    spr = self.per_round(done, now)
    eta = (f" | {1 / max(spr, 1e-9):.2f} rounds/s ETA {(self.total - done) * spr:.0f}s"
           if spr is not None else "")
    self._print(f"[{self.name}] compiled chunk from round {self.last + 1} running: "
                f"{done - self.last} of its rounds done{eta}")
    (self.stream or sys.stdout).flush()
    self.last_line = now

  def _timing(self, done: int, now: float) -> str:
    """`` | r rounds/s ETA s`` (and all algorithms' ETA), or the wait for a steady chunk."""
    if self.steady is None:  # the first chunk (with the compilation) is back
      self.steady, self.first_chunk = (now, done), (now - self.t0, done - self.start)
    spr = self.per_round(done, now)
    if spr is None:
      return " | ETA after the first steady chunk" if done < self.total else ""
    eta = (self.total - done) * spr
    tail = ""
    if self.overall is not None and self.overall.count > 1:
      if self.first_chunk is not None:  # once per run: its start-up beyond steady rounds
        self.overall.startup(self.first_chunk[0] - self.first_chunk[1] * spr)
        self.first_chunk = None
      tail = (f", all {self.overall.count} algorithms "
              f"{self.overall.eta(eta, self.total - done, spr):.0f}s")
    return f" | {1 / max(spr, 1e-9):.2f} rounds/s ETA {eta:.0f}s{tail}"

  def __call__(self, rows: List[dict]):
    """The lines of a chunk's rows (one per round, in order, after the rounds so far)."""
    now = self.clock()
    first, done = self.last + 1, self.last + len(rows)
    where = ""
    if self.position is not None and self.position[1] > 1:
      where = f" algorithm {self.position[0]}/{self.position[1]}"
    if self.overall is not None:
      self.overall.advance(done - self.last)
    self.last = done
    timing = self._timing(done, now)
    due = [(first + i, r) for i, r in enumerate(rows)
           if (first + i) % self.every == 0 or first + i == self.total or (
               i == len(rows) - 1 and now - self.last_line >= self.max_silence)]
    for i, (t, r) in enumerate(due):
      acc = "  -   " if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
      # The rate and ETA on the chunk's last line: its earlier rounds were not timed.
      self._print(f"[{self.name}]{where} round {t:4d}/{self.total} acc {acc} "
                  f"train_loss {r['train_loss']:.4f} online {r['online']} delayed "
                  f"{r['delayed']} dropped {r['dropped']} staleness "
                  f"{r['mean_staleness']:.2f}{timing if i == len(due) - 1 else ''}")
      self.last_line = now
    (self.stream or sys.stdout).flush()


class CompileTimer:
  """``runner`` (a jitted chunk) compiled ahead of its first call for each new argument
  shape, saying so: the first chunk of a run is mostly compilation and would otherwise be
  silent for seconds to minutes. The compiled program is the one ``jit`` would run."""

  def __init__(self, runner, name: str, stream=None):
    self.runner, self.name, self.stream = runner, name, stream
    self.compiled = getattr(runner, "compiled", {})  # shared by a kept runner's runs

  def __call__(self, *args):
    key = jax.tree_util.tree_structure(args), tuple(
        (np.shape(x), str(getattr(x, "dtype", type(x))), getattr(x, "sharding", None))
        for x in jax.tree_util.tree_leaves(args))
    fn = self.compiled.get(key)
    if fn is None:
      rounds = np.shape(args[2])[0]  # the chunk's eval schedule: one entry per round
      print(f"[{self.name}] compiling the round program ({rounds} rounds per call) ...",
            file=self.stream or sys.stdout, flush=True)
      t0 = time.perf_counter()
      fn = self.compiled[key] = self.runner.lower(*args).compile()
      print(f"[{self.name}] compiled in {time.perf_counter() - t0:.1f} s",
            file=self.stream or sys.stdout, flush=True)
    getattr(self.runner, "activate", lambda: None)()
    return fn(*args)


Run = results.Run  # (summary, rows, state, model)


def run_one(cfg: RunConfig, name: str, fed_data=None, model=None, out_dir=None,
            quiet: bool = False, position: Optional[tuple] = None,
            overall: Optional[Overall] = None) -> dict:
  """``run(...).summary``."""
  return run(cfg, name, fed_data, model, out_dir, quiet, position, overall).summary


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
  """
  if out_dir is None and cfg.output.output_dir is not None:
    out_dir = os.path.join(cfg.output.output_dir, name)
  quiet = quiet or cfg.output.quiet
  if out_dir is not None:
    prepare_output_dir(out_dir, cfg.output.resume, cfg.output.overwrite)
  fed_data = load_data(cfg) if fed_data is None else fed_data
  model = build_model(cfg, fed_data) if model is None else model
  writes = out_dir is not None and distributed.is_main()  # process 0 writes the files
  if writes:
    os.makedirs(out_dir, exist_ok=True)
  setup = _setup(cfg, name, fed_data, model)
  ckpt, state, resumed = _resume(cfg, name, out_dir, setup, quiet)
  start_round = int(state.round)
  if start_round < cfg.run.rounds and distributed.is_main():  # what it will take, first
    from fedjax_async import cost  # pylint: disable=g-import-not-at-top
    cost.announce(cost.round_engine(cfg, fed_data, model), cost.ROUND_ENGINE_SMALLER, name)
  if overall is not None:
    overall.skip(start_round)
  progress = Progress(name, cfg.run.rounds, start_round, position=position, overall=overall,
                      every=log_interval(cfg.output.log_every, cfg.run.rounds))
  ecfg = setup.run_ecfg
  if not quiet:  # a line from inside a long compiled chunk of rounds
    ecfg = dataclasses.replace(ecfg, progress=progress.tick)
  # A resumed run rewrites TensorBoard like metrics.jsonl: every step of the earlier
  # event files is purged (session restart at step 0), the restored rows written again.
  metrics = loop.MetricsFile(
      os.path.join(out_dir, "metrics.jsonl") if writes else None,
      resumed.rows if resumed else (),
      TensorBoard(out_dir, cfg.output.tensorboard and writes,
                  purge_step=0 if cfg.output.resume else None))
  host = loop.HostLoop(metrics, ckpt, lambda st: int(st.round),
                       None if quiet else progress,
                       resumed.wall_before if resumed else 0.0, callbacks)
  # With a checkpoint to write, the first SIGINT / SIGTERM stops the run at the end of
  # the chunk of rounds it arrives in, saving that state; a second one stops at once.
  stop_softly = (interrupts.graceful(
      f"[{name}] stopping at the end of this chunk of rounds to save it (a second "
      "Ctrl-C / SIGTERM stops at once)") if ckpt is not None else contextlib.nullcontext())
  runner = engine.make_runner(setup.apply_flat, setup.algorithm, ecfg)
  if not quiet and start_round < cfg.run.rounds:
    runner = CompileTimer(runner, name)
  stopped_early = False
  try:
    with stop_softly:
      state = _simulate(cfg, setup, ecfg, runner, state, host, quiet)
  except loop.EarlyStop as e:  # a callback ended the run: its result so far
    state, stopped_early = e.state, True
    if not quiet:
      print(f"[{name}] stopped by a callback after round {int(state.round)}/{cfg.run.rounds}",
            flush=True)
  except engine.Diverged as e:
    _diverged(e, cfg, name, setup, runner, host, ckpt)
  except KeyboardInterrupt as e:
    raise _interrupted(e, cfg, name, len(metrics.rows), ckpt) from None
  finally:
    metrics.close()
    if ckpt is not None:
      ckpt.close()
  rows = metrics.rows
  summary = summarize(rows, setup.tl, name=name, dataset=fed_data.name, model=model[0],
                      num_params=int(np.size(model[1])), rounds=cfg.run.rounds, wall=host.wall(),
                      config=config_dict(cfg))
  if stopped_early:
    summary["stopped_early_at_round"] = int(state.round)
  if cfg.crypto.secure_aggregation == "ckks":
    summary["ckks_security"] = ckks_security(cfg.crypto.ckks_preset)
  if writes:
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return Run(summary, rows, state, model)


def _resume(cfg: RunConfig, name: str, out_dir: Optional[str], setup: "_Setup",
            quiet: bool):
  """(checkpoints or None, the state to start from, the restored checkpoint or None)."""
  ckpt = None
  if out_dir is not None and (cfg.output.checkpoint_every > 0 or cfg.output.resume):
    ckpt = loop.Checkpoints(os.path.join(out_dir, "checkpoints"), run_config_for(cfg, name),
                            every=cfg.output.checkpoint_every, total=cfg.run.rounds,
                            resume=cfg.output.resume,
                            mismatch=mismatch_flags, keep=cfg.output.keep_checkpoints)
  state, resumed = setup.state, None
  if ckpt is not None:
    # A larger run.rounds extends the run: its timeline's first rounds are the same draws.
    extends = lambda saved, bad: ([b.split("=")[0] for b in bad] == ["run.rounds"]
                                  and int(saved["rounds"]) < cfg.run.rounds)
    resumed = ckpt.restore(state, extends)
  if resumed is not None:
    state = setup.place(jax.tree.map(jnp.asarray, resumed.state))[2]
    if not quiet:
      more = (f", extending its {resumed.config['rounds']} rounds to {cfg.run.rounds}"
              if int(resumed.config["rounds"]) < cfg.run.rounds else "")
      print(f"[{name}] resuming from the checkpoint of round {resumed.position} "
            f"({ckpt.directory}){more}", flush=True)
  elif cfg.output.resume and not quiet and ckpt is not None:
    print(outputs.name_fields(f"[{name}] output.resume: no checkpoint under "
                              f"{ckpt.directory}, starting fresh"),
          flush=True)
  return ckpt, state, resumed


class _Setup(NamedTuple):
  """One algorithm's run, built: its timeline, engine configuration and placed state."""
  algorithm: Any
  apply_flat: Callable
  tl: timeline_lib.Timeline  # unpadded, for the summary
  run_tl: timeline_lib.Timeline  # padded to the devices
  run_ecfg: engine.EngineConfig
  data: engine.DeviceData
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
      client_lib.LocalConfig(cfg.local.batch_size, cfg.local.local_epochs, fed_data.max_examples,
                             cfg.local.random_local_epochs, momentum=cfg.local.momentum > 0,
                             local_steps=cfg.local.local_steps,
                             precision=cfg.local.precision),
      cfg.delay.ring_size,
      client_chunk=(engine.auto_client_chunk(int(np.size(w0))) if cfg.run.client_chunk < 0
                    else cfg.run.client_chunk or None))
  # The engine's view: clients split over the devices (K padded to a multiple of their
  # number; with several, each device gets only its slices of the host arrays).
  devices = sharding.select_devices(cfg.run.devices)
  data = (engine.DeviceData.from_federated(fed_data) if len(devices) == 1 else
          engine.DeviceData(fed_data.x, fed_data.y, fed_data.counts, fed_data.test_x,
                            fed_data.test_y))
  place = lambda s: sharding.shard_clients(ecfg, tl, s, data, devices, cfg.run.client_data)
  initial = lambda: engine.init_state(algorithm, w0, fed_data.num_clients, ecfg.ring_size,
                                      cfg.run.seed)
  run_ecfg, run_tl, state, data = place(initial())  # (place then reuses the placed data)
  return _Setup(algorithm, apply_flat, tl, run_tl, run_ecfg, data, state, place,
                lambda: place(initial())[2])


def _simulate(cfg: RunConfig, setup: _Setup, ecfg, runner, state, host, quiet: bool):
  """The rounds from ``state`` on: the round engine (``runner``), or the encrypted
  server's loop."""
  if cfg.crypto.secure_aggregation == "ckks":
    from fedjax_async.crypto import secure_engine  # pylint: disable=g-import-not-at-top
    return secure_engine.simulate(
        setup.apply_flat, setup.algorithm, ecfg, state, setup.run_tl,
        cfg.hparams(setup.algorithm),
        setup.data, preset=cfg.crypto.ckks_preset, min_depth=cfg.crypto.ckks_min_depth,
        min_scale=cfg.crypto.ckks_min_scale, design=cfg.crypto.ckks_design, on_chunk=host,
        eval_every=cfg.run.eval_every,
        stream=io.StringIO() if quiet else sys.stdout)[0]
  return engine.simulate(runner, state, setup.run_tl, cfg.hparams(setup.algorithm),
                         setup.data,
                         eval_every=cfg.run.eval_every, rounds_per_call=cfg.run.rounds_per_call,
                         on_chunk=host)[0]


def _diverged(e: engine.Diverged, cfg: RunConfig, name: str, setup: _Setup, runner, host,
              ckpt):
  """Checkpoints the last finite state (the host loop wrote the finite rows of the chunk
  that diverged) and raises ``engine.Diverged`` naming the round, the algorithm and that
  checkpoint."""
  if (ckpt is not None and cfg.crypto.secure_aggregation == "none" and e.round is not None
      and e.round - 1 > ckpt.last_saved):
    # The last finite state (after round e.round - 1): the newest checkpoint's state, or
    # the initial one, run on to it (its chunk's state was donated to XLA).
    start = setup.initial()
    if ckpt.latest is not None:
      start = setup.place(jax.tree.map(
          jnp.asarray, ckpt.manager.restore(start, ckpt.latest).state))[2]
    finite, _ = engine.simulate(runner, start, setup.run_tl, cfg.hparams(setup.algorithm),
                                setup.data,
                                eval_every=cfg.run.eval_every, stop_round=e.round - 1,
                                rounds_per_call=cfg.run.rounds_per_call)
    host.save(finite)
  rows = host.metrics.rows
  last = ckpt.latest if ckpt is not None else None
  where = f"; metrics.jsonl holds rounds 1-{len(rows)}" if rows else ""
  where += (f"; last finite checkpoint: round {last} under {ckpt.directory}"
            if last is not None else "; no checkpoint was written")
  raise engine.Diverged(f"algorithm {name}: {e}{where}; a smaller local.lr or algorithm.server_lr "
                        "(PAFed: algorithm.alpha0/1/2) usually avoids it", e.round) from None


def _interrupted(e: KeyboardInterrupt, cfg: RunConfig, name: str, rounds_done: int,
                 ckpt) -> Interrupted:
  """The ``Interrupted`` of a stopped run, naming the round and the checkpoint to resume
  from."""
  signum = getattr(e, "signum", signal.SIGINT)
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
              model: str, num_params: int, rounds: int, wall: float, config: dict) -> dict:
  """summary.json of one run from its metrics rows and timeline."""
  accs = [r["test_accuracy"] for r in rows]
  delayed_mask = tl.valid & ~tl.online
  return {
      "algorithm": name, "dataset": dataset, "model": model,
      "num_params": num_params, "rounds": rounds,
      **metrics_lib.accuracy_summary(accs), "wall_time_s": wall,
      "updates_dropped": int(tl.dropped.sum()), "updates_in_flight_at_end": tl.in_flight_at_end,
      "delayed_updates": int(sum(r["delayed"] for r in rows)),
      "mean_staleness_of_delayed": float(np.mean(tl.staleness()[delayed_mask]))
      if np.any(delayed_mask) else 0.0,
      "config": config,
  }


