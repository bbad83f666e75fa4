"""What every engine holds on device and computes there the same way: the federated data
(``DeviceData``), each client's training key (``client_key``), a ``lax.scan`` over chunks
of rows, a gather materialised into buffers of its own, and the evaluation of a model on
the central test set.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_async.core import tokens


def scan_chunks(fn: Callable, chunk: int, carry, *args):
  """``fn(carry, real [G], *rows) -> (carry, per-row outputs)`` over the rows of ``args``
  in chunks of ``chunk``, one ``lax.scan`` step per chunk; returns the final carry and the
  per-row outputs stacked back to the leading axis K. The last chunk is padded with copies
  of row 0, marked by ``real`` False; their outputs are dropped."""
  k = jax.tree.leaves(args)[0].shape[0]
  num = -(-k // chunk)
  pad = num * chunk - k

  def split(a):
    if pad:
      a = jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad,) + a.shape[1:])])
    return a.reshape((num, chunk) + a.shape[1:])

  real = (jnp.arange(num * chunk) < k).reshape(num, chunk)
  carry, out = jax.lax.scan(lambda c, xs: fn(c, xs[0], *xs[1]), carry,
                            (real, jax.tree.map(split, args)))
  return carry, jax.tree.map(lambda a: a.reshape((num * chunk,) + a.shape[2:])[:k], out)


def evaluate(apply_flat: Callable, w, test_x, test_y, batch: int):
  """(accuracy, mean cross-entropy) of ``w`` on the central test set; for sequence labels
  (``test_y [n, T]``) the token accuracy and the loss of ``core.tokens`` (per token, or
  per sequence: the model's ``token_loss``), ``batch`` then counting tokens
  (``batch // T`` sequences at a time).

  Args:
    apply_flat: the model's forward pass on flat parameters.
    w: the parameters.
    test_x: the test features.
    test_y: the test labels ([n], or [n, T] sequences).
    batch: the examples (tokens) evaluated at a time.
  """
  if test_y.ndim > 1:
    return _evaluate_tokens(apply_flat, w, test_x, test_y, batch)
  n = test_x.shape[0]
  batch = min(batch, n)
  nb = -(-n // batch)
  pad = nb * batch - n
  xs = jnp.concatenate([test_x, jnp.zeros((pad,) + test_x.shape[1:], test_x.dtype)])
  ys = jnp.concatenate([test_y, jnp.zeros((pad,), test_y.dtype)])
  mask = jnp.arange(nb * batch) < n
  xs = xs.reshape((nb, batch) + test_x.shape[1:])
  ys, mask = ys.reshape(nb, batch), mask.reshape(nb, batch)

  def one(args):
    xb, yb, mb = args
    logits = apply_flat(w, xb, train=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
    correct = jnp.argmax(logits, -1) == yb
    return jnp.sum(jnp.where(mb, correct, 0)), jnp.sum(jnp.where(mb, loss, 0.0))

  correct, loss = jax.lax.map(one, (xs, ys, mask))
  return jnp.sum(correct) / n, jnp.sum(loss) / n


def _evaluate_tokens(apply_flat: Callable, w, test_x, test_y, batch: int):
  """``evaluate`` of sequence labels: (right / counted tokens, the ``token_loss``'s sum over
  the test set / its count: non-PAD tokens or sequences)."""
  n = test_x.shape[0]
  batch = max(1, min(batch // max(int(test_y[0].size), 1), n))
  nb = -(-n // batch)
  pad = nb * batch - n
  xs = jnp.concatenate([test_x, jnp.zeros((pad,) + test_x.shape[1:], test_x.dtype)])
  ys = jnp.concatenate([test_y, jnp.zeros((pad,) + test_y.shape[1:], test_y.dtype)])
  mask = (jnp.arange(nb * batch) < n).reshape(nb, batch)
  xs = xs.reshape((nb, batch) + test_x.shape[1:])
  ys = ys.reshape((nb, batch) + test_y.shape[1:])
  masked = tokens.masked_targets(apply_flat)
  kind = tokens.token_loss(apply_flat)

  def one(args):
    xb, yb, mb = args
    logits = apply_flat(w, xb, train=False)
    return (tokens.accuracy_counts(logits, yb, mb, masked)
            + tokens.loss_sum(logits, yb, mb, kind))

  right, counted, loss, weight = (jnp.sum(v) for v in jax.lax.map(one, (xs, ys, mask)))
  return right / jnp.maximum(counted, 1), loss / jnp.maximum(weight, 1.0)


def materialized(tree, always_true):
  """``tree``, computed into buffers of its own before anything later reads it.

  The gathered client state must not stay a lazy gather from the ``[N, d]`` arrays: XLA
  fuses such a gather into its late consumer (the upload, e.g. FedADMM's
  ``w_end - last_local``), which then reads the old array while the scatter at the end
  of the round updates it in place, so XLA copies the whole ``[N, d]`` array every
  round (twice, measured: round time grew with N at fixed K). ``optimization_barrier``
  does not stop that on XLA:CPU (jax 0.6.2 expands it before fusion), a conditional's
  outputs are always materialised: a ``lax.cond`` on ``always_true``, a traced
  predicate that is true at run time (so XLA cannot drop the conditional).
  """
  if not jax.tree.leaves(tree):  # no client state (FedAvg, FedProx, FedNova)
    return tree
  return jax.lax.cond(always_true, lambda c: c,
                      lambda c: jax.tree.map(jnp.zeros_like, c), tree)


class DeviceData(NamedTuple):
  """A federated data set on device (see ``fedjax_async.data.FederatedData``)."""

  x: jax.Array  # [N, M, ...]
  y: jax.Array  # [N, M]
  counts: jax.Array  # [N]
  test_x: jax.Array  # [T, ...]
  test_y: jax.Array  # [T] (sequence labels: [T, L])
  # [N] int32 or None: client i's data are row rows[i] of x and y (a chunk of rounds'
  # clients only, ``core.streaming``); None: row i
  rows: Optional[jax.Array] = None

  @classmethod
  def from_federated(cls, data) -> "DeviceData":
    return cls(jnp.asarray(data.x), jnp.asarray(data.y), jnp.asarray(data.counts),
               jnp.asarray(data.test_x), jnp.asarray(data.test_y))


def client_key(base_key_data, dispatch_round, client_id):
  """The PRNG key of a client's local training: a function of (dispatch round, client)."""
  k = jax.random.wrap_key_data(base_key_data)
  return jax.random.fold_in(jax.random.fold_in(k, dispatch_round), client_id)
