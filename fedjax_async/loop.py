"""The host side of a run, written once: checkpoints and resumption, the metrics file and
what happens between two compiled chunks.

Each driver's compiled loop calls ``on_chunk(state, rows)`` after every chunk: the round
engine (``rounds.engine.run_rounds``, driven by ``rounds.experiment.run``), the virtual
clock (``asynchronous.engine.run_arrivals``, driven by ``asynchronous.experiment``), FedEDS
(``fededs.run``, driven by ``fededs.experiment``) and a sweep's vmapped computations
(``sweeps.store.SweepLoop``). ``HostLoop`` is that callback: a list of ``Callback``s
run in order (after pfl-research's ``run`` and its callbacks), built for the three
engines by ``host_loop`` (its metrics file, a resumed run's rows and wall time):

* ``MetricsFile``: ``metrics.jsonl`` (and TensorBoard), the restored rows rewritten
  first, then each chunk's rows, flushed;
* ``Checkpoints``: orbax checkpoints every k rounds (or groups), at the end, and at a
  signal; with ``resume`` the latest one is restored after its configuration was
  compared with this run's (a ValueError naming the flags that differ, or the folder that
  cannot be read and the checkpoint to fall back to);
* ``StopOnDivergence`` (the chunk's rows up to the first non-finite one written, then
  ``engine.Diverged``), ``WriteMetrics``, ``CheckSignals``, the caller's callbacks,
  ``SaveCheckpoints``, ``Report`` (progress lines) and ``StopOnSignal``: a SIGINT /
  SIGTERM received by any process stops every process after the same chunk, after its
  checkpoint (``distributed.any_process``); within the callbacks a first signal is only
  recorded, so that the chunk's checkpoint is written before the stop.

A signal is answered at the end of a chunk: ``ChunkLengths`` keeps chunks of steady
running near ``CHUNK_SECONDS``, and ``call`` lets the signal's handler run while one
computes (its notice printed at once).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import jax

from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import console
from fedjax_async import distributed
from fedjax_async import interrupts
from fedjax_async.config import ConfigError
from fedjax_async.core import divergence
from fedjax_async.outputs import TensorBoard, json_row


# Seconds of steady running a compiled chunk of rounds (or groups) aims at: the first
# Ctrl-C / SIGTERM is answered at the end of the chunk it arrives in.
CHUNK_SECONDS = 1.0


class ChunkLengths:
  """The length of each compiled chunk of rounds (or groups): ``most`` (run.rounds_per_call)
  or, with ``seconds``, fewer where a chunk of ``most`` would run longer than about that,
  so that a signal (answered at a chunk's end) is answered within about ``seconds`` of
  steady running; at least one round, so a round longer than that is answered at its end.
  The first chunk has ``first`` (from the run's cost estimate; default ``most``); later
  lengths follow the measured seconds per round. Lengths divide ``most`` and a chunk does
  not cross a multiple of ``most`` (``next``'s ``position``), so the chunks of ``most``
  end where they did (``Checkpoints``' ``grid``: checkpoints do not depend on timing);
  changed by a factor of 2 or more (each new length compiles once). Results do not depend
  on the lengths (one compiled round, scanned). Fixed at ``most`` without ``seconds`` and
  across processes (they must agree on every chunk)."""

  def __init__(self, most: int, seconds: Optional[float] = None, first: Optional[int] = None):
    self.most = max(1, int(most))
    self.seconds = seconds if seconds and chunks_timed() else None
    self.length = self.most if first is None or self.seconds is None else self._fit_count(first)
    self.last = 0  # the length of the last chunk handed out

  def _fit_count(self, k: int) -> int:
    """The largest divisor of ``most`` that is <= ``k`` (at least 1)."""
    k = max(1, min(int(k), self.most))
    return max(d for d in range(1, k + 1) if self.most % d == 0)

  def fit(self, seconds_per_round: float) -> int:
    """The length whose chunk runs about ``seconds`` at ``seconds_per_round``."""
    return self._fit_count(int(self.seconds / max(seconds_per_round, 1e-9)))

  def next(self, left: int, position: Optional[int] = None) -> int:
    """The next chunk's length, ``left`` rounds (or groups) to go, from ``position`` (the
    chunk then ends at the next multiple of ``most`` at the latest)."""
    n = min(self.length, left)
    if position is not None:
      n = min(n, self.most - position % self.most)
    self.last = max(1, n)
    return self.last

  def ran(self, n: int, seconds: float, compiled: bool = False):
    """A chunk of ``n`` ran ``seconds`` (its compilation left out: ``call``). A chunk that
    ``compiled`` only shortens the next ones (its compile time may be counted twice)."""
    if self.seconds is None or n < self.length:  # (the last, shorter chunk)
      return
    want = self.fit(seconds / n)
    if ((want < self.length and seconds > 1.5 * self.seconds)
        or (want >= 2 * self.length and seconds < self.seconds / 4 and not compiled)):
      self.length = want


def chunks_timed() -> bool:
  """Whether ``ChunkLengths`` sizes the chunks by their measured time (one process): each
  then ends within about ``CHUNK_SECONDS`` (or one round), with its progress lines.
  Several processes run fixed lengths (``run.rounds_per_call``), which may run long."""
  return jax.process_count() == 1


def first_length(estimate, count: int) -> int:
  """The first chunk's length: the rounds (or groups) whose floating-point work, by a
  ``cost.Cost`` ``estimate`` for ``count`` of them, fits in ``CHUNK_SECONDS`` (the
  estimate's fixed seconds a step, a guess for small runs, are left out)."""
  seconds = estimate.flops / estimate.device.flops_per_second / max(count, 1)
  return int(CHUNK_SECONDS / max(seconds, 1e-9))


_compiling = [0.0]  # seconds spent compiling so far (jax's compile events)


def _count_compilation(event: str, seconds: float, **_):
  if event.startswith("/jax/core/compile/"):  # tracing, lowering, compiling (or the cache)
    _compiling[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_count_compilation)


def call(fn: Callable, *args):
  """``(fn(*args), seconds, compiled)``: ``fn`` (a compiled chunk) run in a helper thread
  until its arrays are computed, the seconds that took without compilation, and whether
  it compiled. Meanwhile the main thread waits in short naps, so that a signal's Python
  handler runs at once (XLA:CPU runs a program with host callbacks, the progress lines,
  within the call, and on large arrays the callbacks in its own threads: called from the
  main thread it held the handler until the chunk ended). An ``Interrupted`` raised by
  the handler leaves the computation to finish in the background, unread; the
  interpreter's exit waits for it (exiting under it crashed XLA)."""
  out, done = [], threading.Event()

  def work():
    try:
      result = fn(*args)
      jax.block_until_ready(result)
      out.append((True, result))
    except BaseException as e:  # pylint: disable=broad-except
      out.append((False, e))
    finally:
      done.set()

  t0, compiled0 = time.perf_counter(), _compiling[0]
  threading.Thread(target=work, name="fedjax_async.loop.call").start()
  while not done.wait(0.05):
    pass
  ok, result = out[0]
  if not ok:
    raise result
  compiling = _compiling[0] - compiled0
  return result, max(time.perf_counter() - t0 - compiling, 0.0), compiling > 0


@dataclasses.dataclass
class Resumed:
  """What a restored checkpoint gives a run: where it stopped, its state and rows."""
  position: int  # rounds (or groups) done
  state: Any
  rows: List[dict]
  wall_before: float  # seconds the run had taken before
  config: dict  # the configuration the checkpoint was made with


class Checkpoints:
  """The checkpoints of one run under ``directory``.

  ``config`` is stored with each checkpoint and compared on resumption through
  ``mismatch(saved, now) -> ["--flag=old (now new)", ...]``. ``every`` (0: none) and
  ``total`` are in ``unit``s (rounds, groups); with ``grid`` (the chunk length asked for:
  ``ChunkLengths``) only a position on its multiples (or the end) is due by ``every``, so
  shorter chunks move no checkpoint. Without ``resume`` a previous run's
  checkpoints in ``directory`` are deleted (it is a fresh run). ``discard`` (a sweep's
  computations): a checkpoint made with another configuration, or that cannot be read, is
  deleted, saying why under ``label``, and the run starts over instead of being refused."""

  def __init__(self, directory: str, config: dict, *, every: int, total: int, resume: bool,
               mismatch: Callable[[dict, dict], List[str]], keep: int = 2,
               unit: str = "round", discard: bool = False, label: str = "",
               grid: int = 1):
    self.directory, self.config = os.path.abspath(directory), config
    self.grid = max(1, int(grid))
    self.every, self.total, self.resume, self.unit = every, total, resume, unit
    self.mismatch, self.keep, self.discard, self.label = mismatch, keep, discard, label
    if not resume and os.path.isdir(self.directory) and distributed.is_main():
      shutil.rmtree(self.directory)  # a fresh run: the previous one's are not its own
    distributed.sync(f"fresh {self.directory}")
    self.manager = (checkpoint_lib.Checkpointer(self.directory, keep)
                    if every > 0 or resume else None)
    self.latest: Optional[int] = None  # the position of the newest complete checkpoint
    self.last_saved = 0

  def restore(self, template, extends: Optional[Callable[[dict, List[str]], bool]] = None
              ) -> Optional[Resumed]:
    """The latest checkpoint in ``template``'s structure; None without ``resume`` or
    without a checkpoint. ``extends(saved_config, differences)``: whether these
    differences continue the saved run (a larger run.rounds), not replace it."""
    if not self.resume or self.manager is None or self.manager.latest_round() is None:
      return None
    try:
      try:  # the flags first: another algorithm's state does not fit the template
        saved = self.manager.restore_meta()["config"]
        bad = self.mismatch(saved, checkpoint_lib.to_json_ready(self.config))
        if bad and self.discard:
          return self._discard(", ".join(bad))
        if bad and not (extends is not None and extends(saved, bad)):
          raise _resume_error(f"the checkpoint under {self.directory} was made with "
                           f"other flags: {', '.join(bad)}")
        r = self.manager.restore(template)
      except checkpoint_lib.CheckpointError as e:
        if self.discard:
          return self._discard(f"unreadable: {e}")
        earlier = [p for p in self.manager.all_rounds() if p < self.manager.latest_round()]
        fallback = (f"the checkpoint of {self.unit} {max(earlier)}" if earlier
                    else f"{self.unit} 0")
        raise _resume_error(f"{e}; delete that folder to resume from {fallback}, or "
                         "pass output.overwrite to start over") from None
    except ValueError:
      self.close()
      raise
    self.latest = self.last_saved = r.round
    return Resumed(r.round, r.state, r.rows, float(r.extra.get("wall_time_s", 0.0)), saved)

  def _discard(self, why: str) -> None:
    """Deletes the checkpoints (``discard``): the run starts over."""
    self.close()
    if self.label:
      console.say(f"[{self.label}] discarding the checkpoint under {self.directory} ({why}): the "
                  "computation starts over")
    if distributed.is_main():
      shutil.rmtree(self.directory, ignore_errors=True)
    distributed.sync(f"discard {self.directory}")
    self.manager = (checkpoint_lib.Checkpointer(self.directory, self.keep)
                    if self.every > 0 else None)
    return None

  def due(self, position: int, stopping: bool = False) -> bool:
    """A checkpoint is due at ``position``: a multiple of ``every`` reached (or the end),
    or the run is stopping at a signal with rounds done since the last one."""
    if self.manager is None:
      return False
    on_grid = position % self.grid == 0 or position >= self.total
    return ((on_grid and checkpoint_lib.should_save(self.last_saved, position, self.every,
                                                    self.total))
            or (stopping and self.last_saved < position))

  def save(self, position: int, state, rows: Sequence[dict], wall_time_s: float):
    """A signal during the save is raised after it, and after this checkpoint is known
    as the latest (the message of the ``Interrupted`` names it)."""
    with interrupts.deferred():
      self.manager.save(position, state, list(rows), self.config,
                        {"wall_time_s": wall_time_s})
      self.latest = self.last_saved = position

  def close(self):
    if self.manager is not None:
      self.manager.close()


def _resume_error(message: str) -> ValueError:
  """A ``config.ConfigError`` of output.resume."""
  return ConfigError("output.resume", message)


class MetricsFile:
  """``metrics.jsonl`` at ``path`` (None: rows kept in memory only) and TensorBoard
  scalars: the ``rows_before`` (of a restored checkpoint) written first, which drops any
  row written after that checkpoint, then each chunk's rows (each through ``annotate``)."""

  def __init__(self, path: Optional[str], rows_before: Sequence[dict] = (),
               tensorboard: Optional[TensorBoard] = None,
               annotate: Optional[Callable[[Sequence[dict]], None]] = None):
    self.rows = list(rows_before)
    self.file = open(path, "w") if path is not None else None  # pylint: disable=consider-using-with
    self.tb = tensorboard
    self.annotate = annotate  # adds fields to the rows in place (their bytes)
    self._write(self.rows)

  def _write(self, rows):
    if self.annotate is not None:
      self.annotate(rows)
    if self.file is not None:
      for r in rows:
        self.file.write(json_row(r) + "\n")
      self.file.flush()
    if self.tb is not None:
      self.tb.write(rows)

  def __call__(self, rows: Sequence[dict]):
    self.rows.extend(rows)
    self._write(rows)

  def sync(self):
    """Every row so far on disk (before a checkpoint that holds them is written)."""
    if self.tb is not None:
      self.tb.sync()

  def close(self):
    if self.file is not None:
      self.file.close()
    if self.tb is not None:
      self.tb.close()


def stopping() -> bool:
  """Whether a signal arrived in any process (recorded here too, so that every process
  stops after the same chunk)."""
  stop = distributed.any_process(interrupts.pending())
  if stop and not interrupts.pending():
    interrupts.record(signal.SIGTERM)
  return stop


class Callback:
  """One piece of the host loop (after pfl-research's callbacks): ``after_chunk`` runs on
  the host after every compiled chunk of rounds (or groups) with the state after it, the
  chunk's metrics rows and the loop (``loop.rows``: every row so far, ``loop.wall()``,
  ``loop.stopping``: a signal arrived in some process).
  A user's callback (``simulate(..., callbacks=[...])``) runs before the checkpoint of the
  chunk; ``loop.stop()`` ends the run after that checkpoint (early stopping: the round
  engine returns the rows and state so far; every process must ask for it after the same
  chunk)."""

  def after_chunk(self, loop: "HostLoop", state, rows: Sequence[dict]):
    pass


class StopOnDivergence(Callback):
  """``engine.Diverged`` at the chunk's first non-finite row (``divergence.first_nonfinite``:
  the model, or the test loss): the rows before it are written, and no checkpoint is
  made of the non-finite state. Runs first, before the rows are written."""

  def after_chunk(self, loop, state, rows):
    bad = divergence.first_nonfinite(rows)
    if bad is not None:
      if loop.metrics is not None:
        loop.metrics(rows[:bad])
      raise divergence.diverged(rows, bad)


class WriteMetrics(Callback):
  """The chunk's rows to ``loop.metrics`` (metrics.jsonl, TensorBoard, ``loop.rows``)."""

  def after_chunk(self, loop, state, rows):
    loop.metrics(rows)


class CheckSignals(Callback):
  """``loop.stopping``: whether a SIGINT / SIGTERM arrived in any process. Every process
  asks after the chunk's rows are written and again after the caller's callbacks (a
  signal during one), so that all stop after the same chunk, with its checkpoint; a
  signal that arrives later counts at the next chunk."""

  def after_chunk(self, loop, state, rows):
    now = stopping()  # (a collective: every process asks, whatever it holds)
    loop.stopping = loop.stopping or now


class SaveCheckpoints(Callback):
  """A checkpoint when due (``Checkpoints.due``), or now when a signal arrived."""

  def __init__(self, checkpoints: Checkpoints):
    self.checkpoints = checkpoints

  def after_chunk(self, loop, state, rows):
    if self.checkpoints.due(loop.position(state), loop.stopping):
      loop.save(state)


class Report(Callback):
  """``progress(rows)``: the console lines of a chunk."""

  def __init__(self, progress: Callable[[Sequence[dict]], None]):
    self.progress = progress

  def after_chunk(self, loop, state, rows):
    if rows:
      self.progress(rows)


class EarlyStop(interrupts.Interrupted):
  """A callback asked this run to stop (``HostLoop.stop``): ``state`` is the state after
  the chunk it stopped at. The round engine returns its result up to there; the other
  drivers treat it as an ``Interrupted``."""

  def __init__(self, state, message: str = ""):
    super().__init__(message, signal.SIGINT)
    self.state = state


class StopOnSignal(Callback):
  """``Interrupted`` when a SIGINT / SIGTERM arrived (``CheckSignals``), or ``EarlyStop``
  when a callback asked for a stop (after the chunk's checkpoint)."""

  def after_chunk(self, loop, state, rows):
    if loop.stop_requested:
      raise EarlyStop(state)
    if loop.stopping:
      interrupts.check_interrupted()


class HostLoop:
  """``on_chunk(state, rows)`` of every driver: each callback in order: the clients'
  health lines (``progress.health``, a ``progress.HealthWatch``), the divergence
  check (``StopOnDivergence``, unless ``stop_on_divergence`` is False), the rows to
  ``metrics`` (metrics.jsonl, TensorBoard), the signal check of every process
  (``CheckSignals``), the caller's ``callbacks``, a checkpoint when
  due (at ``position(state)``), the progress lines, and the signal check (``Interrupted``
  after the checkpoint)."""

  def __init__(self, metrics: Optional[MetricsFile], checkpoints: Optional[Checkpoints],
               position: Callable[[Any], int], progress: Optional[Callable] = None,
               wall_before: float = 0.0, callbacks: Sequence[Callback] = (),
               stop_on_divergence: bool = True):
    self.metrics, self.checkpoints, self.position = metrics, checkpoints, position
    self.wall_before = wall_before
    health = getattr(progress, "health", None)  # progress.HealthWatch: before the check
    self.callbacks: List[Callback] = (
        ([Report(health)] if health is not None else [])
        + ([StopOnDivergence()] if stop_on_divergence else [])
        + ([WriteMetrics()] if metrics is not None else []) + [CheckSignals()]
        + list(callbacks) + ([CheckSignals()] if callbacks else [])
        + ([SaveCheckpoints(checkpoints)] if checkpoints is not None else [])
        + ([Report(progress)] if progress is not None else []) + [StopOnSignal()])
    # the engines hand a chunk with non-finite rows to this loop instead of raising
    self.stops_on_divergence = stop_on_divergence
    self.t0 = time.perf_counter()
    self.chunk: List[dict] = []  # the last chunk's rows (a divergence error reads them)
    self.stopping = False  # a signal arrived in some process (this chunk's check)
    self.stop_requested = False  # a callback asked for a stop (``stop``)

  @property
  def rows(self) -> List[dict]:
    """Every metrics row so far (a resumed run's restored ones first)."""
    return self.metrics.rows

  def wall(self) -> float:
    """Seconds of the run so far, a resumed run's earlier ones included."""
    return self.wall_before + time.perf_counter() - self.t0

  def stop(self):
    """Stop after this chunk (its checkpoint first): ``EarlyStop``. Nothing global is
    recorded: the next run is not stopped."""
    self.stop_requested = self.stopping = True

  def save(self, state, position: Optional[int] = None):
    self.metrics.sync()
    self.checkpoints.save(self.position(state) if position is None else position, state,
                          self.metrics.rows, self.wall())

  def __call__(self, state, rows: Sequence[dict]):
    # A first signal within the callbacks is only recorded (raised by StopOnSignal, after
    # the checkpoint that it makes due): raised in a callback it skipped that checkpoint.
    self.stopping = False
    self.chunk = rows
    if isinstance(self.position, ChunkCount):
      self.position.advance()
    handler = interrupts.handle_interrupts()
    with handler, interrupts.graceful(""):
      for callback in self.callbacks:
        callback.after_chunk(self, state, rows)
      if handler.active and interrupts.pending() and jax.process_count() == 1:
        # after the last check, and no block around this one keeps it: now, saved first
        if self.checkpoints is not None and self.checkpoints.due(self.position(state), True):
          self.save(state)
        interrupts.check_interrupted()


class ChunkCount:
  """The position of a driver whose state does not hold it (the virtual clock's groups),
  as ``HostLoop``'s ``position``: ``start`` plus the length of each chunk handed out
  (``lengths.last``, counted when the loop gets the chunk), at most ``total``."""

  def __init__(self, start: int, lengths: ChunkLengths, total: int):
    self.done, self.lengths, self.total = start, lengths, total

  def advance(self):
    self.done = min(self.done + self.lengths.last, self.total)

  def __call__(self, state) -> int:
    return self.done


def host_loop(out_dir: Optional[str], checkpoints: Optional[Checkpoints],
              resumed: Optional[Resumed], position: Callable[[Any], int], *,
              progress: Optional[Callable] = None, callbacks: Sequence[Callback] = (),
              annotate: Optional[Callable[[Sequence[dict]], None]] = None,
              tensorboard: Optional[TensorBoard] = None) -> HostLoop:
  """The ``HostLoop`` of one run, every engine's: ``metrics.jsonl`` under ``out_dir``
  (None: the rows kept in memory only), rewritten from the ``resumed`` checkpoint's rows
  (``Checkpoints.restore``; None: a fresh run), then each chunk's; a resumed run's wall
  time goes on from the checkpoint's. The caller closes ``loop.metrics`` and the
  checkpoints.

  Args:
    out_dir: the run's folder (None: no metrics file).
    checkpoints: its ``Checkpoints`` (None: none).
    resumed: the restored checkpoint (None: a fresh run).
    position: state -> the rounds (or groups) done, or a ``ChunkCount``.
    progress: the progress lines of a chunk's rows (None: none).
    callbacks: the caller's ``Callback``s.
    annotate: adds fields to the rows before they are written (``MetricsFile``).
    tensorboard: the run's ``TensorBoard`` scalars (None: none).
  """
  metrics = MetricsFile(None if out_dir is None else os.path.join(out_dir, "metrics.jsonl"),
                        resumed.rows if resumed else (), tensorboard, annotate=annotate)
  return HostLoop(metrics, checkpoints, position, progress,
                  resumed.wall_before if resumed else 0.0, callbacks)
