"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

A client trains from w_tau and uploads its delta Delta_i = w_end - w_tau (FedBuff Alg. 1,
client lines). The server keeps a buffer (sum + count) as its state; each arrival adds its
staleness-weighted delta

    sum <- sum + s(t - tau) Delta_i,   count <- count + 1,   s(t - tau) = 1 / sqrt(1 + t - tau)

(FedBuff Sec. 5: "we scale each update by 1/sqrt(1 + staleness)"; ``hp['fedbuff_staleness']``
= 0 turns the weighting off). On the K-th arrival (``arrival.flush``, drawn by the virtual
clock with ``buffer_k`` = K) the server applies the mean Delta_bar = sum / count with its
own SGD-momentum optimiser (FedBuff Alg. 1 server lines; FedOpt-style server step):

    m <- beta_s m + Delta_bar,   w <- w + eta_s m,   sum <- 0, count <- 0.

Each delta may also be weighted by its client's example count (``example_weight``,
``avg_num_examples``: FLSim's example weights, ``fedasync.example_weight``; off by default).

Hyperparameters: ``server_lr`` (eta_s), ``server_momentum`` (beta_s), ``fedbuff_staleness``,
``example_weight``, ``avg_num_examples``, ``mu`` (optional proximal term, 0 by default).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedasync
from fedjax_async.algorithms import fedprox


HPARAMS = (
    base.HParam("mu", 0.0, "Proximal coefficient (0: none).",
                bounds="[0, inf)"),
    fedasync.AVG_NUM_EXAMPLES,
    base.HParam("server_momentum", 0.0, "beta_s, the server's momentum.",
                bounds="[0, 1)"),
    base.HParam("fedbuff_staleness", 1.0, "Deltas weighed by 1/sqrt(1 + staleness).", kind="bool", bounds="[0, 1]"),
)


class BufferState(NamedTuple):
  total: jax.Array  # [d] sum of weighted deltas since the last server step
  count: jax.Array  # float32: arrivals in the buffer
  momentum: jax.Array  # [d] server momentum


def init_server_state(w0):
  return BufferState(jnp.zeros_like(w0), jnp.float32(0.0), jnp.zeros_like(w0))


def sqrt_staleness(staleness):
  """s(t - tau) = 1 / sqrt(1 + t - tau)."""
  return jax.lax.rsqrt(1.0 + jnp.asarray(staleness, jnp.float32))


def server_step(w, state: BufferState, upload, arrival, hp):
  """Buffer the weighted delta; on ``arrival.flush`` take one server optimiser step.

  Args:
    w: [d] the model current at the arrival.
    state: the ``BufferState``: the buffered sum, its count, the server momentum.
    upload: [d] the arrival's upload.
    arrival: the ``Arrival``.
    hp: the hyper-parameters.
  """
  use = hp["fedbuff_staleness"]
  weight = jnp.where(use > 0, sqrt_staleness(arrival.staleness), 1.0)
  weight = weight * fedasync.example_weight(arrival.num_examples, hp)  # 1 by default
  total = state.total + weight * upload
  count = state.count + 1.0
  mean = total / count
  momentum = hp["server_momentum"] * state.momentum + mean
  stepped = w + hp["server_lr"] * momentum
  flush = arrival.flush
  new_state = BufferState(jnp.where(flush, 0.0, total), jnp.where(flush, 0.0, count),
                          jnp.where(flush, momentum, state.momentum))
  return jnp.where(flush, stepped, w), new_state


ALGORITHM = base.Algorithm(
    name="fedbuff",
    local_penalty=fedprox.proximal_penalty,
    client_final=base.delta_upload,
    server_step=server_step,
    init_server_state=init_server_state,
    buffered=True,
    hparams=HPARAMS,
)
