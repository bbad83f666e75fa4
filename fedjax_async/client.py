"""Local training of one client, written for ``jax.vmap`` over a client axis.

fedjax-style split into ``client_init`` / ``client_step`` / ``client_final``:

* ``client_init`` draws the client's local epoch count and one shuffle of its own examples
  per epoch (padding rows sort last, so they are never drawn); ``minibatches`` turns
  them into every step's rows and mask;
* ``client_step`` (built by ``make_client_step``) takes one optax SGD step on a minibatch
  of B of the client's examples (a partial last batch is masked, padding never enters
  loss or gradient); steps past the client's own budget E_i * ceil(n_i / B) leave it
  unchanged (a loop of a fixed step count, like the benchmarks' per-step loop, may run
  past a client's budget);
* ``client_final`` (the algorithm's) turns (start, end) into an upload.

``train`` runs the three for one client, the steps in one ``lax.fori_loop`` over the
client's own budget (under ``vmap``: the largest budget among the clients vmapped together);
the benchmarks' fedjax-pattern loop calls the same ``client_step`` once per jitted call.

Parameters are flat vectors ``[d]``; ``apply_flat(w, x, train, rng)`` is the model. Where
the model offers ``apply_flat.split`` (``models.FlatApply``), the local steps carry the
parameters as one 1-D piece per leaf (``local_params``), and ``train`` returns them flat.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_async.algorithms import base


@dataclasses.dataclass(frozen=True)
class LocalConfig:
  """Static shape of local training (changing it recompiles)."""

  batch_size: int = 50
  max_epochs: int = 1  # E (or the upper end of U{1..E} with random_epochs)
  max_examples: int = 1  # M, the padded per-client size
  random_epochs: bool = False  # FedADMM's E_i ~ U{1..E} per client and round
  # False: plain SGD, no momentum buffer carried through the local steps (hp['momentum']
  # must then be 0). It saves two of the five parameter-sized passes of every step's
  # update, which matters for large models whose step is bound by memory traffic.
  momentum: bool = True

  @property
  def steps_per_epoch(self) -> int:
    return -(-self.max_examples // self.batch_size)

  @property
  def max_steps(self) -> int:
    return self.max_epochs * self.steps_per_epoch


class ClientResult(NamedTuple):
  w_end: jax.Array  # [d]
  num_steps: jax.Array  # int32: optimiser steps actually taken (tau_i)
  mean_loss: jax.Array  # mean minibatch loss over those steps


def local_optimizer(hp, cfg: LocalConfig) -> optax.GradientTransformation:
  """The clients' optax SGD: with momentum ``hp['momentum']``, or plain if not cfg.momentum."""
  if cfg.momentum:
    return optax.sgd(hp["lr"], momentum=hp["momentum"])
  m = hp.get("momentum", 0.0)
  if not isinstance(m, jax.core.Tracer) and float(m) != 0.0:
    raise ValueError(f"LocalConfig(momentum=False) runs plain SGD but hp['momentum'] is {m}; "
                     "set LocalConfig.momentum=True to use momentum")
  return optax.sgd(hp["lr"])


def masked_cross_entropy(logits, labels, mask):
  """Mean softmax cross-entropy over the rows where ``mask`` is set (0 if none)."""
  # One-hot form: its gradient is dense arithmetic; optax's integer-label form gathers
  # with take_along_axis, whose transpose is a scatter-add (slow on XLA:CPU, and one more
  # kernel per local step).
  logp = jax.nn.log_softmax(logits)
  losses = -jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype), -1)
  mask = mask.astype(losses.dtype)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


class ClientInit(NamedTuple):
  perms: jax.Array  # int32 [E, M]: per-epoch shuffles; the first n entries are real rows
  num_epochs: jax.Array  # int32: E_i
  spe: jax.Array  # int32: ceil(n_i / B), steps per epoch for this client


def client_init(key, num_examples, cfg: LocalConfig, epochs=None) -> ClientInit:
  """Per-epoch shuffles of the client's own rows and its epoch budget.

  ``epochs`` (a traced scalar <= cfg.max_epochs, e.g. FedEDS's annealed E_t) overrides the
  static epoch count; with ``cfg.random_epochs`` it is the upper end of U{1..E}.
  """
  k_epochs, k_perm = jax.random.split(key)
  max_e = (cfg.max_epochs if epochs is None else
           jnp.minimum(jnp.asarray(epochs).astype(jnp.int32), cfg.max_epochs))
  if cfg.random_epochs:
    num_epochs = jax.random.randint(k_epochs, (), 1, jnp.asarray(max_e) + 1)
  else:
    num_epochs = jnp.asarray(max_e, jnp.int32)
  valid = jnp.arange(cfg.max_examples) < num_examples

  def one_perm(k):
    u = jax.random.uniform(k, (cfg.max_examples,))
    return jnp.argsort(jnp.where(valid, u, 2.0))  # padding rows sort last

  perms = jax.vmap(one_perm)(jax.random.split(k_perm, cfg.max_epochs))
  spe = jnp.maximum((num_examples + cfg.batch_size - 1) // cfg.batch_size, 1)
  return ClientInit(perms.astype(jnp.int32), num_epochs.astype(jnp.int32), spe)


def minibatches(init: ClientInit, num_examples, cfg: LocalConfig):
  """(steps [S], rows [S, B], masks [S, B]): the minibatch of every local step.

  Step s draws positions (s mod spe) * B .. + B of epoch s // spe's shuffle; positions
  past the client's n_i examples are masked (a partial last batch).
  """
  steps = jnp.arange(cfg.max_steps)
  epochs = jnp.minimum(steps // init.spe, cfg.max_epochs - 1)
  pos = (steps % init.spe)[:, None] * cfg.batch_size + jnp.arange(cfg.batch_size)
  rows = init.perms[epochs[:, None], jnp.minimum(pos, cfg.max_examples - 1)]
  return steps, rows, pos < num_examples


def minibatch(x, y, rows, client_index=None):
  """Rows ``rows`` of the client's ``x``, ``y`` ([M, ...]), or, with ``client_index``,
  of ``x[client_index]`` in every client's [N, M, ...] (read in place, no per-client copy)."""
  if client_index is None:
    return x[rows], y[rows]
  return x[client_index, rows], y[client_index, rows]


def local_params(apply_flat: Callable, w):
  """``w [d]`` as the local steps carry it: ``apply_flat.split(w)`` (per-leaf pieces:
  no step then slices the kernels out of ``[d]`` or concatenates their gradients back),
  or ``w`` itself for a model without ``split``."""
  split = getattr(apply_flat, "split", None)
  return split(w) if split is not None else w


def flat_params(w):
  """The flat ``[d]`` vector of ``w`` (``local_params``' pieces, or already flat)."""
  return jnp.concatenate(w) if isinstance(w, tuple) else w


def make_client_step(apply_flat: Callable, algorithm: base.Algorithm, w_start, client_state,
                     hp, cfg: LocalConfig, budget, dropout_key):
  """(optimizer, client_step) for one client; ``client_step(carry, batch) -> carry``.

  ``carry = (w, opt_state, loss_sum)``, ``w`` flat or ``local_params``' pieces;
  ``batch = (s, x_b, y_b, mask_b)``. One optax step on f_i(w) + algorithm.local_penalty(w,
  w_start, state) over the minibatch (the penalty sees ``w`` flat, like ``w_start``; with
  no penalty the concatenation is dead code); a step with ``s >= budget`` (past
  E_i * ceil(n_i / B)) leaves the carry unchanged.
  """
  opt = local_optimizer(hp, cfg)

  def loss_fn(w, xb, yb, mask, rng):
    logits = apply_flat(w, xb, train=True, rng=rng)
    return masked_cross_entropy(logits, yb, mask) + algorithm.local_penalty(
        flat_params(w), w_start, client_state, hp)

  grad_fn = jax.value_and_grad(loss_fn)

  def client_step(carry, batch):
    w, opt_state, loss_sum = carry
    s, xb, yb, mask = batch
    loss, g = grad_fn(w, xb, yb, mask, jax.random.fold_in(dropout_key, s))
    updates, new_opt_state = opt.update(g, opt_state, w)
    active = s < budget
    w = jax.tree.map(lambda n, o: jnp.where(active, n, o), optax.apply_updates(w, updates), w)
    opt_state = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_opt_state, opt_state)
    return w, opt_state, loss_sum + jnp.where(active, loss, 0.0)

  return opt, client_step


def train(
    apply_flat: Callable,
    algorithm: base.Algorithm,
    w_start,
    client_state,
    x,
    y,
    num_examples,
    key,
    hp,
    cfg: LocalConfig,
    client_index=None,
) -> ClientResult:
  """Runs one client's local training (vmap this over clients).

  ``x``, ``y``: the client's own padded examples ``[M, ...]``; or, with ``client_index``
  (a traced int), every client's ``[N, M, ...]``, each step then reading its minibatch
  rows straight from ``x[client_index]`` (the engine does this: no ``[K, M, ...]`` copy
  of the round's data is made).

  Minimises f_i(w) + algorithm.local_penalty(w, w_start, state) with optax SGD (momentum
  ``hp['momentum']``, lr ``hp['lr']``) for E_i epochs of ceil(n_i/B) minibatches:
  ``client_init``, then ``client_step`` over the client's E_i * ceil(n_i / B) minibatches
  in one loop.
  """
  x, y = jnp.asarray(x), jnp.asarray(y)
  k_init, k_drop = jax.random.split(key)
  init = client_init(k_init, num_examples, cfg, hp.get("local_epochs"))  # None: static E
  budget = init.num_epochs * init.spe
  opt, client_step = make_client_step(apply_flat, algorithm, w_start, client_state, hp, cfg,
                                      budget, k_drop)
  # Minibatch rows and masks of every step, computed once before the step loop; each
  # step gathers its own rows (a [S, B, ...] copy of the data up front was not faster).
  _, all_rows, masks = minibatches(init, num_examples, cfg)

  def loop_step(s, carry):
    xb, yb = minibatch(x, y, all_rows[s], client_index)
    return client_step(carry, (s, xb, yb, masks[s]))

  w = local_params(apply_flat, w_start)
  carry = (w, opt.init(w), jnp.float32(0.0))
  # The loop runs the client's own budget of steps, not cfg.max_steps (a while loop: the
  # trip count is traced). Under vmap it runs the largest budget among the clients vmapped
  # together (JAX keeps finished clients' carries unchanged), so a round without the
  # federation's largest client does not pay for that client's padded steps.
  w_end, _, loss_sum = jax.lax.fori_loop(0, jnp.minimum(budget, cfg.max_steps), loop_step,
                                         carry)
  return ClientResult(flat_params(w_end), budget, loss_sum / jnp.maximum(budget, 1))
