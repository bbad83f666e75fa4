"""DP-FedAvg (McMahan et al., ICLR 2018, Alg. 1) with optional adaptive clipping (Andrew
et al., NeurIPS 2021, their DP-FedAvg with adaptive clipping): user-level differential
privacy on the round engine.

``private(algorithm)`` is a function of a round rule that returns one, as
``server_optimizers.with_server_optimizer`` is: it keeps ``algorithm``'s clients (their
local penalty; their upload must be the update Delta_k = w_end - w_start,
``base.delta_upload``: FedAvg's, FedProx's) and gives it DP-FedAvg's server. The two
compose: ``server_optimizers.configured(private(fedavg.ALGORITHM), cfg)`` runs the server
optimiser on the noised step (post-processing: DP-FedAdam, Andrew et al.'s server
momentum). ``dp_fedavg`` is ``private`` of FedAvg's clients; DP-FedProx is
``private(fedprox.ALGORITHM, name="dp_fedprox")``. Round t, with m = qN the expected
number of clients (``hp``'s
``dp_clients_per_round``, from the timeline's sampling rate q):

  Delta_k' = Delta_k min(1, C_t / ||Delta_k||)            (Alg. 1's per-user clip)
  Delta~ = (sum_k Delta_k' + N(0, (z_D C_t)^2 I)) / m      (the fixed denominator qW)
  w_{t+1} = w_t + eta Delta~                                (eta: --server_lr)

Every arrival weighs 1 (``--client_weighting`` is not read: weights <= 1 bound a user's
contribution by C). The clipped deltas are summed chunk by chunk (a ``StreamedServer``, so
``client_chunk`` never holds ``[K, d]``); the noise is drawn once a round, in ``finish``,
from a key of (run seed, round): the same with any chunking, devices or rounds per call,
and after a resumption. Adaptive clipping (``dp_quantile`` gamma > 0; Andrew et al.):

  b_k = 1[||Delta_k|| <= C_t],  b~ = (sum_k b_k + N(0, sigma_b^2)) / m,
  C_{t+1} = C_t exp(-eta_C (b~ - gamma)),  z_D = (z^-2 - (2 sigma_b)^-2)^(-1/2)

with sigma_b = ``dp_count_noise`` m (Andrew et al. take m / 20), so that the two releases
spend what one Gaussian mechanism of multiplier z does; fixed clipping has z_D = z.
The server state is log(C_t / C_0). Accounting (``run_hparams``, ``report``): T rounds of
the Poisson-subsampled Gaussian of multiplier z at rate q (``privacy.spent_epsilon``), z
calibrated to ``dp_epsilon`` when that is finite. The timeline draws a fixed-size sample
of the clients not in flight, not Poisson's: the accountant's q is that of McMahan et al.'s
sampling, the usual approximation for a fixed-size sample.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_async import privacy
from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedavg

CLIP = base.HParam("dp_update_clip", 2.0, "C, the L2 clip of each update (adaptive: C_0).",
                   bounds="(0, inf)")
NOISE = base.HParam("dp_noise_multiplier", 0.0, "z: noise std zC on the sum (0: none).",
                    bounds="[0, inf)")
EPSILON = base.HParam("dp_epsilon", math.inf, "Target epsilon: z calibrated (inf: none).",
                      bounds="(0, inf]")
DELTA = base.HParam("dp_delta", 1e-5, "The (epsilon, delta)'s delta.", bounds="(0, 1)")
QUANTILE = base.HParam("dp_quantile", 0.0, "gamma: C tracks this norm quantile (0: "
                       "fixed).", bounds="[0, 1)")
CLIP_LR = base.HParam("dp_clip_lr", 0.2, "eta_C, the adaptive clip's step.",
                      bounds="[0, inf)")
COUNT_NOISE = base.HParam("dp_count_noise", 0.05, "sigma_b / m, b~'s noise std (paper: "
                          "1/20).", bounds="(0, inf)")
HPARAMS = (CLIP, NOISE, EPSILON, DELTA, QUANTILE, CLIP_LR, COUNT_NOISE)
NOISE_STREAM = 0x0D9F  # the noise keys' root, apart from the clients' (device.client_key)


class DpState(NamedTuple):
  log_clip_scale: jax.Array  # float32 log(C_t / C_0): 0 with a fixed clip


class DpSums(NamedTuple):
  clipped: jax.Array  # [d] sum_k Delta_k'
  unclipped: jax.Array  # float32 sum_k b_k
  log_clip_scale: jax.Array  # the round's log(C_t / C_0), from the server state


def clip_norm(log_clip_scale, hp) -> jax.Array:
  """C_t = C_0 exp(log(C_t / C_0))."""
  return hp["dp_update_clip"] * jnp.exp(log_clip_scale)


def update_noise_multiplier(hp) -> jax.Array:
  """z_D: z with a fixed clip; (z^-2 - (2 sigma_b)^-2)^(-1/2) with an adaptive one (Andrew
  et al.), sigma_b = dp_count_noise * m."""
  z = jnp.asarray(hp["dp_noise_multiplier"], jnp.float32)
  two_sigma_b = 2.0 * hp["dp_count_noise"] * hp["dp_clients_per_round"]
  inner = jnp.maximum(1.0 / jnp.maximum(z, 1e-30) ** 2 - 1.0 / two_sigma_b ** 2, 1e-30)
  adaptive = jnp.where(z > 0, inner ** -0.5, 0.0)
  return jnp.where(hp["dp_quantile"] > 0, adaptive, z)


def noise_keys(hp, round_index):
  """(update noise key, count noise key) of round ``round_index``: a function of the run
  seed (``hp['dp_seed']``) and the round only."""
  root = jax.random.fold_in(jax.random.PRNGKey(NOISE_STREAM),
                            jnp.asarray(hp["dp_seed"]).astype(jnp.uint32))
  return jax.random.split(jax.random.fold_in(root, round_index))


def _init(w, server_state: DpState) -> DpSums:
  return DpSums(jnp.zeros_like(w), jnp.float32(0.0), server_state.log_clip_scale)


def _add(sums: DpSums, uploads, rows, hp) -> DpSums:
  """The chunk's valid deltas clipped to C_t and summed, and their b_k."""
  clip = clip_norm(sums.log_clip_scale, hp)
  norms = jnp.linalg.norm(uploads, axis=1)
  factor = jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-30))  # Alg. 1's per-user clip
  valid = jnp.asarray(rows.valid).astype(jnp.float32)
  clipped = sums.clipped + jnp.einsum("g,gd->d", valid * factor, uploads)
  unclipped = sums.unclipped + jnp.sum(valid * (norms <= clip))
  return DpSums(clipped, unclipped, sums.log_clip_scale)


def _finish(w, server_state: DpState, sums: DpSums, arrivals, round_index, hp):
  """The noised mean over m, the server's step, and C_{t+1} (Andrew et al.'s geometric update).

  Args:
    w: [d] the global model.
    server_state: ``DpState``.
    sums: the round's ``DpSums``.
    arrivals: the round's ``Arrivals``.
    round_index: the round (0-based).
    hp: the hyper-parameters.
  """
  del arrivals
  m = hp["dp_clients_per_round"]
  clip = clip_norm(server_state.log_clip_scale, hp)
  k_update, k_count = noise_keys(hp, round_index)
  sigma = update_noise_multiplier(hp) * clip  # z_D C_t
  noised = (sums.clipped + sigma * jax.random.normal(k_update, w.shape, w.dtype)) / m
  new_w = w + base.server_lr(hp, round_index) * noised
  sigma_b = hp["dp_count_noise"] * m
  below = (sums.unclipped + sigma_b * jax.random.normal(k_count, (), jnp.float32)) / m
  step = jnp.where(hp["dp_quantile"] > 0, -hp["dp_clip_lr"] * (below - hp["dp_quantile"]),
                   0.0)
  metrics = {"dp_update_clip": clip, "dp_unclipped_fraction": below}
  return new_w, DpState(server_state.log_clip_scale + step), metrics


SERVER = base.StreamedServer(init=_init, add=_add, finish=_finish)
SERVER_UPDATE = base.streamed_server_update(SERVER)


def private(algorithm: base.Algorithm, name: Optional[str] = None) -> base.Algorithm:
  """``algorithm``'s clients with DP-FedAvg's server (module docstring), named ``name``
  (default ``dp_<name>``), declaring ``HPARAMS`` beside its own."""
  if algorithm.server_update is None or algorithm.client_final is not base.delta_upload:
    raise ValueError(f"private: algorithm {algorithm.name!r} is no round rule whose clients "
                     "upload w_end - w_start (base.delta_upload), the update DP-FedAvg clips")
  if algorithm.client_state_keys:
    raise ValueError(f"private: algorithm {algorithm.name!r} keeps client state; DP-FedAvg's "
                     "clients keep none")
  own = tuple(h for h in algorithm.hparams if h.name not in {p.name for p in HPARAMS})
  return dataclasses.replace(
      algorithm, name=name or f"dp_{algorithm.name}", streamed_server=SERVER,
      server_update=SERVER_UPDATE, hparams=own + HPARAMS,
      init_server_state=lambda w0: DpState(jnp.float32(0.0)))


def is_private(algorithm) -> bool:
  """Whether ``algorithm`` runs DP-FedAvg's server (declares ``HPARAMS``)."""
  return algorithm is not None and CLIP in getattr(algorithm, "hparams", ())


def clients_per_round(num_clients: int, participation: float) -> int:
  """m, the clients the timeline samples a round (``timeline.build``'s)."""
  return max(1, int(round(participation * num_clients)))


def run_hparams(hp: dict, num_clients: int, participation: float, rounds: int,
                seed: int) -> dict:
  """``hp`` with what a run derives: ``dp_clients_per_round`` m, ``dp_seed``, and z
  calibrated to a finite ``dp_epsilon`` over ``rounds`` rounds at q = m / N
  (``privacy.calibrate_noise_multiplier``). ValueError naming the flag for z's given
  twice, or an adaptive clip whose 2 sigma_b <= z (z_D undefined).

  Args:
    hp: the run's hyper-parameters (``HPARAMS`` among them).
    num_clients: N.
    participation: the fraction sampled a round.
    rounds: T.
    seed: the run's seed (the noise keys').
  """
  m = clients_per_round(num_clients, participation)
  z, eps = float(hp["dp_noise_multiplier"]), float(hp["dp_epsilon"])
  if math.isfinite(eps):
    if z > 0:
      raise ValueError(f"algorithm.dp_noise_multiplier: give it or a finite "
                       f"algorithm.dp_epsilon, not both (got {z:g} and {eps:g})")
    z = privacy.calibrate_noise_multiplier(eps, float(hp["dp_delta"]), int(rounds),
                                           sampling_rate=m / num_clients)
  two_sigma_b = 2.0 * float(hp["dp_count_noise"]) * m
  if hp["dp_quantile"] > 0 and z >= two_sigma_b:
    raise ValueError(f"algorithm.dp_count_noise: an adaptive clip needs 2 sigma_b = "
                     f"{two_sigma_b:.3g} > z = {z:.3g} (z_D = (z^-2 - (2 sigma_b)^-2)^-1/2, "
                     f"Andrew et al.): set it above {z / (2 * m):.3g}")
  return dict(hp, dp_noise_multiplier=z, dp_clients_per_round=float(m),
              dp_seed=float(seed))


def report(hp: dict, num_clients: int, rounds_run: int) -> dict:
  """The privacy block of a DP-FedAvg run's summary: its (epsilon, delta) spent over the
  rounds it ran (``privacy.spent_epsilon``, Poisson-sampled at q = m / N)."""
  m = float(hp["dp_clients_per_round"])
  z, eps = float(hp["dp_noise_multiplier"]), float(hp["dp_epsilon"])
  q = min(1.0, m / num_clients)
  return {"mechanism": "dp_fedavg", "noise_multiplier": z,
          "update_noise_multiplier": float(update_noise_multiplier(hp)),
          "clip": float(hp["dp_update_clip"]), "quantile": float(hp["dp_quantile"]),
          "clients_per_round": m, "sampling_rate": q, "rounds": int(rounds_run),
          "delta": float(hp["dp_delta"]), "epsilon_target": eps if math.isfinite(eps) else None,
          "epsilon_spent": privacy.spent_epsilon(z, int(rounds_run), float(hp["dp_delta"]), q)}


def notice(run_name: str, block: dict, rounds: int) -> str:
  """One line before a DP-FedAvg run trains: its noise and the epsilon it will spend."""
  if block["noise_multiplier"] <= 0:
    return (f"[{run_name}] DP-FedAvg: updates clipped to C = {block['clip']:g}, no noise "
            "(epsilon inf; --dp_epsilon or --dp_noise_multiplier add it)")
  return (f"[{run_name}] DP-FedAvg: noise multiplier z = {block['noise_multiplier']:.4g}, "
          f"C = {block['clip']:g}, q = {block['sampling_rate']:.3g} over {rounds} rounds: "
          f"epsilon {block['epsilon_spent']:.4g} (delta {block['delta']:g})")


# FedAvg's clients (DP-FedProx from Python: private(fedprox.ALGORITHM, name=...)).
ALGORITHM = private(fedavg.ALGORITHM, name="dp_fedavg")
