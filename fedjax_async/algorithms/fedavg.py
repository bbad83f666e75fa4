"""FedAvg (McMahan et al., AISTATS 2017).

Clients upload the delta w_i - w_g of their local SGD; the server adds the average of the
arrivals weighted by example count n_i, scaled by a server learning rate (1 = FedAvg).
Stale deltas of delayed clients are averaged with the online ones (plain asynchronous
FedAvg, as the PAFed paper's baseline runs it).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base


def example_weighted_step(w, uploads, arrivals, round_index, hp):
  """w + eta * sum_k n_k upload_k / sum_k n_k over valid arrivals."""
  weights = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
  eta = base.server_lr(hp, round_index)
  return w + eta * base.weighted_mean(uploads, weights)


def server_update(w, server_state, uploads, arrivals, round_index, hp):
  return example_weighted_step(w, uploads, arrivals, round_index, hp), server_state, {}


ALGORITHM = base.Algorithm(
    name="fedavg",
    local_penalty=base.no_penalty,
    client_final=base.delta_upload,
    server_update=server_update,
)
