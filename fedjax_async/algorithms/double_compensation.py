"""Double compensation (Guo et al., "A Double-Compensation-Based Federated Learning Scheme
for Data Privacy Protection in a Social IoT Scenario"), Alg. 1.

Heterogeneity compensation (client, Alg. 1 lines 12-19): starting from the received model
w_tau the client minimises g(w) = f(w) + rho/2 ||w - w_tau||^2 while the minibatch loss
g(w_{k,h}; z) is above the threshold v (a step budget of E epochs caps the loop; steps
after the threshold are masked), and pushes (w_k*, w_tau).

Delay compensation (server, Alg. 1 lines 5-8; Eqs. 9-11): the FedProx fixed point gives
the gradient rho (w_tau - w_k*) at w_tau (Eq. 9); DC-ASGD's first-order Taylor correction
with the diagonal Hessian approximation g (.) g (Eq. 5) moves it to the current model:

    g = rho (w_tau - w_k*) - lambda_t lambda rho^2 (w_tau - w_k*) (.) (w_tau - w_k*)
        (.) (w_{t-1} - w_tau),
    w_t = w_{t-1} - eta g.

lambda_t is "a parameter to improve the accuracy of time delay compensation, in [0, 1]"
(Table 2); the paper gives no schedule for it and fixes lambda = 1 in all experiments, so
both are hyperparameters (``dc_lambda_t``, default 1, and ``dc_lambda``).
Hyperparameters: ``dc_rho`` (rho), ``dc_lambda``, ``dc_lambda_t``, ``server_lr`` (eta),
``loss_threshold`` (v).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base


def fedprox_penalty(w, w_start, client_state, hp):
  """rho/2 ||w - w_tau||^2 (Alg. 1 line 14)."""
  del client_state
  diff = w - w_start
  return 0.5 * hp["dc_rho"] * jnp.vdot(diff, diff)


def compensated_gradient(w_prev, w_tau, w_star, rho, lam, lam_t):
  """Alg. 1 line 7 / Eq. 10:
  rho (w_tau - w*) - lam_t lam rho^2 (w_tau - w*) (.) (w_tau - w*) (.) (w_prev - w_tau).

  Args:
    w_prev: [d] the current global model w_{t-1}.
    w_tau: [d] the model the client trained from.
    w_star: [d] its trained model w*.
    rho: the proximal coefficient rho.
    lam: the compensation's lambda.
    lam_t: lambda_t, in [0, 1] (Table 2).
  """
  d = w_tau - w_star
  return rho * d - lam_t * lam * rho ** 2 * d * d * (w_prev - w_tau)


def server_step(w, server_state, upload, arrival, hp):
  """w_t = w_{t-1} - eta g (Alg. 1 line 8, Eq. 11); ``upload`` is w_k*.

  Args:
    w: [d] the model current at the arrival.
    server_state: the server's state.
    upload: [d] the client's trained model w_k*.
    arrival: the ``Arrival``.
    hp: the hyper-parameters.
  """
  g = compensated_gradient(w, arrival.w_start, upload, hp["dc_rho"], hp["dc_lambda"],
                           hp["dc_lambda_t"])
  return w - hp["server_lr"] * g, server_state


HPARAMS = (
    base.HParam("dc_rho", 1.0, "rho of the proximal term and Eq. 9.", bounds="[0, inf)"),
    base.HParam("dc_lambda", 1.0, "lambda of Eq. 10."),
    base.HParam("dc_lambda_t", 1.0, "lambda_t of Eq. 10.",
                bounds="[0, 1]"),
    base.HParam("loss_threshold", 0.0, "v: local steps stop at a loss <= v (line 12)."),
)

ALGORITHM = base.Algorithm(
    name="double_compensation",
    local_penalty=fedprox_penalty,
    client_final=base.model_upload,
    server_step=server_step,
    early_stop=True,
    hparams=HPARAMS,
)


# The paper's baseline: FedAsync-hinge with the FedProx term rho/2 ||w - w_tau||^2 in the
# client loss (Guo et al. Sec. 4.2); use fedasync with staleness_fn = 2 and mu = rho.
def fedasync_hinge_hparams(hp):
  """FedAsync hyperparameters of the paper's baseline from double-compensation ones."""
  out = dict(hp)
  out.update(staleness_fn=2.0, mu=hp["dc_rho"])
  return out
