"""SCAFFOLD and FedDyn on the round engine against float64 references of the papers'
algorithms, written here in numpy (full-batch local steps: a minibatch's order cannot
matter; a softmax regression; 12 rounds of 3 of 6 clients, so that clients not sampled
keep their state).

SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1, option II): y <- y - eta_l (g(y) - c_i
+ c); c_i^+ = c_i - c + (x - y) / (K eta_l); x <- x + eta_g mean(Delta y); c <- c +
|S|/N mean(Delta c). FedDyn (Acar et al., ICLR 2021, Alg. 1): the client minimises
L_k - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2, then g_k <- g_k - alpha (theta_k -
theta^{t-1}); h <- h - alpha/m sum(theta_k - theta^{t-1}); theta = mean(theta_k) - h/alpha.
With delays a client starts from the model (SCAFFOLD: and c) of its dispatch round.

Tolerance: the engine runs float32; 12 rounds of 3 full-batch steps stay within
|w - w_ref| <= 1e-4 (1 + |w_ref|) of the float64 reference (measured: <= 2e-7 on w).
"""

import functools
import os

import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import algorithms
from fedjax_async.core import client as client_lib
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.rounds import engine

import natural_files as nf
import run_script

N, M, D, C, ROUNDS, E = 6, 8, 4, 3, 12, 3  # E full-batch epochs = K local steps
LR, ETA_G, ALPHA = 0.4, 0.8, 0.3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, M, D)).astype(np.float32)
Y = RNG.integers(0, C, (N, M)).astype(np.int32)
COUNTS = np.array([8, 5, 3, 7, 6, 4], np.int32)
W0 = RNG.normal(scale=0.3, size=D * C + C).astype(np.float32)
_DELAYED = timeline_lib.build(N, ROUNDS, 0.5, timeline_lib.DelayConfig(0.4, "uniform", 2),
                              seed=3)
# without delays, padded to the same K slots: the runs of both share one compiled program
TIMELINES = {True: _DELAYED, False: timeline_lib.build(
    N, ROUNDS, 0.5, timeline_lib.DelayConfig(0.0, "uniform", 2), seed=3,
    min_slots=_DELAYED.valid.shape[1])}


def apply_flat(w, xb, train=False, rng=None):
  del train, rng
  return xb @ w[:D * C].reshape(D, C) + w[D * C:]


# ------------------------------------------------------------------ the references


def grad(w, i):
  """The full-batch gradient of client i's mean cross-entropy at w (float64)."""
  x, y = X[i, :COUNTS[i]].astype(np.float64), Y[i, :COUNTS[i]]
  z = x @ w[:D * C].reshape(D, C) + w[D * C:]
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  g = (p - np.eye(C)[y]) / len(y)
  return np.concatenate([(x.T @ g).ravel(), g.sum(0)])


def arrivals(tl, t):
  """Round t's arrivals: [(client, dispatch round)]."""
  return [(int(tl.client[t, s]), int(tl.dispatch[t, s])) for s in range(tl.valid.shape[1])
          if tl.valid[t, s]]


def scaffold_reference(tl, weighting="uniform"):
  x, c = W0.astype(np.float64), np.zeros(D * C + C)
  c_i = np.zeros((N, D * C + C))
  sent = {0: (x, c)}  # the (x, c) of each round's start
  for t in range(ROUNDS):
    dy, dc, p, new = [], [], [], {}
    for i, t0 in arrivals(tl, t):
      x0, c0 = sent[t0]
      y = x0.copy()
      for _ in range(E):
        y = y - LR * (grad(y, i) - c_i[i] + c0)  # Alg. 1 line 10
      plus = c_i[i] - c0 + (x0 - y) / (E * LR)  # line 12, option II
      dy.append(y - x0)
      dc.append(plus - c_i[i])
      p.append(1.0 if weighting == "uniform" else float(COUNTS[i]))
      new[i] = plus
    if p:
      p = np.asarray(p) / np.sum(p)
      x = x + ETA_G * p @ np.asarray(dy)  # lines 16-17
      c = c + len(p) / N * (p @ np.asarray(dc))
    for i, v in new.items():
      c_i[i] = v
    sent[t + 1] = (x, c)
  return x, c, c_i


def feddyn_reference(tl):
  theta, h = W0.astype(np.float64), np.zeros(D * C + C)
  g = np.zeros((N, D * C + C))
  sent = {0: theta}
  for t in range(ROUNDS):
    thetas, deltas, new = [], [], {}
    for k, t0 in arrivals(tl, t):
      start = sent[t0]
      th = start.copy()
      for _ in range(E):  # gradient steps on L_k - <g_k, th> + alpha/2 ||th - start||^2
        th = th - LR * (grad(th, k) - g[k] + ALPHA * (th - start))
      new[k] = g[k] - ALPHA * (th - start)
      deltas.append(th - start)
      thetas.append(theta + (th - start))  # theta_k itself for an online client
    if thetas:
      h = h - ALPHA / N * np.sum(deltas, 0)
      theta = np.mean(thetas, 0) - h / ALPHA
    for k, v in new.items():
      g[k] = v
    sent[t + 1] = theta
  return theta, h, g


# ------------------------------------------------------------------ the engine's runs


@functools.lru_cache(maxsize=None)
def run(name, delays, chunk=None, rounds_per_call=ROUNDS, stream=True, weighting=0.0):
  alg = algorithms.get(name)
  local = client_lib.LocalConfig(batch_size=M, max_epochs=E, max_examples=M, momentum=False)
  cfg = engine.EngineConfig(local, ring_size=3, eval_batch=M, client_chunk=chunk,
                            stream_uploads=stream)
  data = engine.DeviceData(*map(jnp.asarray, (X, Y, COUNTS, X[0], Y[0])))
  hp = {"lr": LR, "momentum": 0.0, "server_lr": ETA_G, "server_lr2": ETA_G,
        "server_lr_switch_round": -1, "client_weighting": weighting, "feddyn_alpha": ALPHA}
  state = engine.init_state(alg, W0, N, 3, 0)
  state, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, cfg), state,
                                  TIMELINES[delays], hp, data, eval_every=100,
                                  rounds_per_call=rounds_per_call)
  assert len(rows) == ROUNDS
  return state


# Each algorithm: without delays; with delays; with delays chunked one client a chunk
# (uploads streamed) and three (a non-divisor of K = 4, the [K, d] uploads stacked), in calls of
# several rounds; client_weighting=examples (traced: no new program). Made when first
# asked for (``run`` keeps them), shared by the tests.
RUNS = {"plain": dict(delays=False), "delays": dict(delays=True),
        "chunk1": dict(delays=True, chunk=1, rounds_per_call=4),
        "chunk3": dict(delays=True, chunk=3, rounds_per_call=6, stream=False),
        "examples": dict(delays=False, weighting=1.0)}


class Runs:
  def __init__(self, name):
    self.name = name

  def __getitem__(self, key):
    return run(self.name, **RUNS[key])


@pytest.fixture(scope="module")
def scaffold_runs():
  return Runs("scaffold")


@pytest.fixture(scope="module")
def feddyn_runs():
  return Runs("feddyn")


def close(got, want):
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_the_timelines_sample_part_of_the_clients_and_delay_some():
  plain, delayed = TIMELINES[False], TIMELINES[True]
  for t in range(ROUNDS):
    assert 0 < len(arrivals(plain, t)) < N
  assert any(t0 < t for t in range(ROUNDS) for _, t0 in arrivals(delayed, t))


def test_scaffold_equals_its_float64_reference(scaffold_runs):
  x, c, c_i = scaffold_reference(TIMELINES[False])
  s = scaffold_runs["plain"]
  close(s.w, x)
  close(s.server_state["c"], c)
  close(s.client_state["c_i"], c_i)
  assert np.abs(c).max() > 1e-3 and np.abs(c_i).max() > 1e-3
  x, c, c_i = scaffold_reference(TIMELINES[False], weighting="examples")
  close(scaffold_runs["examples"].w, x)  # client_weighting=examples: n_i in both means
  close(scaffold_runs["examples"].server_state["c"], c)


def test_a_delayed_scaffold_client_reads_the_x_and_c_of_its_dispatch_round(scaffold_runs):
  x, c, c_i = scaffold_reference(TIMELINES[True])
  for k in ("delays", "chunk1", "chunk3"):
    s = scaffold_runs[k]
    close(s.w, x)
    close(s.server_state["c"], c)
    close(s.client_state["c_i"], c_i)
  np.testing.assert_allclose(scaffold_runs["chunk1"].w, scaffold_runs["delays"].w,
                             rtol=1e-5, atol=1e-6)


def test_feddyn_equals_its_float64_reference(feddyn_runs):
  theta, h, g = feddyn_reference(TIMELINES[False])
  s = feddyn_runs["plain"]
  close(s.w, theta)
  close(s.server_state["h"], h)
  close(s.client_state["grad"], g)
  assert np.abs(h).max() > 1e-3


def test_feddyn_with_delays_chunks_and_rounds_per_call(feddyn_runs):
  theta, h, g = feddyn_reference(TIMELINES[True])
  for k in ("delays", "chunk1", "chunk3"):
    close(feddyn_runs[k].w, theta)
    close(feddyn_runs[k].server_state["h"], h)
    close(feddyn_runs[k].client_state["grad"], g)


def test_the_virtual_clock_refuses_them_by_name():
  for name in ("scaffold", "feddyn"):
    assert name in algorithms.names("rounds")
    assert name not in algorithms.names_on("virtual_clock")


# ------------------------------------------------------------------ the entry points


def test_both_run_from_the_cli(tmp_path):
  out = str(tmp_path / "out")
  proc = run_script.run(["--algorithm=scaffold,feddyn", "--rounds=2", "--num_clients=6",
                         "--local_steps=2", "--feddyn_alpha=0.1", f"--output_dir={out}",
                         "--quiet"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("scaffold", "feddyn"):
    rows = run_script.read_rows(os.path.join(out, name, "metrics.jsonl"))
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["test_accuracy"] is not None


def test_both_run_from_python_on_natural_image_clients(tmp_path):
  """LEAF FEMNIST files (28 x 28 images, one client per writer): a natural split."""
  sizes = [3, 6, 2, 5]
  train, test = nf.emnist_clients(sizes, 0), nf.emnist_clients([4], 1)
  as_leaf = lambda c: (c[0].reshape(len(c[1]), -1).tolist(), [int(v) for v in c[1]])
  d = str(tmp_path)
  nf.write_leaf(d, "train", {"all_data_0_niid_0_keep_0_train_9.json":
                             {f"f{i:04d}": as_leaf(c) for i, c in enumerate(train)}})
  nf.write_leaf(d, "test", {"all_data_0_niid_0_keep_0_test_9.json": {"t0": as_leaf(test[0])}})
  result = fa.simulate(algorithm="scaffold,feddyn", dataset="leaf_femnist", data_dir=d,
                       rounds=2, participation=0.5, delay_fraction=0, model="logreg",
                       batch_size=2, local_epochs=1, quiet=True)
  for name in ("scaffold", "feddyn"):
    r = result.runs[name]
    assert r.summary["dataset"] == "leaf_femnist"
    assert [row["online"] for row in r.rows] == [2, 2]
    w = np.asarray(r.state.w)
    assert w.shape == (28 * 28 * 62 + 62,) and np.all(np.isfinite(w))
