"""FedEDS's schedules: piecewise epoch annealing (Eq. 5), the transfer weights
(Eqs. 9-10), the equal-work baseline's epochs, ``FedEDSConfig`` (Sec. VI-A3) and the
engine hp of one round."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np


Array = jax.Array


# ------------------------------------------------------------------------ schedules


def annealed_epochs(t, e_max, e_min, t_alpha, t_beta):
  """Local epochs E_t of round t (1-based) by piecewise epoch annealing (Eq. 5).

  E_t = E_max for t <= T_alpha; E_max - floor((E_max - E_min)(t - T_alpha) /
  (T_beta - T_alpha)) for T_alpha < t <= T_beta; E_min for t > T_beta. Works on Python
  ints (host) and on traced scalars.

  Args:
    t: the round (1-based; an int or a traced scalar).
    e_max: E_max.
    e_min: E_min.
    t_alpha: T_alpha, the last round at E_max.
    t_beta: T_beta, the last annealed round (E_min after it).
  """
  if isinstance(t, (int, np.integer)):
    if t <= t_alpha:
      return int(e_max)
    if t <= t_beta:
      return int(e_max - ((e_max - e_min) * (t - t_alpha)) // (t_beta - t_alpha))
    return int(e_min)
  t = jnp.asarray(t)
  span = max(t_beta - t_alpha, 1)
  mid = e_max - jnp.floor_divide((e_max - e_min) * (t - t_alpha), span)
  return jnp.where(t <= t_alpha, e_max, jnp.where(t <= t_beta, mid, e_min)).astype(jnp.int32)


def transfer_weights(t, m: float = 3.0, eps: float = 0.01) -> Tuple[float, float]:
  """(lambda_c, lambda_dis) of round t (1-based), Eqs. 9-10.

  lambda_c = sigmoid(m (t - 1)), lambda_dis = 1 - lambda_c; once lambda_dis < eps it is
  set to 0 and lambda_c to 1. Round 1 gives (0.5, 0.5).
  """
  z = math.exp(-m * (t - 1))
  lam_dis = z / (1.0 + z)
  if lam_dis < eps:
    return 1.0, 0.0
  return 1.0 / (1.0 + z), lam_dis


def equal_work_epochs(num_rounds: int, cfg: "FedEDSConfig") -> list:
  """Per-round local epochs of the equal-work baseline: the same total as FedEDS's
  annealed E_1..E_T (Eq. 5), spread as evenly as integers allow (floor(total / T) each,
  one more in the rounds where floor(r * extra / T) steps up). Every client takes
  ceil(n_i / B) steps per epoch, so the baseline takes exactly FedEDS's local steps."""
  total = sum(annealed_epochs(t, cfg.e_max, cfg.e_min, cfg.t_alpha, cfg.t_beta)
              for t in range(1, num_rounds + 1))
  base, extra = divmod(total, num_rounds)
  return [base + ((r + 1) * extra // num_rounds - r * extra // num_rounds)
          for r in range(num_rounds)]


@dataclasses.dataclass(frozen=True)
class FedEDSConfig:
  """The paper's Sec. VI-A3 settings (defaults) plus this implementation's choices."""

  e_max: int = 5  # E_max (Eq. 5)
  e_min: int = 1  # E_min
  t_alpha: int = 1  # T_alpha^turn
  t_beta: int = 3  # T_beta^turn
  m: float = 3.0  # speed of lambda_c / lambda_dis (Eqs. 9-10)
  eps: float = 0.01  # lambda_dis below eps is switched off
  lr: float = 0.01  # client SGD
  momentum: float = 0.9
  weight_decay: float = 1e-4
  batch_size: int = 50
  pretrain_epochs: int = 5  # E_c of Alg. 1 (not given in the paper)
  encryptor_epochs: int = 20  # E_g of Alg. 1 (Sec. VI-D: 20 epochs)
  encryptor_lr: float = 1e-3  # AdamW
  encryptor_weight_decay: float = 1e-2  # AdamW's usual default (not given in the paper)
  unet_width: int = 16  # channels of the UNet's first level (doubled per level)
  transfer_batch: int = 50  # encrypted rows per local step in the KL term
  layer_gain_std: float = 1.0  # s: theta_l gain = 1 + s * A_k, A_k ~ N(0, 1)
  layer_bias_std: float = 1.0  # theta_l bias = b * B_k, B_k ~ N(0, 1)

  def __post_init__(self):
    checks = [
        ("e_min", self.e_min >= 1, ">= 1"),
        ("e_max", self.e_max >= self.e_min, ">= e_min"),
        ("t_alpha", self.t_alpha >= 0, ">= 0"),
        ("t_beta", self.t_beta > self.t_alpha, "> t_alpha"),
        ("eps", 0.0 <= self.eps < 0.5, "in [0, 0.5)"),
        ("batch_size", self.batch_size >= 1, ">= 1"),
        ("transfer_batch", self.transfer_batch >= 1, ">= 1"),
        ("pretrain_epochs", self.pretrain_epochs >= 1, ">= 1"),
        ("encryptor_epochs", self.encryptor_epochs >= 1, ">= 1"),
    ]
    for name, ok, what in checks:
      if not ok:
        raise ValueError(f"FedEDSConfig.{name} must be {what}, got {getattr(self, name)}")


def round_hparams(base_hp: Dict[str, float], t: int, cfg: FedEDSConfig, *, anneal: bool,
                  share: bool, fixed_epochs: int = 1) -> Dict[str, float]:
  """The engine ``hp`` of round t (1-based) for FedEDS / its ablations (Alg. 2, l. 2-3).

  ``local_epochs`` is E_t (Eq. 5) with ``anneal`` else ``fixed_epochs`` (an int, or a
  per-round sequence indexed by t - 1, e.g. ``equal_work_epochs``); with ``share``
  the transfer weights come from Eqs. 9-10, else (1, 0). The engine's loss is
  CE + local_penalty, so ``wrap``'s penalty divides by lambda_c and the learning rate is
  scaled by lambda_c here: lr * lambda_c * (CE + pen / lambda_c) = lr * (lambda_c CE + pen),
  the gradient of Eq. 8 (Eq. 11 for FedProx) exactly.

  Args:
    base_hp: the hyper-parameters every round starts from.
    t: the round (1-based).
    cfg: the ``FedEDSConfig``.
    anneal: E_t by Eq. 5 (else ``fixed_epochs``).
    share: the transfer weights of Eqs. 9-10 (else (1, 0)).
    fixed_epochs: the epochs without ``anneal``: an int, or one per round.
  """
  lam_c, lam_dis = transfer_weights(t, cfg.m, cfg.eps) if share else (1.0, 0.0)
  hp = dict(base_hp)
  hp["local_epochs"] = (annealed_epochs(t, cfg.e_max, cfg.e_min, cfg.t_alpha, cfg.t_beta)
                        if anneal else int(fixed_epochs) if np.ndim(fixed_epochs) == 0
                        else int(fixed_epochs[t - 1]))
  hp["fededs_lambda_c"] = lam_c
  hp["fededs_lambda_dis"] = lam_dis
  hp["lr"] = base_hp["lr"] * lam_c
  return hp
