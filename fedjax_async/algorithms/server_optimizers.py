"""Server optimisers on the aggregated update (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021): FedAvgM, FedAdam and FedYogi for any round rule.

The round's rule computes its step Delta_t = w_plain - w_t with eta = 1 (FedAvg's weighted
mean of the deltas, FedADMM's mean upload, PAFed's Eq. 17 sum); Delta_t is the negative
pseudo-gradient g_t = -Delta_t of an optax ``GradientTransformation``, and

  w_{t+1} = w_t - eta_t * tx.update(g_t)        (eta_t: algorithm.server_lr, its schedule)

  sgd       optax.identity()                          w + eta Delta (the rule itself)
  momentum  optax.trace(beta1)                        FedAvgM: v = beta1 v + Delta
  adam      optax.scale_by_adam(beta1, beta2, tau)    FedAdam
  yogi      optax.scale_by_yogi(beta1, beta2, tau)    FedYogi

Deviation: optax's Adam and Yogi correct the moments' bias (m / (1 - beta1^t)); Reddi et
al.'s Alg. 2 leaves it out "for ease of exposition". Their tau (adaptivity, 1e-3) is optax's
eps. Yogi's accumulators start at optax's 1e-6.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax

from fedjax_async.algorithms import base

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi")


def transformation(name: str, beta1: float = 0.9, beta2: float = 0.99,
                   tau: float = 1e-3) -> optax.GradientTransformation:
  """The optax transformation of the server optimiser ``name`` (``SERVER_OPTIMIZERS``)."""
  if name == "sgd":
    return optax.identity()
  if name == "momentum":
    return optax.trace(decay=beta1)
  if name == "adam":
    return optax.scale_by_adam(b1=beta1, b2=beta2, eps=tau)
  if name == "yogi":
    return optax.scale_by_yogi(b1=beta1, b2=beta2, eps=tau)
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
  (the rule's own, the optimiser's)."""
  if algorithm.server_update is None:
    raise ValueError(f"algorithm {algorithm.name!r}: a server optimiser needs a round rule "
                     "(server_update)")
  inner_update = algorithm.server_update

  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    own, opt_state = server_state
    plain, own, metrics = inner_update(w, own, uploads, arrivals, round_index, _unit_lr(hp))
    new_w, opt_state = _step(tx, w, plain, opt_state, round_index, hp)
    return new_w, (own, opt_state), metrics

  streamed = algorithm.streamed_server
  if streamed is not None:
    def finish(w, server_state, carry, arrivals, round_index, hp):
      own, opt_state = server_state
      plain, own, metrics = streamed.finish(w, own, carry, arrivals, round_index,
                                            _unit_lr(hp))
      new_w, opt_state = _step(tx, w, plain, opt_state, round_index, hp)
      return new_w, (own, opt_state), metrics

    streamed = streamed._replace(finish=finish)
  init_inner = algorithm.init_server_state
  return dataclasses.replace(
      algorithm, server_update=server_update, streamed_server=streamed,
      init_server_state=lambda w0: (init_inner(w0), tx.init(jnp.asarray(w0, jnp.float32))))


def configured(algorithm: base.Algorithm, cfg) -> base.Algorithm:
  """``algorithm`` with the server optimiser of ``cfg`` (an ``AlgorithmConfig``); itself
  for ``sgd``."""
  if cfg.server_optimizer == "sgd":
    return algorithm
  return with_server_optimizer(algorithm, transformation(
      cfg.server_optimizer, cfg.server_beta1, cfg.server_beta2, cfg.server_tau))
