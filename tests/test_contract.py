"""One algorithm contract for both engines: toy rules written here, outside the package,
against ``algorithms/base.py``: a round rule runs on the round engine and (as rounds of
one arrival) on the virtual clock, a per-arrival rule on the virtual clock, each checked
against a plain loop."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async import algorithms
from fedjax_async.asynchronous import engine as async_engine
from fedjax_async.rounds import engine
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.asynchronous import virtual_clock as vc
from fedjax_async.algorithms import base
import test_async
import test_engine


def toy_client_final(w_start, w_end, client_state, num_steps, hp):
  del num_steps, hp
  return base.ClientOutput(upload=w_end - w_start, state=client_state)


def toy_server_update(w, server_state, uploads, arrivals, round_index, hp):
  """w + eta * (the arrivals' deltas averaged with weights n_i)."""
  del round_index
  n = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
  step = jnp.einsum("k,kd->d", n, uploads) / jnp.maximum(jnp.sum(n), 1e-12)
  return w + hp["server_lr"] * step, server_state, {}


TOY = base.Algorithm(name="toy", local_penalty=lambda w, w_start, cs, hp: jnp.float32(0.0),
                     client_final=toy_client_final, server_update=toy_server_update)


def test_a_toy_algorithm_runs_on_the_round_engine_as_a_plain_loop_computes_it():
  """With eta = 1 the toy is FedAvg: test_engine's numpy loop over rounds and clients."""
  tl = timeline_lib.build(test_engine.N, 6, 0.4, timeline_lib.DelayConfig(0.5, "uniform", 3),
                          seed=3)
  cfg = test_engine.make_cfg(ring=4)
  state = engine.init_state(TOY, test_engine.W0, test_engine.N, cfg.ring_size, 0)
  state, _ = engine.run_rounds(engine.make_runner(test_engine.apply_flat, TOY, cfg), state, tl,
                             test_engine.HP, test_engine.device_data(), rounds_per_call=3)
  assert test_engine.HP["server_lr"] == 1.0
  history = test_engine.reference_run("fedavg", tl, cfg)
  np.testing.assert_allclose(np.asarray(state.w), history[-1], rtol=2e-4, atol=2e-5)


def test_the_same_toy_runs_on_the_virtual_clock_one_arrival_at_a_time():
  """Each arrival applied to the model current at its arrival: w += eta (w_new - w_tau),
  in the event-by-event loop of test_async."""
  data = test_async.tiny_data()
  clock = vc.ClockConfig(concurrency=4, num_updates=20, epochs=test_async.LOCAL.max_epochs,
                         compute=vc.Distribution("uniform", 0.5, 2.0))
  schedule = vc.draw_schedule(clock, np.asarray(data.counts), seed=2)
  assert schedule.staleness.max() >= 2  # stale arrivals: w_tau differs from w
  hp = {"lr": 0.1, "momentum": 0.5, "mu": 0.0, "server_lr": 0.7}
  w, rows, _ = test_async.run_batched(TOY, schedule,
                                      data, hp, 4)

  def rule(w, state, w_new, w_tau, staleness):
    del staleness
    return w + 0.7 * (w_new - w_tau), state, True

  w_ref, versions, _ = test_async.reference_loop(schedule, data, hp, rule, schedule.ring_size)
  assert versions == 20 and len(rows) == 20
  np.testing.assert_allclose(w, w_ref, rtol=2e-5, atol=2e-6)


def toy_server_step(w, server_state, upload, arrival, hp):
  """One arrival: w + eta s (w_new - w_tau), s = 1 / (1 + staleness); counts the arrivals."""
  s = 1.0 / (1.0 + arrival.staleness.astype(jnp.float32))
  return w + hp["server_lr"] * s * upload, server_state + 1


TOY_STEP = base.Algorithm(name="toy_step", local_penalty=base.no_penalty,
                          client_final=base.delta_upload, server_step=toy_server_step,
                          init_server_state=lambda w0: jnp.int32(0))


def test_a_toy_per_arrival_rule_runs_on_the_virtual_clock_as_a_plain_loop_computes_it():
  data = test_async.tiny_data()
  clock = vc.ClockConfig(concurrency=4, num_updates=16, epochs=test_async.LOCAL.max_epochs,
                         compute=vc.Distribution("uniform", 0.5, 2.0))
  schedule = vc.draw_schedule(clock, np.asarray(data.counts), seed=4)
  assert schedule.staleness.max() >= 2
  hp = {"lr": 0.1, "momentum": 0.5, "mu": 0.0, "server_lr": 0.6}
  w, rows, _ = test_async.run_batched(TOY_STEP, schedule, data, hp, 4)

  def rule(w, state, w_new, w_tau, staleness):
    return w + 0.6 / (1.0 + staleness) * (w_new - w_tau), state, True

  w_ref, versions, _ = test_async.reference_loop(schedule, data, hp, rule, schedule.ring_size)
  assert versions == 16 and len(rows) == 16
  np.testing.assert_allclose(w, w_ref, rtol=2e-5, atol=2e-6)


def test_a_rule_of_each_kind_and_the_engines_that_run_it():
  assert TOY.engine == "rounds" and TOY_STEP.engine == "virtual_clock"
  with pytest.raises(ValueError, match="give server_update .* or server_step"):
    base.Algorithm(name="both", local_penalty=base.no_penalty,
                   client_final=base.delta_upload, server_update=toy_server_update,
                   server_step=toy_server_step)
  with pytest.raises(ValueError, match="dp are the virtual clock's client hooks"):
    base.Algorithm(name="dp_rounds", local_penalty=base.no_penalty,
                   client_final=base.delta_upload, server_update=toy_server_update, dp=True)
  with pytest.raises(ValueError, match=r"pafed keeps per-client state \(dual"):
    async_engine.server_rule(algorithms.get("pafed"))
