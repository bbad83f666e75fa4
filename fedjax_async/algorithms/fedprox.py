"""FedProx (Li et al., MLSys 2020): FedAvg with mu/2 ||w - w_g||^2 in the local loss."""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedavg


MU = base.HParam("mu", 0.01, "Proximal coefficient (Eq. 2).",
                 bounds="[0, inf)")


def proximal_penalty(w, w_start, client_state, hp):
  """mu/2 ||w - w_g||^2 (FedProx Eq. 2), w_g the global model the client received."""
  del client_state
  diff = w - w_start
  return 0.5 * hp["mu"] * jnp.vdot(diff, diff)


ALGORITHM = base.Algorithm(
    name="fedprox",
    local_penalty=proximal_penalty,
    client_final=base.delta_upload,
    server_update=fedavg.server_update,
    streamed_server=fedavg.STREAMED,
    separable_penalty=True,  # mu/2 sum_j (w_j - w_g,j)^2
    hparams=(MU,),
)
