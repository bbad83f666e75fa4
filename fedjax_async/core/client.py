"""Local training of one client, written for ``jax.vmap`` over a client axis.

fedjax-style split into ``client_init`` / ``client_step`` / ``client_final``:

* ``client_init`` draws the client's local epoch count and one shuffle key per epoch;
  ``step_minibatch`` turns step s into its rows (``index_shuffle`` of the client's own n_i
  rows: padding is never drawn) and mask;
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
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_async.algorithms import base
from fedjax_async.core import augment
from fedjax_async.core import tokens


PRECISIONS = ("float32", "tf32", "bf16")  # LocalConfig.precision


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
  # > 0: at most this many minibatch steps per task (PrivaAsyncFed Alg. 1's H, Table II's
  # "Local Steps"), within the E epochs' shuffles; 0: the E epochs' steps.
  local_steps: int = 0
  # The forward and backward pass's arithmetic (``PRECISIONS``): "float32" as written
  # (dots and convolutions at JAX's default matmul precision: TF32 on recent NVIDIA GPUs),
  # "tf32" (``jax.default_matmul_precision("tensorfloat32")`` around the loss and its
  # gradient), "bf16" (parameters and inputs cast to bfloat16 for the loss and its
  # gradient). The parameters, their updates, the optimiser state and the penalty stay
  # float32.
  precision: str = "float32"
  # Augmentation of each minibatch inside the step (``augment.AUGMENTATIONS``: "none" or
  # "crop_flip"), from a key of the client's and the step's; ``augment_fill``: the
  # per-channel value of crop_flip's padding (() = 0).
  augment: str = "none"
  augment_fill: tuple = ()
  # > 0: each step's gradient (data loss and penalty) clipped to this global L2 norm
  # before the SGD update (``optax.clip_by_global_norm``); 0: unclipped, as the papers.
  grad_clip: float = 0.0

  def __post_init__(self):
    if self.augment not in augment.AUGMENTATIONS:
      raise ValueError(f"local.augment: must be one of {', '.join(augment.AUGMENTATIONS)}, "
                       f"got {self.augment!r}")
    if self.local_steps < 0:
      raise ValueError(f"local.local_steps: must be >= 0, got {self.local_steps}")
    if not self.grad_clip >= 0:
      raise ValueError(f"local.client_grad_clip: must be >= 0 (0: off), got {self.grad_clip}")
    if self.precision not in PRECISIONS:
      raise ValueError(f"local.precision: must be one of {', '.join(PRECISIONS)}, got "
                       f"{self.precision!r}")

  @property
  def steps_per_epoch(self) -> int:
    return -(-self.max_examples // self.batch_size)

  @property
  def max_steps(self) -> int:
    steps = self.max_epochs * self.steps_per_epoch
    return min(steps, self.local_steps) if self.local_steps else steps


class ClientResult(NamedTuple):
  w_end: jax.Array  # [d]
  num_steps: jax.Array  # int32: optimiser steps actually taken (tau_i)
  mean_loss: jax.Array  # mean minibatch data loss (cross-entropy, without the penalty)


def local_optimizer(hp, cfg: LocalConfig) -> optax.GradientTransformation:
  """The clients' optax SGD: with momentum ``hp['momentum']``, or plain if not cfg.momentum;
  after ``optax.clip_by_global_norm(cfg.grad_clip)`` when that is > 0."""
  if cfg.momentum:
    sgd = optax.sgd(hp["lr"], momentum=hp["momentum"])
  else:
    m = hp.get("momentum", 0.0)
    if not isinstance(m, jax.core.Tracer) and float(m) != 0.0:
      raise ValueError(f"LocalConfig(momentum=False) runs plain SGD but hp['momentum'] is "
                       f"{m}; set LocalConfig.momentum=True to use momentum")
    sgd = optax.sgd(hp["lr"])
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), sgd) if cfg.grad_clip else sgd


def masked_cross_entropy(logits, labels, mask, token_loss: str = "per_token"):
  """Mean softmax cross-entropy over the rows where ``mask`` is set (0 if none); for
  sequence labels (``labels [B, T]``, logits ``[B, T, V]``) over the tokens of those rows
  that are not padding (``tokens.PAD``), reduced as ``token_loss`` says
  (``tokens.reduce_loss``: per token, or per sequence)."""
  # One-hot form: its gradient is dense arithmetic; optax's integer-label form gathers
  # with take_along_axis, whose transpose is a scatter-add (slow on XLA:CPU, and one more
  # kernel per local step).
  logp = jax.nn.log_softmax(logits)
  losses = -jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype), -1)
  if labels.ndim > 1:  # (static: the [B] image path is unchanged)
    total, count = tokens.reduce_loss(
        losses, tokens.token_weights(labels, mask).astype(losses.dtype), token_loss)
    return total / jnp.maximum(count, 1.0)
  mask = mask.astype(losses.dtype)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


SHUFFLE_ROUNDS = 24  # swap-or-not rounds of ``index_shuffle``


class ClientInit(NamedTuple):
  shuffle_keys: jax.Array  # uint32 [E, SHUFFLE_ROUNDS, 2]: epoch e's index_shuffle keys
  num_epochs: jax.Array  # int32: E_i
  spe: jax.Array  # int32: ceil(n_i / B), steps per epoch for this client


def client_init(key, num_examples, cfg: LocalConfig, epochs=None) -> ClientInit:
  """Per-epoch shuffle keys of the client's own rows and its epoch budget.

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
  shuffle_keys = jax.random.bits(k_perm, (cfg.max_epochs, SHUFFLE_ROUNDS, 2), jnp.uint32)
  spe = jnp.maximum((num_examples + cfg.batch_size - 1) // cfg.batch_size, 1)
  return ClientInit(shuffle_keys, num_epochs.astype(jnp.int32), spe)


def step_budget(init: ClientInit, cfg: LocalConfig):
  """The client's steps this task: E_i * ceil(n_i / B), at most ``cfg.local_steps``."""
  budget = init.num_epochs * init.spe
  return jnp.minimum(budget, cfg.local_steps) if cfg.local_steps else budget


def _mix32(v):
  """A 32-bit integer hash (lowbias32, from hash-prospector): ``index_shuffle``'s coin."""
  v = v ^ (v >> 16)
  v = v * jnp.uint32(0x7FEB352D)
  v = v ^ (v >> 15)
  v = v * jnp.uint32(0x846CA68B)
  return v ^ (v >> 16)


def index_shuffle(positions, round_keys, n):
  """``pi(positions)`` for the pseudorandom permutation ``pi`` of [0, n) that ``round_keys``
  ([R, 2] uint32) choose; ``positions`` int in [0, n).

  A position maps to its row without the permutation being made (as TensorFlow's
  ``tf.random.experimental.index_shuffle`` does), by the swap-or-not shuffle (Hoang, Morris
  and Rogaway, CRYPTO 2012): in round r, with K_r = key mod n, x and its partner
  K_r - x (mod n) swap when a keyed hash of the larger of the two has its bit set; each
  round is an involution of [0, n), so any n is its own domain. The cost is R rounds per
  position drawn, not a sort of the client's padded rows (the argsort of [M] random keys
  per client and epoch that this replaced took ~70 ms at M = 33,600 on the 2-core CPU,
  every round). R = 24: uniform over all 120 orders of 5 rows, over the first row's
  position at n = 1000 and over which pairs of rows share a minibatch in
  ``tests/test_client_shuffle.py``. No integer division per position: K_r mod n is taken
  once per call ([R] values) and the partner is K_r - x or K_r - x + n (a ``%`` per position
  and round made a 10-client step of 50 rows cost 1.09 ms instead of 0.09 ms on XLA:CPU).
  """
  n = jnp.maximum(jnp.asarray(n).astype(jnp.uint32), jnp.uint32(1))
  x = jnp.asarray(positions).astype(jnp.uint32)
  k_mod = round_keys[:, 0] % n  # K_r in [0, n)
  for r in range(round_keys.shape[0]):
    k = k_mod[r]
    partner = jnp.where(x <= k, k - x, k + n - x)  # K_r - x (mod n), x < n
    swap = (_mix32(jnp.maximum(x, partner) ^ round_keys[r, 1]) >> 7) & 1
    x = jnp.where(swap == 1, partner, x)
  return x.astype(jnp.int32)


def step_minibatch(init: ClientInit, s, num_examples, cfg: LocalConfig):
  """(rows [B], mask [B]): the minibatch of local step ``s``.

  Step s draws positions (s mod spe) * B .. + B of epoch s // spe's shuffle of the
  client's n_i rows; positions past n_i are masked (a partial last batch), so padding
  rows are never drawn and every real row is drawn once per epoch.
  """
  epoch = jnp.minimum(s // init.spe, cfg.max_epochs - 1)
  pos = (s % init.spe) * cfg.batch_size + jnp.arange(cfg.batch_size)
  mask = pos < num_examples
  last = jnp.maximum(num_examples - 1, 0)
  rows = index_shuffle(jnp.minimum(pos, last), init.shuffle_keys[epoch], num_examples)
  return rows, mask


def minibatches(init: ClientInit, num_examples, cfg: LocalConfig):
  """(steps [S], rows [S, B], masks [S, B]): ``step_minibatch`` of every local step."""
  steps = jnp.arange(cfg.max_steps)
  rows, masks = jax.vmap(lambda s: step_minibatch(init, s, num_examples, cfg))(steps)
  return steps, rows, masks


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


def compute_dtype(w, x, precision: str):
  """``(w, x)`` as the loss sees them: cast to bfloat16 for ``precision="bf16"`` (floating
  inputs only; the gradient of the cast brings the parameters' gradient back to float32),
  else unchanged."""
  if precision != "bf16":
    return w, x
  cast = lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a
  return jax.tree.map(cast, w), cast(x)


def with_precision(fn: Callable, precision: str) -> Callable:
  """``fn`` traced under ``jax.default_matmul_precision("tensorfloat32")`` for
  ``precision="tf32"`` (every dot and convolution it makes, the backward ones included),
  else ``fn``."""
  if precision != "tf32":
    return fn

  def wrapped(*args, **kwargs):
    with jax.default_matmul_precision("tensorfloat32"):
      return fn(*args, **kwargs)

  return wrapped


class Privatize(NamedTuple):
  """Differential privacy inside the local steps (PrivaAsyncFed Alg. 1 lines 15-24): each
  step's gradient clipped to L2 norm ``clip`` (per example, or the batch's mean gradient),
  then Gaussian noise of std ``sigma`` added to the parameters after the step."""

  clip: jax.Array
  sigma: jax.Array
  per_example: bool  # static: clip every example's gradient (DP-SGD), else the batch's


def clip_by_norm(g, clip):
  """g / max(1, ||g||_2 / C) (PrivaAsyncFed Eq. 17 / Alg. 1 line 20)."""
  norm = jnp.sqrt(jnp.vdot(g, g))
  return g / jnp.maximum(1.0, norm / clip)


def forward(apply_flat: Callable, w, x, rng, precision: str = "float32"):
  """(logits, new model state) of a training-mode pass. The state is the new values of
  the model's mutable collections' leaves (batch statistics, ``FlatApply.state_leaves``),
  ``()`` for a model without them.

  Args:
    apply_flat: the model's forward pass on flat parameters.
    w: the parameters (flat, or ``local_params``' pieces).
    x: the minibatch's inputs.
    rng: the pass's dropout key.
    precision: the pass's arithmetic (``PRECISIONS``).
  """
  out = apply_flat(*compute_dtype(w, x, precision), train=True, rng=rng)
  if getattr(apply_flat, "state_leaves", ()):
    return out[0].astype(jnp.float32), out[1]
  return out.astype(jnp.float32), ()


def with_state(apply_flat: Callable, w, state):
  """``w`` with the model-state leaves replaced by ``state`` (no-op for ``()``)."""
  return apply_flat.set_state(w, state) if state else w


def _penalty_pieces(apply_flat, w_start, client_state):
  """[(w_start's piece, {state name: its piece})] per piece of ``apply_flat.split``, split
  once per client (a ``separable_penalty`` summed over them); None without a split."""
  split = getattr(apply_flat, "split", None)
  if split is None:
    return None
  start_pieces = split(w_start)
  state_pieces = [dict(zip(client_state, p))
                  for p in zip(*(split(v) for v in client_state.values()))]
  return list(zip(start_pieces, state_pieces or [{}] * len(start_pieces)))


def _clipped_mean_grad(apply_flat, w, xb, yb, m, rng, mask, clip: float, precision: str):
  """mean_i clip(mask * grad CE_i) over the batch's real rows (PrivaAsyncFed's per-example
  DP gradient)."""

  def one(xi, yi, i):
    r = jax.random.fold_in(rng, i)
    f = lambda w: masked_cross_entropy(forward(apply_flat, w, xi[None], r, precision)[0],
                                       yi[None], jnp.ones((1,), bool),
                                       tokens.token_loss(apply_flat))
    return clip_by_norm(jax.grad(f)(w) * mask, clip)

  gs = jax.vmap(one)(xb, yb, jnp.arange(xb.shape[0]))
  mf = m.astype(gs.dtype)
  return jnp.einsum("b,bd->d", mf, gs) / jnp.maximum(jnp.sum(mf), 1.0)


def make_client_step(apply_flat: Callable, algorithm: base.Algorithm, w_start, client_state,
                     hp, cfg: LocalConfig, budget, dropout_key, *, mask=None,
                     privatize: Optional[Privatize] = None, noise_key=None,
                     stop_below=None):
  """(optimizer, client_step) for one client; ``client_step(carry, batch) -> carry``.

  ``carry = (w, opt_state, loss_sum)``, ``w`` flat or ``local_params``' pieces (with
  ``stop_below``, ``+ (done, steps_taken)``); ``batch = (s, x_b, y_b, mask_b)``. One
  optax step on f_i(w) + algorithm.local_penalty(w, w_start, state) over the minibatch, ``loss_sum`` adding f_i (the data loss: a metric comparable across
  algorithms); a step with ``s >= budget`` (past E_i * ceil(n_i / B)) leaves the carry
  unchanged. With pieces the penalty sees ``w`` flat (a concatenation per step, dead code
  when there is no penalty), or, for a ``separable_penalty``, is summed over the pieces
  of ``w``, of ``w_start`` and of the ``[d]`` client state, split once per client.
  ``mask [d]`` (flat ``w`` only): gradients and noise only reach the masked-in
  coordinates (PrivaAsyncFed's sub-models). ``privatize``: DP clipping and noise
  (``noise_key`` draws the noise). ``stop_below``: a step whose minibatch objective (data
  loss + penalty) is at or below it is not taken, nor any after it. A model with batch
  statistics has them replaced by the pass's new values after each step (no gradient reaches them).

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm (its local penalty).
    w_start: [d] the model the client starts from.
    client_state: its persistent state (the penalty's).
    hp: the hyper-parameters.
    cfg: the static local configuration.
    budget: the client's steps (``step_budget``).
    dropout_key: the steps' dropout keys (folded with ``s``).
    mask: [d] the parameter mask (None: none).
    privatize: DP clipping and noise (None: none).
    noise_key: the DP noise's key.
    stop_below: the early stop's threshold (None: none).
  """
  opt = local_optimizer(hp, cfg)
  token_loss = tokens.token_loss(apply_flat)  # sequence labels' reduction (a no-op else)
  pieces = None
  if algorithm.separable_penalty and mask is None and privatize is None:
    pieces = _penalty_pieces(apply_flat, w_start, client_state)

  def penalty(w):
    if pieces is not None and isinstance(w, tuple):
      return sum(algorithm.local_penalty(wp, sp, cp, hp) for wp, (sp, cp) in zip(w, pieces))
    return algorithm.local_penalty(flat_params(w), w_start, client_state, hp)

  def loss_fn(w, xb, yb, m, rng):
    """The minibatch objective and, as aux, (data loss, new model state).

    Args:
      w: the parameters.
      xb: the minibatch's inputs.
      yb: its labels.
      m: [B] its real rows.
      rng: the pass's dropout key.
    """
    logits, state = forward(apply_flat, w, xb, rng, cfg.precision)
    data_loss = masked_cross_entropy(logits, yb, m, token_loss)
    return data_loss + penalty(w), (data_loss, state)

  # The step reports the data loss: the penalty's value is never needed (only its
  # gradient), so XLA drops its pass over the parameters.
  grad_fn = with_precision(jax.value_and_grad(loss_fn, has_aux=True), cfg.precision)

  def gradient(w, xb, yb, m, rng):
    """(objective, data loss, gradient, new model state) of the step's minibatch.

    Args:
      w: the parameters.
      xb: the minibatch's inputs.
      yb: its labels.
      m: [B] its real rows.
      rng: the pass's dropout key.
    """
    if privatize is not None and privatize.per_example:
      logits, state = forward(apply_flat, w, xb, rng, cfg.precision)
      loss = masked_cross_entropy(logits, yb, m, token_loss)
      g = _clipped_mean_grad(apply_flat, w, xb, yb, m, rng, mask, privatize.clip,
                             cfg.precision)
      return loss + penalty(w), loss, g + jax.grad(penalty)(w), state
    (objective, (loss, state)), g = grad_fn(w, xb, yb, m, rng)
    if mask is not None:
      g = g * mask
    if privatize is not None:
      g = clip_by_norm(g, privatize.clip)
    return objective, loss, g, state

  def client_step(carry, batch):
    w, opt_state, loss_sum = carry[:3]
    s, xb, yb, m = batch
    objective, loss, g, state = gradient(w, xb, yb, m, jax.random.fold_in(dropout_key, s))
    updates, new_opt_state = opt.update(g, opt_state, w)
    new_w = with_state(apply_flat, optax.apply_updates(w, updates), state)
    if privatize is not None:
      noise = jax.random.normal(jax.random.fold_in(noise_key, s), new_w.shape, new_w.dtype)
      new_w = new_w + privatize.sigma * noise * (1.0 if mask is None else mask)
    active = s < budget
    if stop_below is not None:  # carry (..., done, steps): stops at f_i + penalty <= v
      done = carry[3] | (objective <= stop_below)
      active = active & ~done
    w = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_w, w)
    opt_state = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_opt_state, opt_state)
    out = (w, opt_state, loss_sum + jnp.where(active, loss, 0.0))
    if stop_below is not None:
      out += (done, carry[4] + active.astype(jnp.int32))
    return out

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
    *,
    mask=None,
    privatize: Optional[Privatize] = None,
    stop_below=None,
) -> ClientResult:
  """Runs one client's local training (vmap this over clients): the one local-training
  loop of both engines.

  ``x``, ``y``: the client's own padded examples ``[M, ...]``; or, with ``client_index``
  (a traced int), every client's ``[N, M, ...]``, each step then reading its minibatch
  rows straight from ``x[client_index]`` (the engine does this: no ``[K, M, ...]`` copy
  of the round's data is made).

  Minimises f_i(w) + algorithm.local_penalty(w, w_start, state) with optax SGD (momentum
  ``hp['momentum']``, lr ``hp['lr']``) for E_i epochs of ceil(n_i/B) minibatches:
  ``client_init``, then ``client_step`` over the client's E_i * ceil(n_i / B) minibatches
  in one loop. The virtual clock's options: ``mask [d]`` (training starts from
  ``w_start * mask``; see ``make_client_step``), ``privatize`` (DP clipping and noise)
  and ``stop_below`` (a traced threshold: the client stops at the first step whose
  minibatch objective, data loss + penalty, is at or below it, that step not taken; ``num_steps`` counts the
  steps taken).

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the algorithm (its local penalty).
    w_start: [d] the model the client starts from.
    client_state: its persistent state.
    x: the features (the client's ``[M, ...]``, or every client's ``[N, M, ...]``).
    y: the labels, as ``x``.
    num_examples: n_i, the client's real examples.
    key: the task's PRNG key (shuffles, dropout, noise, augmentation).
    hp: the hyper-parameters.
    cfg: the static local configuration.
    client_index: the client's row of ``x`` and ``y`` (None: they are its own).
    mask: [d] the parameter mask (None: none).
    privatize: DP clipping and noise (None: none).
    stop_below: the early stop's threshold (None: none).
  """
  x, y = jnp.asarray(x), jnp.asarray(y)
  k_init, k_drop = jax.random.split(key)
  init = client_init(k_init, num_examples, cfg, hp.get("local_epochs"))  # None: static E
  budget = step_budget(init, cfg)
  if mask is not None:
    w_start = w_start * mask
  opt, client_step = make_client_step(
      apply_flat, algorithm, w_start, client_state, hp, cfg, budget, k_drop, mask=mask,
      privatize=privatize, noise_key=jax.random.fold_in(key, 0x0D15), stop_below=stop_below)

  k_aug = jax.random.fold_in(key, 0xA06)  # augmentation's draws (none: unused)

  def batch(s):
    rows, m = step_minibatch(init, s, num_examples, cfg)
    xb, yb = minibatch(x, y, rows, client_index)  # gathered per step, not copied up front
    xb = augment.apply(cfg.augment, xb, jax.random.fold_in(k_aug, s), cfg.augment_fill)
    return s, xb, yb, m

  flat = mask is not None or privatize is not None
  w = w_start if flat else local_params(apply_flat, w_start)
  carry = (w, opt.init(w), jnp.float32(0.0))
  limit = jnp.minimum(budget, cfg.max_steps)
  if stop_below is None:
    # The loop runs the client's own budget of steps, not cfg.max_steps (a while loop: the
    # trip count is traced). Under vmap it runs the largest budget among the clients
    # vmapped together (JAX keeps finished clients' carries unchanged), so a round
    # without the federation's largest client does not pay for that client's padded steps.
    w_end, _, loss_sum = jax.lax.fori_loop(0, limit, lambda s, c: client_step(c, batch(s)),
                                           carry)
    steps = budget
  else:  # a while loop that also ends at the early stop (under vmap: when all have ended)
    _, (w_end, _, loss_sum, _, steps) = jax.lax.while_loop(
        lambda c: (c[0] < limit) & ~c[1][3],
        lambda c: (c[0] + 1, client_step(c[1], batch(c[0]))),
        (jnp.int32(0), carry + (jnp.bool_(False), jnp.int32(0))))
  return ClientResult(flat_params(w_end), steps, loss_sum / jnp.maximum(steps, 1))
