"""FedAvgM, FedAdam and FedYogi (Reddi et al. 2021) on the round's step, against plain
numpy recurrences."""

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


def reference(name, eta=0.5, beta1=0.9, beta2=0.99, tau=1e-3):
  w = np.array([1.0, 2.0, 3.0])
  m, v = np.zeros(3), np.zeros(3)
  if name == "yogi":
    m, v = np.full(3, 1e-6), np.full(3, 1e-6)
  out = []
  for t, delta in enumerate(STEPS.astype(np.float64), start=1):
    if name == "sgd":
      w = w + eta * delta
    elif name == "momentum":  # FedAvgM: v = beta v + Delta, w + eta v
      m = beta1 * m + delta
      w = w + eta * m
    else:  # FedAdam / FedYogi with bias correction (optax), g = -Delta
      g = -delta
      m = beta1 * m + (1 - beta1) * g
      if name == "adam":
        v = beta2 * v + (1 - beta2) * g ** 2
      else:  # Yogi: v - (1 - beta2) sign(v - g^2) g^2
        v = v - (1 - beta2) * np.sign(v - g ** 2) * g ** 2
      mh, vh = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
      w = w - eta * mh / (np.sqrt(vh) + tau)
    out.append(w.copy())
  return np.array(out)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "yogi"])
def test_server_optimizer_against_its_recurrence(name):
  np.testing.assert_allclose(run(name), reference(name), rtol=1e-5, atol=1e-5)


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
