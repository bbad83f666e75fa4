"""Client-side differential privacy: the seed's noise scale and an honest accountant.

The seed (PrivaAsyncFed, Cheng, Xue, Zhu; Alg. 1 lines 15-24) clips each local step's
gradient to L2 norm C, takes the SGD step w <- w - mu g~, and adds N(0, sigma^2) to every
parameter with sigma = Delta f / epsilon, Delta f = mu * 2C / |D_k| (Eq. 24). It treats
epsilon as the budget of that one step and never composes the many steps (and tasks) of a
client. This module

* reproduces that calibration (``alg1_sigma``; ``eq25_sigma`` is Eq. 25's Gaussian-mechanism
  variant with the sqrt(2 ln(1.25/delta)) factor);
* gives the L2 sensitivity a step really has (``step_sensitivity``): with per-example
  clipping (Eq. 17) and a mean over a minibatch of b rows, replacing one example moves the
  step by at most mu * 2C / b (not / |D_k|: only the minibatch enters a step); with the
  whole minibatch gradient clipped (Alg. 1 line 20) one example can move it by mu * 2C;
* reports the (epsilon, delta) actually spent by all of a client's steps with dp-accounting's
  RDP accountant: ``count`` compositions of a Gaussian mechanism with noise multiplier
  z = sigma / sensitivity (``spent_epsilon``); no subsampling amplification is claimed (the
  engine shuffles, it does not Poisson-sample), so this is an upper bound;
* calibrates sigma to a target total epsilon by bisection (``calibrate_noise_multiplier``,
  ``calibrate_sigma``);
* for DP-FedAvg on the round engine (``algorithms.dp_fedavg``), the same with each round's
  clients Poisson-sampled at rate q (``sampling_rate``: McMahan et al. 2018's sampling, the
  subsampled Gaussian's RDP at the integer orders ``SAMPLED_ORDERS``).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np


def validate(epsilon: float, delta: float, clip: float):
  """ValueError naming the flag for an invalid privacy setting (epsilon = inf: no DP)."""
  if not epsilon > 0:  # also catches NaN
    raise ValueError(f"privacy.dp_epsilon: must be > 0 (or inf for no noise), got {epsilon}")
  if not 0.0 < delta < 1.0:
    raise ValueError(f"privacy.dp_delta: must be in (0, 1), got {delta}")
  if not (clip > 0 and math.isfinite(clip)):
    raise ValueError(f"privacy.dp_clip: must be a finite number > 0, got {clip}")


def alg1_sensitivity(lr, clip, num_examples):
  """Delta f = mu * 2C / |D_k| (PrivaAsyncFed Alg. 1 line 15, Eq. 24)."""
  return lr * 2.0 * clip / num_examples


def alg1_sigma(lr, clip, num_examples, epsilon):
  """The seed's noise std sigma = Delta f / epsilon (Alg. 1 line 24); 0 for epsilon = inf."""
  return alg1_sensitivity(lr, clip, num_examples) / epsilon


def eq25_sigma(lr, clip, num_examples, epsilon, delta):
  """Eq. 25: sigma = Delta f sqrt(2 ln(1.25 / delta)) / epsilon (one Gaussian mechanism).

  Args:
    lr: the local learning rate mu.
    clip: the clipping norm C.
    num_examples: |D_k|, the client's example count.
    epsilon: the per-step budget.
    delta: the per-step failure probability.
  """
  return alg1_sensitivity(lr, clip, num_examples) * jnp.sqrt(2.0 * jnp.log(1.25 / delta)
                                                             ) / epsilon


def smallest_batch(num_examples, batch_size):
  """Rows in a client's smallest minibatch (its last, partial one): n - (ceil(n/B)-1) B."""
  n = jnp.asarray(num_examples)
  full = (n + batch_size - 1) // batch_size - 1
  return jnp.maximum(n - full * batch_size, 1)


def step_sensitivity(lr, clip, batch_rows, clip_mode: str = "example"):
  """L2 sensitivity of one noisy step w.r.t. replacing one example of the client.

  'example' (Eq. 17: per-example clipping, mean over ``batch_rows``): lr * 2C / b;
  'batch' (Alg. 1 line 20: the minibatch gradient clipped as a whole): lr * 2C.
  """
  if clip_mode == "batch":
    return lr * 2.0 * clip + 0.0 * batch_rows
  return lr * 2.0 * clip / batch_rows


# RDP orders of the subsampled Gaussian: integer ones only (dp-accounting's closed form;
# its fractional orders need a slow series that warns at small q), 0.07 s an evaluation.
SAMPLED_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 192, 256, 512)


def spent_epsilon(noise_multiplier: float, steps: int, delta: float,
                  sampling_rate: float = 1.0) -> float:
  """epsilon after ``steps`` Gaussian mechanisms of noise multiplier z (RDP, then (eps,
  delta) conversion), each on a Poisson sample at rate ``sampling_rate`` q when q < 1
  (``SAMPLED_ORDERS``). inf for z = 0 with steps > 0, 0 for no steps."""
  if steps <= 0:
    return 0.0
  if not noise_multiplier > 0:
    return math.inf
  # Google's accountant (with scipy: ~0.75 s to import) is loaded by DP runs only
  import dp_accounting  # pylint: disable=g-import-not-at-top
  event = dp_accounting.GaussianDpEvent(float(noise_multiplier))
  if sampling_rate < 1:
    acc = dp_accounting.rdp.RdpAccountant(list(SAMPLED_ORDERS))
    event = dp_accounting.PoissonSampledDpEvent(float(sampling_rate), event)
  else:
    acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(event, int(steps))
  return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def calibrate_noise_multiplier(target_epsilon: float, delta: float, steps: int,
                               tol: float = 1e-4, hi: float = 1e4,
                               sampling_rate: float = 1.0) -> float:
  """Smallest z (bisection, relative tolerance ``tol``) with spent_epsilon(z) <= target.

  Args:
    target_epsilon: the total epsilon to spend (inf: 0, no noise).
    delta: the target delta.
    steps: the number of noisy steps composed.
    tol: the bisection's relative tolerance.
    hi: the largest z tried (ValueError if even it spends more).
    sampling_rate: q, each step's Poisson sampling rate (1: none).
  """
  validate(target_epsilon, delta, 1.0)
  if not math.isfinite(target_epsilon):
    return 0.0
  spent = lambda z: spent_epsilon(z, steps, delta, sampling_rate)
  lo = 1e-3
  if spent(lo) <= target_epsilon:
    return lo
  if spent(hi) > target_epsilon:
    raise ValueError(f"privacy.dp_epsilon={target_epsilon} is not reachable with z <= {hi}")
  while hi - lo > tol * lo:
    mid = math.sqrt(lo * hi)
    if spent(mid) <= target_epsilon:
      hi = mid
    else:
      lo = mid
  return hi


def calibrate_sigma(target_epsilon: float, delta: float, steps: int,
                    sensitivity: float = 1.0, tol: float = 1e-4) -> float:
  """Noise std so that ``steps`` steps of L2 sensitivity ``sensitivity`` spend at most
  (target_epsilon, delta): sigma = z * sensitivity.

  Args:
    target_epsilon: the total epsilon to spend.
    delta: the target delta.
    steps: the number of noisy steps composed.
    sensitivity: one step's L2 sensitivity.
    tol: the bisection's relative tolerance.
  """
  return calibrate_noise_multiplier(target_epsilon, delta, steps, tol) * sensitivity


def account_clients(steps: Sequence[int], sigmas: Sequence[float],
                    sensitivities: Sequence[float], delta: float) -> np.ndarray:
  """Per-client epsilon spent: client i ran steps[i] steps with noise std sigmas[i] and
  per-step sensitivity sensitivities[i]."""
  out = np.zeros(len(steps))
  cache = {}
  for i, (s, sig, sens) in enumerate(zip(steps, sigmas, sensitivities)):
    z = float(sig) / float(sens)
    key = (round(z, 12), int(s))
    if key not in cache:
      cache[key] = spent_epsilon(z, int(s), delta)
    out[i] = cache[key]
  return out


def report(steps, counts, *, lr: float, clip: float, epsilon: float, delta: float,
           batch_size: int, clip_mode: str, noise_multiplier: float = 0.0) -> dict:
  """The privacy block of a run summary: the seed's per-step epsilon beside the (epsilon,
  delta) every client actually spent over all its steps.

  Args:
    steps: the local steps each client took.
    counts: each client's example count.
    lr: the local learning rate.
    clip: the clipping norm C.
    epsilon: the seed's per-step epsilon (Alg. 1's noise when ``noise_multiplier`` is 0).
    delta: the delta the spent epsilons are reported at.
    batch_size: the local minibatch size (a client's smallest batch sets its sensitivity).
    clip_mode: ``example`` or ``batch`` (``step_sensitivity``).
    noise_multiplier: z of calibrated noise (0: the seed's Alg. 1 sigma).
  """
  counts = np.asarray(counts, np.float64)
  rows = np.asarray(smallest_batch(counts, batch_size), np.float64)
  sens = np.asarray(step_sensitivity(lr, clip, rows, clip_mode), np.float64)
  sens = np.broadcast_to(sens, counts.shape)
  if noise_multiplier > 0:
    sigmas = noise_multiplier * sens
  else:
    sigmas = np.asarray(alg1_sigma(lr, clip, counts, epsilon), np.float64)
  eps = account_clients(steps, sigmas, sens, delta)
  finite = eps[np.isfinite(eps)]
  return {
      "seed_per_step_epsilon": epsilon, "delta": delta, "clip": clip, "clip_mode": clip_mode,
      "noise_mode": "calibrated" if noise_multiplier > 0 else "alg1",
      "noise_multiplier": [float(s / t) for s, t in zip(sigmas, sens)],
      "steps_per_client": [int(s) for s in steps],
      "epsilon_spent_per_client": [float(e) for e in eps],
      "epsilon_spent_max": float(eps.max()) if eps.size else 0.0,
      "epsilon_spent_median": float(np.median(finite)) if finite.size else math.inf,
  }
