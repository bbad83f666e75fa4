"""FedAsync (Xie, Koyejo, Gupta, 2019): staleness-weighted model mixing on every arrival.

A client trains from the model w_tau it was dispatched with, minimising
f(w) + mu/2 ||w - w_tau||^2 (FedAsync's regularised local objective; mu = 0 is plain SGD),
and uploads its model w_new. On arrival at server version t the server mixes

    w_t = (1 - a_t) w_{t-1} + a_t w_new,   a_t = a * s(t - tau)          (FedAsync Alg. 1)

with one of the paper's staleness functions s (FedAsync Sec. 5.2):

* constant:   s(t - tau) = 1;
* polynomial: s(t - tau) = (t - tau + 1)^(-a_poly);
* hinge:      s(t - tau) = 1 if t - tau <= b else 1 / (a_h (t - tau - b) + 1).

t - tau is the number of server versions between the client's dispatch and the update's
arrival (the engine's ``Arrival.staleness``): 0 for an update trained from the current
model, as FedAsync's released code counts it (xcgoner/async_fl:
``worker_delay = epoch - worker_ts``, the model made at epoch e stamped e + 1) and FedLab
(``staleness = self.round - receive_model_time``). A fresh update is thus weighted
s(0) = 1 (a_t = a) and the hinge bends after staleness b.

Hyperparameters: ``mix_alpha`` (a), ``staleness_fn`` (0 constant, 1 polynomial, 2 hinge;
a traced code so sweeps can vmap it), ``poly_a``, ``hinge_a``, ``hinge_b``, ``mu``.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedprox

MU = base.HParam("mu", 0.0, "Proximal coefficient of the local objective.", bounds="[0, inf)")
POLY_A = base.HParam("poly_a", 0.5, "a of the polynomial staleness s.",
                     bounds="[0, inf)")
HINGE_A = base.HParam("hinge_a", 10.0, "a, the hinge staleness s's slope.",
                      bounds="(0, inf)")
HINGE_B = base.HParam("hinge_b", 4.0, "b, the staleness where the hinge bends.", bounds="[0, inf)")


HPARAMS = (MU, POLY_A, HINGE_A, HINGE_B)


def constant_staleness(staleness):
  """s(t - tau) = 1."""
  return jnp.ones_like(jnp.asarray(staleness, jnp.float32))


def polynomial_staleness(staleness, a):
  """s(t - tau) = (t - tau + 1)^(-a)."""
  return jnp.power(jnp.asarray(staleness, jnp.float32) + 1.0, -a)


def hinge_staleness(staleness, a, b):
  """s(t - tau) = 1 if t - tau <= b else 1 / (a (t - tau - b) + 1)."""
  s = jnp.asarray(staleness, jnp.float32)
  return jnp.where(s <= b, 1.0, 1.0 / (a * (s - b) + 1.0))


def staleness_weight(staleness, hp):
  """s(t - tau) chosen by ``hp['staleness_fn']`` (0 constant, 1 polynomial, 2 hinge)."""
  kind = jnp.asarray(hp.get("staleness_fn", 0.0))
  return jnp.select(
      [kind == 1, kind == 2],
      [polynomial_staleness(staleness, hp.get("poly_a", 0.5)),
       hinge_staleness(staleness, hp.get("hinge_a", 10.0), hp.get("hinge_b", 4.0))],
      constant_staleness(staleness))


def mix(w, w_new, alpha):
  """(1 - alpha) w + alpha w_new."""
  return (1.0 - alpha) * w + alpha * w_new


def server_step(w, server_state, upload, arrival, hp):
  """w_t = (1 - a_t) w_{t-1} + a_t w_new, a_t = a s(t - tau) (Alg. 1), t - tau = staleness."""
  alpha = hp["mix_alpha"] * staleness_weight(arrival.staleness, hp)
  return mix(w, upload, alpha), server_state


ALGORITHM = base.Algorithm(
    name="fedasync",
    local_penalty=fedprox.proximal_penalty,  # mu/2 ||w - w_tau||^2
    client_final=base.model_upload,
    server_step=server_step,
    hparams=HPARAMS,
)
