"""The vmapped round engine against plain per-client reference loops and hand computations."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async.core import client as client_lib
from fedjax_async.rounds import engine
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedadmm
from fedjax_async.algorithms import get
from fedjax_async.algorithms import pafed

N, M, D, C = 12, 24, 6, 3
HP = dict(lr=0.1, momentum=0.5, rho=0.5, mu=0.3, alpha0=0.8, alpha1=0.6, alpha2=0.4,
          server_lr=1.0, server_lr2=1.0, server_lr_switch_round=-1, client_weighting=0.0,
          ducc_project_conflicting=1.0, alpha_decay=1.0)


def apply_flat(w, xb, train=False, rng=None):
  del train, rng
  return xb @ w[:D * C].reshape(D, C) + w[D * C:]


@functools.lru_cache(maxsize=None)
def toy_data(seed=0):
  rng = np.random.default_rng(seed)
  w_true = rng.normal(size=(D, C))
  x = rng.normal(size=(N, M, D)).astype(np.float32)
  y = np.argmax(x @ w_true + 0.3 * rng.normal(size=(N, M, C)), -1).astype(np.int32)
  counts = rng.integers(5, M + 1, N).astype(np.int32)
  for i in range(N):  # padding rows are garbage: they must never be read
    x[i, counts[i]:] = 1e6
  tx = rng.normal(size=(64, D)).astype(np.float32)
  ty = np.argmax(tx @ w_true, -1).astype(np.int32)
  return x, y, counts, tx, ty


def device_data():
  return engine.DeviceData(*map(jnp.asarray, toy_data()))


def make_cfg(epochs=2, batch=4, ring=4):
  return engine.EngineConfig(client_lib.LocalConfig(batch, epochs, M), ring)


W0 = np.random.default_rng(1).normal(scale=0.1, size=D * C + C).astype(np.float32)


class PiecesApply:
  """The toy model offering ``split`` like ``models.FlatApply``: the local steps then carry
  (kernel, bias) as two pieces, and the model must be called with those pieces."""

  def split(self, w):
    return (w[:D * C], w[D * C:])

  def __call__(self, w, xb, train=False, rng=None):
    del train, rng
    kernel, bias = w  # a flat w here would be a bug in client.train
    return xb @ kernel.reshape(D, C) + bias


# ------------------------------------------------------------ local training


@pytest.mark.parametrize("pieces", [False, True])
@pytest.mark.parametrize("momentum", [HP["momentum"], 0.0])
def test_local_training_matches_hand_written_sgd(momentum, pieces):
  """Heavy-ball SGD; with momentum 0 the plain-SGD path (no momentum buffer); with
  ``pieces`` the model's per-leaf pieces carried through the steps, returned flat."""
  x, y, counts, _, _ = toy_data()
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M,
                               momentum=momentum > 0)
  hp = {k: jnp.float32(v) for k, v in dict(HP, momentum=momentum).items()}
  i = 3
  key = jax.random.PRNGKey(7)
  model = PiecesApply() if pieces else apply_flat
  res = client_lib.train(model, get("fedavg"), jnp.asarray(W0), {}, x[i], y[i],
                         jnp.int32(counts[i]), key, hp, cfg)
  # Reference: the same shuffles, minibatches of 4 of the client's own rows, heavy-ball SGD.
  init = client_lib.client_init(jax.random.split(key)[0], counts[i], cfg)
  n = counts[i]

  def loss(w, xb, yb):
    logits = xb @ w[:D * C].reshape(D, C) + w[D * C:]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(yb)), yb])

  w, trace, steps = jnp.asarray(W0), jnp.zeros_like(W0), 0
  for e in range(2):
    order = list(np.asarray(client_lib.index_shuffle(jnp.arange(n), init.shuffle_keys[e], n)))
    assert sorted(order) == list(range(n))  # a permutation of the real rows only
    for b in range(0, n, 4):
      rows = order[b:b + 4]
      g = jax.grad(loss)(w, x[i][rows], y[i][rows])
      trace = g + momentum * trace
      w = w - HP["lr"] * trace
      steps += 1
  assert int(res.num_steps) == steps == 2 * (-(-n // 4))
  np.testing.assert_allclose(res.w_end, w, rtol=1e-5, atol=1e-6)


def test_reported_loss_is_the_data_loss_without_the_penalty():
  """FedProx with a large mu and a start far from w_start's optimum: ``mean_loss`` is the
  mean cross-entropy of the minibatches before each step (what FedAvg reports too), not
  the local objective with mu/2 ||w - w_g||^2; the steps still descend the objective."""
  x, y, counts, _, _ = toy_data()
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=1, max_examples=M, momentum=False)
  hp = {k: jnp.float32(v) for k, v in dict(HP, momentum=0.0, mu=5.0).items()}
  i, key = 2, jax.random.PRNGKey(11)
  w_g = jnp.asarray(W0)
  res = client_lib.train(apply_flat, get("fedprox"), w_g, {}, x[i], y[i],
                         jnp.int32(counts[i]), key, hp, cfg)
  init = client_lib.client_init(jax.random.split(key)[0], counts[i], cfg)
  n = int(counts[i])

  def ce(w, xb, yb):
    logits = xb @ w[:D * C].reshape(D, C) + w[D * C:]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(yb)), yb])

  def objective(w, xb, yb):
    return ce(w, xb, yb) + 0.5 * 5.0 * jnp.vdot(w - w_g, w - w_g)

  w, data_losses, objectives = w_g, [], []
  order = list(np.asarray(client_lib.index_shuffle(jnp.arange(n), init.shuffle_keys[0], n)))
  for b in range(0, n, 4):
    rows = order[b:b + 4]
    data_losses.append(float(ce(w, x[i][rows], y[i][rows])))
    objectives.append(float(objective(w, x[i][rows], y[i][rows])))
    w = w - HP["lr"] * jax.grad(objective)(w, x[i][rows], y[i][rows])
  np.testing.assert_allclose(res.w_end, w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(res.mean_loss), np.mean(data_losses), rtol=1e-5)
  assert np.mean(objectives) > np.mean(data_losses) + 1e-3  # the penalty was not zero


def _loop_primitives(jaxpr):
  """Names of the primitives inside the while loops of ``jaxpr`` (nested jaxprs too)."""
  names = []

  def subs(value):  # the jaxprs in an equation's params (jax.core.jaxprs_in_params < 0.8)
    if hasattr(value, "eqns"):
      yield value
    elif hasattr(value, "jaxpr") and hasattr(value, "consts"):  # a ClosedJaxpr
      yield value.jaxpr
    elif isinstance(value, (tuple, list)):
      for v in value:
        yield from subs(v)

  def walk(jx, inside):
    for eqn in jx.eqns:
      if inside:
        names.append(eqn.primitive.name)
      for sub in subs(tuple(eqn.params.values())):
        walk(sub, inside or eqn.primitive.name == "while")

  walk(jaxpr.jaxpr, False)
  return names


@pytest.mark.parametrize("separable", [True, False])
@pytest.mark.parametrize("name", ["fedprox", "fedadmm", "pafed"])
def test_local_penalty_on_the_pieces_equals_the_flat_path(name, separable):
  """FedProx's and FedADMM's penalties (w_start, duals) with the per-leaf pieces carried:
  summed over the pieces (``separable_penalty``, split once per client: no concatenation
  inside the local steps) or on the concatenated flat ``w``, the end model is the flat
  path's."""
  x, y, counts, _, _ = toy_data()
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M)
  hp = {k: jnp.float32(v) for k, v in HP.items()}
  alg = get(name)
  assert alg.separable_penalty
  alg = dataclasses.replace(alg, separable_penalty=separable)
  w_start = jnp.asarray(W0)
  state = {k: 0.3 * jnp.ones_like(w_start) + 0.01 * jnp.arange(W0.size)
           for k in alg.init_client_state(w_start)}
  i, key = 5, jax.random.PRNGKey(3)

  def run(model):
    return client_lib.train(model, alg, w_start, state, x[i], y[i], jnp.int32(counts[i]),
                            key, hp, cfg)

  flat, split = run(apply_flat), run(PiecesApply())
  assert float(jnp.max(jnp.abs(flat.w_end - W0))) > 1e-3  # it trained
  np.testing.assert_allclose(split.w_end, flat.w_end, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(split.mean_loss, flat.mean_loss, rtol=1e-6)
  in_loop = _loop_primitives(jax.make_jaxpr(lambda: run(PiecesApply()))())
  assert "dot_general" in in_loop  # the local steps are in the loop that was walked
  assert ("concatenate" in in_loop) == (not separable)


def test_plain_sgd_config_refuses_a_nonzero_momentum():
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=1, max_examples=M, momentum=False)
  with pytest.raises(ValueError, match="momentum"):
    client_lib.local_optimizer({"lr": 0.1, "momentum": 0.5}, cfg)
  plain = client_lib.local_optimizer({"lr": 0.1, "momentum": 0.0}, cfg)
  heavy = client_lib.local_optimizer({"lr": 0.1, "momentum": 0.0},
                                     dataclasses.replace(cfg, momentum=True))
  assert jax.tree.leaves(plain.init(jnp.zeros(3))) == []  # no momentum buffer carried
  assert len(jax.tree.leaves(heavy.init(jnp.zeros(3)))) == 1


def test_random_local_epochs_within_range():
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=5, max_examples=M,
                               random_epochs=True)
  epochs = [int(client_lib.client_init(jax.random.PRNGKey(s), 10, cfg).num_epochs)
            for s in range(60)]
  assert min(epochs) == 1 and max(epochs) == 5


# ------------------------------------------------------------ reference loop


def np_weighted_mean(vs, ws):
  ws = np.asarray(ws, np.float64)
  return (ws[:, None] * vs).sum(0) / ws.sum() if ws.sum() > 0 else 0.0  # no arrival: 0


def np_ducc(online, delayed):
  """Alg. 4 with the exact min, written independently in numpy."""
  m = online.mean(0) if len(online) else np.zeros(online.shape[1])
  m1 = np.zeros_like(m)
  m2 = np.zeros_like(m)
  n1 = n2 = 0.0
  for u in delayed:
    s = (m @ u + 1) / 2
    x = min(s, 0.5)
    m1 += (s - x) * u
    n1 += s - x
    m2 += (x - 0.5) * u
    n2 += x - 0.5
  m1 = m1 / n1 if n1 != 0 else m1 * 0
  m2 = m2 / n2 if n2 != 0 else m2 * 0
  if m @ m > 0:
    m2 = m2 - (m2 @ m) / (m @ m) * m
  return m, m1, m2


def reference_run(name, tl, cfg, hp_values=HP, admm_upload="received"):
  """Plain loop: rounds, then clients one at a time; numpy server rules. ADMM clients
  upload as Gong et al.'s FedADMM code (``update.py``: w_end minus the theta received,
  plus the dual change over rho), or with ``admm_upload="last_local"`` minus the client's
  last local model (Eq. 16 as printed)."""
  HP = hp_values  # noqa: N806 (the server rules below read it)
  x, y, counts, _, _ = toy_data()
  alg = get(name, admm_upload)
  hp = {k: jnp.float32(v) for k, v in HP.items()}
  train_one = jax.jit(functools.partial(client_lib.train, apply_flat, alg, hp=hp,
                                        cfg=cfg.local))
  base_key = jax.random.key_data(jax.random.PRNGKey(0))
  history = [W0.astype(np.float64)]
  dual = {i: np.zeros_like(W0, np.float64) for i in range(N)}
  last = {i: W0.astype(np.float64) for i in range(N)}
  for t in range(tl.num_rounds):
    w = history[-1]
    ups, online, ns, taus = [], [], [], []
    for j in np.flatnonzero(tl.valid[t]):
      c, disp = int(tl.client[t, j]), int(tl.dispatch[t, j])
      start = history[disp]
      cstate = {"dual": jnp.asarray(dual[c], jnp.float32),
                "last_local": jnp.asarray(last[c], jnp.float32)}
      cstate = {k: cstate[k] for k in alg.client_state_keys}
      res = train_one(jnp.asarray(start, jnp.float32), cstate, x[c], y[c],
                      jnp.int32(counts[c]), engine.client_key(base_key, disp, c))
      w_end = np.asarray(res.w_end, np.float64)
      tau = float(res.num_steps)
      if name in ("fedavg", "fedprox"):
        up = w_end - start
      elif name == "fednova":
        rho = HP["momentum"]
        a = (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
        up = (start - w_end) / a
      else:  # ADMM client, Eqs. 10 and 16
        new_dual = dual[c] + HP["rho"] * (w_end - start)
        prev = last[c] if admm_upload == "last_local" else start
        up = (w_end - prev) + (new_dual - dual[c]) / HP["rho"]
        dual[c], last[c] = new_dual, w_end
        if name == "pafed":
          up = up / np.linalg.norm(up)
      ups.append(up)
      online.append(bool(tl.online[t, j]))
      ns.append(float(counts[c]))
      taus.append(tau)
    ups, online = np.array(ups), np.array(online)
    if name in ("fedavg", "fedprox"):
      w = w + np_weighted_mean(ups, ns)
    elif name == "fednova":
      p = np.array(ns) / np.sum(ns)
      rho = HP["momentum"]
      a = np.array([(tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho) for tau in taus])
      w = w - (p @ a) * (p[:, None] * ups).sum(0)
    elif name == "fedadmm":
      w = w + HP["server_lr"] * ups.mean(0)
    else:
      m, m1, m2 = np_ducc(ups[online], ups[~online])
      w = w + HP["alpha0"] * m + HP["alpha1"] * m1 + HP["alpha2"] * m2
    history.append(w)
  return history


@pytest.mark.parametrize("name,delay,upload", [
    (name, delay, "received") for name in ("fedavg", "fedprox", "fednova", "fedadmm",
                                           "pafed") for delay in (0.0, 0.5)] + [
    ("fedadmm", 0.5, "last_local"), ("pafed", 0.5, "last_local")])
def test_engine_equals_sequential_reference(name, delay, upload):
  rounds = 6
  tl = timeline_lib.build(N, rounds, 0.4, timeline_lib.DelayConfig(delay, "uniform", 3),
                          seed=3)
  if delay:
    assert (tl.valid & ~tl.online).sum() > 0, "the timeline must contain stale arrivals"
  cfg = make_cfg(ring=4)
  alg = get(name, upload)
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  # Two calls of 3 rounds: one compiled chunk length (a ragged 4 + 2 compiled twice).
  state, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, HP,
                                device_data(), rounds_per_call=3)
  history = reference_run(name, tl, cfg, admm_upload=upload)
  np.testing.assert_allclose(np.asarray(state.w), history[-1], rtol=2e-4, atol=2e-5)
  assert [r["delayed"] for r in rows] == list((tl.valid & ~tl.online).sum(1))
  assert [r["online"] for r in rows] == list((tl.valid & tl.online).sum(1))


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_clients_equal_the_sequential_reference(chunk):
  # K = 0.4 * N slots per round, not a multiple of 3: the last chunk is padded.
  rounds = 5
  tl = timeline_lib.build(N, rounds, 0.4, timeline_lib.DelayConfig(0.5, "uniform", 3),
                          seed=4)
  assert tl.client.shape[1] % 3 != 0
  cfg = dataclasses.replace(make_cfg(ring=4), client_chunk=chunk)
  alg = get("pafed")
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  state, _ = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, HP,
                             device_data(), rounds_per_call=5)
  history = reference_run("pafed", tl, cfg)
  np.testing.assert_allclose(np.asarray(state.w), history[-1], rtol=2e-4, atol=2e-5)
  # The persistent duals, scattered back from the chunks, equal the one-vmap engine's.
  ref = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  ref, _ = engine.run_rounds(engine.make_runner(apply_flat, alg, make_cfg(ring=4)), ref, tl,
                           HP, device_data(), rounds_per_call=5)
  np.testing.assert_allclose(np.asarray(state.client_state["dual"]),
                             np.asarray(ref.client_state["dual"]), rtol=1e-5, atol=1e-6)
  assert np.any(np.asarray(ref.client_state["dual"]) != 0)


def shuffled_slots(tl: timeline_lib.Timeline, seed: int) -> timeline_lib.Timeline:
  """``tl`` with each round's slots in a random order (delayed before online ones too)."""
  rng = np.random.default_rng(seed)
  perm = np.stack([rng.permutation(tl.client.shape[1]) for _ in range(tl.num_rounds)])
  take = lambda a: np.take_along_axis(a, perm, axis=1)
  return tl._replace(client=take(tl.client), dispatch=take(tl.dispatch),
                     online=take(tl.online), valid=take(tl.valid))


@pytest.mark.parametrize("name,chunk,shuffle", [
    ("fedavg", 3, False), ("fedprox", 1, False), ("fednova", 3, False), ("fedadmm", 1, False),
    ("pafed", 1, False), ("pafed", 2, False), ("pafed", 3, True)])
def test_streamed_uploads_equal_the_sequential_reference(name, chunk, shuffle):
  # With client_chunk, each chunk's uploads are folded into the server rule's carry as it
  # is trained (no [K, d] block): one weighted sum for the linear rules, DUCC's running
  # sums for PAFed (online rows first; a chunk that holds both kinds weighs its delayed
  # rows against the full online mean). The result is the reference loop's, padded chunk
  # too; with the slots of each round shuffled, the engine puts the online ones first.
  rounds = 5
  tl = timeline_lib.build(N, rounds, 0.4, timeline_lib.DelayConfig(0.5, "uniform", 3),
                          seed=4)
  real_online = (tl.valid & tl.online).sum(1)
  if name == "pafed" and chunk == 2:  # some chunk holds online and delayed rows
    assert np.any((real_online % 2 != 0) & ((tl.valid & ~tl.online).sum(1) > 0))
  if shuffle:
    tl = shuffled_slots(tl, seed=5)
    first_delayed = np.argmax(tl.valid & ~tl.online, axis=1)
    last_online = tl.client.shape[1] - 1 - np.argmax((tl.valid & tl.online)[:, ::-1], axis=1)
    assert np.any(first_delayed < last_online)  # delayed slots before online ones
  cfg = dataclasses.replace(make_cfg(ring=4), client_chunk=chunk)
  alg = get(name)
  assert engine.streams_uploads(alg, cfg, tl.client.shape[1])
  assert not engine.streams_uploads(alg, dataclasses.replace(cfg, stream_uploads=False),
                                    tl.client.shape[1])
  # PAFed with a local learning rate large enough that some delayed updates conflict.
  hp = dict(HP, lr=1.0) if name == "pafed" else HP
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  state, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, hp,
                                device_data(), rounds_per_call=5)
  history = reference_run(name, tl, cfg, hp)
  np.testing.assert_allclose(np.asarray(state.w), history[-1], rtol=2e-4, atol=2e-5)
  if name == "fednova":  # the metric apply_sum derives from the weights: sum_i p_i a_i
    assert all(r["tau_eff"] > 1.0 for r in rows)
  if name == "pafed":  # DUCC's count of conflicting delayed uploads, from its running sums
    ref_state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
    _, ref_rows = engine.run_rounds(engine.make_runner(apply_flat, alg, make_cfg(ring=4)),
                                  ref_state, tl, hp, device_data(), rounds_per_call=5)
    assert [r["conflicting"] for r in rows] == [r["conflicting"] for r in ref_rows]
    assert sum(r["conflicting"] for r in rows) > 0


@pytest.mark.parametrize("name,stream,per_slot", [
    ("fedavg", True, 0), ("fedadmm", True, 0), ("pafed", True, 0), ("fedavg", False, 1),
    ("pafed", False, 1)])
def test_chunked_rounds_hold_no_per_client_block(name, stream, per_slot):
  # A model with d ~ 50k (a dead tail of parameters), in chunks of 2 clients. XLA's own
  # buffer plan of the jitted rounds (temp bytes) at K = 6 and K = 12: its growth per
  # client slot, in d-vectors, is 0 when the uploads are folded in chunk by chunk (FedAvg;
  # FedADMM and PAFed, whose two state rows per client are gathered and scattered chunk by
  # chunk too), and 1 (the [K, d] uploads) when they are kept. Before the chunks gathered
  # their own state rows, PAFed's round grew by 6-7; before DUCC's running sums, by 1.
  tail = 50_000
  w0 = np.concatenate([W0, np.zeros(tail, np.float32)])

  def apply_big(w, xb, train=False, rng=None):
    return apply_flat(w[:W0.size], xb) + 0.0 * jnp.sum(w[W0.size:])

  d = w0.size
  hp = {key: jnp.float32(v) for key, v in HP.items()}
  cfg = dataclasses.replace(make_cfg(ring=2), client_chunk=2, stream_uploads=stream)
  runner = engine.make_runner(apply_big, get(name), cfg)
  temp = {}
  for participation in (0.5, 1.0):
    tl = timeline_lib.build(N, 2, participation, timeline_lib.DelayConfig(0.0, "uniform", 1),
                            seed=4)
    k = tl.client.shape[1]
    assert engine.streams_uploads(get(name), cfg, k) == stream
    slots = jax.tree.map(jnp.asarray, tl.slice(0, 2))
    state = engine.init_state(get(name), w0, N, 2, 0)
    compiled = runner.lower(state, slots, jnp.ones(2, bool), hp, device_data()).compile()
    temp[k] = compiled.memory_analysis().temp_size_in_bytes
  (k1, t1), (k2, t2) = sorted(temp.items())
  assert (k1, k2) == (6, 12)
  growth = (t2 - t1) / (k2 - k1) / (d * 4)  # d-vectors per client slot
  assert per_slot - 0.1 < growth < per_slot + 0.1, (temp, growth)


def test_round_hp_schedule_equals_one_call_per_round_with_that_hp():
  # simulate(round_hp=...) scans per-round lr, mu and local_epochs inside one chunk; the
  # reference calls the engine once per round with that round's values as plain hp.
  rounds = 4
  tl = timeline_lib.build(N, rounds, 0.5, timeline_lib.DelayConfig(0.5, "uniform", 2),
                          seed=6)
  sched = {"lr": [0.1, 0.05, 0.2, 0.1], "mu": [0.3, 0.0, 0.3, 1.0],
           "local_epochs": [2, 1, 2, 1]}
  alg = get("fedprox")
  runner = engine.make_runner(apply_flat, alg, make_cfg(epochs=2, ring=4))
  state = engine.init_state(alg, W0, N, 4, 0)
  state, rows = engine.run_rounds(runner, state, tl, HP, device_data(), rounds_per_call=4,
                                round_hp=sched)
  ref = engine.init_state(alg, W0, N, 4, 0)
  ref_rows = []
  for t in range(rounds):
    hp_t = dict(HP, **{k: v[t] for k, v in sched.items()})
    ref, r = engine.run_rounds(runner, ref, tl, hp_t, device_data(), rounds_per_call=1,
                             stop_round=t + 1)
    ref_rows += r
  np.testing.assert_allclose(np.asarray(state.w), np.asarray(ref.w), rtol=1e-5, atol=1e-6)
  assert [r["client_steps"] for r in rows] == [r["client_steps"] for r in ref_rows]
  # Each client that trained in round t took E_t * ceil(n_i / 4) steps (the scheduled E_t,
  # not the runner's largest E = 2)
  counts = toy_data()[2]
  spe = -(-counts // 4)
  for t, row in enumerate(rows):
    trained = tl.client[t][tl.valid[t]]
    assert row["client_steps"] == sched["local_epochs"][t] * int(spe[trained].sum())
  with pytest.raises(ValueError, match="round_hp\\['lr'\\].*\\(4,\\)"):
    engine.run_rounds(runner, engine.init_state(alg, W0, N, 4, 0), tl, HP, device_data(),
                    round_hp={"lr": [0.1, 0.1]})


# ------------------------------------------------------------ staleness and ring buffer


STEP = 0.01  # the recorder's server moves w by STEP * (t + 1) in round t


def recorder_algorithm():
  """Clients upload the model they end local training with; the server ignores the
  uploads, moves w by STEP * (t + 1) (a different global model every round) and reports
  them. With lr = 0 local training ends where it starts, so an upload is the model the
  client was handed to train from."""

  def client_final(w_start, w_end, client_state, num_steps, hp):
    del w_start, num_steps, hp
    return base.ClientOutput(w_end, client_state)

  def server_update(w, ss, uploads, arrivals, t, hp):
    del arrivals, hp
    return w + STEP * (t + 1).astype(w.dtype), ss, {"uploads": uploads}

  return base.Algorithm("recorder", local_penalty=base.no_penalty,
                        client_final=client_final, server_update=server_update)


def test_delayed_clients_start_from_their_dispatch_round_model():
  """Each client's local training starts from the global model of its dispatch round:
  w_t = w_0 + STEP * t (t + 1) / 2 by hand, whatever round the update arrives in."""
  rounds = 10
  tl = timeline_lib.build(N, rounds, 0.5, timeline_lib.DelayConfig(0.5, "uniform", 3), seed=5)
  cfg = make_cfg(epochs=1, ring=4)
  alg = recorder_algorithm()
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  _, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl,
                            dict(HP, lr=0.0), device_data(), rounds_per_call=5)
  stale = 0
  for t in range(rounds):
    for j in np.flatnonzero(tl.valid[t]):
      disp = int(tl.dispatch[t, j])
      want = W0 + np.float32(STEP * disp * (disp + 1) / 2)
      np.testing.assert_allclose(np.asarray(rows[t]["uploads"])[j], want, atol=1e-6,
                                 err_msg=f"round {t}, slot {j}, dispatched in {disp}")
      stale += disp < t
  assert stale >= 5  # stale clients, whose start differs from the current model by >= STEP


def test_updates_older_than_the_buffer_are_dropped_and_counted():
  """R = 2 past models: an update of staleness >= 2 is dropped, not applied from the
  ring slot a newer model has overwritten. The engine's FedAvg equals the plain loop over
  the arrivals of staleness <= 1 alone, and the drops are counted in their rounds."""
  rounds = 12
  ring = 2
  delay = timeline_lib.DelayConfig(0.6, "geometric", mean=3.0, buffer_size=ring)
  tl = timeline_lib.build(N, rounds, 0.5, delay, seed=2)
  # every dispatched update is either trained on arrival, dropped, or still in flight
  assert tl.valid.sum() + tl.dropped.sum() + tl.in_flight_at_end == tl.sampled.sum()
  assert tl.dropped.sum() >= 3
  kept = tl._replace(valid=tl.valid & (tl.staleness() <= ring - 1))
  alg = get("fedavg")
  cfg = make_cfg(epochs=1, ring=ring)
  state = engine.init_state(alg, W0, N, ring, 0)
  state, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, HP,
                                device_data(), rounds_per_call=6)
  history = reference_run("fedavg", kept, cfg)
  np.testing.assert_allclose(np.asarray(state.w), history[-1], rtol=2e-4, atol=2e-5)
  assert [r["dropped"] for r in rows] == list(tl.dropped)
  assert sum(r["delayed"] for r in rows) > 0  # staleness-1 updates do arrive


def test_timeline_never_resamples_a_client_in_flight():
  tl = timeline_lib.build(20, 40, 0.5, timeline_lib.DelayConfig(0.5, "uniform", 4), seed=9)
  for t in range(tl.num_rounds):
    ids = tl.client[t][tl.valid[t]]
    assert len(ids) == len(set(ids))
  # reconstruct in-flight intervals: a client's dispatches must not overlap
  intervals = {}
  for t in range(tl.num_rounds):
    for j in np.flatnonzero(tl.valid[t]):
      intervals.setdefault(int(tl.client[t, j]), []).append((tl.dispatch[t, j], t))
  for iv in intervals.values():
    iv.sort()
    for (d0, a0), (d1, _) in zip(iv, iv[1:]):
      assert d1 > a0


def test_delay_distributions():
  rng = np.random.default_rng(0)
  assert set(timeline_lib.DelayConfig(0.5, "fixed", 3).draw(rng, 50)) == {3}
  u = timeline_lib.DelayConfig(0.5, "uniform", 4).draw(rng, 4000)
  assert set(u) == {1, 2, 3, 4}
  g = timeline_lib.DelayConfig(0.5, "geometric", mean=2.5).draw(rng, 20000)
  assert g.min() == 1 and abs(g.mean() - 2.5) < 0.1
  with pytest.raises(ValueError, match=r"^delay\.fraction: must be in \[0, 1\]"):
    timeline_lib.DelayConfig(1.5)


# ------------------------------------------------------------ DUCC and ADMM by hand


def test_ducc_without_delayed_updates():
  online = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  m, m1, m2 = pafed.ducc(online, jnp.zeros((0, 2)))
  np.testing.assert_allclose(m, [0.5, 0.5])
  np.testing.assert_allclose(m1, [0, 0])
  np.testing.assert_allclose(m2, [0, 0])


def test_ducc_none_conflicting():
  online = jnp.array([[1.0, 0.0]])
  delayed = jnp.array([[0.6, 0.8], [1.0, 0.0]])
  # s = (0.6 + 1)/2 = 0.8 and 1.0; weights w1 = s - 1/2 = 0.3, 0.5; no conflicting class.
  m, m1, m2 = pafed.ducc(online, delayed)
  np.testing.assert_allclose(m1, (0.3 * np.array([0.6, 0.8]) + 0.5 * np.array([1, 0])) / 0.8,
                             rtol=1e-6)
  np.testing.assert_allclose(m2, [0, 0])


def test_ducc_all_conflicting_is_projected_orthogonal():
  online = jnp.array([[1.0, 0.0, 0.0]])
  delayed = jnp.array([[-0.6, 0.8, 0.0], [-0.8, 0.0, 0.6]])
  # s = 0.2, 0.1 -> x = s, w2 = x - 1/2 = -0.3, -0.4; m2 = (-0.3 u1 - 0.4 u2) / -0.7.
  m, m1, m2 = pafed.ducc(online, delayed)
  raw = (0.3 * np.array([-0.6, 0.8, 0]) + 0.4 * np.array([-0.8, 0, 0.6])) / 0.7
  expected = raw - raw[0] * np.array([1.0, 0, 0])  # Eq. 12 with ||m|| = 1
  np.testing.assert_allclose(m1, [0, 0, 0])
  np.testing.assert_allclose(m2, expected, rtol=1e-6, atol=1e-7)
  assert abs(float(jnp.dot(m2, m))) < 1e-7


def test_ducc_mixed_matches_independent_numpy():
  rng = np.random.default_rng(4)
  v = rng.normal(size=(9, 16))
  v /= np.linalg.norm(v, axis=1, keepdims=True)
  m, m1, m2 = pafed.ducc(jnp.asarray(v[:4]), jnp.asarray(v[4:]))
  rm, rm1, rm2 = np_ducc(v[:4], v[4:])
  assert 0 < np.sum(v[4:] @ rm < 0) < 5  # mixed classes
  for a, b in ((m, rm), (m1, rm1), (m2, rm2)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert abs(float(jnp.dot(m2, m))) < 1e-6


def test_ducc_classifies_by_the_direction_of_the_online_mean():
  # The paper normalises the online mean before the Min (Sec. V-A), so with Cheon's
  # approximate Min the classes depend on cos(m, u_j), not on ||m|| cos(m, u_j): four
  # spread-out online updates (||m|| ~ 0.5) give the classes that their mean's unit
  # vector alone, as the only online update, gives.
  from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)
  online = unit(rng.normal(size=(4, 16)) + 0.6 * rng.normal(size=16))
  m_hat = unit(online.mean(0))
  assert np.linalg.norm(online.mean(0)) < 0.7
  delayed = []
  for c in (0.3, -0.2, 0.15, -0.35):  # unit vectors at cos c to m_hat
    r = rng.normal(size=16)
    r = unit(r - (r @ m_hat) * m_hat)
    delayed.append(c * m_hat + np.sqrt(1 - c * c) * r)
  delayed = np.array(delayed)
  np.testing.assert_allclose(delayed @ m_hat, [0.3, -0.2, 0.15, -0.35], atol=1e-12)
  cheon4 = cheon.make_cheon_min(4)
  _, m1, m2 = pafed.ducc(jnp.asarray(online), jnp.asarray(delayed), cheon4)
  _, r1, r2 = pafed.ducc(jnp.asarray(m_hat[None]), jnp.asarray(delayed), cheon4)
  np.testing.assert_allclose(m1, r1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m2, r2, rtol=1e-5, atol=1e-6)


def test_admm_client_on_a_quadratic_solved_by_hand():
  # f(w) = 1/2 ||w - c||^2; the local problem f(w) + y^T(w - g) + rho/2 ||w - g||^2 has
  # the minimiser w* = (c - y + rho g) / (1 + rho) (set the gradient to zero).
  c = jnp.array([1.0, -2.0, 0.5])
  g = jnp.array([0.2, 0.1, -0.3])
  y = jnp.array([0.3, -0.1, 0.2])
  last = jnp.array([0.0, 0.5, 0.5])
  rho = 0.5
  hp = {"rho": rho}
  state = {"dual": y}
  obj = lambda w: 0.5 * jnp.sum((w - c) ** 2) + fedadmm.admm_penalty(w, g, state, hp)
  w = g
  for _ in range(500):
    w = w - 0.2 * jax.grad(obj)(w)
  w_star = (c - y + rho * g) / (1 + rho)
  np.testing.assert_allclose(w, w_star, atol=1e-5)
  out = fedadmm.admm_client_final(g, w_star, state, 0, hp)
  new_y = y + rho * (w_star - g)  # Eq. 10
  np.testing.assert_allclose(out.state["dual"], new_y, atol=1e-6)
  # Eq. 16 from the model received (Gong et al.'s code): w* - g + (y+ - y) / rho.
  np.testing.assert_allclose(out.upload, (w_star - g) + (new_y - y) / rho, atol=1e-6)
  assert set(out.state) == {"dual"}  # no [N, d] last-local models kept
  # Eq. 16 as printed: from the client's last local model, which is then replaced.
  lit = fedadmm.admm_client_final(g, w_star, {"dual": y, "last_local": last}, 0, hp)
  np.testing.assert_allclose(lit.upload, (w_star - last) + (new_y - y) / rho, atol=1e-6)
  np.testing.assert_allclose(lit.state["last_local"], w_star)
  # PAFed uploads the same vector normalised to unit length (Alg. 3 line 8).
  p = pafed.client_final(g, w_star, state, 0, hp)
  np.testing.assert_allclose(p.upload, out.upload / jnp.linalg.norm(out.upload), atol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(p.upload), 1.0, atol=1e-6)


def test_duals_change_only_for_clients_that_trained():
  tl = timeline_lib.build(N, 3, 0.25, timeline_lib.DelayConfig(0.0), seed=1)
  alg = get("fedadmm")
  cfg = make_cfg(epochs=1)
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  state, _ = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, HP,
                             device_data())
  trained = set(tl.client[tl.valid].tolist())
  duals = np.asarray(state.client_state["dual"])
  for i in range(N):
    assert (np.abs(duals[i]).sum() > 0) == (i in trained)


@pytest.mark.parametrize("name,chunk", [("fedadmm", None), ("pafed", None), ("fedadmm", 2),
                                        ("pafed", 1)])
def test_round_updates_the_per_client_state_in_place(name, chunk):
  """No copy of a [N, d] client-state array in the compiled rounds: the scatter that
  writes the round's duals and last models updates the arrays in place, so a round's
  time does not grow with N (it did: XLA copied the array when the upload read it).
  With ``client_chunk`` each chunk gathers and scatters its own rows, the arrays carried
  through the chunks' scan."""
  tl = timeline_lib.build(N, 3, 0.4, timeline_lib.DelayConfig(0.5, "uniform", 3), seed=3)
  alg = get(name)
  cfg = dataclasses.replace(make_cfg(), client_chunk=chunk)
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  slots = jax.tree.map(jnp.asarray, tl.slice(0, 3))
  hlo = engine.make_runner(apply_flat, alg, cfg).lower(
      state, slots, jnp.zeros((3,), bool), HP, device_data()).compile().as_text()
  state_shape = f"f32[{N},{D * C + C}]"
  # the state update is in this program (one row per chunk: a dynamic-update-slice)
  assert re.search(re.escape(state_shape) + r"\{1,0\} (scatter|dynamic-update-slice)\(",
                   hlo)
  copies = [line for line in hlo.splitlines()
            if re.search(r"= " + re.escape(state_shape) + r"\S* copy\(", line)]
  assert not copies, copies


def test_server_lr_schedule():
  hp = {"server_lr": 1.0, "server_lr2": 0.1, "server_lr_switch_round": 5}
  assert float(base.server_lr(hp, 4)) == 1.0
  assert float(base.server_lr(hp, 5)) == pytest.approx(0.1)


def test_auto_client_chunk_trains_large_models_one_client_at_a_time_on_cpu():
  assert engine.auto_client_chunk(1_663_370, "cpu") == 1
  assert engine.auto_client_chunk(610, "cpu") is None
  assert engine.auto_client_chunk(1_663_370, "gpu") is None


@pytest.mark.parametrize("field,value", [("client_chunk", 0), ("client_chunk", -2),
                                         ("ring_size", 0), ("eval_batch", 0)])
def test_engine_config_rejects_bad_values_naming_the_field(field, value):
  local = client_lib.LocalConfig(4, 1, 8)
  kw = {"ring_size": 2, field: value}
  with pytest.raises(ValueError, match=rf"EngineConfig\.{field} must be .*got {value}"):
    engine.EngineConfig(local, **kw)
  engine.EngineConfig(local, ring_size=2, client_chunk=None)  # the default stays valid
  engine.EngineConfig(local, ring_size=1, client_chunk=1, eval_batch=1)


def test_progress_callback_reports_every_round_from_inside_a_chunk_and_changes_nothing():
  tl = timeline_lib.build(N, 6, 0.5, timeline_lib.DelayConfig(0.5, "uniform", 2), seed=3)
  alg = get("fedavg")
  seen, states = [], []
  for progress in (None, lambda r: seen.append(int(r))):
    cfg = dataclasses.replace(make_cfg(ring=3), progress=progress)
    state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
    state, _ = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state, tl, HP,
                               device_data(), rounds_per_call=3)
    states.append(np.asarray(state.w))
  assert seen == [1, 2, 3, 4, 5, 6]  # two compiled chunks of 3 rounds, a call per round
  np.testing.assert_array_equal(states[0], states[1])
