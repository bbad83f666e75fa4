"""Fully asynchronous engine: batched training with exact event-by-event semantics.

The event order of an asynchronous run (``asynchronous.virtual_clock``) does not depend on
the model. The engine therefore takes the precomputed schedule and groups consecutive
kept arrivals (``virtual_clock.group``) so that every member of a group was dispatched at
a version <= v0, the server version when the group starts: every member's start model
already exists. One group step (``group_step``), inside one jitted ``lax.scan`` over
groups:

1. gather each member's start model from the ring buffer by its dispatch version
   (``ring[v % R]``), its parameter mask (pruning scale, ones for a full model) and data;
2. train all G members in ONE ``jax.vmap`` of ``train_local`` (the key of each task is
   ``device.client_key(base_key, dispatch_index, client)``);
3. apply their uploads to the server model SEQUENTIALLY in arrival order (a ``lax.scan``
   over the G slots calling ``the algorithm's ``server_step``), writing each new version v + 1 into
   ``ring[(v + 1) % R]``.

Each update is thus applied to the model current at its arrival and each client trains
from the model current at its dispatch: the same numbers as a plain event loop (tested in
``tests/test_async.py``). Groups are padded to a fixed size G (masked slots neither train
usefully nor touch the model), so a whole run is one compiled step scanned over groups.

``train_local`` calls ``client.train`` (the one local-training loop) with three options
the asynchronous family needs, all switched by the algorithm's static flags and traced
hyperparameters, never per-client Python branches:

* a parameter mask (HeteroFL-style pruning, PrivaAsyncFed Eq. 10): the client trains
  ``w * mask``; gradients and noise are masked, so pruned coordinates stay 0;
* client-side DP (PrivaAsyncFed Alg. 1 lines 15-24): clip the gradient to L2 norm C, take
  the SGD step, then add N(0, sigma^2) noise to the held parameters; the gradient is clipped
  per example (Eq. 17, ``dp_clip_mode='example'``) or per minibatch (Alg. 1 line 20,
  ``'batch'``);
* a loss threshold (double compensation, Guo et al. Alg. 1 lines 15-18): a step whose
  minibatch loss (with the proximal term) is <= v stops the client; later steps are masked.
  ``train_loss`` reports the data loss alone, as on the round engine.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import compilation
from fedjax_async import loop
from fedjax_async import privacy
from fedjax_async.algorithms import base
from fedjax_async.asynchronous import virtual_clock
from fedjax_async.core import client as client_lib
from fedjax_async.core import device
from fedjax_async.core import divergence

Array = jax.Array


Arrival = base.Arrival


def server_rule(algorithm: base.Algorithm):
  """``(init_server_state, server_step)`` of ``algorithm`` on the virtual clock.

  An algorithm with a ``server_step`` gives its own. A round rule (``server_update``)
  sees each arrival as a round of one update (K = 1), applied to the model current at the
  arrival, and the round index its server-lr schedule reads counts the updates applied.
  Its clients must keep no state (the virtual clock keeps none per client): FedAvg,
  FedProx, FedNova, or a new rule.
  """
  if algorithm.server_step is not None:
    return algorithm.init_server_state, algorithm.server_step
  if algorithm.client_reads_server:
    raise ValueError(f"{algorithm.name}'s clients read the server's state "
                     f"({', '.join(algorithm.client_reads_server)}); the virtual clock "
                     "sends them only the model")
  if algorithm.client_state_keys:
    raise ValueError(f"{algorithm.name} keeps per-client state "
                     f"({', '.join(algorithm.client_state_keys)}); the virtual clock's "
                     "clients keep none")

  def server_step(w, server_state, upload, arrival, hp):
    """A round rule's ``server_update`` on one arrival (a round of K = 1).

    Args:
      w: the model current at the arrival.
      server_state: (the rule's state, the number of updates applied).
      upload: the arrival's upload.
      arrival: the arrival (``base.Arrival``).
      hp: the hyper-parameters.
    """
    inner, version = server_state
    fresh = arrival.valid & (arrival.staleness == 0)
    one = base.Arrivals(
        valid=arrival.valid[None], online=fresh[None],
        delayed=(arrival.valid & ~fresh)[None], staleness=arrival.staleness[None],
        num_examples=arrival.num_examples[None], num_steps=arrival.num_steps[None],
        start_params=arrival.w_start[None])
    new_w, inner, _ = algorithm.server_update(w, inner, upload[None], one, version, hp)
    return new_w, (inner, version + 1)

  return (lambda w0: (algorithm.init_server_state(w0), jnp.int32(0))), server_step


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
  """Static shape of an asynchronous run (changing it recompiles)."""

  local: client_lib.LocalConfig
  ring_size: int
  group_size: int
  dp_clip_mode: str = "example"  # 'example' (Eq. 17) | 'batch' (Alg. 1 line 20)
  eval_batch: int = 1000
  # A sharding of the group axis G (``sharding.client_sharding(mesh)``; G a multiple of
  # the device count): the G members train split over the devices. None: one device.
  client_sharding: Optional[Any] = None

  def __post_init__(self):
    if self.dp_clip_mode not in ("example", "batch"):
      raise ValueError(f"privacy.dp_clip_mode: must be 'example' or 'batch', got "
                       f"{self.dp_clip_mode!r}")


# --------------------------------------------------------------------- local training


clip_by_norm = client_lib.clip_by_norm


def noise_std(hp, num_examples, cfg: AsyncConfig):
  """Per-coordinate std of the noise added after each step.

  ``hp['dp_noise_multiplier'] > 0`` (calibrated mode): z * the step's true L2
  sensitivity (``privacy.step_sensitivity``); otherwise the seed's PrivaAsyncFed Alg. 1
  line 24: sigma = Delta f / epsilon with Delta f = lr * 2C / |D_k| (line 15).
  """
  z = hp.get("dp_noise_multiplier", jnp.float32(0.0))
  alg1 = privacy.alg1_sigma(hp["lr"], hp["dp_clip"], num_examples, hp["dp_epsilon"])
  true_sens = privacy.step_sensitivity(hp["lr"], hp["dp_clip"],
                                       privacy.smallest_batch(num_examples,
                                                              cfg.local.batch_size),
                                       cfg.dp_clip_mode)
  return jnp.where(z > 0, z * true_sens, alg1)


def train_local(apply_flat: Callable, algorithm: base.Algorithm, w_start, mask, x, y,
                num_examples, key, hp, cfg: AsyncConfig,
                client_index=None) -> client_lib.ClientResult:
  """One client's local training (vmap over clients): ``client.train`` from
  ``w_start * mask``, with the algorithm's client hooks (DP clipping and noise, the early
  stop at ``hp['loss_threshold']``) as its options.

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm (its DP and early-stop flags).
    w_start: the model the client starts from.
    mask: its parameter mask (ones for a full model).
    x: the data's features (``[N, M, ...]``, read in place at ``client_index``), or the
      client's own.
    y: the labels, as ``x``.
    num_examples: the client's examples.
    key: the task's PRNG key.
    hp: the hyper-parameters.
    cfg: the engine's static configuration.
    client_index: the client's row of ``x`` and ``y`` (None: they are its own).
  """
  privatize = None
  if algorithm.dp:
    privatize = client_lib.Privatize(hp["dp_clip"], noise_std(hp, num_examples, cfg),
                                     cfg.dp_clip_mode == "example")
  return client_lib.train(apply_flat, algorithm, w_start, {}, x, y, num_examples, key, hp,
                          cfg.local, client_index, mask=mask, privatize=privatize,
                          stop_below=hp["loss_threshold"] if algorithm.early_stop else None)


# ------------------------------------------------------------------------- the engine


class AsyncState(NamedTuple):
  w: Array  # [d] current global model
  ring: Array  # [R, d]; ring[v % R] is global version v (for the last R versions)
  server_state: Any
  key: Array  # base key data; task keys derive from (dispatch index, client)


def init_state(algorithm: base.Algorithm, w0, ring_size: int, seed: int) -> AsyncState:
  w0 = jnp.array(w0, jnp.float32, copy=True)
  ring = jnp.broadcast_to(w0, (ring_size,) + w0.shape)
  return AsyncState(w0, ring, server_rule(algorithm)[0](w0),
                    jax.random.key_data(jax.random.PRNGKey(seed)))


GROUP_FIELDS = ("client", "dispatch_version", "dispatch_index", "arrival_version",
                "applies", "valid")


def group_arrays(schedule: virtual_clock.Schedule, group_size: int) -> Dict[str, np.ndarray]:
  """The schedule's kept arrivals as padded groups ``[num_groups, G]`` (+ 'event')."""
  idx = virtual_clock.group(schedule, group_size)
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  out = {"event": idx, "valid": valid}
  for f in ("client", "dispatch_version", "dispatch_index", "arrival_version", "applies"):
    arr = getattr(schedule, f)[safe]
    out[f] = np.where(valid, arr, 0 if f != "applies" else False)
  return out


def group_step(state: AsyncState, grp, hp, data: device.DeviceData, masks, scale_index, *,
               apply_flat, algorithm: base.Algorithm, cfg: AsyncConfig):
  """Steps 1-3 of the module docstring for one padded group.

  Args:
    state: the state before the group.
    grp: the group's ``[G]`` fields (``GROUP_FIELDS``).
    hp: the hyper-parameters.
    data: the device data.
    masks: [S, d] the parameter masks of the S pruning scales.
    scale_index: [N] each client's scale.
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm.
    cfg: the engine's static configuration.

  Returns:
    (the state after the group, its ``[G]`` metrics).
  """
  ring_size = state.ring.shape[0]
  valid = grp["valid"]
  ids = jnp.where(valid, grp["client"], 0)
  dv = grp["dispatch_version"]
  w_start = state.ring[dv % ring_size]
  mask = masks[scale_index[ids]]
  n = data.counts[ids]
  keys = jax.vmap(device.client_key, in_axes=(None, 0, 0))(state.key, grp["dispatch_index"],
                                                            ids)
  train = functools.partial(train_local, apply_flat, algorithm, hp=hp, cfg=cfg)
  client_ids = ids
  if cfg.client_sharding is not None:  # the group's members split over the devices
    w_start, mask, client_ids, n, keys = jax.lax.with_sharding_constraint(
        (w_start, mask, client_ids, n, keys), cfg.client_sharding)
  res = jax.vmap(lambda w, m, c, ni, k: train(w, m, data.x, data.y, ni, k, client_index=c))(
      w_start, mask, client_ids, n, keys)
  w_tau = w_start * mask
  uploads = jax.vmap(lambda ws, we, k: algorithm.client_final(ws, we, {}, k, hp).upload)(
      w_tau, res.w_end, res.num_steps.astype(jnp.float32))
  staleness = jnp.where(valid, grp["arrival_version"] - dv, 0)
  arrivals = Arrival(valid, staleness, grp["applies"], w_tau, mask,
                     n.astype(jnp.float32), res.num_steps.astype(jnp.float32))

  server_step = server_rule(algorithm)[1]

  def apply_one(carry, inp):
    w, sstate, ring = carry
    upload, arr, av = inp
    new_w, new_s = server_step(w, sstate, upload, arr, hp)
    w = jnp.where(arr.valid, new_w, w)
    sstate = jax.tree.map(lambda a, b: jnp.where(arr.valid, a, b), new_s, sstate)
    slot = (av + 1) % ring_size
    write = arr.valid & arr.flush
    ring = ring.at[slot].set(jnp.where(write, w, ring[slot]))
    return (w, sstate, ring), None

  (w, sstate, ring), _ = jax.lax.scan(
      apply_one, (state.w, state.server_state, state.ring),
      (uploads, arrivals, grp["arrival_version"]))
  # client health (divergence.arrival_health): ||w_end - w_start|| before any rule scales it
  delta = jnp.sqrt(jnp.sum(jnp.square(res.w_end - w_tau), axis=1))
  metrics = {"staleness": staleness, "train_loss": res.mean_loss,
             "client_steps": jnp.where(valid, res.num_steps, 0),
             "delta_norm": jnp.where(valid, delta, 0.0),
             "nonfinite": ~jnp.all(jnp.isfinite(w))}
  return AsyncState(w, ring, sstate, state.key), metrics


def run_groups(state: AsyncState, groups, eval_mask, hp, data: device.DeviceData, masks,
               scale_index, *, apply_flat, algorithm, cfg: AsyncConfig):
  """Several groups in one ``lax.scan``; evaluates after groups where ``eval_mask``.

  Args:
    state: the state before the first group.
    groups: the groups' fields, ``[L, G]`` each.
    eval_mask: [L] bool, the groups evaluated after.
    hp: the hyper-parameters.
    data: the device data.
    masks: [S, d] the parameter masks of the S pruning scales.
    scale_index: [N] each client's scale.
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm.
    cfg: the engine's static configuration.
  """

  def body(s, inputs):
    grp, do_eval = inputs
    s, metrics = group_step(s, grp, hp, data, masks, scale_index, apply_flat=apply_flat,
                            algorithm=algorithm, cfg=cfg)
    acc, loss = jax.lax.cond(
        do_eval,
        lambda w: device.evaluate(apply_flat, w, data.test_x, data.test_y, cfg.eval_batch),
        lambda w: (jnp.float32(jnp.nan), jnp.float32(jnp.nan)), s.w)
    metrics["test_accuracy"], metrics["test_loss"] = acc, loss
    return s, metrics

  return jax.lax.scan(body, state, (groups, eval_mask))


def make_runner(apply_flat: Callable, algorithm: base.Algorithm, cfg: AsyncConfig):
  compilation.enable()
  fn = functools.partial(run_groups, apply_flat=apply_flat, algorithm=algorithm, cfg=cfg)
  return jax.jit(fn, donate_argnums=(0,))


def eval_groups(groups: Dict[str, np.ndarray], schedule: virtual_clock.Schedule,
                eval_every: int) -> np.ndarray:
  """Evaluate after the group holding every ``eval_every``-th server update and the last."""
  applies = groups["applies"] & groups["valid"]
  version_after = np.where(applies, groups["arrival_version"] + 1, 0).max(axis=1)
  crossed = np.maximum.accumulate(version_after) // max(eval_every, 1)
  prev = np.concatenate([[0], crossed[:-1]])
  out = crossed > prev
  out[-1] = True
  return out


def run_arrivals(runner, state: AsyncState, schedule: virtual_clock.Schedule, groups, hp,
             data: device.DeviceData, masks, scale_index, *, eval_every: int = 10,
             groups_per_call: int = 50,
             on_chunk: Optional[Callable[[AsyncState, List[dict]], None]] = None,
             start_group: int = 0, lengths: Optional[loop.ChunkLengths] = None):
  """Runs groups ``start_group ..`` (0: all); returns (state, rows), one row per kept
  arrival (in order). ``state`` is the state before group ``start_group`` (a checkpoint's,
  to continue a run: per-task keys come from the dispatch index, so the continuation
  computes what the uninterrupted run does). ``on_chunk(state, rows)`` after each call of
  ``groups_per_call`` groups (or of the lengths ``lengths`` chooses). ``Diverged`` at a
  group whose model is non-finite; a ``loop.HostLoop`` as ``on_chunk`` gets the chunk
  (that group's rows carry ``nonfinite``) and raises it itself
  (``loop.StopOnDivergence``).

  Args:
    runner: the jitted ``run_groups`` (``make_runner``).
    state: the state before group ``start_group``.
    schedule: the virtual clock's ``Schedule``.
    groups: the padded groups (``group_arrays``).
    hp: the hyper-parameters.
    data: the device data.
    masks: [S, d] the parameter masks of the S pruning scales.
    scale_index: [N] each client's scale.
    eval_every: evaluate after every this many server updates (and the last).
    groups_per_call: the groups of a chunk.
    on_chunk: called as ``on_chunk(state, rows)`` after every chunk.
    start_group: the first group to run.
    lengths: chooses the chunks' lengths (None: ``groups_per_call`` each).
  """
  hp = {k: jnp.asarray(v, jnp.float32) for k, v in hp.items()}
  num_groups = groups["valid"].shape[0]
  schedule_eval = eval_groups(groups, schedule, eval_every)
  masks = jnp.asarray(masks, jnp.float32)
  scale_index = jnp.asarray(scale_index, jnp.int32)
  fields = {f: groups[f] for f in GROUP_FIELDS}
  all_rows = []
  lengths = lengths or loop.ChunkLengths(groups_per_call)
  start = int(start_group)
  while start < num_groups:
    end = start + lengths.next(num_groups - start, start)
    pad = lengths.length - (end - start)  # pad with empty groups: a compiled length
    chunk = {f: np.concatenate([v[start:end], np.zeros((pad,) + v.shape[1:], v.dtype)])
             for f, v in fields.items()}
    ev = np.concatenate([schedule_eval[start:end], np.zeros(pad, bool)])
    t0 = time.perf_counter()
    # in a helper thread: a signal's handler runs meanwhile
    (new_state, metrics), running, compiled = loop.call(
        runner, state, jax.tree.map(jnp.asarray, chunk), jnp.asarray(ev), hp, data, masks,
        scale_index)
    lengths.ran(end - start, running, compiled)
    metrics = jax.device_get(metrics)
    elapsed = time.perf_counter() - t0
    rows = []
    for gi in range(end - start):
      g = start + gi
      if metrics["nonfinite"][gi] and not divergence.host_stops_on_divergence(on_chunk):
        raise divergence.Diverged(f"group {g}: the global model is not finite (NaN/Inf)")
      members = np.flatnonzero(groups["valid"][g])
      for j in members:
        e = int(groups["event"][g, j])
        row = {"event": e, "group": g, "client": int(schedule.client[e]),
               "dispatch_version": int(schedule.dispatch_version[e]),
               "arrival_version": int(schedule.arrival_version[e]),
               "staleness": int(metrics["staleness"][gi, j]),
               "virtual_time": float(schedule.time[e]),
               "train_loss": float(metrics["train_loss"][gi, j]),
               "delta_norm": float(metrics["delta_norm"][gi, j]),
               "client_steps": int(metrics["client_steps"][gi, j]),
               "test_accuracy": None, "test_loss": None,
               "wall_time": elapsed / max(end - start, 1) / max(len(members), 1)}
        if metrics["nonfinite"][gi]:  # (only then: the rows' keys are otherwise unchanged)
          row["nonfinite"] = True
        rows.append(row)
      if ev[gi]:
        rows[-1]["test_accuracy"] = float(metrics["test_accuracy"][gi])
        rows[-1]["test_loss"] = float(metrics["test_loss"][gi])
    state = new_state
    all_rows.extend(rows)
    if on_chunk is not None:
      on_chunk(state, rows)
    start = end
  return state, all_rows


def full_masks(w0) -> np.ndarray:
  """One all-ones mask (unpruned algorithms)."""
  return np.ones((1, np.size(w0)), np.float32)


def client_steps(schedule: virtual_clock.Schedule, counts, cfg: client_lib.LocalConfig
                 ) -> np.ndarray:
  """Local optimiser steps each client takes over the run (for privacy accounting):
  E * ceil(n_i / B), at most ``cfg.local_steps``, per kept task (without random epochs or
  early stopping)."""
  counts = np.asarray(counts)
  per_task = cfg.max_epochs * np.maximum(-(-counts // cfg.batch_size), 1)
  if cfg.local_steps:
    per_task = np.minimum(per_task, cfg.local_steps)
  tasks = np.bincount(schedule.client[schedule.kept()], minlength=len(counts))
  return tasks * per_task
