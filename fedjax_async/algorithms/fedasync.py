"""FedAsync (Xie, Koyejo, Gupta, 2019): staleness-weighted model mixing on every arrival.

A client trains from the model w_tau it was dispatched with, minimising
f(w) + mu/2 ||w - w_tau||^2 (FedAsync's regularised local objective; mu = 0 is plain SGD),
and uploads its model w_new. On arrival at server version t the server mixes

    w_t = (1 - a_t) w_{t-1} + a_t w_new,   a_t = a * s(t - tau)          (FedAsync Alg. 1)

with one of the paper's staleness functions s (FedAsync Sec. 5.2):

* constant:   s(t - tau) = 1;
* polynomial: s(t - tau) = (t - tau + 1)^(-a_poly);
* hinge:      s(t - tau) = 1 if t - tau <= b else 1 / (a_h (t - tau - b) + 1);
* threshold:  s(t - tau) = 1 if t - tau <= c else v (FLSim's ThresholdStalenessWeight).

FLSim divides s by s(avg_staleness); ``avg_staleness`` = 0 (the default) divides by
s(0) = 1, FedAsync's form. Arrivals may also be weighted by their example count n
(``example_weight``: FLSim's example weights f(n) / f(avg_num_examples), f(n) = n,
sqrt(n) or log10(1 + n)); a_t is then a s(t - tau) f(n) / f(avg_n), at most 1.

t - tau is the number of server versions between the client's dispatch and the update's
arrival (the engine's ``Arrival.staleness``): 0 for an update trained from the current
model, as FedAsync's released code counts it (xcgoner/async_fl:
``worker_delay = epoch - worker_ts``, the model made at epoch e stamped e + 1) and FedLab
(``staleness = self.round - receive_model_time``). A fresh update is thus weighted
s(0) = 1 (a_t = a) and the hinge bends after staleness b.

Hyperparameters: ``mix_alpha`` (a), ``staleness_fn`` (0 constant, 1 polynomial, 2 hinge,
3 threshold; a traced code so sweeps can vmap it), ``poly_a``, ``hinge_a``, ``hinge_b``,
``threshold_cutoff``, ``threshold_value``, ``avg_staleness``, ``example_weight`` (0 none,
1 linear, 2 sqrt, 3 log10), ``avg_num_examples``, ``mu``.
"""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedprox

MU = base.HParam("mu", 0.0, "Proximal coefficient of the local objective.", bounds="[0, inf)")
POLY_A = base.HParam("poly_a", 0.5, "a of the polynomial staleness s.",
                     bounds="[0, inf)")
HINGE_A = base.HParam("hinge_a", 10.0, "a, the hinge staleness s's slope.",
                      bounds="(0, inf)")
HINGE_B = base.HParam("hinge_b", 4.0, "b, the staleness where the hinge bends.", bounds="[0, inf)")


THRESHOLD_CUTOFF = base.HParam("threshold_cutoff", 4.0, "c: threshold s is 1 up to c.",
                               bounds="[0, inf)")
THRESHOLD_VALUE = base.HParam("threshold_value", 0.5, "v: threshold s past c.",
                              bounds="[0, inf)")
AVG_STALENESS = base.HParam("avg_staleness", 0.0, "s / s(this) (FLSim's; 0: s).",
                            bounds="[0, inf)")
AVG_NUM_EXAMPLES = base.HParam("avg_num_examples", 1.0, "f(n) / f(this).",
                               bounds="(0, inf)")
# Example weights' f (``hp["example_weight"]``'s index; FLSim's AsyncExampleWeight).
EXAMPLE_WEIGHTS = ("none", "linear", "sqrt", "log10")
# The staleness functions s (``hp["staleness_fn"]``'s index).
STALENESS_FNS = ("constant", "polynomial", "hinge", "threshold")


def mix_alpha_problem(text) -> Optional[str]:
  """None when ``text`` is a comma list of distinct a in (0, 1] (a run each), else what is
  wrong."""
  try:
    alphas = [float(v) for v in str(text).split(",") if v.strip()]
  except ValueError:
    return f"expected comma-separated numbers, got {text!r}"
  if not alphas or len(set(alphas)) != len(alphas):
    return f"needs distinct values (one run each), got {text!r}"
  return next((f"must be in (0, 1], got {a}" for a in alphas if not 0 < a <= 1), None)


MIX_ALPHA = base.Option("mix_alpha", "0.6", "FedAsync's a (comma list: one run each).",
                        check=mix_alpha_problem)
STALENESS_FN = base.Option("staleness_fn", "hinge", "constant | polynomial | hinge | threshold "
                           "(FedAsync; threshold: FLSim's).", STALENESS_FNS)
EXAMPLE_WEIGHT = base.Option("example_weight", "none", "FedAsync / FedBuff arrivals weighted "
                             "by f(n): none | linear | sqrt | log10 (FLSim's).", EXAMPLE_WEIGHTS)
OPTIONS = (MIX_ALPHA, STALENESS_FN, EXAMPLE_WEIGHT)

HPARAMS = (MU, POLY_A, HINGE_A, HINGE_B, THRESHOLD_CUTOFF, THRESHOLD_VALUE, AVG_STALENESS,
           AVG_NUM_EXAMPLES)


def constant_staleness(staleness):
  """s(t - tau) = 1."""
  return jnp.ones_like(jnp.asarray(staleness, jnp.float32))


def polynomial_staleness(staleness, a):
  """s(t - tau) = (t - tau + 1)^(-a)."""
  return jnp.power(jnp.asarray(staleness, jnp.float32) + 1.0, -a)


def hinge_staleness(staleness, a, b):
  """s(t - tau) = 1 if t - tau <= b else 1 / (a (t - tau - b) + 1)."""
  s = jnp.asarray(staleness, jnp.float32)
  return jnp.where(s <= b, 1.0, 1.0 / (a * (s - b) + 1.0))


def threshold_staleness(staleness, cutoff, value):
  """s(t - tau) = 1 if t - tau <= c else v."""
  s = jnp.asarray(staleness, jnp.float32)
  return jnp.where(s <= cutoff, 1.0, jnp.asarray(value, jnp.float32))


def _raw_staleness(staleness, hp):
  kind = jnp.asarray(hp["staleness_fn"])
  return jnp.select(
      [kind == 1, kind == 2, kind == 3],
      [polynomial_staleness(staleness, hp["poly_a"]),
       hinge_staleness(staleness, hp["hinge_a"], hp["hinge_b"]),
       threshold_staleness(staleness, hp["threshold_cutoff"], hp["threshold_value"])],
      constant_staleness(staleness))


def staleness_weight(staleness, hp):
  """s(t - tau) / s(avg_staleness), s chosen by ``hp['staleness_fn']`` (0 constant,
  1 polynomial, 2 hinge, 3 threshold); ``avg_staleness`` 0: s(t - tau) itself."""
  return _raw_staleness(staleness, hp) / _raw_staleness(hp["avg_staleness"], hp)


def _raw_example_weight(n, kind):
  n = jnp.asarray(n, jnp.float32)
  return jnp.select([kind == 1, kind == 2, kind == 3],
                    [n, jnp.sqrt(n), jnp.log10(1.0 + n)], jnp.ones_like(n))


def example_weight(num_examples, hp):
  """f(n) / f(avg_num_examples) by ``hp['example_weight']`` (``EXAMPLE_WEIGHTS``' index;
  0: 1)."""
  kind = jnp.asarray(hp["example_weight"])
  return (_raw_example_weight(num_examples, kind)
          / _raw_example_weight(hp["avg_num_examples"], kind))


def mix(w, w_new, alpha):
  """(1 - alpha) w + alpha w_new."""
  return (1.0 - alpha) * w + alpha * w_new


def server_step(w, server_state, upload, arrival, hp):
  """w_t = (1 - a_t) w_{t-1} + a_t w_new, a_t = a s(t - tau) (Alg. 1), t - tau = staleness.

  Args:
    w: [d] the model current at the arrival.
    server_state: the server's state.
    upload: [d] the client's trained model.
    arrival: the ``Arrival``.
    hp: the hyper-parameters.
  """
  alpha = hp["mix_alpha"] * staleness_weight(arrival.staleness, hp)
  alpha = jnp.minimum(alpha * example_weight(arrival.num_examples, hp), 1.0)
  return mix(w, upload, alpha), server_state


ALGORITHM = base.Algorithm(
    name="fedasync",
    local_penalty=fedprox.proximal_penalty,  # mu/2 ||w - w_tau||^2
    client_final=base.model_upload,
    server_step=server_step,
    hparams=HPARAMS,
)
