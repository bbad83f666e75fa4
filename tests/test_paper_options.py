"""The PAFed experiment made checkable: the three accuracy metrics, the global step's norm,
the authors'-code options (Model1, input normalisation, the delay and server-step options),
Eq. 17's alpha decay, Eq. 13's two readings, the dropped-update option and the two Table V
flag files."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async import metrics
from fedjax_async import outputs
from fedjax_async import models
from fedjax_async.algorithms import base
from fedjax_async.algorithms import pafed
from fedjax_async.data import loader
from fedjax_async.rounds import experiment
from fedjax_async.core import timeline as timeline_lib

import run_script

ROOT = run_script.ROOT
TABLE = os.path.join(ROOT, "experiments", "pafed_table.py")
FMNIST = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"


# ------------------------------------------------------------------------- metrics

def test_the_three_accuracy_metrics_by_hand():
  # 12 rounds; None = not evaluated. By hand:
  #   final: the last evaluated value, 0.50
  #   last-10 mean: rounds 3..12 evaluated .60 .55 .40 .70 .45 .50 (None skipped) -> 3.20 / 6
  #   best so far: .30 .80 .80 .80 .80 .80 .80 .80 .80 .80 .80 .80 -> last 10: 0.80
  accs = [0.3, 0.8, 0.6, None, 0.55, 0.4, None, 0.7, None, 0.45, None, 0.5]
  got = metrics.accuracy_summary(accs)
  assert got["final_accuracy"] == pytest.approx(0.50)
  assert got["last10_mean_accuracy"] == pytest.approx(3.20 / 6)
  assert got["average_best_accuracy"] == pytest.approx(0.80)
  # a short curve: the best so far .1 .5 .5 .5 .6 .6, last 3 -> (.5 + .6 + .6) / 3
  assert metrics.average_best_accuracy([0.1, 0.5, None, 0.4, 0.6, 0.55], last=3) == \
      pytest.approx((0.5 + 0.6 + 0.6) / 3)


def test_short_runs_mark_their_last10_metrics_and_final_is_never_marked():
  assert metrics.mark_short("0.5", "last10_mean_accuracy", 10) == "0.5" + metrics.SHORT_RUN_MARK
  assert metrics.mark_short("0.5", "average_best_accuracy", 5).endswith(metrics.SHORT_RUN_MARK)
  assert metrics.mark_short("0.5", "final_accuracy", 5) == "0.5"
  assert metrics.mark_short("0.5", "average_best_accuracy", 11) == "0.5"
  table = outputs.comparison_table([
      {"algorithm": "x", "rounds": 8, "final_accuracy": 0.5, "last10_mean_accuracy": 0.4,
       "average_best_accuracy": 0.6, "wall_time_s": 1.0}])
  assert "| x | 0.5000 | 0.4000† | 0.6000† | 1.0 |" in table and metrics.SHORT_RUN_NOTE in table


def _run(tmp_path, **kw):
  cfg = dict(algorithm="fedavg,pafed", dataset="synthetic", num_clients=10,
             participation=0.5, rounds=12, local_epochs=1, batch_size=10, eval_every=1,
             quiet=True, seed=3)
  cfg.update(kw)
  return fa.simulate(**cfg)


@pytest.fixture(scope="module")
def twelve_rounds():
  return _run(None)


def test_summaries_hold_the_three_metrics_of_their_rows(twelve_rounds):
  for run in twelve_rounds.runs.values():
    accs = [r["test_accuracy"] for r in run.rows]
    s = run.summary
    # recomputed here from the rows, by the definitions (not through metrics.py)
    tail = [a for a in accs[-10:] if a is not None]
    running = np.maximum.accumulate(np.array(accs, float))
    assert s["final_accuracy"] == pytest.approx(accs[-1])
    assert s["last10_mean_accuracy"] == pytest.approx(np.mean(tail))
    assert s["average_best_accuracy"] == pytest.approx(np.mean(running[-10:]))
    # the three differ on these curves: a metric computed as another fails one line above
    assert len({round(s[k], 6) for k in metrics.KEYS}) == 3, s


def test_rows_hold_the_global_step_norm(tmp_path):
  # one round: ||w_1 - w_0|| with w_0 the model's initialisation and w_1 the final state
  res = _run(tmp_path, rounds=1, algorithm="pafed")
  cfg = fa.RunConfig().replace(dataset="synthetic", num_clients=10, seed=3)
  fed = experiment.load_data(cfg)
  _, w0, _ = experiment.build_model(cfg, fed)
  run = res.runs["pafed"]
  want = float(np.linalg.norm(np.asarray(run.state.w) - np.asarray(w0)))
  assert run.rows[0]["server_step_norm"] == pytest.approx(want, rel=1e-5)


# ------------------------------------------------------------------- PAFed's server

def _unit(v):
  v = np.asarray(v, np.float64)
  return v / np.linalg.norm(v)


def _reference(online, delayed, project_conflicting):
  """Alg. 4 / Eqs. 12-14 in numpy: m the online mean; weights (m . u / |m| + 1) / 2 - 1/2
  split into the non-conflicting (> 0) and conflicting (< 0) classes; one class projected
  onto the normal plane of m."""
  m = np.mean(online, axis=0)
  dots = np.array([u @ m / np.linalg.norm(m) for u in delayed])
  w = dots / 2.0
  pos, neg = w > 0, w < 0
  m1 = (w[pos] @ delayed[pos]) / w[pos].sum()
  m2 = (w[neg] @ delayed[neg]) / w[neg].sum()
  proj = lambda v: v - (v @ m) / (m @ m) * m
  return (m, m1, proj(m2)) if project_conflicting else (m, proj(m1), m2)


@pytest.mark.parametrize("project_conflicting", [True, False])
def test_ducc_projects_the_class_it_is_told_to(project_conflicting):
  online = np.stack([_unit([1, 0.2, 0, 0.1]), _unit([0.8, -0.1, 0.3, 0])])
  delayed = np.stack([_unit([0.9, 0.5, 0, 0]), _unit([0.2, 1, 0.4, 0]),
                      _unit([-1, 0.3, 0.2, 0]), _unit([-0.5, -0.5, 1, 0.2])])
  want = _reference(online, delayed, project_conflicting)
  for flag in (project_conflicting, jnp.float32(project_conflicting)):  # static or traced
    got = pafed.ducc(online, delayed)
    sums = pafed.ducc_init(jnp.zeros(4))
    sums = pafed.ducc_add(sums, online, jnp.ones(2, bool), jnp.zeros(2, bool))
    sums = pafed.ducc_add(sums, delayed, jnp.zeros(4, bool), jnp.ones(4, bool))
    got = pafed.ducc_result(sums, 0.0, flag)
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g), w, atol=1e-6)


def test_eq17_alpha_decays_by_gamma_per_round():
  online = np.stack([_unit([1, 0.2, 0]), _unit([0.7, 0.1, 0.2])])
  delayed = np.stack([_unit([0.3, 1, 0]), _unit([-1, 0.2, 0.1])])
  m, m1, m2 = _reference(online, delayed, True)
  alphas = dict(alpha0=0.8, alpha1=0.4, alpha2=0.2)
  server = pafed.make_streamed_server()
  sums = server.init(jnp.zeros(3), ())
  rows = lambda on, de: base.Arrivals(valid=jnp.asarray(on | de), online=jnp.asarray(on),
                                      delayed=jnp.asarray(de), staleness=None,
                                      num_examples=None, num_steps=None, start_params=None)
  hp = base.with_defaults(pafed.ALGORITHM, {"ducc_project_conflicting": 1.0})
  sums = server.add(sums, online, rows(np.ones(2, bool), np.zeros(2, bool)), hp)
  sums = server.add(sums, delayed, rows(np.zeros(2, bool), np.ones(2, bool)), hp)
  w = np.array([0.5, -1.0, 2.0])
  arr = rows(np.array([True, True, False, False]), np.array([False, False, True, True]))
  step = 0.8 * m + 0.4 * m1 + 0.2 * m2  # Eq. 17
  for gamma, t in ((1.0, 7), (0.5, 3), (0.9, 0)):
    new_w, _, _ = server.finish(jnp.asarray(w), None, sums, arr, t,
                                dict(hp, **alphas, alpha_decay=gamma))
    np.testing.assert_allclose(np.asarray(new_w), w + gamma ** t * step, atol=1e-6)


# --------------------------------------------------------------- dropped updates

def test_a_dropped_update_trains_its_client_only_with_train_dropped():
  # Every delayed update is 3 rounds late and the ring keeps 2 models: all are dropped. In
  # 4 rounds only round 0's delayed clients arrive (in round 3, dropped), and none is
  # sampled again (free from round 4), so their duals touch no later upload.
  kw = dict(algorithm="fedadmm", dataset="synthetic", num_clients=10, participation=0.5,
            rounds=4, local_epochs=1, batch_size=10, quiet=True, seed=1,
            delay_fraction=0.4, delay_distribution="fixed", max_delay=3, buffer_size=2)
  tl = timeline_lib.build(10, 4, 0.5, timeline_lib.DelayConfig(0.4, "fixed", 3, 2.0, 2, True),
                          seed=1)
  assert tl.dropped.sum() > 0 and not (tl.valid & ~tl.online).any()
  lost_clients = set(tl.client[tl.lost].tolist())
  assert lost_clients
  runs = {flag: fa.simulate(train_dropped=flag, **kw).runs["fedadmm"] for flag in (False, True)}
  # the server never sees a lost upload: the same global models
  np.testing.assert_allclose(np.asarray(runs[True].state.w), np.asarray(runs[False].state.w),
                             atol=1e-6)
  trained = {flag: {c for c in range(10)
                    if np.any(np.asarray(r.state.client_state["dual"][c]) != 0)}
             for flag, r in runs.items()}
  # each dropped client's dual moves only when it trains (train_dropped)
  assert lost_clients <= trained[True]
  assert not lost_clients & trained[False]


# ------------------------------------------------------------ authors' code options

def test_cnn_fedadmm_is_model1_of_the_authors_code():
  model = models.get_model("cnn_fedadmm", 10, (28, 28, 1))
  assert models.count_params(model, (28, 28, 1)) == 1_663_370  # Table II's CNN
  x = jax.random.uniform(jax.random.PRNGKey(0), (3, 28, 28, 1))
  params = models.init_params(model, (28, 28, 1), jax.random.PRNGKey(1))
  got = np.asarray(model.apply({"params": params}, x))
  # Model1 with lax's convolution: conv, pool, conv, pool (no ReLU), Dense, ReLU, Dense,
  # softmax.
  leaves = {k: v for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  p = {"/".join(str(getattr(e, "key", e)) for e in k): np.asarray(v) for k, v in leaves.items()}
  conv = lambda h, name: jax.lax.conv_general_dilated(
      h, p[f"{name}/kernel"], (1, 1), "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC")) + p[f"{name}/bias"]
  pool = lambda h: jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1),
                                         (1, 2, 2, 1), "VALID")
  h = pool(conv(pool(conv(x, "conv1")), "conv2")).reshape(3, -1)
  h = np.maximum(h @ p["fc1/kernel"] + p["fc1/bias"], 0)
  logits = h @ p["fc2/kernel"] + p["fc2/bias"]
  want = np.exp(logits - logits.max(1, keepdims=True))
  want /= want.sum(1, keepdims=True)
  np.testing.assert_allclose(got, want, atol=2e-5)
  np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)


def test_fedadmm_normalisation_and_its_refusals():
  x = np.array([[0.0, 0.1307, 1.0]], np.float32)
  np.testing.assert_allclose(loader.normalized(x, "fedadmm"),
                             [[-0.1307 / 0.3081, 0.0, 0.8693 / 0.3081]], rtol=1e-6)
  assert loader.normalized(x, "none") is x
  with pytest.raises(ValueError, match="data.normalize=fedadmm: normalises image inputs"):
    loader.load("synthetic", normalize="fedadmm")
  with pytest.raises(ValueError, match="data.normalize: unknown normalisation 'z'"):
    loader.load("synthetic", normalize="z")
  for bad, msg in (({"alpha_decay": 0.0}, "algorithm.alpha_decay: must be in"),
                   ({"ducc_projection": "both"}, "algorithm.ducc_projection: must be")):
    with pytest.raises(config_lib.ConfigError, match=msg):
      config_lib.validate(fa.RunConfig().replace(**bad))


# ------------------------------------------------------------------- flag files

@pytest.mark.skipif(not os.path.isfile(FMNIST), reason="Fashion-MNIST IDX files absent "
                    "(apt-get install dataset-fashion-mnist)")
@pytest.mark.parametrize("name", ["paper", "authors"])
def test_table_v_flag_files_run(name, tmp_path):
  # Each flag file for 2 rounds on small data: 10 clients, 2 local steps, 200 test
  # examples, the MLP instead of the CNN (the flag file's model is built and checked by
  # the flag parsing either way), one partition and delta.
  args = [f"--flagfile=experiments/flags/pafed_table_{name}.flags", "--rounds=2",
          "--num_clients=10", "--participation=0.3", "--local_steps=2", "--num_seeds=1",
          "--algorithm=pafed",
          "--test_subset=200", "--model=mlp", "--partitions=shards", "--deltas=0.7",
          "--checkpoint_every=0", f"--output_dir={tmp_path}"]
  if name == "authors":
    args.append("--server_lr_switch_round=1")
  out = subprocess.run([sys.executable, TABLE] + args, env=run_script.env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  table = json.load(open(tmp_path / "table.json"))
  stored = table["run_config"]
  if name == "authors":
    assert (stored["normalize"], stored["random_local_epochs"], stored["server_lr2"],
            stored["mu"], stored["delay"]["max_delay"]) == ("fedadmm", True, 0.5, 0.1, 4)
  else:
    assert (stored["normalize"], stored["random_local_epochs"], stored["mu"],
            stored["delay"]["max_delay"]) == ("none", False, 0.01, 3)
  summary = json.load(open(tmp_path / "shards/runs/pafed/delay_fraction=0.7_seed=0/summary.json"))
  assert set(metrics.KEYS) <= set(summary)
  md = (tmp_path / "table.md").read_text()
  # T = 2: PAFed's last-10 and average best cells marked, the note under the tables
  assert md.count(metrics.SHORT_RUN_MARK) == 3 and metrics.SHORT_RUN_NOTE in md
