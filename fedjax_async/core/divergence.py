"""A run that diverged: the first non-finite row of a chunk and the error naming its round
(or the virtual clock's group), with the finite rows before it."""

from __future__ import annotations

from typing import List, Optional

import numpy as np


class Diverged(RuntimeError):
  """The global model or the test loss became NaN/Inf in ``round`` (1-based, as the
  console counts rounds)."""

  def __init__(self, message: str, round_number: Optional[int] = None,
               rows: Optional[List[dict]] = None):
    super().__init__(message)
    self.round = round_number
    self.rows = rows or []  # the finite rounds of the chunk that diverged


def first_nonfinite(rows: List[dict]) -> Optional[int]:
  """The index of the first row whose model (``nonfinite``) or test loss is NaN/Inf, or
  None: what ``loop.StopOnDivergence`` stops at (rounds, or the virtual clock's arrivals)."""
  for i, r in enumerate(rows):
    loss = r.get("test_loss")
    if r.get("nonfinite") or (loss is not None and not np.isfinite(loss)):
      return i
  return None


def host_stops_on_divergence(on_chunk) -> bool:
  """Whether ``on_chunk`` (a ``loop.HostLoop`` with ``StopOnDivergence``) takes a chunk
  with non-finite rows and stops the run itself; else the engine raises ``Diverged``."""
  return bool(getattr(on_chunk, "stops_on_divergence", False))


def diverged(rows: List[dict], i: int) -> Diverged:
  """The ``Diverged`` of row ``i`` (``first_nonfinite``), carrying the rows before it."""
  r = rows[i]
  if "round" in r:
    return Diverged(f"round {r['round']}: the global model or test loss is not finite "
                    "(NaN/Inf)", r["round"], rows[:i])
  return Diverged(f"group {r['group']}: the global model or test loss is not finite "
                  "(NaN/Inf)", None, rows[:i])
