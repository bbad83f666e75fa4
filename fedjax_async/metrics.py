"""A run's accuracy summary: three numbers that read differently, always reported together.

* ``final_accuracy``: the test accuracy of the last evaluated round (the model a user keeps);
* ``last10_mean_accuracy``: the mean test accuracy over the last ``LAST`` rounds (where the
  curve ends, averaged over its round-to-round swings);
* ``average_best_accuracy``: the PAFed paper's Table V metric, the mean over the last
  ``LAST`` rounds of the best accuracy reached so far. It never decreases with a model
  that gets worse, and for T <= ``LAST`` rounds it averages the whole curve's running
  best, so tables mark the last-10 metrics of such runs (``mark_short``).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

LAST = 10
KEYS = ("final_accuracy", "last10_mean_accuracy", "average_best_accuracy")
SHORT_RUN_MARK = "†"
SHORT_RUN_NOTE = (f"{SHORT_RUN_MARK} T <= {LAST} rounds: the last-{LAST} metrics average the "
                  "whole run (early rounds included), not its end.")


def _finite(values):
  return [v for v in values if v is not None and math.isfinite(v)]


def last10_mean_accuracy(accuracies: Sequence[Optional[float]], last: int = LAST) -> float:
  """Mean of the evaluated test accuracies among the last ``last`` rounds (None: a round
  without evaluation)."""
  tail = _finite(accuracies[-last:])
  return sum(tail) / len(tail) if tail else float("nan")


def average_best_accuracy(accuracies: Sequence[Optional[float]], last: int = LAST) -> float:
  """The PAFed paper's metric: the mean over the last ``last`` rounds of the best test
  accuracy reached so far (rounds without evaluation carry the previous best)."""
  best, running = [], -math.inf
  for a in accuracies:
    if a is not None and math.isfinite(a):
      running = max(running, a)
    best.append(running)
  tail = [b for b in best[-last:] if math.isfinite(b)]
  return sum(tail) / len(tail) if tail else float("nan")


def final_accuracy(accuracies: Sequence[Optional[float]]) -> float:
  """The last evaluated test accuracy."""
  done = _finite(accuracies)
  return done[-1] if done else float("nan")


def accuracy_summary(accuracies: Sequence[Optional[float]]) -> Dict[str, float]:
  """The three ``KEYS`` of one run's per-round test accuracies (None where not evaluated),
  and ``best_accuracy`` (the highest)."""
  done = _finite(accuracies)
  return {"final_accuracy": final_accuracy(accuracies),
          "best_accuracy": max(done) if done else float("nan"),
          "last10_mean_accuracy": last10_mean_accuracy(accuracies),
          "average_best_accuracy": average_best_accuracy(accuracies)}


def first_reaching(rows: Sequence[dict], target: float) -> Optional[int]:
  """The index of the first row whose test accuracy is >= ``target`` (None: none)."""
  for i, r in enumerate(rows):
    a = r.get("test_accuracy")
    if a is not None and a >= target:
      return i
  return None


def rounds_to_target(rows: Sequence[dict], target: float) -> Dict[str, object]:
  """A round-engine summary's keys of run.target_accuracy (none for 0): the target and
  the round of the first row at or above it (None: not reached)."""
  if not target:
    return {}
  hit = first_reaching(rows, target)
  return {"target_accuracy": target,
          "rounds_to_target": None if hit is None else rows[hit]["round"]}


def retarget_rounds(summary: dict, rows: Sequence[dict], target: float) -> dict:
  """A stored run's ``summary`` with the keys of ``target`` (``rounds_to_target``)."""
  out = {k: v for k, v in summary.items() if k not in ("target_accuracy", "rounds_to_target")}
  return {**out, **rounds_to_target(rows, target)}


def is_short(rounds: int) -> bool:
  """Whether a run of ``rounds`` rounds is too short for the last-10 metrics to mean the
  end of training."""
  return rounds <= LAST


def mark_short(text: str, key: str, rounds: int) -> str:
  """``text`` (a formatted metric) marked when ``key`` is a last-10 metric of a short run."""
  return text + SHORT_RUN_MARK if key != "final_accuracy" and is_short(rounds) else text


def count_from_one(rows: List[dict]) -> List[dict]:
  """Stored rows with ``round`` counted from 1: rows written counting from 0 (their first
  row's round is 0) are shifted by one; others (a virtual clock's, without rounds) are
  returned as they are. A list of such lists (a sweep's) is read list by list."""
  if rows and isinstance(rows[0], list):  # a sweep's rows, one list per run
    return [count_from_one(r) for r in rows]
  if rows and isinstance(rows[0], dict) and rows[0].get("round") == 0:
    return [{**r, "round": r["round"] + 1} for r in rows]
  return rows


# Communication in plaintext runs (docs/experiments.md, "Bytes"): one message is a
# model-sized vector as the engine holds it, d parameters x the global model's itemsize (4
# bytes in float32; a pruned client's sub-model, its kept parameters). Up: an upload that
# reaches the server and is aggregated (one dropped as too stale is not); down: a global
# model dispatched to a client. Client state (control variates, duals) is never sent.


def message_bytes(w, kept: Optional[float] = None) -> int:
  """One message's bytes: ``w``'s size (or ``kept`` of its parameters) x its itemsize."""
  dtype = np.dtype(w.dtype if hasattr(w, "dtype") else np.asarray(w).dtype)
  return int(round(np.prod(np.shape(w)) if kept is None else kept)) * dtype.itemsize


def add_round_bytes(rows: Sequence[dict], uploads, dispatched, message: int) -> None:
  """The round engine's rows with ``bytes_up`` (round t's ``uploads[t]`` messages) and
  ``bytes_down`` (its ``dispatched[t]``); bytes a row already has (measured on CKKS's wire)
  are kept."""
  for r in rows:
    if "round" in r:
      t = int(r["round"]) - 1
      r.setdefault("bytes_up", int(uploads[t]) * message)
      r.setdefault("bytes_down", int(dispatched[t]) * message)


def add_arrival_bytes(rows: Sequence[dict], client_bytes) -> None:
  """The virtual clock's rows (one per kept arrival) with ``bytes_up`` (its upload) and
  ``bytes_down`` (the model it was dispatched with), ``client_bytes[client]`` each."""
  for r in rows:
    if "client" in r:
      b = int(client_bytes[int(r["client"])])
      r.setdefault("bytes_up", b)
      r.setdefault("bytes_down", b)


def bytes_totals(rows: Sequence[dict], down_extra: int = 0) -> Dict[str, int]:
  """A summary's ``<key>_total`` of each ``bytes_<...>`` key of the rows (``bytes_up``,
  ``bytes_down``, CKKS's links between its servers): the rows' sums, ``down_extra`` added
  to ``bytes_down_total`` (models sent that no row counts)."""
  keys = sorted({k for r in rows for k in r if k.startswith("bytes_")} | {"bytes_up",
                                                                         "bytes_down"})
  out = {f"{k}_total": int(sum(r.get(k) or 0 for r in rows)) for k in keys}
  out["bytes_down_total"] += int(down_extra)
  return out
