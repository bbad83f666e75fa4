"""FedNova (Wang et al., NeurIPS 2020): normalised averaging.

Client i takes tau_i local steps; with SGD momentum rho its aggregation vector has
||a_i||_1 = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho) (FedNova Sec. 4.2; rho = 0
gives the vanilla solver's a_i = tau_i). It uploads the normalised gradient
d_i = (w_g - w_i) / ||a_i||_1 and the server steps

  w <- w - eta * tau_eff * sum_i p_i d_i,   tau_eff = sum_i p_i ||a_i||_1,  p_i = n_i / n

(FedNova Eq. 6). Stale normalised gradients are averaged with the online ones.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedavg


def momentum_a_norm(num_steps, rho):
  """||a_i||_1 for tau_i steps of SGD with heavy-ball momentum rho."""
  tau = jnp.asarray(num_steps, jnp.float32)
  rho = jnp.asarray(rho, jnp.float32)
  safe = jnp.where(rho < 1.0, 1.0 - rho, 1.0)
  geometric = jnp.where(rho > 0, (1.0 - rho ** tau) / safe, 1.0)
  return jnp.where(rho > 0, (tau - rho * geometric) / safe, tau)


def client_final(w_start, w_end, client_state, num_steps, hp):
  """FedNova's normalised update (w_start - w_end) / ||a_i||_1.

  Args:
    w_start: [d] the model the client started from.
    w_end: [d] its model after local training.
    client_state: its persistent state.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  a = jnp.maximum(momentum_a_norm(num_steps, hp["momentum"]), 1e-12)
  return base.ClientOutput(upload=(w_start - w_end) / a, state=client_state)


def apply_sum(w, server_state, upload_sum, weights, arrivals, round_index, hp):
  """Eq. 6 from S = sum_i n_i d_i: p_i = n_i / n, sum_i p_i d_i = S / n.

  Args:
    w: [d] the global model.
    server_state: the server's state.
    upload_sum: [d] S = sum_k weight_k upload_k.
    weights: [K] the arrivals' weights.
    arrivals: the round's ``Arrivals``.
    round_index: the round (0-based).
    hp: the hyper-parameters.
  """
  n = jnp.maximum(jnp.sum(weights), 1e-12)
  a = momentum_a_norm(arrivals.num_steps, hp["momentum"])
  tau_eff = jnp.sum(weights * a) / n
  eta = base.server_lr(hp, round_index)
  return w - eta * tau_eff * (upload_sum / n), server_state, {"tau_eff": tau_eff}


# The weights are FedAvg's (n_i for valid arrivals), normalised in apply_sum.
STREAMED = base.streamed_linear(base.LinearServer(weight=fedavg.example_weights,
                                                  apply=apply_sum))
server_update = base.streamed_server_update(STREAMED)


ALGORITHM = base.Algorithm(
    name="fednova",
    local_penalty=base.no_penalty,
    client_final=client_final,
    server_update=server_update,
    streamed_server=STREAMED,
)
