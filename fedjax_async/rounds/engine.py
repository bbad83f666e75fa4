"""The round loop: ring buffer of past global models, vmapped clients, jitted rounds.

One round t (``round_step``), all inside one jitted function:

1. read round t's arrival slots from the timeline (``fedjax_async.core.timeline``): client ids,
   dispatch rounds, online/valid masks, padded to K;
2. gather each arrival's starting model from the ring buffer by its dispatch round
   (``ring[dispatch % R]``; so the server state its rule's clients read, ``server_ring``)
   and its persistent state (``[N, d]`` arrays, e.g. ADMM duals) by client id;
3. train all K clients in one ``jax.vmap`` of ``client.train`` (each step reads its
   minibatch rows from the ``[N, M, ...]`` data in place; with ``client_sharding`` the K
   clients are split over the devices; with ``client_chunk`` a ``lax.scan`` over chunks
   of vmapped clients does steps 2-4 chunk by chunk);
4. ``algorithm.client_final`` (vmapped) -> uploads and new per-client state, scattered back
   by client id (padding slots scatter out of bounds and are dropped); with
   ``client_chunk`` and a server rule that reads the uploads in one pass the uploads are
   folded in chunk by chunk (``EngineConfig.stream_uploads``);
5. ``algorithm.server_update`` folds the arrivals into the global model;
6. write the new global model into the ring buffer at ``(t + 1) % R``.

``run_chunk`` fuses several rounds into one ``lax.scan`` (no host round trip per round),
evaluating the global model on the central test set in the rounds the host asks for.
``run_rounds`` is the host loop: it feeds chunks, prints progress and hands metrics back.
A delayed client is trained in its arrival round from the model of its dispatch round; the
timeline never re-samples a client while its update is in flight, so its persistent state
is the same as at dispatch and the result equals training at dispatch time.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import compilation
from fedjax_async import loop
from fedjax_async.algorithms import base
from fedjax_async.core import client as client_lib
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.core.device import (DeviceData, client_key, evaluate, materialized,
                                      scan_chunks)
from fedjax_async.core.divergence import (Diverged, diverged, first_nonfinite,
                                          host_stops_on_divergence)


class SimState(NamedTuple):
  """Everything a run needs to continue (what a checkpoint saves)."""

  round: jax.Array  # int32: the next round to run
  w: jax.Array  # [d] current global model
  ring: jax.Array  # [R, d]; ring[t % R] is the global model at the start of round t
  client_state: Dict[str, jax.Array]  # each [N, d]
  server_state: Any
  key: jax.Array  # base PRNG key; client keys derive from (dispatch round, client id)
  # {key: [R, d]}: the server state the clients read (``Algorithm.client_reads_server``)
  # at the start of round t in slot t % R, beside ``ring``'s model
  server_ring: Dict[str, jax.Array] = {}


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static configuration of the round engine.

  ``client_sharding`` (optional, e.g. ``fedjax_async.sharding.client_sharding(mesh)``): a
  ``jax.sharding.Sharding`` for arrays with a leading client-slot axis K. When set, the
  gathered per-client arrays of a round are constrained to it, so local training runs
  split over the mesh's devices (K must be a multiple of the device count; see
  ``fedjax_async.sharding.pad_timeline``). ``None`` (default) leaves the round unchanged.

  ``client_chunk`` (optional, G): train the round's K clients as a ``lax.scan`` over
  ceil(K / G) chunks of G vmapped clients instead of one vmap of K. Same results; the
  training intermediates (activations, gradients, momentum) exist for G clients at a
  time, and each chunk gathers and scatters its own rows of the ``[N, d]`` client state,
  so large models at large K fit in memory and a chunk's parameters stay in cache
  (docs/performance.md). ``None`` (default): one vmap over all K.

  ``stream_uploads`` (default True): with ``client_chunk`` and an algorithm whose server
  reads the uploads in one pass (``Algorithm.streamed_server``: FedAvg, FedProx, FedNova
  and FedADMM through one weighted sum, PAFed through DUCC's running sums), each chunk's
  uploads are folded into the rule's carry as the chunk is trained, a ``lax.scan`` carry,
  so the round's ``[K, d]`` uploads never exist (the same sums in a different order of
  additions). False keeps the ``[K, d]`` block.

  ``drop_nonfinite`` (default False, a deviation from every paper's server): an arrival
  whose upload, new client state or local loss is not finite is no arrival (the server
  never sees it, ``dropped_nonfinite`` in the round's metrics) and its client keeps the
  state it had (``client_health``).

  ``progress`` (optional): called on the host with the number of rounds done at the end
  of every round, from inside a compiled chunk of rounds (``jax.debug.callback``), so a
  console can report a long chunk while it runs. It changes no result.
  """

  local: client_lib.LocalConfig
  ring_size: int
  eval_batch: int = 1000
  client_sharding: Optional[Any] = None
  client_chunk: Optional[int] = None
  stream_uploads: bool = True
  drop_nonfinite: bool = False
  progress: Optional[Callable[[Any], None]] = None

  def __post_init__(self):
    if self.ring_size < 1:
      raise ValueError(f"EngineConfig.ring_size must be >= 1 (one slot per round of delay "
                       f"kept), got {self.ring_size}")
    if self.eval_batch < 1:
      raise ValueError(f"EngineConfig.eval_batch must be >= 1, got {self.eval_batch}")
    if self.client_chunk is not None and self.client_chunk < 1:
      raise ValueError(f"EngineConfig.client_chunk must be None (one vmap over all K "
                       f"clients) or >= 1 (clients per lax.scan chunk), got "
                       f"{self.client_chunk}")


# Models at least this large train one client at a time (``client_chunk=1``) on CPU by
# default: measured on a 2-core CPU (docs/performance.md, "The CNN round against the
# roofline"), the 1.66M-parameter CNN round ran 1.3-1.7x faster that way than as one vmap
# of K clients (each client's parameters stay in cache through its step), while
# 610-parameter logistic regression ran 1.1-1.5x slower (it needs the vmap to amortise
# per-step overhead).
AUTO_CHUNK_MIN_PARAMS = 100_000


def auto_client_chunk(num_params: int, backend: Optional[str] = None) -> Optional[int]:
  """The ``client_chunk`` used when none is given: 1 for large models on CPU, else None."""
  backend = jax.default_backend() if backend is None else backend
  return 1 if backend == "cpu" and num_params >= AUTO_CHUNK_MIN_PARAMS else None


def init_state(algorithm: base.Algorithm, w0, num_clients: int, ring_size: int,
               seed: int) -> SimState:
  """The state before round 0: ``w0`` as the model and in every ring slot, each client's
  initial state, the server's, the PRNG key of ``seed``.

  Args:
    algorithm: the algorithm (its client and server state).
    w0: [d] the initial model.
    num_clients: N.
    ring_size: R, the ring buffer's slots.
    seed: the base PRNG key's seed.
  """
  w0 = jnp.array(w0, jnp.float32, copy=True)  # the runner donates the state's buffers
  one = algorithm.init_client_state(w0)
  client_state = {k: jnp.broadcast_to(one[k], (num_clients,) + w0.shape)
                  for k in algorithm.client_state_keys}
  ring = jnp.broadcast_to(w0, (ring_size,) + w0.shape)
  server_state = algorithm.init_server_state(w0)
  server_ring = {k: jnp.broadcast_to(v, (ring_size,) + jnp.shape(v))
                 for k, v in base.server_reads(algorithm, server_state).items()}
  return SimState(jnp.int32(0), w0, ring, client_state, server_state,
                  jax.random.key_data(jax.random.PRNGKey(seed)), server_ring)


class ClientPhase(NamedTuple):
  """Steps 1-4 of a round: what the server receives, and the updated client state."""

  uploads: Optional[jax.Array]  # [K, d]; None when streamed (upload_carry instead)
  arrivals: base.Arrivals
  client_state: Dict[str, jax.Array]  # [N, d] each, already scattered
  mean_loss: jax.Array  # [K]
  upload_carry: Any = None  # the streamed server rule's carry after all K uploads
  health: Optional[Dict[str, jax.Array]] = None  # [K] each: ``client_health``'s scalars
  arrived: Optional[jax.Array] = None  # [K] bool: the round's arrivals before any drop


def client_health(w_start, res: client_lib.ClientResult, out: base.ClientOutput,
                  state_key: Optional[str]) -> Dict[str, jax.Array]:
  """One client's health scalars, reduced where it trained: ``loss`` (its mean local
  loss), ``delta_norm`` (||w_end - w_start||, before any rule normalises it; inf where it
  overflows float32), ``finite`` (its loss, upload and new state all finite) and, for a
  rule with client state, ``state_norm`` (the norm of its new ``state_key`` vector: the
  ADMM dual)."""
  leaves = jax.tree.leaves((out.upload, out.state, out.correction))
  finite = jnp.isfinite(res.mean_loss)
  for leaf in leaves:
    finite = finite & jnp.all(jnp.isfinite(leaf))
  health = {"loss": res.mean_loss, "delta_norm": _norm(res.w_end - w_start),
            "finite": finite}
  if state_key is not None:
    health["state_norm"] = _norm(out.state[state_key])
  return health


def _norm(x):
  """||x||, scaled by max |x| first: finite up to float32's largest value (a plain sum of
  squares overflows past 1.8e19)."""
  m = jnp.max(jnp.abs(x))
  return m * jnp.linalg.norm(jnp.where(m > 0, x / jnp.where(m > 0, m, 1.0), 0.0))


def health_state_key(algorithm: base.Algorithm) -> Optional[str]:
  """The client-state vector whose norm the round's health reports: the ADMM dual, else
  the rule's first state vector; None for a rule without client state."""
  keys = algorithm.client_state_keys
  return ("dual" if "dual" in keys else keys[0]) if keys else None


def _nonfinite_as_inf(x):
  return jnp.where(jnp.isnan(x), jnp.inf, x)


def _masked_median(x, mask):
  """The median of ``x`` over ``mask`` (NaN where the mask is empty); +inf sorts last."""
  n = jnp.sum(mask)
  s = jnp.sort(jnp.where(mask, x, jnp.inf))
  mid = (s[jnp.maximum(n - 1, 0) // 2] + s[n // 2]) / 2
  return jnp.where(n > 0, mid, jnp.nan)


def health_metrics(health: Dict[str, jax.Array], arrived) -> Dict[str, jax.Array]:
  """The round's client health (docs/experiments.md, "metrics.jsonl"), reduced over its
  arrivals (``arrived`` [K], before ``drop_nonfinite``): the largest and median local loss
  and ||Delta||, a non-finite value counting as +inf; ``worst_client``, the client of the
  largest ||Delta|| (-1 in a round without arrivals), its loss and state norm; the share of
  arrivals with a non-finite result; for a rule with client state the largest state norm.
  NaN (a row's null) where the round has no arrivals."""
  n = jnp.sum(arrived)
  loss = _nonfinite_as_inf(health["loss"])
  delta = _nonfinite_as_inf(health["delta_norm"])
  largest = lambda x: jnp.where(n > 0, jnp.max(jnp.where(arrived, x, -jnp.inf)), jnp.nan)
  worst = jnp.argmax(jnp.where(arrived, delta, -1.0))  # the first of the largest
  out = {
      "client_loss_max": largest(loss),
      "client_loss_median": _masked_median(loss, arrived),
      "delta_norm_max": largest(delta),
      "delta_norm_median": _masked_median(delta, arrived),
      "worst_client": jnp.where(n > 0, health["client"][worst], -1).astype(jnp.int32),
      "worst_client_loss": jnp.where(n > 0, health["loss"][worst], jnp.nan),
      "client_nonfinite_share": jnp.sum(arrived & ~health["finite"]) / jnp.maximum(n, 1),
  }
  if "state_norm" in health:
    out["client_state_norm_max"] = largest(_nonfinite_as_inf(health["state_norm"]))
    out["worst_client_state_norm"] = jnp.where(n > 0, health["state_norm"][worst], jnp.nan)
  return out


def _finite_rows(tree, ok):
  """``tree``'s rows where ``ok`` [G], zeros elsewhere (a dropped upload enters no sum)."""
  return jax.tree.map(
      lambda a: jnp.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, 0), tree)


def trains_in_chunks(cfg: EngineConfig, k: int) -> bool:
  """Whether a round of K slots trains its clients in ``client_chunk`` chunks."""
  return cfg.client_chunk is not None and cfg.client_chunk < k


def streams_uploads(algorithm: base.Algorithm, cfg: EngineConfig, k: int) -> bool:
  """Whether a round of K slots folds its uploads in chunk by chunk (``stream_uploads``)."""
  return (cfg.stream_uploads and algorithm.streamed_server is not None
          and trains_in_chunks(cfg, k))


def _vmap_rows(fn: Callable) -> Callable:
  """``jax.vmap(fn)``, except that a chunk of one row calls ``fn`` on the row itself (and
  adds the axis back): the per-client program then has no batch dimension of size 1,
  which XLA:CPU compiles into slower code."""

  def run(*args):
    if jax.tree.leaves(args)[0].shape[0] != 1:
      return jax.vmap(fn)(*args)
    out = fn(*jax.tree.map(lambda a: a[0], args))
    return jax.tree.map(lambda a: a[None], out)

  return run


def _train_in_chunks(train_and_final, client_state, round_start, hp, algorithm, cfg,
                     always_true, ring_row, ids, client_ids, n_local, keys, valid, online,
                     staleness, num_clients):
  """The round's clients in chunks of ``cfg.client_chunk``, one ``lax.scan`` step each.

  Each chunk gathers its own rows of the ``[N, d]`` client state and scatters its new rows
  back (the arrays are the scan's carry, updated in place), so no ``[K, d]`` block of
  gathered or new state exists; with a streamed server rule (``streams_uploads``) its
  uploads are folded into the rule's carry (started from ``round_start``, the round's
  (w, server_state)), else they are stacked ``[K, d]``.
  Returns (training results [K], health scalars [K], (uploads [K, d], their corrections)
  or (None, None), the rule's carry or None, the new client state).
  """
  stream = streams_uploads(algorithm, cfg, valid.shape[0])
  rule = algorithm.streamed_server

  def body(carry, real, ri, si, ci, ni, ki, v, on, st):
    """One chunk of G clients: trained, their state scattered back, their uploads folded in
    or kept.

    Args:
      carry: (the [N, d] client state, the streamed rule's carry).
      real: [G] bool, the chunk's real rows (False: ``scan_chunks``'s padding).
      ri: [G] the ring rows of their start models.
      si: [G] the client ids their new state scatters to (N: none).
      ci: [G] their data rows.
      ni: [G] their example counts.
      ki: [G] their PRNG keys.
      v: [G] bool, the arrivals.
      on: [G] bool, the online slots.
      st: [G] their staleness.
    """
    cstate, total = carry
    cs = materialized({k: a[ci] for k, a in cstate.items()}, always_true)
    res, out, health = _vmap_rows(train_and_final)(ri, cs, ci, ni, ki)
    keep = real & health["finite"] if cfg.drop_nonfinite else real
    si = jnp.where(keep, si, num_clients)  # padding rows scatter out of bounds
    cstate = {k: a.at[si].set(out.state[k], mode="drop") for k, a in cstate.items()}
    upload = (out.upload, out.correction)
    upload = _finite_rows(upload, keep) if cfg.drop_nonfinite else upload
    if stream:  # the chunk's uploads folded in here (e.g. a [d] sum), not kept [K, d]
      v = v & keep
      rows = base.Arrivals(valid=v, online=on & v, delayed=v & ~on, staleness=st,
                           num_examples=ni.astype(jnp.float32),
                           num_steps=res.num_steps.astype(jnp.float32), start_params=None,
                           correction=_correction(upload[1]),
                           num_clients=jnp.full(v.shape, num_clients, jnp.float32))
      total = rule.add(total, upload[0], rows, hp)
      return (cstate, total), (res, health, ())
    return (cstate, total), (res, health, upload)

  # the rule's carry from (w, server_state) at the round's start (uploads are w-shaped)
  zero = rule.init(*round_start) if stream else None
  (new_state, total), (res, health, uploads) = scan_chunks(
      body, cfg.client_chunk, (client_state, zero), ring_row, ids, client_ids, n_local, keys,
      valid, online, staleness)
  return res, health, (None, None) if stream else uploads, total, new_state


def _correction(c):
  """A round's (or chunk's) ``ClientOutput.correction`` rows, None when the rule has none."""
  return c if jax.tree.leaves(c) else None


_SLOT_FIELDS = ("valid", "client", "dispatch", "online", "lost")  # a round's [K] slot arrays


def _train_in_one_vmap(train_and_final, client_state, cfg, always_true, ring_row, ids,
                       gather_ids, client_ids, n_local, keys):
  """The round's K clients in one vmap: (training results, health, (uploads [K, d], their
  corrections), the new client state scattered back by ``ids``; padding and, with
  ``cfg.drop_nonfinite``, non-finite results are dropped)."""
  num_clients = jax.tree.leaves(client_state)[0].shape[0] if client_state else 0
  cstate = materialized({k: v[gather_ids] for k, v in client_state.items()}, always_true)
  if cfg.client_sharding is not None:
    cstate = jax.lax.with_sharding_constraint(cstate, cfg.client_sharding)
  res, out, health = jax.vmap(train_and_final)(ring_row, cstate, client_ids, n_local, keys)
  uploads, scatter_ids = (out.upload, out.correction), ids
  if cfg.drop_nonfinite:  # a non-finite result: no upload, the client's state kept
    uploads = _finite_rows(uploads, health["finite"])
    scatter_ids = jnp.where(health["finite"], ids, num_clients)
  new_cstate = {k: client_state[k].at[scatter_ids].set(out.state[k], mode="drop")
                for k in client_state}
  return res, health, uploads, new_cstate


def client_phase(state: SimState, slots, hp, data: DeviceData, *, apply_flat: Callable,
                 algorithm: base.Algorithm, cfg: EngineConfig) -> ClientPhase:
  """Gather (ring buffer, client state), vmapped local training, scatter.

  Args:
    state: the state at the round's start.
    slots: the round's row of the timeline (``valid``, ``client``, ``dispatch``, ...).
    hp: the hyper-parameters.
    data: the device data.
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm.
    cfg: the engine's static configuration.
  """
  t = state.round
  num_clients = data.counts.shape[0]
  k = slots["valid"].shape[0]
  if streams_uploads(algorithm, cfg, k) and algorithm.streamed_server.online_first:
    # The rule folds in every online upload before any delayed one (PAFed's DUCC weighs
    # a delayed upload against the online mean): the round's online slots first. The
    # timeline already orders them so (``timeline.build``); other timelines need not.
    order = jnp.argsort(~(slots["valid"] & slots["online"]), stable=True)
    slots = dict(slots, **{f: slots[f][order] for f in _SLOT_FIELDS if f in slots})
  if cfg.client_sharding is not None:
    # The slot arrays replicated: without this GSPMD splits them like the clients, and
    # every sum over K in the metrics becomes a cross-device all-reduce.
    rep = jax.sharding.NamedSharding(cfg.client_sharding.mesh, jax.sharding.PartitionSpec())
    slots = dict(slots, **jax.lax.with_sharding_constraint(
        {k: slots[k] for k in _SLOT_FIELDS if k in slots}, rep))
  valid = slots["valid"]
  # A lost slot (timeline.DelayConfig.train_dropped) trains and keeps its client state,
  # but is no arrival: the server never sees its upload.
  trains = valid if "lost" not in slots else valid | slots["lost"]
  ids = jnp.where(trains, slots["client"], num_clients)  # out of bounds for padding
  gather_ids = jnp.minimum(ids, num_clients - 1)
  dispatch = slots["dispatch"]
  ring_row = dispatch % state.ring.shape[0]  # the ring slot holding the model each client started from
  n = data.counts[gather_ids]
  keys = jax.vmap(client_key, in_axes=(None, 0, 0))(state.key, dispatch, gather_ids)
  client_ids, n_local = gather_ids, n
  if cfg.client_sharding is not None:  # split the client-slot axis K over the devices
    ring_row, client_ids, n_local, keys = jax.lax.with_sharding_constraint(
        (ring_row, client_ids, n, keys), cfg.client_sharding)

  train = functools.partial(client_lib.train, apply_flat, algorithm, hp=hp, cfg=cfg.local)
  state_key = health_state_key(algorithm)
  def train_and_final(ri, cs, ci, ni, ki):
    # The start model is read from its ring slot here, not gathered into a [K, d] block
    # first (with client_chunk, one write and one read of d floats less per client), and so
    # is the server state it reads (``Algorithm.client_reads_server``).
    # Each local step reads its minibatch rows from data.x[ci]: the round's clients' data
    # is never copied out as a [K, M, ...] block (gigabytes with a large padded M, and
    # the slowest part of a round's first run on CPU: fresh pages).
    w0 = state.ring[ri]
    cs = {**cs, **{key: r[ri] for key, r in state.server_ring.items()}}
    res = train(w0, cs, data.x, data.y, ni, ki,
                client_index=ci if data.rows is None else data.rows[ci])
    out = algorithm.client_final(w0, res.w_end, cs, res.num_steps, hp)
    health = client_health(w0, res, out, state_key)
    return res._replace(w_end=()), out, health  # w_end is not kept: no [K, d] copy of it

  online = valid & slots["online"]
  staleness = jnp.where(valid, t - dispatch, 0)
  upload_carry = None
  if trains_in_chunks(cfg, k):
    res, health, uploads, upload_carry, new_cstate = _train_in_chunks(
        train_and_final, state.client_state, (state.w, state.server_state), hp, algorithm,
        cfg, t >= 0, ring_row, ids, client_ids, n_local, keys, valid, online, staleness,
        num_clients)
  else:
    res, health, uploads, new_cstate = _train_in_one_vmap(
        train_and_final, state.client_state, cfg, t >= 0, ring_row, ids, gather_ids,
        client_ids, n_local, keys)
  if cfg.drop_nonfinite:  # (the streamed rule's carry already left them out)
    valid = valid & health["finite"]
    online = online & valid
    staleness = jnp.where(valid, staleness, 0)
  arrivals = base.Arrivals(valid=valid, online=online, delayed=valid & ~slots["online"],
                           staleness=staleness,
                           num_examples=n.astype(jnp.float32),
                           num_steps=res.num_steps.astype(jnp.float32),
                           start_params=state.ring[ring_row], correction=_correction(uploads[1]),
                           num_clients=jnp.full(valid.shape, num_clients, jnp.float32))
  mean_loss = res.mean_loss
  if cfg.client_sharding is not None:
    # The per-client [K] scalars replicated (like the slot arrays above): the round's
    # metrics and the server's weights then sum them on every device instead of one
    # cross-device rendezvous per sum (FedAvg: 4 collectives per round instead of 10).
    fields = ("valid", "online", "delayed", "staleness", "num_steps")
    small, mean_loss, health = jax.lax.with_sharding_constraint(
        ({f: getattr(arrivals, f) for f in fields}, mean_loss, health), rep)
    arrivals = arrivals._replace(**small)
  return ClientPhase(uploads[0], arrivals, new_cstate, mean_loss, upload_carry,
                     dict(health, client=gather_ids), slots["valid"])


def finish_round(state: SimState, phase: ClientPhase, new_w, server_state, slots,
                 alg_metrics) -> tuple:
  """Step 6 (ring buffer write, round counter) and the round's metrics.

  Args:
    state: the state at the round's start.
    phase: the round's ``client_phase``.
    new_w: w^{t+1}.
    server_state: the server's new state.
    slots: the round's row of the timeline.
    alg_metrics: the server rule's own metrics.

  Returns:
    (the new state, the round's metrics).
  """
  t = state.round
  slot = (t + 1) % state.ring.shape[0]
  ring = state.ring.at[slot].set(new_w)
  server_ring = {k: r.at[slot].set(server_state[k]) for k, r in state.server_ring.items()}
  new_state = SimState(t + 1, new_w, ring, phase.client_state, server_state, state.key,
                       server_ring)
  a = phase.arrivals
  delayed_f = a.delayed.astype(jnp.float32)
  num_valid = jnp.sum(a.valid)
  n_k = a.num_examples
  metrics = {
      "round": t + 1,  # rounds done: row r is the model after r rounds (1-based)
      "online": jnp.sum(a.online),
      "delayed": jnp.sum(a.delayed),
      "dropped": slots["dropped"],
      "mean_staleness": jnp.sum(a.staleness * delayed_f) / jnp.maximum(jnp.sum(delayed_f), 1),
      "max_staleness": jnp.max(jnp.where(a.delayed, a.staleness, 0)),
      # the round's training loss as Flower and pfl report it: example-weighted
      "train_loss": jnp.sum(jnp.where(a.valid, n_k * phase.mean_loss, 0.0)) / jnp.maximum(
          jnp.sum(jnp.where(a.valid, n_k, 0.0)), 1e-12),
      "train_loss_uniform": jnp.sum(jnp.where(a.valid, phase.mean_loss, 0.0)) / jnp.maximum(
          num_valid, 1),
      "client_steps": jnp.sum(jnp.where(a.valid, a.num_steps, 0)).astype(jnp.int32),
      "nonfinite": ~jnp.all(jnp.isfinite(new_w)),
      "model_norm": jnp.linalg.norm(new_w),  # ||w||: a diverging scale shows here first
      "server_step_norm": jnp.linalg.norm(new_w - state.w),  # ||w_{t+1} - w_t||
  }
  if phase.health is not None:
    metrics.update(health_metrics(phase.health, phase.arrived))
    # arrivals that EngineConfig.drop_nonfinite kept from the server (0 without it)
    metrics["dropped_nonfinite"] = jnp.sum(phase.arrived & ~a.valid).astype(jnp.int32)
  metrics.update(alg_metrics)
  return new_state, metrics


def round_step(state: SimState, slots, hp, data: DeviceData, *, apply_flat: Callable,
               algorithm: base.Algorithm, cfg: EngineConfig):
  """One round (steps 1-6 of the module docstring). ``slots``: one row of the timeline.

  Args:
    state: the state at the round's start.
    slots: the round's row of the timeline.
    hp: the hyper-parameters.
    data: the device data.
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm.
    cfg: the engine's static configuration.

  Returns:
    (the new state, the round's metrics).
  """
  phase = client_phase(state, slots, hp, data, apply_flat=apply_flat, algorithm=algorithm,
                       cfg=cfg)
  if phase.upload_carry is not None:  # streamed: the rule finished from its carry
    new_w, server_state, alg_metrics = algorithm.streamed_server.finish(
        state.w, state.server_state, phase.upload_carry, phase.arrivals, state.round, hp)
  else:
    new_w, server_state, alg_metrics = algorithm.server_update(
        state.w, state.server_state, phase.uploads, phase.arrivals, state.round, hp)
  return finish_round(state, phase, new_w, server_state, slots, alg_metrics)


def run_chunk(state: SimState, slots, eval_mask, hp, data: DeviceData, round_hp=None, *,
              apply_flat, algorithm, cfg: EngineConfig):
  """Several rounds in one ``lax.scan``; evaluates where ``eval_mask`` is set.

  ``round_hp`` (optional): a dict of ``[L]`` arrays, one value per round of the chunk,
  that override the same keys of ``hp`` round by round (schedules such as FedEDS's E_t,
  Eq. 5, and lambda_c / lambda_dis, Eqs. 9-10), scanned with the rounds so that a schedule
  needs no recompilation.

  Args:
    state: the state at the chunk's start.
    slots: the chunk's rows of the timeline (``[L]`` leading axis).
    eval_mask: [L] bool, the rounds evaluated.
    hp: the hyper-parameters.
    data: the device data.
    round_hp: ``[L]`` per-round values that override ``hp`` (None: none).
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm.
    cfg: the engine's static configuration.

  Returns:
    (the final state, the rounds' metrics stacked ``[L]``).
  """

  def body(s, inputs):
    row, do_eval, hp_t = inputs
    hp_r = {**hp, **hp_t}
    s, metrics = round_step(s, row, hp_r, data, apply_flat=apply_flat, algorithm=algorithm,
                            cfg=cfg)
    if cfg.progress is not None:
      jax.debug.callback(cfg.progress, s.round)  # _report: the current run's progress
    acc, loss = jax.lax.cond(
        do_eval,
        lambda w: evaluate(apply_flat, w, data.test_x, data.test_y, cfg.eval_batch),
        lambda w: (jnp.float32(jnp.nan), jnp.float32(jnp.nan)), s.w)
    metrics["test_accuracy"], metrics["test_loss"] = acc, loss
    return s, metrics

  return jax.lax.scan(body, state, (slots, eval_mask, {} if round_hp is None else round_hp))


# Compiled runners by (apply_flat, algorithm, config): a second run of the same shapes in
# this process compiles nothing. ``TRACES`` counts the traces of ``run_chunk`` (a trace
# precedes every compilation).
_RUNNERS: "collections.OrderedDict" = collections.OrderedDict()
_RUNNERS_KEPT = 8
_PROGRESS: list = [None]  # the progress function of the run being executed
TRACES = [0]


def _report(rounds_done):
  if _PROGRESS[0] is not None:
    _PROGRESS[0](rounds_done)


def make_runner(apply_flat: Callable, algorithm: base.Algorithm, cfg: EngineConfig):
  """``jit(run_chunk)`` with the static parts bound; the state buffer is donated. The
  program is kept for later runs with the same parts (the last ``_RUNNERS_KEPT``), and
  so are its ahead-of-time compilations (``Runner.compiled``); ``cfg.progress`` is the
  run's own (called through ``_report``). JAX's persistent cache is on
  (``compilation.enable``)."""
  compilation.enable()
  progress = cfg.progress
  shared = dataclasses.replace(cfg, progress=_report if progress is not None else None)
  try:
    key = (apply_flat, algorithm, shared)
    kept = _RUNNERS.get(key)
  except TypeError:  # an unhashable part: not kept
    key, kept = None, None
  if kept is None:
    fn = functools.partial(_traced_chunk, apply_flat=apply_flat, algorithm=algorithm,
                           cfg=shared)
    kept = (jax.jit(fn, donate_argnums=(0,)), {})
    if key is not None:
      _RUNNERS[key] = kept
      while len(_RUNNERS) > _RUNNERS_KEPT:
        _RUNNERS.popitem(last=False)
  else:
    _RUNNERS.move_to_end(key)
  return Runner(kept[0], progress, kept[1])


class Runner:
  """A kept jitted chunk called for one run: its progress function is the one
  ``_report`` calls (set before each call: the callbacks may run after it returns);
  ``compiled``: ahead-of-time compilations by argument shapes, shared by the runs."""

  def __init__(self, jitted, progress, compiled: dict):
    self.jitted, self.progress, self.compiled = jitted, progress, compiled

  def activate(self):
    """This run's progress function is the one the program's callbacks reach."""
    _PROGRESS[0] = self.progress

  def __call__(self, *args, **kwargs):
    self.activate()
    return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    self.activate()
    return self.jitted.lower(*args, **kwargs)


def _traced_chunk(*args, **kwargs):
  TRACES[0] += 1
  return run_chunk(*args, **kwargs)


def eval_schedule(num_rounds: int, eval_every: int, last: int = 10) -> np.ndarray:
  """Evaluate every ``eval_every`` rounds, and in each of the last ``last`` rounds (the
  PAFed paper's "average best accuracy" needs those)."""
  t = np.arange(num_rounds)
  return ((t + 1) % max(eval_every, 1) == 0) | (t >= num_rounds - last)


def metrics_to_rows(metrics: Dict[str, Any]) -> List[Dict[str, Any]]:
  """Scan output (dict of [C] arrays) -> one JSON-ready dict per round."""
  host = jax.device_get(metrics)
  rows = []
  for i in range(len(host["round"])):
    row = {}
    for k, v in host.items():
      x = np.asarray(v)[i]
      if x.ndim:  # per-arrival diagnostics stay arrays
        row[k] = x
      elif x.dtype == bool:
        row[k] = bool(x)
      elif np.issubdtype(x.dtype, np.integer):
        row[k] = int(x)
      else:
        x = float(x)
        row[k] = None if np.isnan(x) else x
    if row.get("test_accuracy") is not None and "test_loss" in row and row["test_loss"] is None:
      row["test_loss"] = float("nan")  # evaluated, and NaN: a divergence (first_nonfinite)
    rows.append(row)
  return rows


def run_rounds(runner, state: SimState, timeline: timeline_lib.Timeline, hp, data: DeviceData,
             *, eval_every: int = 1, rounds_per_call: int = 10,
             on_chunk: Optional[Callable[[SimState, List[dict]], None]] = None,
             stop_round: Optional[int] = None,
             round_hp: Optional[Dict[str, Any]] = None,
             lengths: Optional[loop.ChunkLengths] = None) -> tuple:
  """Runs rounds ``state.round .. stop_round`` (default: the whole timeline), in chunks
  of ``rounds_per_call`` rounds, or of the lengths ``lengths`` chooses.

  ``on_chunk(state, rows)`` is called after every jitted chunk (progress printing,
  metrics files, checkpoints). ``Diverged`` is raised naming the round when the global
  model or the test loss turns non-finite, carrying the rows of that chunk's earlier
  rounds; a ``loop.HostLoop`` as ``on_chunk`` gets the chunk and raises it itself
  (``loop.StopOnDivergence``, after writing those rows).
  ``round_hp``: per-round values ``{key: [num_rounds]}`` (0-based engine rounds) that
  override ``hp[key]`` in each round, traced like ``hp`` (a schedule does not recompile).

  Args:
    runner: the jitted ``run_chunk`` (``make_runner``).
    state: the state to continue from.
    timeline: the timeline.
    hp: the hyper-parameters.
    data: the device data.
    eval_every: evaluate every this many rounds (and in the last 10).
    rounds_per_call: the rounds of a chunk.
    on_chunk: called as ``on_chunk(state, rows)`` after every chunk.
    stop_round: stop before this round (None: the timeline's end).
    round_hp: per-round hyper-parameters ``{key: [num_rounds]}``.
    lengths: chooses the chunks' lengths (None: ``rounds_per_call`` each).

  Returns:
    (the final state, one metrics row per round run).
  """
  total = timeline.num_rounds
  stop = total if stop_round is None else min(stop_round, total)
  schedule = eval_schedule(total, eval_every)
  hp = {k: jnp.asarray(v, jnp.float32) for k, v in hp.items()}
  if round_hp is not None:
    round_hp = {k: np.asarray(v, np.float32) for k, v in round_hp.items()}
    for k, v in round_hp.items():
      if v.shape != (total,):
        raise ValueError(f"round_hp[{k!r}]: expected one value per round, shape "
                         f"({total},), got {v.shape}")

  def run_chunk(state, start, end):
    t0 = time.perf_counter()
    slots = jax.tree.map(jnp.asarray, timeline.slice(start, end))
    # streamed data (core.streaming): the chunk's own clients copied to the device now
    chunk_data = data.for_rounds(timeline, start, end) if hasattr(data, "for_rounds") else data
    args = (state, slots, jnp.asarray(schedule[start:end]), hp, chunk_data)
    if round_hp is not None:
      args += ({k: jnp.asarray(v[start:end]) for k, v in round_hp.items()},)
    # in a helper thread: a signal's handler runs meanwhile
    (new_state, metrics), running, compiled = loop.call(runner, *args)
    lengths.ran(end - start, running, compiled)
    rows = metrics_to_rows(metrics)
    elapsed = time.perf_counter() - t0
    for r in rows:
      r["wall_time"] = elapsed / len(rows)
    return new_state, rows

  lengths = lengths or loop.ChunkLengths(rounds_per_call)
  all_rows = []
  start = int(state.round)
  while start < stop:
    end = start + lengths.next(stop - start, start)
    new_state, rows = run_chunk(state, start, end)
    bad = None if host_stops_on_divergence(on_chunk) else first_nonfinite(rows)
    if bad is not None:  # the chunk's state is gone (donated): its finite rows travel
      raise diverged(rows, bad)
    state = new_state
    all_rows.extend(rows)
    if on_chunk is not None:
      on_chunk(state, rows)
    start = end
  return state, all_rows
