"""A run that diverged: the first non-finite row of a chunk and the error naming its round
(or the virtual clock's group), with the finite rows before it; the clients' health in the
rows (``outlier``, ``cause``; the virtual clock's arrivals through ``arrival_health``):
which client blew up first, and the advice that fits."""

from __future__ import annotations

from typing import List, Optional

import jax.numpy as jnp
import numpy as np


class Diverged(RuntimeError):
  """The global model or the test loss became NaN/Inf in ``round`` (1-based, as the
  console counts rounds); ``kind``: "model", or "test_loss" (a finite model whose test
  loss is not)."""

  def __init__(self, message: str, round_number: Optional[int] = None,
               rows: Optional[List[dict]] = None, kind: str = "model",
               row: Optional[dict] = None):
    super().__init__(message)
    self.round = round_number
    self.rows = rows or []  # the finite rounds of the chunk that diverged
    self.kind = kind
    self.row = row  # the non-finite row itself


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
    return Diverged(f"round {r['round']}: {what}", r["round"], rows[:i], kind, r)
  return Diverged(f"group {r['group']}: {what}", None, rows[:i], kind, r)


# A client is far outside its round when its local loss or ||Delta|| is more than
# OUTLIER_RATIO times the round's median (the loss's median taken as at least LOSS_FLOOR,
# ||Delta||'s as at least DELTA_FLOOR: a converged round's tiny median names no one), or
# when its result is not finite.
OUTLIER_RATIO = 100.0
LOSS_FLOOR = 1.0
DELTA_FLOOR = 0.01


def _num(x) -> float:
  return float("nan") if x is None else float(x)


def outlier(row: dict) -> Optional[str]:
  """"nonfinite", "outlier" (``worst_client``'s loss or the round's largest ||Delta||
  beyond ``OUTLIER_RATIO`` x the median) or None, from a round's health fields (None
  for a row without them)."""
  if row.get("worst_client", -1) is None or row.get("worst_client", -1) < 0:
    return None
  if row.get("client_nonfinite_share"):
    return "nonfinite"
  loss, delta = _num(row.get("worst_client_loss")), _num(row.get("delta_norm_max"))
  loss_mid = max(_num(row.get("client_loss_median")), LOSS_FLOOR)
  delta_mid = max(_num(row.get("delta_norm_median")), DELTA_FLOOR)
  if loss > OUTLIER_RATIO * loss_mid or delta > OUTLIER_RATIO * delta_mid:
    return "outlier"
  return None


# The virtual clock's arrivals are one client each: a client is compared with the median
# of the last ARRIVAL_WINDOW arrivals, its own included (``arrival_health``).
ARRIVAL_WINDOW = 100


def _median(values) -> float:
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  return float(np.median(v)) if v.size else float("nan")


def arrival_health(rows: List[dict], before: List[dict] = ()) -> List[dict]:
  """A round's health fields (``outlier``, ``describe``) for each of the virtual clock's
  arrival rows ``rows`` (its ``client``, ``train_loss`` and ``delta_norm``), the medians
  taken over the last ``ARRIVAL_WINDOW`` arrivals of ``before`` + ``rows``; [] for rows
  without ``delta_norm`` (a run stored without it)."""
  if not rows or "delta_norm" not in rows[0]:
    return []
  past = [r for r in before if "delta_norm" in r][-ARRIVAL_WINDOW:]
  window, out = past + list(rows), []
  for i, r in enumerate(rows):
    near = window[max(0, len(past) + i + 1 - ARRIVAL_WINDOW):len(past) + i + 1]
    loss, delta = _num(r.get("train_loss")), _num(r.get("delta_norm"))
    out.append({"group": r.get("group"), "event": r.get("event"),
                "worst_client": r["client"], "worst_client_loss": loss,
                "delta_norm_max": delta,
                "client_loss_median": _median([q.get("train_loss") for q in near]),
                "delta_norm_median": _median([q.get("delta_norm") for q in near]),
                "client_nonfinite_share": float(not (np.isfinite(loss)
                                                     and np.isfinite(delta))),
                **({"nonfinite": True} if r.get("nonfinite") else {})})
  return out


def describe(row: dict, dual: bool = True) -> str:
  """``client c (local loss x, ||Delta|| y[, its dual ||y|| z])`` of a round's worst client."""
  state = row.get("worst_client_state_norm")
  dual = f", its dual ||y|| {_num(state):.4g}" if dual and state is not None else ""
  return (f"client {row['worst_client']} (local loss {_num(row.get('worst_client_loss')):.4g}"
          f", ||Delta|| {_num(row.get('delta_norm_max')):.4g}{dual})")


CLOCK_LOCAL_ADVICE = ("the cause is local training: a smaller local.lr or local.momentum, "
                      "or local.client_grad_clip (e.g. 10), usually avoids it")
LOCAL_ADVICE = (CLOCK_LOCAL_ADVICE + " (algorithm.drop_nonfinite_uploads keeps the global "
                "model finite)")
SERVER_ADVICE = ("a smaller local.lr or algorithm.server_lr (PAFed: algorithm.alpha0/1/2) "
                 "usually avoids it")


def cause(rows: List[dict]) -> Optional[tuple]:
  """(what the clients' health in ``rows``, a run's rows up to and including the
  non-finite one, says went wrong first, whether the cause is local), or None for rows
  without health fields. A non-finite client result is a local cause when a client was
  far out before it or others of its round were finite; else the model they started
  from is (a server step)."""
  if rows and "event" in rows[-1]:  # the virtual clock's arrivals
    rows = arrival_health(rows)
  if not rows or "worst_client" not in rows[-1]:
    return None
  where = lambda r: f"round {r['round']}" if "round" in r else f"group {r.get('group')}"
  around = "its round" if "round" in rows[-1] else "the arrivals before it"
  first_bad = next((r for r in rows if outlier(r) == "nonfinite"), None)
  first_out = next((r for r in rows if outlier(r) is not None), None)
  earlier = ""
  if first_bad is not None:
    same = next((r for r in rows if outlier(r) is not None
                 and r["worst_client"] == first_bad["worst_client"]), first_bad)
    if same is not first_bad:
      earlier = f"; it was first far outside {around} in {where(same)}: {describe(same)}"
    if first_out is not same:
      earlier += (f"; the first client far outside {around}: {describe(first_out)} in "
                  f"{where(first_out)}")
  if first_bad is not None:
    text = f"the first non-finite client result: {describe(first_bad)} in {where(first_bad)}"
    if first_out is first_bad and (first_bad.get("client_nonfinite_share") or 0) >= 1:
      # no client far out before it, and none of its round finite: the model they all
      # started from is the likelier cause (a server step), not one client's training
      unit = "round" if "round" in first_bad else "group"
      return (f"{text}; no client was far out before it, nor any of its {unit} finite: the "
              "likelier cause is the model they started from", False)
    return text + earlier, True
  if first_out is not None:
    return (f"every client's result was finite; the first client far outside {around}: "
            f"{describe(first_out)} in {where(first_out)}", True)
  return (f"every client's result was finite and none far outside {around}: the server "
          "step made the model non-finite", False)


def _finite(x) -> bool:
  try:
    return bool(jnp.all(jnp.isfinite(x)))
  except Exception:  # pylint: disable=broad-except  (arrays this process cannot read)
    return True


def advice(data, rows: Optional[List[dict]] = None) -> str:
  """What to change after a ``Diverged``: which features are not finite, if ``data``'s (a
  ``FederatedData`` or the engine's ``DeviceData``) are not; else what the clients' health
  in ``rows`` (the run's rows up to the non-finite one) found (``cause``) and the advice
  that fits it: the local step for a local blow-up, the server step otherwise."""
  bad = [what for what, x in (("training", data.x), ("test", data.test_x)) if not _finite(x)]
  if bad:
    return (f"the {' and '.join(bad)} features hold NaN/Inf: drop or impute those examples "
            "(fa.data.from_arrays and from_clients refuse them)")
  found = cause(rows or [])
  if found is None:
    return SERVER_ADVICE
  text, local = found
  clock = bool(rows) and "event" in rows[-1]  # (the virtual clock drops no upload)
  return f"{text}; {(CLOCK_LOCAL_ADVICE if clock else LOCAL_ADVICE) if local else SERVER_ADVICE}"
