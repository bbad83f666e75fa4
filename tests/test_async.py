"""Tests of the asynchronous family: virtual clock, batched engine vs an event loop,
staleness functions, pruning masks, client DP noise, double compensation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async.asynchronous import engine as async_engine
from fedjax_async.core import client as client_lib
from fedjax_async.rounds import engine
from fedjax_async.asynchronous import virtual_clock as vc
from fedjax_async.algorithms import base
from fedjax_async.algorithms import double_compensation
from fedjax_async.algorithms import dp_fedasync
from fedjax_async.algorithms import fedasync
from fedjax_async.algorithms import fedbuff
from fedjax_async.algorithms import fedprox
from fedjax_async.algorithms import privaasyncfed

D_IN, NUM_CLASSES, N_CLIENTS, M = 5, 3, 6, 12


def logreg_apply(w, x, train=False, rng=None):
  del train, rng
  k = w[:D_IN * NUM_CLASSES].reshape(D_IN, NUM_CLASSES)
  return x @ k + w[D_IN * NUM_CLASSES:]


def tiny_data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(N_CLIENTS, M, D_IN)).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, size=(N_CLIENTS, M)).astype(np.int32)
  counts = np.array([12, 7, 10, 12, 5, 9], np.int32)
  tx = rng.normal(size=(20, D_IN)).astype(np.float32)
  ty = rng.integers(0, NUM_CLASSES, size=20).astype(np.int32)
  return engine.DeviceData(*map(jnp.asarray, (x, y, counts, tx, ty)))


W0 = jnp.asarray(np.random.default_rng(1).normal(size=D_IN * NUM_CLASSES + NUM_CLASSES) * .1,
                 jnp.float32)
LOCAL = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M)


# ------------------------------------------------------------------ staleness functions


def test_staleness_functions_match_formulas():
  s = jnp.array([0, 1, 3, 4, 5, 9])
  np.testing.assert_allclose(fedasync.constant_staleness(s), np.ones(6))
  np.testing.assert_allclose(fedasync.polynomial_staleness(s, 0.5),
                             [1.0, 2 ** -.5, 4 ** -.5, 5 ** -.5, 6 ** -.5, 10 ** -.5], rtol=1e-6)
  # hinge with a = 10, b = 4: 1 up to 4, then 1 / (10 (s - 4) + 1)
  np.testing.assert_allclose(fedasync.hinge_staleness(s, 10.0, 4.0),
                             [1, 1, 1, 1, 1 / 11, 1 / 51], rtol=1e-6)
  hp = base.with_defaults(fedasync.ALGORITHM, {"staleness_fn": 1.0, "poly_a": 2.0})
  np.testing.assert_allclose(fedasync.staleness_weight(jnp.array(3), hp), 1 / 16, rtol=1e-6)
  np.testing.assert_allclose(fedbuff.sqrt_staleness(jnp.array([0, 3, 8])), [1, .5, 1 / 3],
                             rtol=1e-6)


# ------------------------------------------------------------------------ virtual clock


def test_completion_time_formula():
  counts = np.array([10, 20, 30])
  cfg = vc.ClockConfig(concurrency=1, num_updates=5, epochs=3,
                       compute=vc.Distribution("constant", 0.5),
                       comm=vc.Distribution("constant", 2.0))
  clients = vc.draw_clients(cfg, counts, np.random.default_rng(0))
  np.testing.assert_allclose(clients.duration, 3 * counts * 0.5 + 2.0)
  # device classes scale compute and communication by the class slow-down
  cfg2 = vc.ClockConfig(concurrency=1, num_updates=5, epochs=1,
                        compute=vc.Distribution("constant", 1.0),
                        comm=vc.Distribution("constant", 1.0),
                        device_classes=vc.PRIVAASYNCFED_CLASSES)
  c2 = vc.draw_clients(cfg2, np.full(10, 4), np.random.default_rng(0))
  np.testing.assert_array_equal(np.bincount(c2.device_class), [3, 3, 2, 2])
  slow = np.array([1.0, 2.0, 4.0, 8.0])[c2.device_class]
  np.testing.assert_allclose(c2.duration, 4 * slow + slow)
  np.testing.assert_array_equal(c2.scale_index, c2.device_class)


def test_sequential_clock_has_no_staleness_and_adds_durations():
  counts = np.array([3, 5])
  cfg = vc.ClockConfig(concurrency=1, num_updates=6, compute=vc.Distribution("constant", 1.))
  s = vc.draw_schedule(cfg, counts, seed=3)
  assert np.all(s.staleness == 0)
  np.testing.assert_allclose(s.time, np.cumsum(counts[s.client]))
  np.testing.assert_array_equal(s.arrival_version, np.arange(6))


@pytest.mark.parametrize("k", [1, 3])
def test_clock_invariants_and_histogram(k):
  counts = np.array([12, 7, 10, 12, 5, 9])
  cfg = vc.ClockConfig(concurrency=4, num_updates=30, buffer_k=k,
                       compute=vc.Distribution("lognormal", 0.1, 0.8),
                       comm=vc.Distribution("exponential", 0.5))
  s = vc.draw_schedule(cfg, counts, seed=0)
  assert s.staleness_histogram().sum() == s.kept().sum() == 30 * k
  assert s.applies.sum() == 30
  assert np.all(np.diff(s.time) >= 0) and np.all(s.staleness >= 0)
  assert s.staleness.max() > 0
  assert s.in_flight_at_end == 4
  np.testing.assert_allclose(s.updates_per_second(), 30 / s.time[s.applies][-1])
  # a client is never in flight twice: its dispatches and arrivals alternate
  for c in range(len(counts)):
    idx = np.flatnonzero(s.client == c)
    assert len(set(s.dispatch_index[idx])) == len(idx)
  # every group member was dispatched no later than the group's first arrival version
  g = vc.group(s, 4)
  for row in g:
    m = row[row >= 0]
    assert np.all(s.dispatch_version[m] <= s.arrival_version[m[0]])
  assert sorted(g[g >= 0].tolist()) == list(range(len(s.client)))


def test_ring_buffer_drops_are_counted():
  cfg = vc.ClockConfig(concurrency=5, num_updates=40, ring_size=2,
                       compute=vc.Distribution("exponential", 1.0))
  s = vc.draw_schedule(cfg, np.full(6, 10), seed=1)
  assert s.dropped.sum() > 0
  assert np.all(s.staleness[s.dropped] > 1) and np.all(s.staleness[s.kept()] <= 1)
  assert s.staleness_histogram().sum() == 40


# ------------------------------------------------------ batched engine == event loop


def reference_loop(schedule, data, hp, server_rule, ring_size, seed=0):
  """Plain event-by-event loop: each kept arrival trains with ``client.train`` (FedProx
  penalty = FedAsync's mu/2 ||w - w_tau||^2) from the model of its dispatch version and is
  applied to the current model by ``server_rule`` written in this test. Returns the final
  model, the version count and each kept arrival's ||w_end - w_start|| (numpy)."""
  hp = {k: jnp.float32(v) for k, v in hp.items()}
  train = jax.jit(functools.partial(client_lib.train, logreg_apply, fedprox.ALGORITHM,
                                    hp=hp, cfg=LOCAL))
  base = jax.random.key_data(jax.random.PRNGKey(seed))
  versions = [np.asarray(W0)]
  w = np.asarray(W0)
  state, deltas = None, []
  for e in range(len(schedule.client)):
    if schedule.dropped[e]:
      continue
    c, dv = int(schedule.client[e]), int(schedule.dispatch_version[e])
    assert len(versions) - 1 == schedule.arrival_version[e]
    assert len(versions) - 1 - dv <= ring_size - 1
    key = engine.client_key(base, int(schedule.dispatch_index[e]), c)
    res = train(jnp.asarray(versions[dv]), {}, data.x[c], data.y[c], data.counts[c], key)
    deltas.append(np.linalg.norm(np.asarray(res.w_end, np.float64) - versions[dv]))
    w, state, new_version = server_rule(w, state, np.asarray(res.w_end), versions[dv],
                                        int(schedule.staleness[e]))
    if new_version:
      versions.append(w)
  return w, len(versions) - 1, deltas


def run_batched(algorithm, schedule, data, hp, group_size):
  cfg = async_engine.AsyncConfig(LOCAL, schedule.ring_size, group_size)
  groups = async_engine.group_arrays(schedule, group_size)
  state = async_engine.init_state(algorithm, W0, cfg.ring_size, seed=0)
  runner = async_engine.make_runner(logreg_apply, algorithm, cfg)
  state, rows = async_engine.run_arrivals(runner, state, schedule, groups, hp, data,
                                      async_engine.full_masks(W0), np.zeros(N_CLIENTS),
                                      eval_every=5, groups_per_call=7)
  return np.asarray(state.w), rows, groups


FEDASYNC_HP = base.with_defaults(fedasync.ALGORITHM, {
    "lr": 0.1, "momentum": 0.5, "mu": 0.05, "mix_alpha": 0.6, "staleness_fn": 2.,
    "hinge_a": 1.0, "hinge_b": 1.0, "example_weight": 0.0})


@pytest.mark.parametrize("ring_size", [0, 3])
def test_fedasync_batched_equals_event_loop(ring_size):
  data = tiny_data()
  cfg = vc.ClockConfig(concurrency=4, num_updates=25, epochs=LOCAL.max_epochs,
                       compute=vc.Distribution("uniform", 0.5, 2.0), ring_size=ring_size)
  s = vc.draw_schedule(cfg, np.asarray(data.counts), seed=2)
  assert s.staleness.max() >= 2
  assert (s.dropped.sum() > 0) == (ring_size == 3)
  w_batched, rows, groups = run_batched(fedasync.ALGORITHM, s, data, FEDASYNC_HP, 4)
  assert groups["valid"].shape[0] < s.kept().sum()  # batching actually happened
  assert len(rows) == s.kept().sum()

  def rule(w, state, w_new, w_tau, staleness):
    # hinge a = 1, b = 1 at t - tau = staleness (xcgoner/async_fl: epoch - worker_ts)
    a = 0.6 * (1.0 if staleness <= 1 else 1.0 / (1.0 * (staleness - 1) + 1.0))
    return (1 - a) * w + a * w_new, state, True

  w_ref, nv, deltas = reference_loop(s, data, FEDASYNC_HP, rule, s.ring_size)
  assert nv == 25
  np.testing.assert_allclose(w_batched, w_ref, rtol=2e-5, atol=2e-6)
  # each arrival's health: ||w_end - w_start|| of its own training, in arrival order
  np.testing.assert_allclose([r["delta_norm"] for r in rows], deltas, rtol=1e-4)
  assert not np.allclose(w_ref, W0)


def test_fedbuff_batched_equals_event_loop():
  data = tiny_data(1)
  hp = base.with_defaults(fedbuff.ALGORITHM, {"lr": 0.1, "momentum": 0.0, "mu": 0.0,
                                              "server_lr": 0.8, "server_momentum": 0.5,
                                              "example_weight": 0.0})
  cfg = vc.ClockConfig(concurrency=3, num_updates=8, buffer_k=3, epochs=LOCAL.max_epochs,
                       compute=vc.Distribution("exponential", 1.0))
  s = vc.draw_schedule(cfg, np.asarray(data.counts), seed=5)
  assert s.staleness.max() >= 1
  w_batched, _, groups = run_batched(fedbuff.ALGORITHM, s, data, hp, 5)
  assert groups["valid"].sum(axis=1).max() > 1

  def rule(w, state, w_new, w_tau, staleness):
    buf, cnt, mom = state if state is not None else (np.zeros_like(w), 0, np.zeros_like(w))
    buf = buf + (w_new - w_tau) / np.sqrt(1.0 + staleness)
    cnt += 1
    if cnt == 3:
      mom = 0.5 * mom + buf / 3
      return w + 0.8 * mom, (np.zeros_like(w), 0, mom), True
    return w, (buf, cnt, mom), False

  w_ref, nv, _ = reference_loop(s, data, hp, rule, s.ring_size)
  assert nv == 8
  np.testing.assert_allclose(w_batched, w_ref, rtol=2e-5, atol=2e-6)


def test_train_local_plain_matches_client_train():
  data = tiny_data()
  hp = {k: jnp.float32(v) for k, v in FEDASYNC_HP.items()}
  cfg = async_engine.AsyncConfig(LOCAL, 2, 1)
  key = jax.random.PRNGKey(7)
  a = async_engine.train_local(logreg_apply, fedasync.ALGORITHM, W0, jnp.ones_like(W0),
                               data.x[1], data.y[1], data.counts[1], key, hp, cfg)
  b = client_lib.train(logreg_apply, fedprox.ALGORITHM, W0, {}, data.x[1], data.y[1],
                       data.counts[1], key, hp, LOCAL)
  np.testing.assert_allclose(a.w_end, b.w_end, rtol=1e-6, atol=1e-7)
  assert int(a.num_steps) == int(b.num_steps) == 2 * 2  # E * ceil(7 / 4)


# ------------------------------------------------------------------ double compensation


def test_double_compensation_server_step_formula():
  w_prev = np.array([1.0, -2.0, 0.5])
  w_tau = np.array([0.5, -1.0, 0.0])
  w_star = np.array([0.0, 1.0, 0.25])
  rho, lam, lam_t, eta = 2.0, 0.5, 0.8, 0.1
  d = w_tau - w_star  # [0.5, -2, -0.25]
  g = rho * d - lam_t * lam * rho ** 2 * d * d * (w_prev - w_tau)
  # by hand: rho d = [1, -4, -0.5]; 1.6 d^2 (w_prev - w_tau) = [0.2, -6.4, 0.05]
  np.testing.assert_allclose(g, [0.8, 2.4, -0.55])
  arr = base.Arrival(True, 3, True, jnp.asarray(w_tau), jnp.ones(3), 1.0, 1.0)
  hp = {"dc_rho": rho, "dc_lambda": lam, "dc_lambda_t": lam_t, "server_lr": eta}
  w_new, _ = double_compensation.server_step(jnp.asarray(w_prev), (), jnp.asarray(w_star),
                                             arr, hp)
  np.testing.assert_allclose(w_new, w_prev - eta * np.array([0.8, 2.4, -0.55]), rtol=1e-6)


def test_loss_threshold_stops_local_training():
  """Local training stops at the first step whose minibatch loss is <= the threshold: that
  step and later ones are not taken (checked against a plain loop over the same batches)."""
  data = tiny_data()
  cfg = async_engine.AsyncConfig(LOCAL, 2, 1)
  base_hp = {"lr": 0.1, "momentum": 0.0, "dc_rho": 1.0}
  key = jax.random.PRNGKey(0)
  n = int(data.counts[0])
  run = lambda v: async_engine.train_local(
      logreg_apply, double_compensation.ALGORITHM, W0, jnp.ones_like(W0), data.x[0],
      data.y[0], data.counts[0], key,
      {k: jnp.float32(x) for k, x in dict(base_hp, loss_threshold=v).items()}, cfg)

  # Reference: plain SGD (lr 0.1) on CE + rho/2 ||w - w0||^2 over the client's minibatches,
  # the loss L_s of every step s taken before that step's update.
  init = client_lib.client_init(jax.random.split(key)[0], data.counts[0], LOCAL)

  def objective(w, xb, yb, m):
    ce = client_lib.masked_cross_entropy(logreg_apply(w, xb), yb, m)
    return ce + 0.5 * jnp.vdot(w - W0, w - W0)

  w, losses, ws = W0, [], [W0]
  for s in range(LOCAL.max_steps):
    rows, m = client_lib.step_minibatch(init, s, n, LOCAL)
    loss, g = jax.value_and_grad(objective)(w, data.x[0][rows], data.y[0][rows], m)
    losses.append(float(loss))
    w = w - 0.1 * g
    ws.append(w)
  # The first step j >= 1 whose loss is below every earlier one: a threshold halfway
  # between L_j and the earlier losses' minimum stops there (not L_j itself: the engine's
  # float32 loss may differ from this loop's in the last bit).
  j = next(j for j in range(1, len(losses)) if losses[j] < min(losses[:j]))
  v = 0.5 * (losses[j] + min(losses[:j]))

  never, at_once, mid = run(-1.0), run(100.0), run(v)
  assert int(never.num_steps) == LOCAL.max_steps == 6
  np.testing.assert_allclose(never.w_end, ws[-1], rtol=1e-5, atol=1e-6)
  assert int(at_once.num_steps) == 0
  np.testing.assert_array_equal(at_once.w_end, W0)
  assert int(mid.num_steps) == j, (int(mid.num_steps), losses)
  np.testing.assert_allclose(mid.w_end, ws[j], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(mid.mean_loss, np.mean(losses[:j]), rtol=1e-5)


@pytest.mark.parametrize("local_steps", [1, 3, 5])
def test_local_steps_caps_each_task_at_the_first_minibatches(local_steps):
  """--local_steps S (PrivaAsyncFed Table II's "Local Steps", Alg. 1's H): a task takes
  the first min(S, E ceil(n / B)) minibatch steps of its E epochs' shuffles; checked
  against plain SGD over the same minibatches, and the accounting's step count."""
  data = tiny_data()
  local = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M,
                                 local_steps=local_steps)
  cfg = async_engine.AsyncConfig(local, 2, 1)
  hp = {"lr": jnp.float32(0.1), "momentum": jnp.float32(0.0), "mu": jnp.float32(0.0)}
  key = jax.random.PRNGKey(4)
  n = int(data.counts[1])  # 7 examples: ceil(7 / 4) = 2 steps per epoch, 4 in all
  out = async_engine.train_local(logreg_apply, fedasync.ALGORITHM, W0, jnp.ones_like(W0),
                                 data.x[1], data.y[1], data.counts[1], key, hp, cfg)
  init = client_lib.client_init(jax.random.split(key)[0], n, local)
  w = W0
  for s in range(min(local_steps, 4)):
    rows, m = client_lib.step_minibatch(init, s, n, local)
    g = jax.grad(lambda w: client_lib.masked_cross_entropy(
        logreg_apply(w, data.x[1][rows]), data.y[1][rows], m))(w)
    w = w - 0.1 * g
  assert int(out.num_steps) == min(local_steps, 4)
  np.testing.assert_allclose(out.w_end, w, rtol=1e-5, atol=1e-6)
  sched = vc.draw_schedule(vc.ClockConfig(concurrency=2, num_updates=4), np.asarray(data.counts), 0)
  tasks = np.bincount(sched.client[sched.kept()], minlength=N_CLIENTS)
  spe = -(-np.asarray(data.counts) // 4)
  np.testing.assert_array_equal(async_engine.client_steps(sched, data.counts, local),
                                tasks * np.minimum(local_steps, 2 * spe))


def test_local_steps_clock_counts_the_examples_of_those_steps():
  # n = 10, B = 4: minibatches of 4, 4, 2 per epoch; 2 epochs = 6 steps, 20 examples
  by_steps = [vc.task_examples(2, 10, s, 4) for s in range(1, 8)]
  assert by_steps == [4, 8, 10, 14, 18, 20, 20]
  assert vc.task_examples(2, 10) == 20  # no cap: epochs * n
  cfg = vc.ClockConfig(concurrency=1, num_updates=3, epochs=2, local_steps=2, batch_size=4,
                       compute=vc.Distribution("constant", 0.5),
                       comm=vc.Distribution("constant", 1.0))
  clients = vc.draw_clients(cfg, np.array([10, 3]), np.random.default_rng(0))
  np.testing.assert_allclose(clients.duration, [8 * 0.5 + 1.0, 6 * 0.5 + 1.0])
  with pytest.raises(ValueError, match=r"^local\.local_steps: must be >= 0"):
    client_lib.LocalConfig(local_steps=-1)


# ----------------------------------------------------------------------------- pruning


def mlp_params(key, hidden=(8, 6)):
  sizes = (D_IN,) + hidden + (NUM_CLASSES,)
  keys = jax.random.split(key, len(sizes) - 1)
  return {f"Dense_{i}": {"kernel": jax.random.normal(k, (a, b)) * 0.5, "bias": jnp.zeros(b)}
          for i, (k, a, b) in enumerate(zip(keys, sizes[:-1], sizes[1:]))}


MLP_ORDER = [("Dense_0",), ("Dense_1",), ("Dense_2",)]  # the layers in call order


def mlp_apply_fn(unravel):
  def apply(w, x, train=False, rng=None):
    p = unravel(w)
    h = x
    for i in range(3):
      h = h @ p[f"Dense_{i}"]["kernel"] + p[f"Dense_{i}"]["bias"]
      if i < 2:
        h = jax.nn.relu(h)
    return h
  return apply


def test_scale_masks_keep_the_leading_units():
  params = mlp_params(jax.random.PRNGKey(0))
  masks = privaasyncfed.scale_masks(params, MLP_ORDER)
  tree = privaasyncfed.layer_masks(params, MLP_ORDER, 0.5)
  # Dense_0 [5, 8]: all 5 inputs, first 4 units; Dense_1 [8, 6]: rows < 4, cols < 3;
  # Dense_2 [6, 3]: rows < 3, all classes
  np.testing.assert_array_equal(tree["Dense_0"]["kernel"].sum(0), [5] * 4 + [0] * 4)
  np.testing.assert_array_equal(tree["Dense_1"]["kernel"][:4, :3], 1)
  assert tree["Dense_1"]["kernel"].sum() == 12
  np.testing.assert_array_equal(tree["Dense_2"]["kernel"].sum(1), [3] * 3 + [0] * 3)
  np.testing.assert_array_equal(tree["Dense_2"]["bias"], 1)
  np.testing.assert_array_equal(tree["Dense_0"]["bias"], [1] * 4 + [0] * 4)
  expect = [5 * 8 + 8 + 8 * 6 + 6 + 6 * 3 + 3,  # scale 1
            5 * 6 + 6 + 6 * 4 + 4 + 4 * 3 + 3,  # 0.75: floor(6), floor(4.5)=4
            5 * 4 + 4 + 4 * 3 + 3 + 3 * 3 + 3,
            5 * 2 + 2 + 2 * 1 + 1 + 1 * 3 + 3]
  np.testing.assert_array_equal(masks.sum(1), expect)


def test_masked_full_model_computes_the_pruned_model():
  params = mlp_params(jax.random.PRNGKey(1))
  w, unravel = jax.flatten_util.ravel_pytree(params)
  mask = privaasyncfed.scale_masks(params, MLP_ORDER)[2]
  x = jax.random.normal(jax.random.PRNGKey(2), (4, D_IN))
  masked = mlp_apply_fn(unravel)(w * mask, x)
  p = params
  h = jax.nn.relu(x @ p["Dense_0"]["kernel"][:, :4] + p["Dense_0"]["bias"][:4])
  h = jax.nn.relu(h @ p["Dense_1"]["kernel"][:4, :3] + p["Dense_1"]["bias"][:3])
  small = h @ p["Dense_2"]["kernel"][:3] + p["Dense_2"]["bias"]
  np.testing.assert_allclose(masked, small, rtol=1e-5, atol=1e-6)


def test_sub_model_masks_follow_the_call_order_not_the_sorted_keys():
  # A flax MLP of 11 dense layers: its params come back from models.init_params (a jit)
  # with sorted keys, Dense_10 (the output layer) between Dense_1 and Dense_2. The masks
  # must follow the call order: the masked full network equals the pruned network
  # computed by hand (first floor(s * units) units of each hidden layer kept).
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from fedjax_async import models  # pylint: disable=g-import-not-at-top

  class Deep(nn.Module):  # tanh(0) = 0 like ReLU, but no unit dies; biases non-zero
    @nn.compact
    def __call__(self, x, train=False):
      bias = nn.initializers.normal(0.5)
      for _ in range(10):
        x = jnp.tanh(nn.Dense(6, bias_init=bias)(x))
      return nn.Dense(NUM_CLASSES, bias_init=bias)(x)

  model = Deep()
  params = models.init_params(model, (D_IN,), jax.random.PRNGKey(4))
  assert list(params)[:3] == ["Dense_0", "Dense_1", "Dense_10"]
  order = privaasyncfed.call_order(model, (D_IN,))
  assert order == [()] + [(f"Dense_{i}",) for i in range(11)]
  w, unravel = jax.flatten_util.ravel_pytree(params)
  mask = privaasyncfed.scale_masks(params, order, (1.0, 0.5))[1]
  x = jax.random.normal(jax.random.PRNGKey(5), (4, D_IN))
  masked = model.apply({"params": unravel(w * mask)}, x)
  h, width = x, D_IN
  for i in range(11):
    p = params[f"Dense_{i}"]
    out = NUM_CLASSES if i == 10 else 3
    h = h[:, :width] @ p["kernel"][:width, :out] + p["bias"][:out]
    h, width = (h if i == 10 else jnp.tanh(h)), out
  assert np.abs(np.asarray(h)).min() > 1e-3
  np.testing.assert_allclose(masked, h, rtol=1e-5, atol=1e-6)


def test_sub_model_masks_of_a_residual_network_and_groupnorm_refused():
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  shape = (8, 8, 3)
  with pytest.raises(ValueError, match="--model.*GroupNorm"):
    privaasyncfed.call_order(models.get_model("resnet18", 10, shape), shape)
  model = models.ResNet18(num_classes=10, norm="none")
  params = models.init_params(model, shape, jax.random.PRNGKey(0))
  order = privaasyncfed.call_order(model, shape)
  tree = privaasyncfed.layer_masks(params, order, 0.5)
  assert tree["stem"]["kernel"].shape == (3, 3, 3, 64)
  # The input layer keeps all 3 colour channels, the output layer all 10 classes.
  np.testing.assert_array_equal(tree["stem"]["kernel"].sum((0, 1, 3)), [9 * 32] * 3)
  np.testing.assert_array_equal(tree["fc"]["kernel"].sum(0), [256] * 10)
  np.testing.assert_array_equal(tree["fc"]["bias"], 1)
  # A skip connection's projection keeps its leading input and output channels.
  sc = tree["layer2_0"]["shortcut"]["kernel"]  # [1, 1, 64, 128]
  np.testing.assert_array_equal(sc[0, 0].sum(1), [64] * 32 + [0] * 32)
  assert privaasyncfed.scale_masks(params, order, (0.5,)).shape == (
      1, jax.flatten_util.ravel_pytree(params)[0].size)


def test_pruned_client_updates_only_its_submodel():
  data = tiny_data()
  params = mlp_params(jax.random.PRNGKey(3))
  w0, unravel = jax.flatten_util.ravel_pytree(params)
  apply = mlp_apply_fn(unravel)
  masks = privaasyncfed.scale_masks(params, MLP_ORDER)
  scale_index = np.full(N_CLIENTS, 2)  # every client trains the 0.5 sub-model
  hp = {"lr": 0.1, "momentum": 0.0, "beta": 0.7, "hinge_a": 1.0, "hinge_b": 1.0,
        "dp_epsilon": 5.0, "dp_clip": 1.0, "dp_delta": 1e-5}
  cfg_clock = vc.ClockConfig(concurrency=3, num_updates=6, epochs=1)
  s = vc.draw_schedule(cfg_clock, np.asarray(data.counts), seed=0)
  cfg = async_engine.AsyncConfig(client_lib.LocalConfig(4, 1, M), s.ring_size, 3)
  state = async_engine.init_state(privaasyncfed.ALGORITHM, w0, cfg.ring_size, 0)
  runner = async_engine.make_runner(apply, privaasyncfed.ALGORITHM, cfg)
  state, _ = async_engine.run_arrivals(runner, state, s, async_engine.group_arrays(s, 3), hp,
                                   data, masks, scale_index, eval_every=100)
  w = np.asarray(state.w)
  held = masks[2] > 0
  np.testing.assert_array_equal(w[~held], np.asarray(w0)[~held])  # exactly unchanged
  assert np.abs(w[held] - np.asarray(w0)[held]).min() > 0  # noise reaches every held one


def test_privaasyncfed_server_mixes_held_parameters_only():
  w = jnp.array([1.0, 2.0, 3.0, 4.0])
  up = jnp.array([0.0, 0.0, 9.0, 9.0])
  mask = jnp.array([1.0, 1.0, 0.0, 0.0])
  arr = base.Arrival(True, 6, True, w, mask, 1.0, 1.0)
  hp = {"beta": 0.5, "hinge_a": 1.0, "hinge_b": 4.0}
  new, _ = privaasyncfed.server_step(w, (), up, arr, hp)
  # staleness 6 (six server updates since dispatch): t - tau = 6, Eq. 16 with FedAsync's +1
  a = 0.5 / (1.0 * (6 - 4) + 1.0)
  np.testing.assert_allclose(new, [(1 - a) * 1, (1 - a) * 2, 3, 4], rtol=1e-6)


# Hand values of a_t = a s(t - tau) with t - tau = the arrival's staleness, a fresh update
# counting 0 as in the authors' code (xcgoner/async_fl worker_delay = epoch - worker_ts;
# FedLab self.round - receive_model_time; PrivaAsyncFed Eq. 15 S(0) = 1, Fig. 2
# alpha_k = beta at t - tau ~ 0). Hinge a = 10, b = 4: 1 while t - tau <= 4, then
# 1 / (10 (t - tau - 4) + 1); polynomial a = 0.5: (t - tau + 1)^-0.5.
HINGE_WEIGHTS = {0: 1.0, 1: 1.0, 3: 1.0, 4: 1.0, 5: 1 / 11, 6: 1 / 21, 9: 1 / 51}
POLY_WEIGHTS = {0: 1.0, 1: 2 ** -.5, 3: 0.5, 8: 1 / 3}


@pytest.mark.parametrize("staleness", sorted(HINGE_WEIGHTS))
def test_privaasyncfed_and_fedasync_hinge_weigh_staleness_alike(staleness):
  """PrivaAsyncFed vs DP-FedAsync uses identical configurations (Sec. IV-B.3): with
  beta = FedAsync's a = 0.6, a full mask and the same hinge, both mix in
  0.6 * HINGE_WEIGHTS[staleness]: exactly 0.6 for a fresh update and at staleness 4."""
  w, up = jnp.zeros(3), jnp.ones(3)
  arr = base.Arrival(True, staleness, True, w, jnp.ones(3), 1.0, 1.0)
  hp = base.with_defaults(fedasync.ALGORITHM, {
      "beta": 0.6, "mix_alpha": 0.6, "hinge_a": 10.0, "hinge_b": 4.0, "staleness_fn": 2.0,
      "poly_a": 0.5, "example_weight": 0.0})
  expected = 0.6 * HINGE_WEIGHTS[staleness]
  priva, _ = privaasyncfed.server_step(w, (), up, arr, hp)
  fedasync_w, _ = fedasync.server_step(w, (), up, arr, hp)
  np.testing.assert_allclose(priva, expected, rtol=1e-6)
  np.testing.assert_allclose(fedasync_w, expected, rtol=1e-6)


@pytest.mark.parametrize("staleness", sorted(POLY_WEIGHTS))
def test_fedasync_polynomial_counts_a_fresh_update_as_zero(staleness):
  """FedAsync polynomial a = 0.5, mix a = 0.5: a fresh update is mixed in with exactly
  0.5 (not 0.5 / sqrt(2)); staleness 3 with 0.5 * 4^-0.5 = 0.25."""
  w, up = jnp.full(2, 2.0), jnp.full(2, 4.0)
  arr = base.Arrival(True, staleness, True, w, jnp.ones(2), 1.0, 1.0)
  hp = base.with_defaults(fedasync.ALGORITHM, {"mix_alpha": 0.5, "staleness_fn": 1.0,
                                               "poly_a": 0.5, "example_weight": 0.0})
  a = 0.5 * POLY_WEIGHTS[staleness]
  new, _ = fedasync.server_step(w, (), up, arr, hp)
  np.testing.assert_allclose(new, (1 - a) * 2.0 + a * 4.0, rtol=1e-6)


# --------------------------------------------------------------------------- client DP


def zero_grad_apply(w, x, train=False, rng=None):
  del train, rng
  return jnp.zeros((x.shape[0], NUM_CLASSES)) + 0.0 * jnp.sum(w) * 0.0


def noise_sample(n, batch_size, hp_extra, algorithm=None, mask=None, d=40, draws=300):
  """w_end of one noisy step from w0 = 0 with zero gradients (only the noise moves w), for
  ``draws`` keys: a client of n examples, minibatch ``batch_size``, one local step."""
  data = tiny_data()
  hp = {k: jnp.float32(v) for k, v in dict(lr=0.5, momentum=0.0, mu=0.0, dp_clip=2.0,
                                            **hp_extra).items()}
  cfg = async_engine.AsyncConfig(client_lib.LocalConfig(batch_size, 1, M, local_steps=1),
                                 2, 1)
  mask = jnp.ones(d) if mask is None else mask
  keys = jax.random.split(jax.random.PRNGKey(0), draws)
  res = jax.vmap(lambda k: async_engine.train_local(
      zero_grad_apply, algorithm or dp_fedasync.ALGORITHM, jnp.zeros(d), mask, data.x[0],
      data.y[0], n, k, hp, cfg))(keys)
  assert int(res.num_steps[0]) == 1
  return np.asarray(res.w_end)


def test_dp_noise_std_matches_alg1_formula():
  """Alg. 1 lines 15, 24: sigma = Delta f / eps, Delta f = lr 2C / |D_k| with |D_k| the
  client's n = 12 examples, not its minibatch of B = 4 (which would give 3 x sigma)."""
  lr, clip, eps, n = 0.5, 2.0, 0.25, 12
  sample = noise_sample(n, 4, dict(dp_epsilon=eps)).ravel()  # 12000 draws
  expected = lr * 2 * clip / n / eps  # = 2/3
  assert abs(sample.std() / expected - 1) < 0.03, (sample.std(), expected)
  assert abs(sample.mean()) < 4 * expected / np.sqrt(sample.size)


def test_dp_calibrated_noise_std_uses_the_smallest_minibatch():
  """--dp_noise=calibrated: sigma = z * lr 2C / b with b the client's smallest minibatch
  (per-example clipping, replace-one): n = 10, B = 4 -> minibatches 4, 4, 2, so b = 2
  and sigma = 0.5 * 0.5 * 4 / 2 = 0.5 (with |D_k| = 10 it would be 0.1, with B 0.25)."""
  z = 0.5
  sample = noise_sample(10, 4, dict(dp_epsilon=1.0, dp_noise_multiplier=z)).ravel()
  expected = z * 0.5 * 2 * 2.0 / 2
  assert abs(sample.std() / expected - 1) < 0.03, (sample.std(), expected)


def test_dp_noise_stays_off_pruned_coordinates():
  """PrivaAsyncFed: a client of pruning scale 0.5 adds noise only to the parameters of
  its sub-model (Alg. 1 line 24 perturbs the client's W_k, the pruned model of Eq. 10);
  every pruned coordinate of the trained model stays exactly 0, every held one moves
  with std sigma = lr 2C / (|D_k| eps)."""
  params = mlp_params(jax.random.PRNGKey(3))
  w0, _ = jax.flatten_util.ravel_pytree(params)
  mask = privaasyncfed.scale_masks(params, MLP_ORDER, (0.5,))[0]
  held = mask > 0
  assert 0 < held.sum() < mask.size
  sample = noise_sample(12, 4, dict(dp_epsilon=1.0), privaasyncfed.ALGORITHM,
                        jnp.asarray(mask), d=w0.size, draws=200)
  np.testing.assert_array_equal(sample[:, ~held], 0.0)
  expected = 0.5 * 2 * 2.0 / 12 / 1.0
  assert abs(sample[:, held].std() / expected - 1) < 0.05


def test_dp_clips_each_example_before_averaging():
  """Eq. 17 (per-example clipping, --dp_clip_mode=example): the step is
  -lr mean_i clip(g_i, C); Alg. 1 line 20 (batch): -lr clip(mean_i g_i, C). Hand
  gradients of softmax regression at w = 0 (p = 1/3 each): g_i = (x_i (p - e_y),
  p - e_y). Two examples x and -x of class 0: their kernel gradients cancel in the mean,
  so clipping the mean keeps the bias gradient whole (norm 0.816 > C = 0.5 -> scaled to
  C), while clipping each example first scales everything by C / ||g_i|| = 0.5 / 2.58."""
  x1 = np.array([1.0, 2.0, 0.0, 2.0, 0.0], np.float32)  # |x| = 3
  x = np.stack([x1, -x1])
  y = np.array([0, 0], np.int32)
  v = np.array([1 / 3 - 1, 1 / 3, 1 / 3])
  grads = [np.concatenate([np.outer(xi, v).ravel(), v]) for xi in x]

  def clip(g, c):
    return g * min(1.0, c / np.linalg.norm(g))

  expected = {"example": -0.8 * np.mean([clip(g, 0.5) for g in grads], axis=0),
              "batch": -0.8 * clip(np.mean(grads, axis=0), 0.5)}
  assert np.abs(expected["example"] - expected["batch"]).max() > 0.1
  hp = {k: jnp.float32(v) for k, v in dict(lr=0.8, momentum=0.0, mu=0.0,
                                            dp_epsilon=jnp.inf, dp_clip=0.5).items()}
  d = D_IN * NUM_CLASSES + NUM_CLASSES
  for mode in ("example", "batch"):
    cfg = async_engine.AsyncConfig(client_lib.LocalConfig(2, 1, 2), 2, 1, dp_clip_mode=mode)
    res = async_engine.train_local(logreg_apply, dp_fedasync.ALGORITHM, jnp.zeros(d),
                                   jnp.ones(d), jnp.asarray(x), jnp.asarray(y), 2,
                                   jax.random.PRNGKey(0), hp, cfg)
    assert int(res.num_steps) == 1
    np.testing.assert_allclose(res.w_end, expected[mode], rtol=1e-5, atol=1e-6,
                               err_msg=mode)


def test_dp_clipping_bounds_the_step():
  data = tiny_data()
  big = jnp.asarray(W0) * 50.0
  for mode in ("example", "batch"):
    cfg = async_engine.AsyncConfig(client_lib.LocalConfig(12, 1, M), 2, 1, dp_clip_mode=mode)
    hp = {k: jnp.float32(v) for k, v in dict(lr=1.0, momentum=0.0, mu=0.0,
                                              dp_epsilon=jnp.inf, dp_clip=0.1).items()}
    res = async_engine.train_local(logreg_apply, dp_fedasync.ALGORITHM, big,
                                   jnp.ones_like(big), data.x[0], data.y[0], 12,
                                   jax.random.PRNGKey(0), hp, cfg)
    step = np.linalg.norm(np.asarray(res.w_end - big))
    assert step <= 0.1 + 1e-5 and step > 0.01, (mode, step)
  np.testing.assert_allclose(async_engine.clip_by_norm(jnp.array([3.0, 4.0]), 1.0), [.6, .8])
  np.testing.assert_allclose(async_engine.clip_by_norm(jnp.array([.3, .4]), 1.0), [.3, .4])


def test_pruned_clients_work_scales_with_s_squared():
  cfg = vc.ClockConfig(concurrency=1, num_updates=5, epochs=1,
                       compute=vc.Distribution("constant", 1.0),
                       comm=vc.Distribution("constant", 1.0),
                       device_classes=vc.PRIVAASYNCFED_CLASSES,
                       pruned_scales=privaasyncfed.SCALES)
  c = vc.draw_clients(cfg, np.full(10, 4), np.random.default_rng(0))
  slow = np.array([1.0, 2.0, 4.0, 8.0])[c.device_class]
  work = np.array([1.0, 0.75, 0.5, 0.25])[c.scale_index] ** 2
  np.testing.assert_allclose(c.duration, (4 + 1) * slow * work)


# ------------------------------------------------------------- the driver's --seeds


def test_async_family_seeds_runs_each_seed_and_tabulates_mean_and_std(tmp_path):
  """--seeds=0,1: each seed's runs under seed<s>/ (each equal to a --seed=<s> run on the
  data of --data_seed=0, the base seed's), and comparison.md with the mean and sample
  standard deviation of their final accuracies."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  import run_script  # pylint: disable=g-import-not-at-top
  script = os.path.join(run_script.ROOT, "experiments", "async_family.py")
  args = ["--algorithm=fedasync", "--num_clients=6", "--concurrency=2", "--num_updates=6",
          "--eval_every=3", "--checkpoint_every=0"]

  def run(*extra):
    return subprocess.run([sys.executable, script] + args + list(extra),
                          env=run_script.env(), capture_output=True, text=True, timeout=600)

  out = run("--seeds=0,1", f"--output_dir={tmp_path / 'both'}")
  assert out.returncode == 0, out.stderr[-3000:]
  single = run("--seed=1", "--data_seed=0", f"--output_dir={tmp_path / 'one'}")
  assert single.returncode == 0, single.stderr[-3000:]
  acc = [json.load(open(tmp_path / "both" / f"seed{s}" / "fedasync" / "summary.json"))[
      "final_accuracy"] for s in (0, 1)]
  alone = json.load(open(tmp_path / "one" / "fedasync" / "summary.json"))["final_accuracy"]
  assert acc[1] == alone
  row = [l for l in (tmp_path / "both" / "comparison.md").read_text().splitlines()
         if l.startswith("| fedasync ")][0]
  mean, std = (acc[0] + acc[1]) / 2, abs(acc[0] - acc[1]) / np.sqrt(2)
  assert row.split("|")[2].strip() == f"{mean:.4f} ± {std:.4f} (2)", row
  bad = run("--seeds=0,0", f"--output_dir={tmp_path / 'bad'}")
  assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
      "error: --seeds: repeats a seed: '0,0'")
