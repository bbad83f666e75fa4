"""What a newcomer meets in the first hour: a DP run spends the epsilon it names,
PrivaAsyncFed's defaults are its paper's, Ctrl-C stops FedEDS's Alg. 1 within a chunk with
its work saved, and the cost of a run is printed before the work."""

import collections
import os
import re

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
  from fedjax_async.asynchronous import experiment as async_experiment
  # (10 clients of one local epoch: the tiers and the model are the defaults under test)
  result = async_experiment.run_virtual_clock(
      fa.AsyncRunConfig(), **dict(TINY_ASYNC, num_clients=10, local_epochs=1, **fields))
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


# ------------------------------------------------------------ 4. cost before work



def pinned_cpu():
  from fedjax_async import cost
  # 60 GFLOP/s and 0.1 s a round: this 2-core CPU's constants
  return cost.Device("cpu", 2, "cpu (2 cores)", 60e9, 0.1)


def fake_data(clients, per_client, shape, test):
  """The shapes the estimate reads (no data is loaded)."""
  import types
  import jax
  return types.SimpleNamespace(
      x=jax.ShapeDtypeStruct((clients, per_client) + shape, np.float32),
      test_x=jax.ShapeDtypeStruct((test,) + shape, np.float32),
      counts=np.full(clients, per_client))


def built(name, shape, classes=10):
  import jax
  from fedjax_async import models
  w0, apply_flat = models.flat_model(models.get_model(name, classes, shape), shape,
                                     jax.random.PRNGKey(0))
  return name, w0, apply_flat


def test_cost_of_a_small_and_a_large_round_engine_run():
  """FLOPs = 3 x forward FLOPs per trained example + 1 x per evaluated test example, the
  forward FLOPs counted by hand from the layers (2 x inputs x outputs per dense layer,
  2 x output pixels x channels x 5 x 5 x input channels per convolution)."""
  from fedjax_async import config as config_lib
  from fedjax_async import cost
  # Logistic regression on 60 features, 10 classes; 30 clients of 100, 10 a round.
  small = config_lib.RunConfig().replace(rounds=20, participation=1 / 3, local_epochs=2)
  fwd = 2 * 60 * 10
  trained = 20 * 10 * 2 * 100  # rounds x clients a round x epochs x examples
  evaluated = 20 * 500  # every round (eval_every=1) x the test set
  est = cost.round_engine(small, fake_data(30, 100, (60,), 500), built("logreg", (60,)),
                          device=pinned_cpu())
  assert est.flops == pytest.approx(3 * fwd * trained + fwd * evaluated, rel=1e-9)
  assert est.seconds < cost.WARN_SECONDS
  # The default Fashion-MNIST CNN: 30 clients of 2000, 10 a round, 2 epochs, 100 rounds.
  conv1 = 2 * 28 * 28 * 32 * 5 * 5 * 1
  conv2 = 2 * 14 * 14 * 64 * 5 * 5 * 32
  dense = 2 * (7 * 7 * 64 * 512 + 512 * 10)
  fwd = conv1 + conv2 + dense
  large = config_lib.RunConfig().replace(dataset="fashion_mnist")
  trained = 100 * 10 * 2 * 2000
  est = cost.round_engine(large, fake_data(30, 2000, (28, 28, 1), 10000),
                          built("cnn", (28, 28, 1)), device=pinned_cpu())
  assert est.flops == pytest.approx(3 * fwd * trained + fwd * 100 * 10000, rel=1e-9)
  assert est.seconds == pytest.approx(est.flops / 60e9 + 100 * 0.1 + cost.COMPILE_SECONDS)
  assert est.line().startswith("cost: 0.32 PFLOP, ~") and est.line().endswith(
      " min on cpu (2 cores)")
  # the data set (float32) is part of the memory
  assert est.memory_bytes > 4 * 30 * 2000 * 784


def test_the_virtual_clocks_time_counts_its_groups_not_its_updates():
  """seconds = FLOPs / throughput + scanned groups x 0.2 of a step's seconds + one
  compilation: 300 updates in 60 groups cost 60 groups, not 300."""
  from fedjax_async import cost
  from fedjax_async.asynchronous import config as async_config
  cfg = async_config.AsyncRunConfig().replace(num_updates=300, eval_every=100)
  fwd = 2 * 60 * 10
  steps = np.full(30, 4)  # 4 local steps of each client's kept tasks
  est = cost.virtual_clock(cfg, fake_data(30, 100, (60,), 500), built("logreg", (60,)),
                           steps, 300, 5, 4, device=pinned_cpu(), num_groups=60)
  b = cfg.local.batch_size
  flops = 3 * fwd * 30 * 4 * b + fwd * 4 * 500  # (evaluated at updates 0, 100, 200, 300)
  assert est.flops == pytest.approx(flops, rel=1e-9)
  assert est.seconds == pytest.approx(
      flops / 60e9 + 60 * 0.2 * 0.1 + cost.COMPILE_SECONDS)
  per_update = cost.virtual_clock(cfg, fake_data(30, 100, (60,), 500), built("logreg", (60,)),
                                  steps, 300, 5, 4, device=pinned_cpu())
  assert per_update.seconds - est.seconds == pytest.approx(240 * 0.2 * 0.1)


def test_cost_warning_for_the_cnn_default_not_for_logreg(capsys):
  from fedjax_async import config as config_lib
  from fedjax_async import cost
  cnn = cost.round_engine(config_lib.RunConfig().replace(dataset="fashion_mnist"),
                          fake_data(30, 2000, (28, 28, 1), 10000), built("cnn", (28, 28, 1)),
                          device=pinned_cpu())
  text = cost.announce(cnn, cost.ROUND_ENGINE_SMALLER, "fedavg")
  assert text.startswith("[fedavg] cost: ") and "\nwarning: " in text
  assert "model.name=mlp" in text and "run.rounds" in text
  assert capsys.readouterr().err == text + "\n"
  logreg = cost.round_engine(config_lib.RunConfig(), fake_data(30, 143, (60,), 1077),
                             built("logreg", (60,)), device=pinned_cpu())
  assert "warning" not in cost.announce(logreg, cost.ROUND_ENGINE_SMALLER)


def test_every_driver_prints_its_cost_first(capsys):
  """The round engine and the virtual clock print the cost line to stderr before
  training, without a warning for logistic regression on synthetic data (``quiet=True``:
  nothing, tests/test_console.py)."""
  fa.simulate(algorithm="fedavg", rounds=2)
  err = capsys.readouterr().err
  assert err.count("[fedavg] cost: ") == 1 and "warning" not in err
  from fedjax_async.asynchronous import experiment as async_experiment
  async_experiment.run_virtual_clock(fa.AsyncRunConfig(), algorithm="fedasync", **TINY_ASYNC)
  err = capsys.readouterr().err
  assert err.count("[fedasync] cost: ") == 1 and "warning" not in err


def test_fededs_cost_warns_at_the_paper_size_not_quick():
  from fedjax_async import cost
  from fedjax_async.fededs import config as fededs_config
  from fedjax_async.fededs import experiment
  paper = fededs_config.FedEDSRunConfig()
  quick = paper.replace(**fededs_config.QUICK)
  est = {}
  for name, cfg in (("paper", paper), ("quick", quick)):
    alphas, ks, bases, variants = experiment.validate(cfg)
    est[name] = experiment.estimate_cost(cfg, len(alphas) * len(ks), len(bases), variants,
                            device=pinned_cpu())
  assert est["paper"].seconds > cost.WARN_SECONDS > est["quick"].seconds
  # Alg. 1 alone at the paper's size: 60000 rows x (5 pre-training epochs of the CNN + 20
  # encryptor epochs through the UNet and the CNN) x 3, for 9 settings and Fig. 3
  assert est["paper"].flops > 10 * 60000 * 5 * 3 * 24e6


# -------------------------------------------- 3. Ctrl-C stops FedEDS's Alg. 1 at once


def toy_alg1_args():
  import jax
  import jax.numpy as jnp
  from fedjax_async import fededs
  shape, clients, rows = (8, 8, 1), 3, 12
  rng = np.random.default_rng(0)
  y = rng.integers(0, 3, (clients, rows)).astype(np.int32)
  x = (0.2 * rng.uniform(size=(clients, rows) + shape)).astype(np.float32)
  x[..., :4, :4, :] += 0.7 * (y == 0)[..., None, None, None]
  model = fededs.SplitModel("mlp", 3, shape, hidden=8)
  w0, _, split = model.flat(jax.random.PRNGKey(0))
  cfg = fededs.FedEDSConfig(pretrain_epochs=2, encryptor_epochs=3, batch_size=5,
                            unet_width=2)
  return (model, fededs.make_encryptor(shape, width=2), split(w0),
          fededs.client_stochastic_layers(7, clients, 8), jnp.asarray(x), jnp.asarray(y),
          jnp.asarray([12, 7, 10], np.int32), jax.random.PRNGKey(1), cfg)


@pytest.mark.parametrize("loop,who", [("map", "client 1 of 3"), ("vmap", "all 3 clients")])
def test_alg1_in_chunks_is_alg1_and_continues_where_a_stop_saved_it(loop, who, tmp_path,
                                                                    capsys):
  """Alg. 1 one epoch per step gives generate_encrypted's sets and losses; stopped after
  its 4th epoch (2 pre-training and 2 encryptor epochs of client 1, or of all clients with
  vmap) it saves them, and a resumed job continues from the 5th to the same result; a
  file of another configuration is not read back."""
  from fedjax_async import fededs
  from fedjax_async.fededs import alg1
  args = toy_alg1_args()
  ref = fededs.generate_encrypted(*args, client_loop=loop, share_rows=6)
  job = alg1.Alg1(*args, client_loop=loop, share_rows=6)
  step, steps = job.step, []

  def stopped_after_4():
    step()
    steps.append(1)
    if len(steps) == 4:
      raise KeyboardInterrupt  # a Ctrl-C during the 4th epoch, raised at its end

  job.step = stopped_after_4
  path = str(tmp_path / "alg1.partial.npz")
  with pytest.raises(KeyboardInterrupt):
    alg1.run(job, path, {"setting": 1}, "[t]", resume=False)
  assert f"[t] Alg. 1 stopped before {who}, encryptor epoch 3 of 3: the epochs " \
         f"before it are saved in {path}" in capsys.readouterr().err
  other = alg1.Alg1(*args, client_loop=loop, share_rows=6)
  assert not alg1.load(path, other, {"setting": 2}, "[t]")  # another configuration
  assert other.where() == f"{who}, pre-training epoch 1 of 2"
  again = alg1.Alg1(*args, client_loop=loop, share_rows=6)
  gen = alg1.run(again, path, {"setting": 1}, "[t]", resume=True)
  assert f"continues from {path} at {who}, encryptor epoch 3 of 3" in (
      capsys.readouterr().out)
  assert not os.path.exists(path)  # done: the partial file is gone
  for a, b in ((gen.shared.x, ref.shared.x), (gen.shared.soft, ref.shared.soft),
               (gen.pretrain_loss, ref.pretrain_loss),
               (gen.encryptor_loss, ref.encryptor_loss)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(gen.shared.counts, ref.shared.counts)


def test_fededs_answers_the_first_ctrl_c_within_an_epoch_saving_alg1(tmp_path):
  """experiments/fededs_table.py: a SIGINT once client 1's Alg. 1 is done stops the run
  within seconds (not after every client's), says what it saved, and the file holds
  client 1's encrypted set."""
  import signal
  import subprocess
  import sys
  import time
  import run_script
  code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
          " sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  proc = subprocess.Popen(
      [sys.executable, "-c", code, os.path.join(run_script.ROOT, "experiments",
                                                "fededs_table.py"),
       "--quick", f"--output_dir={tmp_path}", "--encryptor_epochs=30", "--privacy=false",
       "--utility_epochs=0"], env=run_script.env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  seen, sent = [], None
  for line in proc.stdout:
    seen.append(line)
    if "Alg. 1: client 1 of 5 done" in line:
      sent = time.perf_counter()
      proc.send_signal(signal.SIGINT)
      break
  out, err = proc.communicate(timeout=300)
  assert sent is not None, "".join(seen) + out + err
  waited = time.perf_counter() - sent
  assert proc.returncode == 130, "".join(seen) + out + err
  assert waited < 15, waited  # one epoch of one client, the file, the exit
  path = tmp_path / "runs" / "alpha0.1_K5" / "alg1.partial.npz"
  # the signal lands during client 2's first epoch, or its second on a loaded machine (the
  # epoch under way when the line is read): either way within an epoch, the ones before saved
  assert re.search(re.escape("Alg. 1 stopped before client 2 of 5, pre-training epoch ")
                   + "[12]" + re.escape(f" of 2: the epochs before it are saved in {path}; "
                                        "run again with --resume"), err), err
  assert "interrupted (SIGINT)" in err.splitlines()[-1]
  assert "[fededs] cost: " in err  # (said before the work)
  with np.load(path) as saved:
    assert int(saved["group"]) == 1  # client 1 done, client 2 not started
    assert saved["done0.0"].shape[1:] == (28, 28, 1)  # client 1's encrypted rows
    assert "done1.0" not in saved.files
  assert not (tmp_path / "runs" / "alpha0.1_K5" / "alg1.npz").exists()
