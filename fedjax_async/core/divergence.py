"""A run that diverged: the first non-finite row of a chunk and the error naming its round
(or the virtual clock's group), with the finite rows before it."""

from __future__ import annotations

from typing import List, Optional

import jax.numpy as jnp
import numpy as np


class Diverged(RuntimeError):
  """The global model or the test loss became NaN/Inf in ``round`` (1-based, as the
  console counts rounds); ``kind``: "model", or "test_loss" (a finite model whose test
  loss is not)."""

  def __init__(self, message: str, round_number: Optional[int] = None,
               rows: Optional[List[dict]] = None, kind: str = "model"):
    super().__init__(message)
    self.round = round_number
    self.rows = rows or []  # the finite rounds of the chunk that diverged
    self.kind = kind


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
  kind = "model" if r.get("nonfinite") else "test_loss"
  what = ("the global model is not finite (NaN/Inf)" if kind == "model" else
          f"the test loss is {r.get('test_loss')} (the global model is finite)")
  if "round" in r:
    return Diverged(f"round {r['round']}: {what}", r["round"], rows[:i], kind)
  return Diverged(f"group {r['group']}: {what}", None, rows[:i], kind)


def _finite(x) -> bool:
  try:
    return bool(jnp.all(jnp.isfinite(x)))
  except Exception:  # pylint: disable=broad-except  (arrays this process cannot read)
    return True


def advice(data) -> str:
  """What to change after a ``Diverged``: the step sizes when ``data``'s features (a
  ``FederatedData`` or the engine's ``DeviceData``) are finite, else which are not."""
  bad = [what for what, x in (("training", data.x), ("test", data.test_x)) if not _finite(x)]
  if bad:
    return (f"the {' and '.join(bad)} features hold NaN/Inf: drop or impute those examples "
            "(fa.data.from_arrays and from_clients refuse them)")
  return ("a smaller local.lr or algorithm.server_lr (PAFed: algorithm.alpha0/1/2) usually "
          "avoids it")
