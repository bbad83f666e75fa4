"""Checkpoints of a whole simulation (``engine.SimState`` + metrics rows + config) with orbax.

A checkpoint at round t holds everything ``engine.run_rounds`` needs to continue from round
t exactly as an uninterrupted run would: the global model, the ring buffer of past global
models, every client's persistent state, the server state, the base PRNG key data and the
round counter (the timeline is rebuilt from the seed on the host). Next to the state it
keeps the metrics rows of rounds 0..t-1 and the run configuration, so that a resumed run
rewrites ``metrics.jsonl`` from them and refuses to continue under a different config.

Layout: ``<output_dir>/checkpoints/<round>/{state,meta}`` written by an
``orbax.checkpoint.CheckpointManager`` (a step directory is written under a temporary name
and renamed when complete, so a run killed mid-save leaves the previous checkpoint intact).
The state is stored as its flat list of leaves (``leaf_00000``...), restored into the
structure of a template state (``engine.init_state`` of the same configuration).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from typing import Any, List, NamedTuple, Optional

import jax
import numpy as np

from fedjax_async import distributed
from fedjax_async import interrupts
from fedjax_async import metrics as metrics_lib


def _json_default(x):
  """JSON for numpy scalars/arrays that may sit in metrics rows."""
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"not JSON serialisable: {type(x)}")


def to_json_ready(obj):
  """A deep copy of ``obj`` with numpy values turned into plain Python values."""
  return json.loads(json.dumps(obj, default=_json_default))


def state_to_leaves(state) -> dict:
  """A pytree -> ``{"leaf_00000": np.ndarray, ...}`` (host copies, order of tree_leaves;
  an array split across processes stays a global ``jax.Array``: orbax writes it from
  every process, each its own shards)."""
  leaves = jax.tree_util.tree_leaves(state)
  return {f"leaf_{i:05d}": x if distributed.split_across_processes(x) else np.asarray(jax.device_get(x))
          for i, x in enumerate(leaves)}


def _restore_target(x):
  """What orbax restores a leaf as: a numpy array, or a global array with ``x``'s sharding."""
  if distributed.split_across_processes(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  return np.asarray(jax.device_get(x))


def leaves_to_state(leaves: dict, template):
  """Inverse of ``state_to_leaves`` given a template of the same structure."""
  treedef = jax.tree_util.tree_structure(template)
  ordered = [leaves[k] for k in sorted(leaves)]
  if len(ordered) != treedef.num_leaves:
    raise ValueError(f"checkpoint has {len(ordered)} state arrays, the configuration "
                     f"expects {treedef.num_leaves}")
  tmpl_leaves = jax.tree_util.tree_leaves(template)
  for i, (a, b) in enumerate(zip(ordered, tmpl_leaves)):
    if tuple(np.shape(a)) != tuple(np.shape(b)):
      raise ValueError(f"checkpoint state array {i} has shape {np.shape(a)}, the "
                       f"configuration expects {np.shape(b)}")
  return jax.tree_util.tree_unflatten(
      treedef, [a if isinstance(a, jax.Array) else
                np.asarray(a, dtype=b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype)
                for a, b in zip(ordered, tmpl_leaves)])


class Restored(NamedTuple):
  round: int
  state: Any  # in the template's structure (numpy leaves)
  rows: List[dict]  # metrics rows of rounds 0..round-1
  config: dict
  extra: dict


class CheckpointError(ValueError):
  """A checkpoint step that cannot be read (truncated, corrupted or incomplete files); the
  message names the step's folder and what was wrong."""


_REGISTERED = []


def _one_replica_writes(ocp):
  """Across processes: each shard written by one replica. orbax 0.11's replica-parallel
  writes slice under ``jax.sharding.set_mesh``, which jax 0.6 lacks as a context manager."""
  if _REGISTERED:
    return
  absl_logger = logging.getLogger("absl")  # orbax warns that it overrides its default
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)
  finally:
    absl_logger.setLevel(level)
  _REGISTERED.append(True)


class Checkpointer:
  """Saves/restores simulation checkpoints under ``directory`` (one step per round)."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    # orbax (0.4 s to import) is loaded by the first checkpointer, not by every command
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self.ocp = ocp
    if jax.distributed.is_initialized() and jax.process_count() > 1:
      _one_replica_writes(ocp)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "meta"))

  def save(self, round_index: int, state, rows: List[dict], config: dict,
           extra: Optional[dict] = None):
    """Checkpoints ``state`` (the state *before* round ``round_index``) and the rows. A
    SIGINT / SIGTERM during the write waits for its end (``interrupts.deferred``): the
    checkpoint is complete when the ``Interrupted`` is raised.

    Args:
      round_index: the step the checkpoint is saved as (the next round to run).
      state: the state before round ``round_index``.
      rows: the metrics rows of the rounds before it.
      config: the run's config, as a dict (compared on restore).
      extra: any other JSON-ready metadata (the wall time so far).
    """
    meta = {"round": int(round_index), "rows": to_json_ready(rows),
            "config": to_json_ready(config), "extra": to_json_ready(extra or {})}
    with interrupts.deferred():
      try:
        self.manager.save(int(round_index), args=self.ocp.args.Composite(
            state=self.ocp.args.StandardSave(state_to_leaves(state)),
            meta=self.ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except
        raise self._unwritable(round_index, e) from None

  def _unwritable(self, step: int, e: Exception) -> "CheckpointError":
    """A failed save (full disk, permissions, a vanished folder): its partial step folder
    removed, one line naming the folder, the cause and what is kept."""
    for tmp in glob.glob(os.path.join(self.directory, "*.orbax-checkpoint-tmp*")):
      shutil.rmtree(tmp, ignore_errors=True)
    text = str(e).strip()
    cause = next((line for line in text.splitlines() if "No space left" in line), None)
    cause = "the disk is full (No space left on device)" if cause or getattr(
        e, "errno", None) == 28 else f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
    kept = self.latest_round()
    keep = (f"the checkpoint of round {kept} is kept" if kept is not None
            else "no earlier checkpoint exists")
    return CheckpointError(f"cannot write the checkpoint of round {step} under "
                           f"{self.directory}: {cause}; {keep} (free space or give another "
                           "output.output_dir, then rerun with output.resume)")

  def latest_round(self) -> Optional[int]:
    return self.manager.latest_step()

  def all_rounds(self) -> List[int]:
    return list(self.manager.all_steps())

  def _unreadable(self, step: int, e: Exception) -> CheckpointError:
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(f"the checkpoint of round {step} "
                           f"({os.path.join(self.directory, str(step))}) cannot be read: "
                           f"{type(e).__name__}: {detail}")

  def restore_meta(self, round_index: Optional[int] = None) -> dict:
    """The metadata (``round``, ``rows``, ``config``, ``extra``) of a checkpoint (default:
    the latest) without its state, e.g. to compare its configuration first;
    ``CheckpointError`` when it cannot be read."""
    step = self.latest_round() if round_index is None else round_index
    if step is None:
      raise FileNotFoundError(f"no checkpoint under {self.directory}")
    try:
      meta = self.manager.restore(step, args=self.ocp.args.Composite(
          meta=self.ocp.args.JsonRestore()))["meta"]
      int(meta["round"]), list(meta["rows"]), dict(meta["config"])  # pylint: disable=expression-not-assigned
    except Exception as e:  # pylint: disable=broad-except
      raise self._unreadable(step, e) from None
    return meta

  def restore(self, template, round_index: Optional[int] = None) -> Restored:
    """The checkpoint of ``round_index`` (default: the latest) in ``template``'s structure;
    ``CheckpointError`` naming the step's folder when its files cannot be read."""
    step = self.latest_round() if round_index is None else round_index
    if step is None:
      raise FileNotFoundError(f"no checkpoint under {self.directory}")
    abstract = {f"leaf_{i:05d}": _restore_target(x)
                for i, x in enumerate(jax.tree_util.tree_leaves(template))}
    try:
      out = self.manager.restore(step, args=self.ocp.args.Composite(
          state=self.ocp.args.StandardRestore(abstract), meta=self.ocp.args.JsonRestore()))
      meta = out["meta"]
      state = leaves_to_state(dict(out["state"]), template)
      return Restored(int(meta["round"]), state, metrics_lib.count_from_one(list(meta["rows"])),
                      dict(meta["config"]),
                      dict(meta.get("extra", {})))
    except Exception as e:  # pylint: disable=broad-except
      raise self._unreadable(step, e) from None

  def restore_raw(self, round_index: Optional[int] = None) -> Restored:
    """Like ``restore`` without a template: ``state`` is the ``{leaf_i: array}`` dict."""
    step = self.latest_round() if round_index is None else round_index
    if step is None:
      raise FileNotFoundError(f"no checkpoint under {self.directory}")
    out = self.manager.restore(step, args=self.ocp.args.Composite(
        state=self.ocp.args.StandardRestore(), meta=self.ocp.args.JsonRestore()))
    meta = out["meta"]
    state = {k: np.asarray(v) for k, v in dict(out["state"]).items()}
    return Restored(int(meta["round"]), state, metrics_lib.count_from_one(list(meta["rows"])),
                    dict(meta["config"]),
                    dict(meta.get("extra", {})))

  def close(self):
    self.manager.close()


def should_save(prev_round: int, new_round: int, every: int, total: int) -> bool:
  """Save at a chunk boundary when a multiple of ``every`` was reached or passed in
  (prev_round, new_round], and always at the end of the run."""
  if every <= 0:
    return False
  return new_round // every > prev_round // every or new_round >= total
