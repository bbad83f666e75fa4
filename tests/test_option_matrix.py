"""Every round rule x server optimiser, over the engine's execution options, ends at the
model of the plain run (one vmap over the round's clients, one device, one round per call).

The execution options change how a round is computed, never what it computes:
``client_chunk`` (None: one vmap; 1; a non-divisor of K; K), ``rounds_per_call`` (1, 3),
devices (1, 2 forced host devices) and delays (on, off; the plain run has the same
timeline), with the options of what is computed (client weighting, local gradient clipping,
dropping non-finite uploads; DP-FedAvg's noise, drawn from the seed and round) set alike in
a case and its plain run. The rules and optimisers are read from the registries (``algorithms.names``,
``server_optimizers.SERVER_OPTIMIZERS``), with a user-registered rule that has no streamed
server (its chunked path stacks the ``[K, d]`` uploads), so a new one joins the matrix by
being registered. Each rule x optimiser pair runs once; the other options are a pairwise
covering set over the pairs (every value pair of any two options in some case), chosen
greedily, so that each pair of options is exercised together at least once.

JAX fixes its device count at start-up: the runs happen in one subprocess with
``--xla_force_host_platform_device_count=2``, which prints one JSON line per case.
Tolerance: float32, 3 rounds of 6 of 12 clients; sums over clients in another order
differ by ~1e-7 relative, which an adaptive optimiser's 1 / (sqrt(v) + tau) can enlarge
at coordinates where v is tiny: |w - w_plain| <= 1e-4 (1 + |w_plain|).
"""

import functools
import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
  import dataclasses, itertools, json, sys
  import jax, jax.numpy as jnp, numpy as np
  import fedjax_async as fa
  from fedjax_async import algorithms, config, sharding
  from fedjax_async.algorithms import base, server_optimizers as so
  from fedjax_async.core import client as client_lib, timeline as timeline_lib
  from fedjax_async.rounds import engine

  # A user's round rule without a streamed server: half the uniform mean of the deltas.
  def half_mean(w, server_state, uploads, arrivals, round_index, hp):
    p = arrivals.valid.astype(jnp.float32)
    step = jnp.einsum("k,kd->d", p, uploads) / jnp.maximum(jnp.sum(p), 1.0)
    return w + 0.5 * base.server_lr(hp, round_index) * step, server_state, {}
  algorithms.register(base.Algorithm(
      name="user_half_mean", local_penalty=base.no_penalty,
      client_final=base.delta_upload, server_update=half_mean), replace=True)

  N, M, D, C, ROUNDS = 12, 16, 5, 3, 3
  def apply_flat(w, xb, train=False, rng=None):
    return xb @ w[:D * C].reshape(D, C) + w[D * C:]
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, M, D)).astype(np.float32)
  y = rng.integers(0, C, (N, M)).astype(np.int32)
  counts = rng.integers(4, M + 1, N).astype(np.int32)
  tx = rng.normal(size=(24, D)).astype(np.float32)
  ty = rng.integers(0, C, 24).astype(np.int32)
  data = engine.DeviceData(*map(jnp.asarray, (x, y, counts, tx, ty)))
  w0 = rng.normal(scale=0.1, size=D * C + C).astype(np.float32)
  timelines = {d: timeline_lib.build(N, ROUNDS, 0.5, timeline_lib.DelayConfig(
      0.4 if d else 0.0, "uniform", 2), seed=3) for d in (True, False)}
  mesh = sharding.client_mesh(jax.devices()[:2])

  def run(rule, opt, chunk, rpc, devices, delays, weighting, clip, drop):
    local = client_lib.LocalConfig(2, 4, M, grad_clip=clip)
    cfg = config.RunConfig().replace(client_weighting=weighting, algorithm=rule,
                                     server_optimizer=opt, server_lr=(
        1.0 if opt == "sgd" else 0.05), rho=0.3, mu=0.1, alpha0=0.5, alpha1=0.4, alpha2=0.3,
        participation=0.5, dp_update_clip=0.5, dp_noise_multiplier=0.5)  # DP-FedAvg's noise on
    alg = so.configured(algorithms.get(rule), cfg.algorithm)
    hp = cfg.hparams(alg, N)
    tl = timelines[delays]
    ecfg = engine.EngineConfig(local, ring_size=3, eval_batch=24, client_chunk=chunk,
                               drop_nonfinite=drop)
    state = engine.init_state(alg, w0, N, 3, 0)
    d = data
    if devices > 1:
      ecfg = dataclasses.replace(ecfg, client_sharding=sharding.client_sharding(mesh))
      tl = sharding.pad_timeline(tl, mesh.size)
      d, state = sharding.replicate(data, mesh), sharding.replicate(state, mesh)
    runner = engine.make_runner(apply_flat, alg, ecfg)
    state, _ = engine.run_rounds(runner, state, tl, hp, d, rounds_per_call=rpc)
    return np.asarray(state.w)

  from test_option_matrix import covering_cases
  rules = list(algorithms.names("rounds"))
  cases = covering_cases(rules, list(so.SERVER_OPTIMIZERS))
  print("SETUP " + json.dumps({"devices": len(jax.devices()), "rules": rules,
                               "optimizers": list(so.SERVER_OPTIMIZERS), "cases": cases}),
        flush=True)
  for case in cases:
    rule, opt, chunk, rpc, devices, delays, *semantic = case
    try:
      got = run(rule, opt, chunk, rpc, devices, delays, *semantic)
      want = run(rule, opt, None, 1, 1, delays, *semantic)
      out = {"case": case, "got": got.tolist(), "want": want.tolist()}
    except Exception as e:  # reported per case
      out = {"case": case, "error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(out), flush=True)
""")

K = 6  # 12 clients x participation 0.5
OPTIONS = {  # the execution options and their values; the first of each is the plain run's
    "client_chunk": (None, 1, 4, K),
    "rounds_per_call": (1, 3),
    "devices": (1, 2),
    "delays": (True, False),
    # options of what is computed, the same in a case and its plain run
    "client_weighting": ("auto", "examples", "uniform"),
    "client_grad_clip": (0.0, 1.0),
    "drop_nonfinite_uploads": (False, True),
}


def covering_cases(rules, optimizers):
  """(rule, optimiser, chunk, rounds_per_call, devices, delays, weighting, clip, drop)
  cases: every rule x optimiser pair once, and every value pair of any two dimensions in
  some case (greedy pairwise cover). No case is run the plain way."""
  dims = [rules, optimizers] + [list(v) for v in OPTIONS.values()]
  needed = {(i, a, j, b) for i, j in itertools.combinations(range(len(dims)), 2)
            for a in dims[i] for b in dims[j]}
  plain = tuple(v[0] for v in OPTIONS.values())

  def pairs(case):
    return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}

  cases = []
  rest = [c for c in itertools.product(*dims[2:]) if c[:3] != plain[:3]]
  for rule, opt in itertools.product(rules, optimizers):
    best = max(rest, key=lambda c: len(pairs((rule, opt) + c) & needed))
    cases.append((rule, opt) + best)
    needed -= pairs(cases[-1])
  while needed:
    best = max(itertools.product(*dims), key=lambda c: len(pairs(c) & needed)
               if c[2:5] != plain[:3] else -1)
    cases.append(best)
    needed -= pairs(best)
  return cases


@functools.lru_cache(maxsize=None)
def matrix_results():
  """The child's set-up (devices, the registered rules and optimisers, the cases) and one
  result per case."""
  env = dict(run_script.env(), PYTHONPATH=f"{ROOT}{os.pathsep}{os.path.join(ROOT, 'tests')}",
             XLA_FLAGS=run_script.xla_flags("--xla_force_host_platform_device_count=2"))
  proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, text=True,
                        capture_output=True, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = proc.stdout.splitlines()
  setup = json.loads([l for l in lines if l.startswith("SETUP ")][0].split(" ", 1)[1])
  results = [json.loads(l.split(" ", 1)[1]) for l in lines if l.startswith("RESULT ")]
  return setup, results


def test_covering_set_covers_every_pair_and_every_rule_optimizer():
  rules = ["fedavg", "pafed", "mine"]
  optimizers = ["sgd", "adam"]
  cases = covering_cases(rules, optimizers)
  dims = [rules, optimizers] + [list(v) for v in OPTIONS.values()]
  assert {(c[0], c[1]) for c in cases} == set(itertools.product(rules, optimizers))
  for i, j in itertools.combinations(range(len(dims)), 2):
    assert {(c[i], c[j]) for c in cases} == set(itertools.product(dims[i], dims[j]))
  plain = tuple(v[0] for v in OPTIONS.values())
  assert all(c[2:5] != plain[:3] for c in cases)


@pytest.mark.xdist_group("option_matrix")
def test_every_rule_and_optimizer_gives_the_plain_model_under_every_option():
  setup, results = matrix_results()
  assert setup["devices"] == 2
  # the registries' every rule (the user's one included) and optimiser
  assert {"fedavg", "fedprox", "fednova", "fedadmm", "pafed", "dp_fedavg",
          "user_half_mean"} <= set(setup["rules"])
  assert {"sgd", "momentum", "adam", "yogi", "adagrad"} <= set(setup["optimizers"])
  assert {(r["case"][0], r["case"][1]) for r in results} == set(
      itertools.product(setup["rules"], setup["optimizers"]))
  cases = setup["cases"]
  assert len(results) == len(cases)
  failures = []
  for case, r in zip(cases, results):
    if "error" in r:
      failures.append(f"{case}: {r['error']}")
      continue
    got, want = np.asarray(r["got"]), np.asarray(r["want"])
    err = np.max(np.abs(got - want) / (1.0 + np.abs(want)))
    if not np.all(np.isfinite(got)) or err > 1e-4:
      failures.append(f"{case}: max relative difference {err:.3g}")
  assert not failures, f"{len(failures)} of {len(cases)} cases differ:\n" + "\n".join(
      failures)


# ------------------------------------------------------------------ the virtual clock


def _clock_algorithms():
  from fedjax_async import algorithms
  return algorithms.names_on("virtual_clock")


def _run_clock(name, group_size, groups_per_call):
  """``name`` on the batched virtual clock (test_async's tiny logistic regression and
  clients), the clock's own hyper-parameters (FedAsync's a = 0.6, hinge staleness)."""
  from fedjax_async import algorithms
  from fedjax_async.asynchronous import config as async_config
  from fedjax_async.asynchronous import engine as async_engine
  from fedjax_async.asynchronous import experiment as async_experiment
  from fedjax_async.asynchronous import virtual_clock as vc
  import test_async as ta
  data = ta.tiny_data(2)
  alg = algorithms.get(name)
  hp = async_experiment.hparams(async_config.AsyncRunConfig(), 0.6, alg)
  clock = vc.ClockConfig(concurrency=4, num_updates=12, buffer_k=3 if alg.buffered else 1,
                         epochs=ta.LOCAL.max_epochs, compute=vc.Distribution(
                             "uniform", 0.5, 2.0))
  schedule = vc.draw_schedule(clock, np.asarray(data.counts), seed=2)
  cfg = async_engine.AsyncConfig(ta.LOCAL, schedule.ring_size, group_size)
  groups = async_engine.group_arrays(schedule, group_size)
  state = async_engine.init_state(alg, ta.W0, cfg.ring_size, seed=0)
  runner = async_engine.make_runner(ta.logreg_apply, alg, cfg)
  state, _ = async_engine.run_arrivals(
      runner, state, schedule, groups, hp, data, async_engine.full_masks(ta.W0),
      np.zeros(ta.N_CLIENTS), eval_every=100, groups_per_call=groups_per_call)
  return np.asarray(state.w)


# (group size G, groups per call): a non-divisor of the concurrency 4 and all of it, one
# group a call and several; each algorithm takes the next, so that every pair is run.
CLOCK_BATCHING = ((3, 1), (4, 5), (3, 5), (4, 1))


@pytest.mark.parametrize("index,name", list(enumerate(_clock_algorithms())))
def test_every_clock_algorithm_gives_the_one_arrival_model_in_groups(index, name):
  """Arrivals trained G at a time, one or several groups per call, end at the model of
  one arrival a call (tolerance: test_async's batched-against-event-loop one)."""
  import test_async as ta
  want = _run_clock(name, 1, 1)
  group_size, groups_per_call = CLOCK_BATCHING[index % len(CLOCK_BATCHING)]
  got = _run_clock(name, group_size, groups_per_call)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=(
      f"{name}, group_size {group_size}, groups_per_call {groups_per_call}"))
  assert not np.allclose(want, np.asarray(ta.W0))
