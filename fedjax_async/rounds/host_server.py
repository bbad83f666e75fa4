"""Rounds whose server step runs on the host: the round engine's jitted client phase and
round end around a ``HostServer`` (PAFed's server under CKKS, ``crypto.secure_engine``).

The same round as ``engine.round_step``, with step 5 (the server) on the host:

1-4. ``engine.client_phase`` (jitted): gather from the ring buffer, vmapped local
     training, the uploads, client state scattered back.
5.   ``server.step``: the round's uploads (online and delayed) in, w^{t+1} out, with the
     clients dispatched next round (who receive w^{t+1}).
6.   ``engine.finish_round`` (jitted): ring-buffer write and the round's metrics.

Rounds run one at a time (a host server's work per round is seconds to minutes, so fusing
rounds in a scan would buy nothing). The server plugs in here; it imports nothing of the
round engine.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Callable, Dict, List, Optional, Protocol, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import console
from fedjax_async import interrupts
from fedjax_async.algorithms import base
from fedjax_async.core import device as ops
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.rounds import engine


class HostServer(Protocol):
  """A server step on the host (``run_host_rounds``)."""

  name: str  # the progress lines' prefix, e.g. "pafed/ckks"
  stages: Tuple[str, ...]  # the timed stages of ``step`` (``he_<stage>_s`` metrics)

  def step(self, t: int, w: np.ndarray, uploads: np.ndarray, online: np.ndarray,
           delayed: np.ndarray, recipients: tuple
           ) -> Tuple[np.ndarray, Dict[str, object], Dict[str, float]]:
    """Round t: (w^{t+1}, the round's own metrics, seconds per stage) from w^t (the
    state's), the round's [K, d] uploads with their online / delayed masks, and the
    clients dispatched in round t + 1.

    Args:
      t: the round.
      w: w^t.
      uploads: the round's [K, d] uploads.
      online: [K] bool, the online uploads.
      delayed: [K] bool, the delayed uploads that arrived.
      recipients: the clients dispatched in round t + 1.
    """

  def note(self, metrics: Dict[str, object]) -> str:
    """Text appended to the round's progress line."""

  def close(self) -> None:
    """Frees what the server started (worker pools)."""


def next_round_recipients(tl: timeline_lib.Timeline, t: int) -> tuple:
  """Clients dispatched in round t + 1: they need w^{t+1} (PAFed: Enc_pk_i(w^{t+1}), Alg. 5
  line 8).

  Those online in round t + 1 and the delayed ones dispatched then, whose updates arrive
  in later rounds. A client dispatched in t + 1 whose update is dropped (older than the
  ring buffer) or still in flight after the last round has no slot in the timeline and
  is not counted (its update never reaches the server)."""
  if t + 1 >= tl.num_rounds:
    return ()
  later = np.s_[t + 1:]
  sel = tl.valid[later] & (tl.dispatch[later] == t + 1)
  return tuple(int(i) for i in np.unique(tl.client[later][sel]))


def round_shape(tl: timeline_lib.Timeline) -> Dict[str, int]:
  """The largest round of ``tl``: uploads, delayed uploads, and clients that receive a
  model (ids below ``recipients``): what a host server is sized for."""
  return {"uploads": int(tl.valid.sum(1).max()),
          "delayed": int((tl.valid & ~tl.online).sum(1).max()),
          "recipients": int(tl.sampled.max()) + 1}


def _round_rows(metrics: dict, evaluated, t_round: float) -> List[dict]:
  """The round's metrics row (with the test accuracy and loss when ``evaluated``)."""
  acc, loss = evaluated if evaluated is not None else (jnp.float32(jnp.nan),
                                                       jnp.float32(jnp.nan))
  metrics["test_accuracy"], metrics["test_loss"] = acc, loss
  rows = engine.metrics_to_rows(jax.tree.map(lambda v: jnp.asarray(v)[None], metrics))
  rows[0]["wall_time"] = time.perf_counter() - t_round
  return rows


def _plaintext_pieces(apply_flat: Callable, algorithm: base.Algorithm,
                      ecfg: engine.EngineConfig, data: engine.DeviceData):
  """The jitted client phase, round end and evaluation of the round engine. The round's
  [K, d] uploads are kept (not folded into the plaintext server's running sums chunk by
  chunk): the host server takes them."""
  ecfg = dataclasses.replace(ecfg, stream_uploads=False)
  phase_fn = jax.jit(functools.partial(engine.client_phase, apply_flat=apply_flat,
                                       algorithm=algorithm, cfg=ecfg))
  eval_fn = jax.jit(lambda w: ops.evaluate(apply_flat, w, data.test_x, data.test_y,
                                           ecfg.eval_batch))
  return phase_fn, jax.jit(engine.finish_round), eval_fn


def _step_or_stop(run_step: Callable, state, on_chunk: Optional[Callable]):
  """``run_step()``; on a stop asked for mid-round (``interrupts.Interrupted`` from the
  server) this round is dropped: ``on_chunk`` with no rows checkpoints the rounds before
  it, as at a stop between rounds, and raises the stop itself."""
  try:
    return run_step()
  except interrupts.Interrupted:
    if on_chunk is not None:
      on_chunk(state, [])
    raise


def run_host_rounds(apply_flat: Callable, algorithm: base.Algorithm,
                    ecfg: engine.EngineConfig, state: engine.SimState,
                    tl: timeline_lib.Timeline, hp: Dict[str, float],
                    data: engine.DeviceData, server: HostServer, *,
                    on_chunk: Optional[Callable] = None, eval_every: int = 1,
                    stop_round: Optional[int] = None, stream=sys.stdout):
  """Runs rounds ``state.round ..`` with ``server``'s step on the host; ``on_chunk(state,
  rows)`` after each round (the host loop's checkpoints and signals).

  Returns ``(state, rows, totals)``: the final state, one metrics row per round (the
  engine's keys plus the server's) and the total seconds per stage.

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm (its client side; the server is ``server``).
    ecfg: the round engine's static configuration.
    state: the state to continue from.
    tl: the timeline.
    hp: the hyper-parameters.
    data: the device data.
    server: the host server.
    on_chunk: called as ``on_chunk(state, rows)`` after each round.
    eval_every: evaluate every this many rounds (and in the last 10).
    stop_round: stop before this round (None: the timeline's end).
    stream: where progress lines go.
  """
  hp = {k: jnp.asarray(v, jnp.float32) for k, v in hp.items()}
  phase_fn, finish_fn, eval_fn = _plaintext_pieces(apply_flat, algorithm, ecfg, data)
  total = tl.num_rounds
  stop = total if stop_round is None else min(stop_round, total)
  schedule = engine.eval_schedule(total, eval_every)
  totals = {s: 0.0 for s in server.stages}
  all_rows: List[dict] = []
  for t in range(int(state.round), stop):
    t_round = time.perf_counter()
    slots = jax.tree.map(lambda a: jnp.asarray(a[0]), tl.slice(t, t + 1))
    phase = phase_fn(state, slots, hp, data)
    uploads = np.asarray(phase.uploads, np.float64)
    online = np.asarray(phase.arrivals.online)
    delayed = np.asarray(phase.arrivals.delayed)
    w = np.asarray(state.w, np.float64)
    new_w, alg_metrics, timings = _step_or_stop(
        lambda: server.step(t, w, uploads, online, delayed, next_round_recipients(tl, t)),
        state, on_chunk)
    alg_metrics = dict(alg_metrics)
    alg_metrics.update({f"he_{s}_s": jnp.float32(timings[s]) for s in server.stages})
    state, metrics = finish_fn(state, phase, jnp.asarray(new_w, jnp.float32),
                               state.server_state, slots, alg_metrics)
    rows = _round_rows(metrics, eval_fn(state.w) if schedule[t] else None, t_round)
    if hasattr(server, "traffic"):  # bytes measured on its wire
      rows[0].update(server.traffic())
    if (not engine.host_stops_on_divergence(on_chunk)
        and engine.first_nonfinite(rows) is not None):
      raise engine.diverged(rows, 0)
    for s in server.stages:
      totals[s] += timings[s]
    console.say(f"[{server.name}] round {t + 1}/{total}: " + ", ".join(
              f"{s} {timings[s]:.2f}s" for s in server.stages)
                + f" ({rows[0]['delayed']} delayed{server.note(alg_metrics)})", stream=stream,
                level=console.PROGRESS)
    all_rows.extend(rows)
    if on_chunk is not None:
      on_chunk(state, rows)
  n = max(len(all_rows), 1)
  console.say(f"[{server.name}] mean time per round: " + ", ".join(
            f"{s} {totals[s] / n:.2f}s" for s in server.stages), stream=stream,
              level=console.PROGRESS)
  return state, all_rows, totals


def run_encrypted_rounds(apply_flat: Callable, algorithm: base.Algorithm,
                         ecfg: engine.EngineConfig, state: engine.SimState,
                         tl: timeline_lib.Timeline, hp: Dict[str, float],
                         data: engine.DeviceData, *, protocol=None, on_chunk=None,
                         eval_every: int = 1, stop_round: Optional[int] = None,
                         stream=sys.stdout, **server_kw):
  """``run_host_rounds`` with PAFed's server under CKKS (``crypto.secure_aggregation=
  ckks``): ``crypto.secure_engine.make_server`` for ``tl``'s largest round and the
  data's clients (``server_kw``: its preset, min_depth, min_scale, design,
  empty_class_tol), or around a ``protocol`` already made. The server's worker pools
  are closed at the end.

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm (PAFed).
    ecfg: the round engine's static configuration.
    state: the state to continue from.
    tl: the timeline.
    hp: the hyper-parameters.
    data: the device data.
    protocol: a protocol already made (None: a new one).
    on_chunk: called as ``on_chunk(state, rows)`` after each round.
    eval_every: evaluate every this many rounds (and in the last 10).
    stop_round: stop before this round (None: the timeline's end).
    stream: where progress lines go.
    **server_kw: ``make_server``'s settings.
  """
  # OpenFHE is an optional dependency: the encrypted server is loaded only here.
  from fedjax_async.crypto import secure_engine  # pylint: disable=g-import-not-at-top
  server = secure_engine.make_server(
      algorithm.name, hp, int(state.w.shape[0]), int(data.counts.shape[0]),
      protocol=protocol, stream=stream, **round_shape(tl), **server_kw)
  try:
    return run_host_rounds(apply_flat, algorithm, ecfg, state, tl, hp, data, server,
                           on_chunk=on_chunk, eval_every=eval_every, stop_round=stop_round,
                           stream=stream)
  finally:
    server.close()
