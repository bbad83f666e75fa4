"""Every registered algorithm on every engine it declares, against the contract of
``algorithms/base.py``: its functions (shapes, state carried unchanged in structure, padding
ignored, the streamed rule equal to the whole-round one, a separable penalty summed over
pieces, no local progress leaving the model where it is), one round or a few server updates
through ``fedjax_async.simulate`` (one run each, a finite model, the documented row and
summary keys, the same rows for the same seed), and every other engine refusing it by
``algorithm.names``.

The cases are the registry's at collection time: an algorithm added to it is checked
without editing this file.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import algorithms
from fedjax_async import config
from fedjax_async import results
from fedjax_async.algorithms import base
from fedjax_async.asynchronous import config as async_config
from fedjax_async.asynchronous import experiment as async_experiment

# Every engine where an algorithm's rule is meaningful: its own, and the virtual clock for
# a round rule whose clients keep no state (``algorithms.names_on``).
PAIRS = [(n, e) for e in algorithms.ENGINES for n in algorithms.names_on(e)]
REFUSED = [(n, e) for n in algorithms.names() for e in algorithms.ENGINES
           if n not in algorithms.names_on(e)]
pytestmark = pytest.mark.xdist_group("algorithm_contract")  # one worker: the runs are shared

# The keys docs/experiments.md ("metrics.jsonl") and fedjax_async/results.py document.
ROW_KEYS = {
    "rounds": {"round", "online", "delayed", "dropped", "mean_staleness", "max_staleness",
               "train_loss", "client_steps", "nonfinite", "model_norm", "server_step_norm",
               "test_accuracy", "test_loss", "wall_time", "client_loss_max",
               "client_loss_median", "delta_norm_max", "delta_norm_median", "worst_client",
               "worst_client_loss", "client_nonfinite_share", "dropped_nonfinite"},
    "virtual_clock": {"event", "virtual_time", "arrival_version", "train_loss",
                      "test_accuracy", "test_loss", "wall_time"},
}
SUMMARY_KEYS = {"final_accuracy", "best_accuracy", "last10_mean_accuracy",
                "average_best_accuracy"}
# Tiny runs: one round of 6 clients; 3 server updates of 6 clients, 2 in flight.
ROUNDS = dict(num_clients=6, rounds=1, local_steps=2, quiet=True)
NUM_UPDATES = 3
CLOCK = dict(num_clients=6, concurrency=2, num_updates=NUM_UPDATES, buffer_k=2,
             local_steps=2, group_size=1, groups_per_call=8, eval_every=1)
D, K = 7, 3


def hparams(name, engine=None):
  """The hp dict ``engine`` (default: the algorithm's own) gives its functions."""
  alg = algorithms.get(name)
  if (engine or alg.engine) == "rounds":
    return config.RunConfig().hparams(alg)
  return async_experiment.hparams(async_config.AsyncRunConfig(), 0.6, alg)


def simulate(names, engine):
  if engine == "rounds":
    return fa.simulate(algorithm=list(names), **ROUNDS)
  return fa.simulate(async_config.AsyncRunConfig(), algorithm=",".join(names), **CLOCK)


@pytest.fixture(scope="module")
def runs():
  """engine -> two results of the same call (every algorithm of that engine in one call),
  made when first asked for."""
  made = {}

  def get(engine):
    if engine not in made:
      made[engine] = [simulate(algorithms.names_on(engine), engine) for _ in range(2)]
    return made[engine]

  return get


def vector(seed, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).normal(size=D), jnp.float32)


def arrivals(w, staleness, num_examples=(12., 30., 7.), valid=(True, True, True)):
  valid, staleness = np.asarray(valid), np.asarray(staleness, np.int32)
  return base.Arrivals(
      valid=jnp.asarray(valid), online=jnp.asarray(valid & (staleness == 0)),
      delayed=jnp.asarray(valid & (staleness > 0)), staleness=jnp.asarray(staleness),
      num_examples=jnp.asarray(num_examples, jnp.float32),
      num_steps=jnp.full(len(valid), 4.0, jnp.float32),
      start_params=jnp.stack([w + (0.0 if s == 0 else 0.1 * s) * vector(40 + s)
                              for s in staleness]),
      num_clients=jnp.full(len(valid), 10.0, jnp.float32))


def arrival(w_start, staleness):
  return base.Arrival(valid=jnp.bool_(True), staleness=jnp.int32(staleness),
                      flush=jnp.bool_(True), w_start=w_start, mask=jnp.ones(D, jnp.float32),
                      num_examples=jnp.float32(12.0), num_steps=jnp.float32(4.0))


def same_structure(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  assert [np.shape(x) for x in jax.tree.leaves(a)] == [np.shape(x) for x in jax.tree.leaves(b)]


def client_view(alg, w):
  """A fresh client's state with the server state it reads (``client_reads_server``)."""
  return {**alg.init_client_state(w), **base.server_reads(alg, alg.init_server_state(w))}


def client_outputs(alg, hp, w, ends):
  """Each client's ``ClientOutput`` after training from ``w`` to ``ends[k]``, fresh."""
  return [alg.client_final(w, e, client_view(alg, w), jnp.float32(4.0), hp) for e in ends]


def client_uploads(alg, hp, w, ends):
  """Each client's upload after training from ``w`` to ``ends[k]`` with a fresh state."""
  return jnp.stack([out.upload for out in client_outputs(alg, hp, w, ends)])


def with_corrections(alg, hp, w, ends, rows):
  """``rows`` with the clients' corrections (``ClientOutput.correction``), if any."""
  outs = client_outputs(alg, hp, w, ends)
  if not jax.tree.leaves(outs[0].correction):
    return rows
  return rows._replace(correction=jnp.stack([out.correction for out in outs]))


# ----------------------------------------------------------------------- the registry


def test_the_registry_holds_one_algorithm_per_name_on_one_engine():
  every = algorithms.names()
  assert every and len(set(every)) == len(every)
  by_engine = [algorithms.names(e) for e in algorithms.ENGINES]
  assert sorted(sum(by_engine, ())) == sorted(every)  # each name on exactly one engine
  for name in every:
    alg, engine = algorithms.get(name), algorithms.engine_of(name)
    assert isinstance(alg, base.Algorithm) and alg.name == name
    assert alg.engine == engine and name in algorithms.names(engine)
    assert name in algorithms.names_on(engine)
    names = [h.name for h in alg.hparams]
    assert len(set(names)) == len(names) and all(k.isidentifier() for k in names), name
    assert all(h.check(h.default) is None and h.help for h in alg.hparams), name


@pytest.mark.parametrize("name,engine", PAIRS)
def test_the_functions_take_and_give_the_documented_shapes(name, engine):
  alg, hp = algorithms.get(name), hparams(name, engine)
  w0 = vector(0)
  state = alg.init_client_state(w0)
  assert sorted(state) == sorted(alg.client_state_keys), name
  assert all(np.shape(v) == (D,) for v in state.values())
  w = w0 + vector(1, 0.1)
  view = client_view(alg, w0)
  penalty, grad = jax.value_and_grad(alg.local_penalty)(w, w0, view, hp)
  assert np.shape(penalty) == () and np.isfinite(penalty) and np.all(np.isfinite(grad))
  out = alg.client_final(w0, w, view, jnp.float32(4.0), hp)
  assert np.shape(out.upload) == (D,) and np.all(np.isfinite(out.upload))
  same_structure(out.state, state)
  server_state = alg.init_server_state(w0)
  if alg.server_update is not None:
    ends = [w0 + vector(k, 0.1) for k in range(K)]
    new_w, new_state, metrics = alg.server_update(
        w0, server_state, client_uploads(alg, hp, w0, ends),
        with_corrections(alg, hp, w0, ends, arrivals(w0, (0, 2, 0))), jnp.int32(0), hp)
    assert isinstance(metrics, dict) and all(np.shape(v) == () for v in metrics.values())
  else:
    new_w, new_state = alg.server_step(w0, server_state, out.upload, arrival(w0, 2), hp)
  assert np.shape(new_w) == (D,) and np.all(np.isfinite(new_w))
  assert not np.allclose(new_w, w0)  # a client's progress moves the model
  same_structure(new_state, server_state)  # carried through the engines' scans


@pytest.mark.parametrize("name,engine", PAIRS)
def test_jitted_functions_give_the_same_model_twice_and_as_run_eagerly(name, engine):
  alg, hp = algorithms.get(name), hparams(name, engine)
  w0 = vector(0)
  ends = [w0 + vector(k, 0.1) for k in range(K)]
  if alg.server_update is not None:
    args = (w0, alg.init_server_state(w0), client_uploads(alg, hp, w0, ends),
            with_corrections(alg, hp, w0, ends, arrivals(w0, (0, 1, 0))), jnp.int32(0), hp)
    step = lambda *a: alg.server_update(*a)[0]
  else:
    args = (w0, alg.init_server_state(w0), client_uploads(alg, hp, w0, ends)[0],
            arrival(w0, 1), hp)
    step = lambda *a: alg.server_step(*a)[0]
  jitted = jax.jit(step)
  first, second = jitted(*args), jitted(*args)
  np.testing.assert_array_equal(first, second)
  np.testing.assert_allclose(first, step(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,engine", PAIRS)
def test_no_local_progress_leaves_the_model_where_it_is(name, engine):
  """Every client's model ends where it started (a zero local learning rate), every past
  model equals the current one: the server rule has nothing to move the model by, fresh or
  stale arrivals alike."""
  alg, hp = algorithms.get(name), hparams(name, engine)
  w = vector(0)
  upload = client_uploads(alg, hp, w, [w])[0]
  if alg.server_update is not None:
    stay = with_corrections(alg, hp, w, [w] * K, arrivals(w, (0, 2, 0))._replace(
        start_params=jnp.tile(w, (K, 1))))
    new_w, _, _ = alg.server_update(w, alg.init_server_state(w), jnp.tile(upload, (K, 1)),
                                    stay, jnp.int32(0), hp)
    np.testing.assert_allclose(new_w, w, rtol=0, atol=1e-6)
  else:
    for staleness in (0, 2):
      new_w, _ = alg.server_step(w, alg.init_server_state(w), upload, arrival(w, staleness),
                                 hp)
      np.testing.assert_allclose(new_w, w, rtol=0, atol=1e-6)


ROUND_RULES = [(n, e) for n, e in PAIRS if algorithms.get(n).server_update is not None]


@pytest.mark.parametrize("name,engine", ROUND_RULES)
def test_padding_slots_change_nothing(name, engine):
  """The round engine pads each round to K slots (``Arrivals.valid`` False): whatever
  those slots hold, the round's model, server state and metrics are those of its real
  arrivals."""
  alg, hp = algorithms.get(name), hparams(name, engine)
  w0 = vector(0)
  ends = [w0 + vector(k, 0.1) for k in range(K)]
  real = client_uploads(alg, hp, w0, ends)
  rows = with_corrections(alg, hp, w0, ends, arrivals(w0, (0, 2, 0)))
  server_state = alg.init_server_state(w0)
  want = alg.server_update(w0, server_state, real, rows, jnp.int32(0), hp)
  junk = 1e3 * jnp.stack([vector(7), vector(8)])
  padded_rows = arrivals(w0, (0, 2, 0, 0, 1), num_examples=(12., 30., 7., 50., 60.),
                         valid=(True, True, True, False, False))
  padded_rows = padded_rows._replace(
      start_params=padded_rows.start_params.at[3:].set(junk),
      correction=None if rows.correction is None else jnp.concatenate([rows.correction,
                                                                       junk]))
  got = alg.server_update(w0, server_state, jnp.concatenate([real, junk]), padded_rows,
                          jnp.int32(0), hp)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


STREAMED = [(n, e) for n, e in PAIRS if algorithms.get(n).streamed_server is not None]


@pytest.mark.parametrize("name,engine", STREAMED)
def test_a_streamed_rule_folded_in_chunks_is_its_server_update(name, engine):
  """``server_update`` must be the streamed rule's (base.py): the uploads folded in two
  chunks (``start_params`` None, the online rows first) give the one-call round."""
  alg, hp = algorithms.get(name), hparams(name, engine)
  rule = alg.streamed_server
  w0 = vector(0)
  ends = [w0 + vector(k, 0.1) for k in range(4)]
  uploads = client_uploads(alg, hp, w0, ends)
  rows = with_corrections(alg, hp, w0, ends, arrivals(
      w0, (0, 0, 1, 3), num_examples=(12., 30., 7., 20.), valid=(True,) * 4))
  server_state = alg.init_server_state(w0)
  want = alg.server_update(w0, server_state, uploads, rows, jnp.int32(0), hp)
  carry = rule.init(w0, server_state)
  for part in (slice(0, 2), slice(2, 4)):
    chunk = jax.tree.map(lambda a, p=part: a[p], rows._replace(start_params=None))
    carry = rule.add(carry, uploads[part], chunk, hp)
  got = rule.finish(w0, server_state, carry, rows._replace(correction=None), jnp.int32(0),
                    hp)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


SEPARABLE = [(n, e) for n, e in PAIRS if algorithms.get(n).separable_penalty]


@pytest.mark.parametrize("name,engine", SEPARABLE)
def test_a_separable_penalty_is_the_sum_over_pieces(name, engine):
  alg, hp = algorithms.get(name), hparams(name, engine)
  w0, w = vector(0), vector(1)
  state = {k: vector(10 + i) for i, k in enumerate(sorted(client_view(alg, w0)))}
  whole = alg.local_penalty(w, w0, state, hp)
  pieces = sum(alg.local_penalty(w[p], w0[p], {k: v[p] for k, v in state.items()}, hp)
               for p in (slice(0, 3), slice(3, D)))
  np.testing.assert_allclose(pieces, whole, rtol=1e-5)


# ------------------------------------------------------------------ the public entry


@pytest.mark.parametrize("name,engine", PAIRS)
def test_the_public_entry_runs_it_with_the_documented_result(runs, name, engine):
  result = runs(engine)[0]
  assert isinstance(result, results.Result)
  mine = [k for k, r in result.runs.items() if r.summary["algorithm"] == name]
  assert mine == [name], list(result.runs)  # one run, named by the algorithm
  run = result.runs[name]
  w = np.asarray(run.state.w)
  assert w.shape == (np.size(run.model[1]),) and np.all(np.isfinite(w))
  assert not np.array_equal(w, np.ravel(run.model[1]))  # it trained
  assert run.rows and all(ROW_KEYS[engine] <= set(r) for r in run.rows), run.rows[0]
  for r in run.rows:
    for k, v in r.items():
      if isinstance(v, float):
        assert np.isfinite(v), (k, r)
  evaluated = [r["test_accuracy"] for r in run.rows if r["test_accuracy"] is not None]
  s = run.summary
  assert SUMMARY_KEYS <= set(s), sorted(s)
  assert evaluated and s["final_accuracy"] == evaluated[-1]
  assert s["best_accuracy"] == max(evaluated) >= s["final_accuracy"]
  assert 0 <= min(evaluated) and s["best_accuracy"] <= 1
  assert min(evaluated) <= s["last10_mean_accuracy"] <= max(evaluated)
  if engine == "rounds":
    assert [r["round"] for r in run.rows] == [1]  # the model after round 1
  else:
    assert s["server_updates"] == NUM_UPDATES
    assert run.rows[-1]["arrival_version"] == NUM_UPDATES - 1  # the version it met
    events = [r["event"] for r in run.rows]
    times = [r["virtual_time"] for r in run.rows]
    assert events == sorted(set(events)) and times == sorted(times)


@pytest.mark.parametrize("name,engine", PAIRS)
def test_the_same_seed_gives_the_same_rows_and_model(runs, name, engine):
  first, second = (r.runs[name] for r in runs(engine))
  strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]
  assert strip(first.rows) == strip(second.rows)
  np.testing.assert_array_equal(first.state.w, second.state.w)


def test_an_algorithms_own_hyperparameter_reaches_it_on_the_virtual_clock():
  """base.Algorithm.hparams: the declared default reaches the functions in ``hp``, and
  ``hp={...}`` sets it: gamma = 0 (FedAsync's mixing weight) leaves the model at w0."""
  fedasync = algorithms.get("fedasync")

  def server_step(w, server_state, upload, one, hp):
    return fedasync.server_step(w, server_state, upload, one, dict(hp, mix_alpha=hp["gamma"]))

  own = base.Algorithm(name="contract_own_hp", local_penalty=fedasync.local_penalty,
                       client_final=fedasync.client_final, server_step=server_step,
                       init_server_state=fedasync.init_server_state,
                       hparams=(base.HParam("gamma", 0.5),))
  algorithms.register(own, replace=True)
  try:
    run = simulate([own.name], "virtual_clock").runs[own.name]
    still = fa.simulate(async_config.AsyncRunConfig(), algorithm=own.name, hp={"gamma": 0.0},
                        **CLOCK).runs[own.name]
  finally:
    algorithms._REGISTERED.pop(own.name)  # pylint: disable=protected-access
  assert np.all(np.isfinite(np.asarray(run.state.w)))
  assert not np.array_equal(np.asarray(run.state.w), np.asarray(run.model[1]))
  np.testing.assert_array_equal(np.asarray(still.state.w), np.asarray(still.model[1]))


def test_hparams_take_hparam_objects_only_and_say_how_to_write_them():
  """``hparams`` holds ``HParam``s, as given (nothing converted): a ``(name, default)``
  pair, a name, or a list in place of the tuple is one TypeError naming the algorithm and
  what to write."""
  fedavg = algorithms.get("fedavg")
  parts = dict(local_penalty=fedavg.local_penalty, client_final=fedavg.client_final,
               server_update=fedavg.server_update)
  beta = base.HParam("beta", 1.0)
  own = base.Algorithm(name="x", hparams=(beta,), **parts)
  assert own.hparams == (beta,) and own.hparams[0] is beta
  for hparams, message in (
      ((("beta", 1.0),), "algorithm 'x': hparams item ('beta', 1.0) is not an HParam: "
       "write base.HParam('beta', 1.0)"),
      ((beta, "mu"), "algorithm 'x': hparams item 'mu' is not an HParam: write "
       "base.HParam(name, default)"),
      ([beta], "algorithm 'x': hparams is a list, not a tuple: write "
       "hparams=(base.HParam(name, default), ...)")):
    with pytest.raises(TypeError) as e:
      base.Algorithm(name="x", hparams=hparams, **parts)
    assert str(e.value) == message


@pytest.mark.parametrize("name,engine", REFUSED)
def test_an_engine_it_does_not_declare_refuses_it_by_name(name, engine):
  # the engine's own configuration given (without one, a name only the virtual clock runs
  # picks the virtual clock: tests/test_engine_choice.py)
  with pytest.raises(config.ConfigError) as e:
    if engine == "rounds":
      fa.simulate(config.RunConfig(), algorithm=[name], **ROUNDS)
    else:
      simulate([name], engine)
  assert e.value.path == "algorithm.names" and repr(name) in e.value.message
