"""What a newcomer meets in the first hour: a DP run spends the epsilon it names,
PrivaAsyncFed's defaults are its paper's, Ctrl-C stops FedEDS's Alg. 1 within a chunk with
its work saved, and the cost of a run is printed before the work."""

import collections
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

import fedjax_async as fa

TINY_ASYNC = dict(num_updates=20, eval_every=10)


def rdp_epsilon(z: float, steps: int, delta: float) -> float:
  """epsilon of ``steps`` Gaussian mechanisms of noise multiplier z, straight from
  dp-accounting (not through fedjax_async.privacy)."""
  acc = rdp.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(z), steps)
  return acc.get_epsilon(delta)


# ---------------------------------------------------------------- 1. honest DP defaults


def test_dp_run_spends_the_epsilon_it_names(capsys):
  """docs/api.md's example (dp_fedasync, dp_epsilon=5) at the defaults: the steps each
  client really took (its rows) under the run's noise multiplier spend <= 5, and close
  to 5 for the busiest client; the start line says so."""
  run = fa.simulate(fa.AsyncRunConfig(), algorithm="dp_fedasync", dp_epsilon=5.0,
                    **TINY_ASYNC).runs["dp_fedasync"]
  steps = collections.Counter()
  for r in run.rows:
    steps[r["client"]] += r["client_steps"]
  z = run.summary["hparams"]["dp_noise_multiplier"]
  assert z > 0
  spent = [rdp_epsilon(z, s, 1e-5) for s in steps.values()]
  assert max(spent) <= 5.0 + 1e-9
  assert max(spent) > 4.9
  assert run.summary["privacy"]["epsilon_spent_max"] == pytest.approx(max(spent), rel=1e-6)
  err = capsys.readouterr().err
  assert "spends at most epsilon 5" in err and "warning" not in err


def test_dp_alg1_noise_warns_with_the_epsilon_it_spends(capsys):
  """The paper's per-step sigma (dp_noise=alg1) spends orders of magnitude more than
  dp_epsilon: one warning line before training names that epsilon."""
  run = fa.simulate(fa.AsyncRunConfig(), algorithm="dp_fedasync", dp_epsilon=5.0,
                    dp_noise="alg1", **TINY_ASYNC).runs["dp_fedasync"]
  spent = run.summary["privacy"]["epsilon_spent_max"]
  assert spent > 1e3
  warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
  assert len(warning) == 1
  assert f"spends epsilon {spent:.3g}" in warning[0]
  assert "dp_noise=calibrated" in warning[0]


# ------------------------------------------------- 2. PrivaAsyncFed's paper defaults


def final_models(capsys=None, **fields):
  from fedjax_async.asynchronous import driver
  result = driver.simulate(fa.AsyncRunConfig(), **TINY_ASYNC, **fields)
  return {name: np.asarray(run.state.w) for name, run in result.runs.items()}


def test_privaasyncfed_defaults_prune_on_the_papers_device_tiers(capsys):
  """At the defaults PrivaAsyncFed runs on the paper's four device tiers with a model that
  has hidden units, so its slower tiers train pruned sub-models and its model differs
  from FedAsync's and DP-FedAsync's. With pruning off (every tier's scale 1) it is
  DP-FedAsync (FedAsync with the same client clipping) to float rounding, and with a clip
  that never binds it is FedAsync: the difference is the paper's pruning (and DP)."""
  w = final_models(algorithm="fedasync,dp_fedasync,privaasyncfed")
  out = capsys.readouterr().out
  assert "clock.device_classes=privaasyncfed" in out and "model mlp " in out
  assert np.abs(w["privaasyncfed"] - w["fedasync"]).max() > 1e-3
  assert np.abs(w["privaasyncfed"] - w["dp_fedasync"]).max() > 1e-3

  unpruned = final_models(algorithm="fedasync,dp_fedasync,privaasyncfed", scales="1,1,1,1")
  np.testing.assert_allclose(unpruned["privaasyncfed"], unpruned["dp_fedasync"], atol=1e-6)
  np.testing.assert_allclose(unpruned["dp_fedasync"], w["dp_fedasync"], atol=1e-6)
  assert np.abs(unpruned["privaasyncfed"] - unpruned["fedasync"]).max() > 1e-3

  plain = final_models(algorithm="fedasync,privaasyncfed", scales="1,1,1,1", dp_clip=1e6)
  np.testing.assert_allclose(plain["privaasyncfed"], plain["fedasync"], atol=1e-6)


def test_explicit_devices_and_model_are_kept(capsys):
  """device_classes=none and an explicit model are the user's: no tiers, no MLP (logistic
  regression has no hidden unit, so nothing is pruned and PrivaAsyncFed is DP-FedAsync)."""
  w = final_models(algorithm="dp_fedasync,privaasyncfed", device_classes="none",
                   model="logreg")
  out = capsys.readouterr().out
  assert "PrivaAsyncFed's defaults" not in out and "model logreg " in out
  np.testing.assert_allclose(w["privaasyncfed"], w["dp_fedasync"], atol=1e-6)
