"""Server optimisers on the aggregated update (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021): FedAvgM, FedAdam, FedYogi and FedAdagrad for any round rule.

The round's rule computes its step Delta_t = w_plain - w_t with eta = 1 (FedAvg's weighted
mean of the deltas, FedADMM's mean upload, PAFed's Eq. 17 sum); Delta_t is the negative
pseudo-gradient g_t = -Delta_t of an optax ``GradientTransformation``, and

  w_{t+1} = w_t - eta_t * tx.update(g_t)        (eta_t: algorithm.server_lr, its schedule)

  sgd       optax.identity()              w + eta Delta (the rule itself)
  momentum  optax.trace(beta1)            FedAvgM: v = beta1 v + Delta
  adam      scale_by_adaptive("adam")     FedAdam:    v = beta2 v + (1 - beta2) g^2
  yogi      scale_by_adaptive("yogi")     FedYogi:    v = v - (1 - beta2) sign(v - g^2) g^2
  adagrad   scale_by_adaptive("adagrad")  FedAdagrad: v = v + g^2

with m = beta1 m + (1 - beta1) g and the step m / (sqrt(v + eps_root) + tau) (Reddi et
al.'s Alg. 2; eps_root = 0 there). Options beside the paper's, each set to reach a peer's
form (docs/api.md, "Conventions beside the peers'"): ``bias_correction`` (adam, yogi):
``moments``, m / (1 - beta1^t) and v / (1 - beta2^t) (optax's, the default), ``step``,
the step times sqrt(1 - beta2^t) / (1 - beta1^t) with tau beside the uncorrected root
(TFF's and Flower's), or ``none`` (Alg. 2 leaves it out "for ease of exposition");
``eps_root`` (TFF's and optax's Adagrad add their epsilon inside the
root), ``accumulator`` v_0 (None: yogi's 1e-6 as optax, 0 for adam and adagrad; TFF's
Adagrad starts at 0.1). Yogi's m starts at v_0 too, as optax's does.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_async.algorithms import base

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi", "adagrad")
ADAPTIVE = ("adam", "yogi", "adagrad")
# v_0 when none is given (optax's Yogi starts its moments at 1e-6).
DEFAULT_ACCUMULATOR = {"adam": 0.0, "yogi": 1e-6, "adagrad": 0.0}
BIAS_CORRECTIONS = ("moments", "step", "none")


class AdaptiveState(NamedTuple):
  count: jax.Array  # int32 t, steps taken
  mu: jax.Array  # m, the first moment
  nu: jax.Array  # v, the second moment (Adagrad's sum of squares)


def scale_by_adaptive(kind: str, beta1: float = 0.9, beta2: float = 0.99,
                      tau: float = 1e-3, eps_root: float = 0.0,
                      accumulator: Optional[float] = None,
                      bias_correction="moments") -> optax.GradientTransformation:
  """Reddi et al.'s Alg. 2 second-moment rules as an optax ``GradientTransformation``.

  Args:
    kind: ``adam``, ``yogi`` or ``adagrad``: how v follows g^2.
    beta1: the first moment's decay (0: m = g).
    beta2: the second moment's decay (adam, yogi; adagrad ignores it).
    tau: the adaptivity, added outside the square root.
    eps_root: added inside the square root.
    accumulator: v_0 (None: ``DEFAULT_ACCUMULATOR[kind]``).
    bias_correction: adam's and yogi's (``BIAS_CORRECTIONS``; True: ``moments``, False:
      ``none``); adagrad is never corrected.
  """
  if kind not in ADAPTIVE:
    raise ValueError(f"scale_by_adaptive: kind is one of {', '.join(ADAPTIVE)}, got {kind!r}")
  v0 = DEFAULT_ACCUMULATOR[kind] if accumulator is None else float(accumulator)
  m0 = v0 if kind == "yogi" else 0.0
  mode = {True: "moments", False: "none"}.get(bias_correction, bias_correction)
  if mode not in BIAS_CORRECTIONS:
    raise ValueError(f"algorithm.server_bias_correction: one of {', '.join(BIAS_CORRECTIONS)}, "
                     f"got {bias_correction!r}")
  mode = "none" if kind == "adagrad" else mode

  def init(params):
    return AdaptiveState(jnp.zeros([], jnp.int32), jnp.full_like(params, m0),
                         jnp.full_like(params, v0))

  def update(g, state, params=None):
    del params
    mu = beta1 * state.mu + (1.0 - beta1) * g
    g2 = jnp.square(g)
    if kind == "adam":
      nu = beta2 * state.nu + (1.0 - beta2) * g2
    elif kind == "yogi":
      nu = state.nu - (1.0 - beta2) * jnp.sign(state.nu - g2) * g2
    else:  # adagrad
      nu = state.nu + g2
    count = state.count + 1
    t = count.astype(jnp.float32)
    mu_hat, nu_hat, scale = mu, nu, 1.0
    if mode == "moments":
      mu_hat, nu_hat = mu / (1.0 - beta1 ** t), nu / (1.0 - beta2 ** t)
    elif mode == "step":
      scale = jnp.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
    step = scale * mu_hat / (jnp.sqrt(nu_hat + eps_root) + tau)
    return step, AdaptiveState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def transformation(name: str, beta1: float = 0.9, beta2: float = 0.99,
                   tau: float = 1e-3, eps_root: float = 0.0,
                   accumulator: Optional[float] = None,
                   bias_correction="moments") -> optax.GradientTransformation:
  """The optax transformation of the server optimiser ``name`` (``SERVER_OPTIMIZERS``).

  Args:
    name: sgd, momentum, adam, yogi or adagrad.
    beta1: momentum's decay; the adaptive rules' first-moment decay.
    beta2: adam's and yogi's second-moment decay.
    tau: the adaptive rules' adaptivity (outside the root).
    eps_root: the adaptive rules' term inside the root.
    accumulator: the adaptive rules' v_0 (None: each one's default).
    bias_correction: adam's and yogi's bias correction (``BIAS_CORRECTIONS``).
  """
  if name == "sgd":
    return optax.identity()
  if name == "momentum":
    return optax.trace(decay=beta1)
  if name in ADAPTIVE:
    return scale_by_adaptive(name, beta1, beta2, tau, eps_root, accumulator,
                             bias_correction)
  raise ValueError(f"algorithm.server_optimizer: unknown {name!r}; choices: "
                   f"{', '.join(SERVER_OPTIMIZERS)}")


def _unit_lr(hp):
  return dict(hp, server_lr=jnp.float32(1.0), server_lr2=jnp.float32(1.0))


def _step(tx, w, new_plain, opt_state, round_index, hp):
  updates, opt_state = tx.update(-(new_plain - w), opt_state)  # g_t = -Delta_t
  return w - base.server_lr(hp, round_index) * updates, opt_state


def with_server_optimizer(algorithm: base.Algorithm,
                          tx: optax.GradientTransformation) -> base.Algorithm:
  """``algorithm`` (a round rule) with ``tx`` applied to its step; its server state is
  (the rule's own, the optimiser's), or for a rule whose clients read its state (a dict,
  ``client_reads_server``) that dict with the optimiser's under ``"server_optimizer"``."""
  if algorithm.server_update is None:
    raise ValueError(f"algorithm {algorithm.name!r}: a server optimiser needs a round rule "
                     "(server_update)")
  inner_update = algorithm.server_update
  reads = bool(algorithm.client_reads_server)

  def unpack(server_state):
    if not reads:
      return server_state
    own = dict(server_state)
    return own, own.pop("server_optimizer")

  def pack(own, opt_state):
    return dict(own, server_optimizer=opt_state) if reads else (own, opt_state)

  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    """The rule's step (at server lr 1) as the optimiser's pseudo-gradient.

    Args:
      w: [d] the global model.
      server_state: the server's state.
      uploads: [K, d] the round's uploads.
      arrivals: their ``Arrivals``.
      round_index: the round (0-based).
      hp: the hyper-parameters.
    """
    own, opt_state = unpack(server_state)
    plain, own, metrics = inner_update(w, own, uploads, arrivals, round_index, _unit_lr(hp))
    new_w, opt_state = _step(tx, w, plain, opt_state, round_index, hp)
    return new_w, pack(own, opt_state), metrics

  inner_streamed = algorithm.streamed_server
  streamed = None
  if inner_streamed is not None:
    inner_finish = inner_streamed.finish

    def finish(w, server_state, carry, arrivals, round_index, hp):
      """The streamed rule's ``finish`` (at server lr 1), then the optimiser's step.

      Args:
        w: [d] the global model.
        server_state: the server's state.
        carry: the streamed rule's carry.
        arrivals: the round's ``Arrivals`` [K].
        round_index: the round (0-based).
        hp: the hyper-parameters.
      """
      own, opt_state = unpack(server_state)
      plain, own, metrics = inner_finish(w, own, carry, arrivals, round_index, _unit_lr(hp))
      new_w, opt_state = _step(tx, w, plain, opt_state, round_index, hp)
      return new_w, pack(own, opt_state), metrics

    streamed = inner_streamed._replace(
        init=lambda w, server_state: inner_streamed.init(w, unpack(server_state)[0]),
        finish=finish)
  init_inner = algorithm.init_server_state
  return dataclasses.replace(
      algorithm, server_update=server_update, streamed_server=streamed,
      init_server_state=lambda w0: pack(init_inner(w0), tx.init(jnp.asarray(w0, jnp.float32))))


def configured(algorithm: base.Algorithm, cfg) -> base.Algorithm:
  """``algorithm`` with the server optimiser of ``cfg`` (an ``AlgorithmConfig``); itself
  for ``sgd``."""
  if cfg.server_optimizer == "sgd":
    return algorithm
  return with_server_optimizer(algorithm, transformation(
      cfg.server_optimizer, cfg.server_beta1, cfg.server_beta2, cfg.server_tau,
      cfg.server_eps_root, cfg.server_accumulator, cfg.server_bias_correction))
