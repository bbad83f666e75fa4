"""FedDyn (Acar et al., ICLR 2021), Algorithm 1: dynamic regularisation.

Client k keeps its gradient state g_k = grad L_k(theta_k) (zero at the start, in the
``[N, d]`` client state; a client not sampled keeps its own). Sent theta^{t-1}, it
minimises (here with its local SGD steps)

  L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2          (Alg. 1, client)
  g_k <- g_k - alpha (theta_k^t - theta^{t-1})                            (Alg. 1, client)

and uploads theta_k^t - theta^{t-1}. With P_t the round's arrivals and m the clients,
the server keeps h (zero at the start):

  h^t = h^{t-1} - alpha (1/m) sum_{P_t} (theta_k^t - theta^{t-1})        (Alg. 1, server)
  theta^t = (1/|P_t|) sum_{P_t} theta_k^t - h^t / alpha

theta_k^t is read as theta^{t-1} + its delta, so a delayed client's delta (from the model
it was sent) joins the current model, as FedAvg applies stale deltas; a round without
arrivals leaves theta and h as they are. ``client_weighting=examples``: the mean and
(|P_t|/m times) the sum weighted by n_k.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base


ALPHA = base.HParam("feddyn_alpha", 0.01, "FedDyn's alpha (Alg. 1).", bounds="(0, inf)")


def init_client_state(w0):
  return {"grad": jnp.zeros_like(w0)}  # grad L_k(theta_k^0) = 0 (Alg. 1 input)


def init_server_state(w0):
  return {"h": jnp.zeros_like(w0)}  # h^0 = 0


def dynamic_penalty(w, w_start, client_state, hp):
  """-<g_k, theta - theta^{t-1}> + alpha/2 ||theta - theta^{t-1}||^2 (the client's
  objective without L_k; the constant <g_k, theta^{t-1}> changes no gradient)."""
  diff = w - w_start
  return -jnp.vdot(client_state["grad"], diff) + 0.5 * hp["feddyn_alpha"] * jnp.vdot(diff, diff)


def client_final(w_start, w_end, client_state, num_steps, hp):
  """g_k <- g_k - alpha (theta_k^t - theta^{t-1}); the upload theta_k^t - theta^{t-1}.

  Args:
    w_start: [d] theta^{t-1}, the model the client was sent.
    w_end: [d] theta_k^t.
    client_state: its g_k.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  del num_steps
  delta = w_end - w_start
  grad = client_state["grad"] - hp["feddyn_alpha"] * delta
  return base.ClientOutput(upload=delta, state={"grad": grad})


def weights(arrivals, hp):
  """1 for each arrival (``client_weighting=examples``: n_k), 0 for padding."""
  return base.client_weights(arrivals, hp, "uniform")


def apply_sum(w, server_state, upload_sum, p, arrivals, round_index, hp):
  """h^t and theta^t (Alg. 1, server) from S = sum_k p_k delta_k.

  Args:
    w: [d] theta^{t-1}.
    server_state: ``{"h": [d]}``.
    upload_sum: [d] S.
    p: [K] the arrivals' weights.
    arrivals: the round's ``Arrivals``.
    round_index: the round (0-based).
    hp: the hyper-parameters.
  """
  del round_index
  alpha = hp["feddyn_alpha"]
  arrived = jnp.sum(arrivals.valid.astype(jnp.float32))  # |P_t|
  mean_delta = base.mean_from_sum(upload_sum, p)
  h = server_state["h"] - alpha * arrived / arrivals.num_clients[0] * mean_delta
  new_w = jnp.where(arrived > 0, w + mean_delta - h / alpha, w)
  return new_w, dict(server_state, h=h), {}


STREAMED = base.streamed_linear(base.LinearServer(weight=weights, apply=apply_sum))


ALGORITHM = base.Algorithm(
    name="feddyn",
    local_penalty=dynamic_penalty,
    client_final=client_final,
    server_update=base.streamed_server_update(STREAMED),
    streamed_server=STREAMED,
    client_state_keys=("grad",),
    init_client_state=init_client_state,
    init_server_state=init_server_state,
    separable_penalty=True,  # sum_j -g_j diff_j + alpha/2 diff_j^2
    hparams=(ALPHA,),
)
