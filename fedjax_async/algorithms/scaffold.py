"""SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 with option II control variates.

The server keeps x (the model) and its control variate c; client i keeps c_i (zero at
the start, in the ``[N, d]`` client state; a client not sampled keeps its own). A client
reads the c of the round it was dispatched in (``client_reads_server``) and, from
y_i = x, takes its K local steps

  y_i <- y_i - eta_l (g_i(y_i) - c_i + c)                         (Alg. 1 line 10)

(the gradient of the local penalty <c - c_i, y - x> added to the minibatch loss's), then

  c_i^+ = c_i - c + (x - y_i) / (K eta_l)                         (line 12, option II)
  uploads (Delta y_i, Delta c_i) = (y_i - x, c_i^+ - c_i)         (line 13)

Delta c_i travels as the upload's ``correction``. With S the round's arrivals and N the
clients,

  x <- x + eta_g (1/|S|) sum_S Delta y_i                          (lines 16-17)
  c <- c + (|S| / N) (1/|S|) sum_S Delta c_i

with eta_g the server learning rate (``--server_lr``) and the mean uniform as printed
(``client_weighting=examples``: weighted by n_i, both means). K is the steps the client
took, eta_l the clients' lr; option II is exact for plain local SGD (momentum 0). A
delayed client's Delta y_i and Delta c_i, computed from the x and c it was sent, join the
round they arrive in.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base


def init_client_state(w0):
  return {"c_i": jnp.zeros_like(w0)}  # c_i = 0 (Alg. 1 line 2)


def init_server_state(w0):
  return {"c": jnp.zeros_like(w0)}  # c = 0 (line 1)


def control_penalty(w, w_start, client_state, hp):
  """<c - c_i, w - x>: its gradient c - c_i is line 10's correction."""
  del hp
  return jnp.vdot(client_state["c"] - client_state["c_i"], w - w_start)


def client_final(w_start, w_end, client_state, num_steps, hp):
  """c_i^+ (line 12, option II) and the uploads (Delta y_i, Delta c_i) (line 13).

  Args:
    w_start: [d] x, the model the client started from.
    w_end: [d] y_i, its model after K local steps.
    client_state: its c_i, and the server's c it read.
    num_steps: K, the local steps it took.
    hp: the hyper-parameters (``lr``: eta_l).
  """
  c_i, c = client_state["c_i"], client_state["c"]
  k = jnp.maximum(jnp.asarray(num_steps, jnp.float32), 1.0)
  new_c_i = c_i - c + (w_start - w_end) / (k * hp["lr"])  # line 12
  return base.ClientOutput(upload=w_end - w_start, state={"c_i": new_c_i},
                           correction=new_c_i - c_i)


def weights(arrivals, hp):
  """1 for each arrival (line 16's mean; ``client_weighting=examples``: n_i), 0 padding."""
  return base.client_weights(arrivals, hp, "uniform")


def add(carry, uploads, rows, hp):
  """The running sums (sum_k p_k Delta y_k, sum_k p_k Delta c_k) of a chunk of arrivals."""
  p = weights(rows, hp)
  dy, dc = carry
  return (dy + jnp.einsum("g,gd->d", p, uploads),
          dc + jnp.einsum("g,gd->d", p, rows.correction))


def finish(w, server_state, carry, arrivals, round_index, hp):
  """x and c from the round's sums (line 17).

  Args:
    w: [d] x, the global model.
    server_state: ``{"c": [d]}``.
    carry: ``add``'s sums over the round's arrivals.
    arrivals: the round's ``Arrivals`` [K].
    round_index: the round (0-based).
    hp: the hyper-parameters.
  """
  p = weights(arrivals, hp)
  dx, dc = (base.mean_from_sum(s, p) for s in carry)  # line 16
  eta_g = base.server_lr(hp, round_index)
  sampled = jnp.sum(arrivals.valid.astype(jnp.float32))  # |S|
  c = server_state["c"] + sampled / arrivals.num_clients[0] * dc  # line 17
  return w + eta_g * dx, dict(server_state, c=c), {"server_lr": eta_g}


STREAMED = base.StreamedServer(
    init=lambda w, server_state: (jnp.zeros_like(w), jnp.zeros_like(w)), add=add,
    finish=finish)


ALGORITHM = base.Algorithm(
    name="scaffold",
    local_penalty=control_penalty,
    client_final=client_final,
    server_update=base.streamed_server_update(STREAMED),
    streamed_server=STREAMED,
    client_state_keys=("c_i",),
    init_client_state=init_client_state,
    init_server_state=init_server_state,
    client_reads_server=("c",),
    separable_penalty=True,  # sum_j (c_j - c_i,j) (w_j - x_j)
)
