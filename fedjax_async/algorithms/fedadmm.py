"""FedADMM (Gong, Li, Freris, ICDE 2022).

Client i keeps a dual variable y_i (it persists across rounds and changes only when the
client trains). With w_g the global model it received and trained from:

  local loss   f_i(w) + y_i^T (w - w_g) + rho/2 ||w - w_g||^2          (PAFed Eq. 8)
  dual update  y_i <- y_i + rho (w_i^+ - w_g)                           (PAFed Eq. 10)
  upload       (w_i^+ - w_g) + (y_i^+ - y_i) / rho                       (PAFed Eq. 16)
  server       w <- w + eta * mean_k(upload_k)                           (PAFed Eq. 11)

Eq. 16's w_i^{tau_r} is read as the model the client started training from, as Gong et
al.'s released code computes it (``update.py``: ``weights - model_prev`` with
``model_prev`` the received theta). ``upload="last_local"`` is the literal reading with
the client's stored last local model (it also carries the global model's drift since the
client last trained; docs/design.md measures what that does to the model's scale).

Stale uploads (delayed clients) are averaged with the online ones, as FedADMM's server does
with whatever arrives. eta switches to eta_2 from a given round (authors' code).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base

# Readings of Eq. 16's w_i^{tau_r}: the received global model (Gong et al.'s code) or the
# client's last local model (the equation as printed).
UPLOADS = ("received", "last_local")
ADMM_UPLOAD = base.Option(
    "admm_upload", "received", "Eq. 16 (FedADMM, PAFed): received (w_end - model received + "
    "dy/rho, Gong et al.'s code) | last_local (as printed; docs/design.md).", UPLOADS)


def state_keys(upload: str = "received") -> tuple:
  return ("dual", "last_local") if upload == "last_local" else ("dual",)


def make_init_client_state(upload: str = "received"):
  def init_client_state(w0):
    # y_i^0 = 0 (and w_i^0 = w^0) (PAFed Alg. 3 line 2).
    state = {"dual": jnp.zeros_like(w0), "last_local": w0}
    return {k: state[k] for k in state_keys(upload)}
  return init_client_state


def admm_penalty(w, w_start, client_state, hp):
  """y_i^T (w - w_g) + rho/2 ||w - w_g||^2 (Eq. 8, without f_i)."""
  diff = w - w_start
  return jnp.vdot(client_state["dual"], diff) + 0.5 * hp["rho"] * jnp.vdot(diff, diff)


def admm_client_final(w_start, w_end, client_state, num_steps, hp):
  """Dual update (Eq. 10) and the augmented upload (Eq. 16), from the model received.

  With a stored ``last_local`` in ``client_state`` (``upload="last_local"``) the upload
  subtracts that instead, and the new local model is stored.

  Args:
    w_start: [d] the model the client started from.
    w_end: [d] its model after local training.
    client_state: its persistent state.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  del num_steps
  rho = hp["rho"]
  dual = client_state["dual"]
  new_dual = dual + rho * (w_end - w_start)  # Eq. 10
  if "last_local" in client_state:
    upload = (w_end - client_state["last_local"]) + (new_dual - dual) / rho
    return base.ClientOutput(upload=upload, state={"dual": new_dual, "last_local": w_end})
  upload = (w_end - w_start) + (new_dual - dual) / rho  # Eq. 16
  return base.ClientOutput(upload=upload, state={"dual": new_dual})


def arrival_weights(arrivals, hp):
  """1 for every valid arrival (Eq. 11 is a plain mean; ``client_weighting=examples``:
  n_k), 0 for padding slots."""
  return base.client_weights(arrivals, hp, "uniform")


def apply_sum(w, server_state, upload_sum, weights, arrivals, round_index, hp):
  """w + eta * mean_k(upload_k) (Eq. 11).

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
  return w + eta * base.mean_from_sum(upload_sum, weights), server_state, {"server_lr": eta}


STREAMED = base.streamed_linear(base.LinearServer(weight=arrival_weights, apply=apply_sum))


RHO = base.HParam("rho", 0.01, "ADMM penalty (Eq. 8).",
                  bounds="(0, inf)")


def make_algorithm(upload: str = "received") -> base.Algorithm:
  """FedADMM with Eq. 16 read as ``upload`` (one of ``UPLOADS``)."""
  if upload not in UPLOADS:
    raise ValueError(f"admm_upload: expected one of {', '.join(UPLOADS)}, got {upload!r}")
  return base.Algorithm(
      name="fedadmm",
      local_penalty=admm_penalty,
      client_final=admm_client_final,
      server_update=base.streamed_server_update(STREAMED),
      client_state_keys=state_keys(upload),
      init_client_state=make_init_client_state(upload),
      streamed_server=STREAMED,
      separable_penalty=True,  # sum_j y_j (w_j - w_g,j) + rho/2 (w_j - w_g,j)^2
      hparams=(RHO,),
  )


ALGORITHM = make_algorithm()
