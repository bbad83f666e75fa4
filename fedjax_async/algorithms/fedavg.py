"""FedAvg (McMahan et al., AISTATS 2017).

Clients upload the delta w_i - w_g of their local SGD; the server adds the average of the
arrivals weighted by example count n_i (``client_weighting=uniform``: 1 each), scaled by a server learning rate (1 = FedAvg).
Stale deltas of delayed clients are averaged with the online ones (plain asynchronous
FedAvg, as the PAFed paper's baseline runs it).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base


def example_weights(arrivals, hp):
  """p_k = n_k for valid arrivals (1 with ``client_weighting=uniform``), 0 for padding."""
  return base.client_weights(arrivals, hp, "examples")


def apply_sum(w, server_state, upload_sum, weights, arrivals, round_index, hp):
  """w + eta * sum_k n_k upload_k / sum_k n_k over valid arrivals.

  Args:
    w: [d] the global model.
    server_state: the server's state.
    upload_sum: [d] S = sum_k weight_k upload_k.
    weights: [K] the arrivals' weights.
    arrivals: the round's ``Arrivals``.
    round_index: the round (0-based).
    hp: the hyper-parameters.
  """
  del arrivals
  eta = base.server_lr(hp, round_index)
  return w + eta * base.mean_from_sum(upload_sum, weights), server_state, {}


STREAMED = base.streamed_linear(base.LinearServer(weight=example_weights, apply=apply_sum))
server_update = base.streamed_server_update(STREAMED)


ALGORITHM = base.Algorithm(
    name="fedavg",
    local_penalty=base.no_penalty,
    client_final=base.delta_upload,
    server_update=server_update,
    streamed_server=STREAMED,
)
