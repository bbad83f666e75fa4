"""FedAvgM, FedAdam and FedYogi (Reddi et al. 2021) on the round's step, against plain
numpy recurrences."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async.algorithms import base
from fedjax_async.algorithms import server_optimizers as so

# A round rule whose step Delta_t is given: uploads[0] (times eta, as FedAvg's would be).
STEPS = np.array([[0.5, -1.0, 2.0], [0.1, 0.3, -0.2], [-0.4, 0.2, 0.6], [0.3, 0.3, 0.3]],
                 np.float32)


def given_step_rule():
  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    return w + base.server_lr(hp, round_index) * uploads[0], server_state, {}
  return base.Algorithm(name="given", local_penalty=base.no_penalty,
                        client_final=base.delta_upload, server_update=server_update)


def run(name, eta=0.5, **kw):
  alg = so.with_server_optimizer(given_step_rule(), so.transformation(name, **kw))
  w = jnp.array([1.0, 2.0, 3.0])
  state = alg.init_server_state(w)
  hp = {"server_lr": eta, "server_lr2": eta, "server_lr_switch_round": -1}
  out = []
  for t, step in enumerate(STEPS):
    w, state, _ = alg.server_update(w, state, jnp.asarray(step)[None], None, t, hp)
    out.append(np.asarray(w))
  return np.array(out)


def reference(name, eta=0.5, beta1=0.9, beta2=0.99, tau=1e-3, eps_root=0.0,
              accumulator=None, bias_correction="moments"):
  """Reddi et al.'s Alg. 2 (with optax's bias correction and Yogi's m_0 = v_0) in numpy."""
  w = np.array([1.0, 2.0, 3.0])
  v0 = {"yogi": 1e-6}.get(name, 0.0) if accumulator is None else accumulator
  m, v = np.full(3, v0 if name == "yogi" else 0.0), np.full(3, v0)
  out = []
  for t, delta in enumerate(STEPS.astype(np.float64), start=1):
    if name == "sgd":
      w = w + eta * delta
    elif name == "momentum":  # FedAvgM: v = beta v + Delta, w + eta v
      m = beta1 * m + delta
      w = w + eta * m
    else:  # FedAdam / FedYogi / FedAdagrad, g = -Delta
      g = -delta
      m = beta1 * m + (1 - beta1) * g
      if name == "adam":
        v = beta2 * v + (1 - beta2) * g ** 2
      elif name == "yogi":  # v - (1 - beta2) sign(v - g^2) g^2
        v = v - (1 - beta2) * np.sign(v - g ** 2) * g ** 2
      else:  # adagrad: v + g^2, never bias-corrected
        v = v + g ** 2
      mh, vh, scale = m, v, 1.0
      if name != "adagrad" and bias_correction == "moments":
        mh, vh = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
      elif name != "adagrad" and bias_correction == "step":  # TFF's, Flower's
        scale = np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
      w = w - eta * scale * mh / (np.sqrt(vh + eps_root) + tau)
    out.append(w.copy())
  return np.array(out)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "yogi", "adagrad"])
def test_server_optimizer_against_its_recurrence(name):
  np.testing.assert_allclose(run(name), reference(name), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,kw", [
    ("adagrad", dict(beta1=0.0, tau=0.0, eps_root=1e-7, accumulator=0.1)),  # TFF's form
    ("adagrad", dict(beta1=0.5, tau=1e-2)),
    ("yogi", dict(accumulator=0.0)),
    ("adam", dict(accumulator=0.3, eps_root=1e-4)),
    ("adam", dict(bias_correction="none")),  # Alg. 2 as printed
    ("yogi", dict(bias_correction="none", tau=1e-2)),
    ("adam", dict(bias_correction="step", tau=1e-2)),
    ("yogi", dict(bias_correction="step")),
])
def test_adaptive_options_against_the_recurrence(name, kw):
  np.testing.assert_allclose(run(name, **kw), reference(name, **kw), rtol=1e-5, atol=1e-5)
  assert not np.allclose(run(name, **kw), run(name), rtol=1e-4, atol=1e-5)  # it changes w


def test_server_optimizers_through_the_engine():
  common = dict(algorithm="fedavg", rounds=3, quiet=True)
  plain = fa.simulate(**common).runs["fedavg"]
  # momentum with beta_1 = 0 is the rule itself
  zero = fa.simulate(server_optimizer="momentum", server_beta1=0.0, **common).runs["fedavg"]
  np.testing.assert_allclose(np.asarray(zero.state.w), np.asarray(plain.state.w), atol=1e-6)
  adam = fa.simulate(server_optimizer="adam", server_lr=0.01, **common).runs["fedavg"]
  assert np.all(np.isfinite(np.asarray(adam.state.w)))
  assert not np.allclose(np.asarray(adam.state.w), np.asarray(plain.state.w))
  with pytest.raises(ValueError, match=r"^algorithm\.server_beta2: must be in \[0, 1\)"):
    fa.simulate(server_optimizer="adam", server_beta2=1.0, **common)


@pytest.mark.parametrize("optimizer", [
    "adam", *[pytest.param(o, marks=pytest.mark.slow) for o in ("momentum", "yogi",
                                                                  "adagrad")]])
def test_cnn_on_fashion_mnist_with_a_server_optimizer_on_the_cli(tmp_path, optimizer):
  """The paper's CNN (>= 100k parameters: one client at a time on CPU, the default
  chunking) with a server optimiser, from the command line."""
  import run_script
  if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
    pytest.skip("Fashion-MNIST IDX files not installed (apt-get install "
                "dataset-fashion-mnist; scripts/bootstrap.sh does)")
  proc = run_script.run([
      "--algorithm=fedavg", "--dataset=fashion_mnist", "--model=cnn", "--num_clients=1000",
      "--participation=0.002", "--local_epochs=1", "--rounds=1", "--delay_fraction=0",
      f"--server_optimizer={optimizer}", "--server_lr=0.01", f"--output_dir={tmp_path}"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
  assert summary["config"]["server_optimizer"] == optimizer
  assert summary["config"]["client_chunk"] == -1  # auto: 1 for this model on CPU
  assert np.isfinite(summary["final_accuracy"])
