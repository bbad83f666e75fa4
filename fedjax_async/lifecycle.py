"""One run's lifecycle, written once for the round engine and the virtual clock (after
fedjax's ``(init, apply)`` one level up and pfl-research's ``run``): ``run`` takes an
``Engine`` (what differs: its checkpoints, cost line, progress, chunk loop, summary) and
does the rest: checkpoints and resumption, the cost line and first chunk length, the host
loop (``loop.host_loop``), closing its files, and summary.json with the final model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, ContextManager, List, Optional, Protocol, Sequence

from fedjax_async import cost
from fedjax_async import distributed
from fedjax_async import loop
from fedjax_async import outputs
from fedjax_async import results
from fedjax_async.core import divergence


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  """An engine's ``loop.Checkpoints`` arguments (``total`` is the engine's) and the
  ``extends`` of its ``restore``."""
  config: dict
  every: int
  resume: bool
  mismatch: Callable[[dict, dict], List[str]]
  unit: str = "round"
  keep: int = 2
  grid: int = 1
  extends: Optional[Callable[[dict, List[str]], bool]] = None


@dataclasses.dataclass(frozen=True)
class Ending:
  """How a run stopped by a signal or a callback ends: the ``state`` its summary is of,
  whether a callback stopped it early, and the error raised after its summary (None: the
  run is returned)."""
  state: Any
  stopped_early: bool = False
  error: Optional[BaseException] = None


class Engine(Protocol):
  """What differs between the engines' runs (positions count rounds or groups)."""
  name: str
  total: int  # the positions of the whole run
  most: int  # the chunk length asked for (``loop.ChunkLengths``)
  smaller: str  # how to pick a small setting (``cost.announce``)
  model: tuple  # (name, w0, apply_flat), for the ``results.Run``
  initial: Any  # the state a fresh run starts from (the template of a checkpoint)
  checkpointing: Optional[Checkpointing]  # None: no checkpoints
  position: Optional[Callable[[Any], int]]  # None: counted by chunks (``loop.ChunkCount``)

  def resumed(self, ckpt: loop.Checkpoints, resumed: Optional[loop.Resumed]) -> Any:
    """The state to start from after ``ckpt.restore`` (said on the console)."""

  def estimate(self, start: int) -> Optional[cost.Cost]:
    """The cost of the run from ``start`` for its cost line (None: no line)."""

  def begin(self, start: int, rows: Sequence[dict]) -> Optional[Callable]:
    """Its notices before the loop; the progress lines of a chunk's rows (None: none)."""

  def annotate(self, rows: Sequence[dict]) -> None:
    """Adds fields (their bytes) to the rows before they are written."""

  def tensorboard(self, files: Optional[str]) -> Optional[outputs.TensorBoard]:
    """The run's TensorBoard scalars under ``files`` (None: none)."""

  def signals(self, ckpt: Optional[loop.Checkpoints]) -> ContextManager:
    """What holds the signals while the chunks run."""

  def run(self, state, host: loop.HostLoop, lengths: loop.ChunkLengths) -> Any:
    """The engine's chunk loop from ``state``, ``host`` after every chunk; its last state."""

  def diverged(self, e: divergence.Diverged, host: loop.HostLoop,
               ckpt: Optional[loop.Checkpoints]) -> BaseException:
    """The error to raise for ``e`` (what went wrong, where to resume)."""

  def interrupted(self, e: KeyboardInterrupt, state, host: loop.HostLoop,
                  ckpt: Optional[loop.Checkpoints]) -> Optional[Ending]:
    """How a run stopped by ``e`` ends, ``state`` the one it started from (None: ``e`` is
    raised)."""

  def summary(self, rows: List[dict], wall: float, state,
              stopped_early_at: Optional[int]) -> dict:
    """The run's summary.json."""


def run(engine: Engine, out_dir: Optional[str], callbacks: Sequence[loop.Callback] = ()
        ) -> results.Run:
  """One run of ``engine``: its checkpoints under ``<out_dir>/checkpoints`` (restored with
  ``checkpointing.resume``), its cost line, the host loop (``callbacks`` after every
  chunk), and on process 0 ``metrics.jsonl``, summary.json and the final model under
  ``out_dir`` (None: nothing written)."""
  files = out_dir if out_dir is not None and distributed.is_main() else None
  if files is not None:
    os.makedirs(files, exist_ok=True)
  ckpt, resumed, state = _restore(engine, out_dir)
  start = resumed.position if resumed is not None else 0
  estimate = engine.estimate(start)
  if estimate is not None:  # what it will take, first
    cost.announce(estimate, engine.smaller, engine.name)
  # chunks of about loop.CHUNK_SECONDS (a signal is answered at a chunk's end)
  lengths = loop.ChunkLengths(engine.most, loop.CHUNK_SECONDS, None if estimate is None
                              else loop.first_length(estimate, engine.total))
  progress = engine.begin(start, resumed.rows if resumed is not None else [])
  host = loop.host_loop(
      files, ckpt, resumed, engine.position or loop.ChunkCount(start, lengths, engine.total),
      progress=progress, callbacks=callbacks, annotate=engine.annotate,
      tensorboard=engine.tensorboard(files))
  try:
    with engine.signals(ckpt):
      ending = Ending(engine.run(state, host, lengths))
  except divergence.Diverged as e:
    raise engine.diverged(e, host, ckpt) from None
  except KeyboardInterrupt as e:  # (loop.EarlyStop too)
    ending = engine.interrupted(e, state, host, ckpt)
    if ending is None:
      raise
  finally:
    host.metrics.close()
    if ckpt is not None:
      ckpt.close()
  summary = engine.summary(host.rows, host.wall(), ending.state,
                           _position(engine, host, ending) if ending.stopped_early else None)
  if files is not None:
    outputs.write_final_model(files, ending.state.w)
    with open(os.path.join(files, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=str)
  if ending.error is not None:
    raise ending.error
  return results.Run(summary, host.rows, ending.state, engine.model)


def _restore(engine: Engine, out_dir: Optional[str]):
  """(checkpoints or None, the restored checkpoint or None, the state to start from)."""
  c = engine.checkpointing
  if out_dir is None or c is None:
    return None, None, engine.initial
  ckpt = loop.Checkpoints(os.path.join(out_dir, "checkpoints"), c.config, every=c.every,
                          total=engine.total, resume=c.resume, mismatch=c.mismatch,
                          keep=c.keep, unit=c.unit, grid=c.grid)
  resumed = ckpt.restore(engine.initial, c.extends)
  return ckpt, resumed, engine.resumed(ckpt, resumed)


def _position(engine: Engine, host: loop.HostLoop, ending: Ending) -> int:
  """Where a run stopped by a callback stopped."""
  return (engine.position or host.position)(ending.state)
