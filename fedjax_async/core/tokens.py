"""Per-token loss and accuracy of sequence labels (next-character / next-word models).

Labels of a sequence data set are ``[T]`` token ids per example (a batch ``[B, T]``, the
model's logits ``[B, T, V]``). The reserved ids are fedjax's and TFF's (fedjax
``datasets/shakespeare.py`` and ``datasets/stackoverflow.py``: PAD 0, BOS 1, EOS 2; the
out-of-vocabulary id is the last, ``V - 1``, with one OOV bucket).

* loss (local training and ``test_loss``): mean softmax cross-entropy over the tokens
  that are not PAD, in rows that are real (fedjax ``core/metrics.py``
  ``SequenceTokenCrossEntropyLoss(masked_target_values=(PAD,))``, summed over the batch);
* accuracy (``test_accuracy``): fedjax's ``SequenceTokenAccuracy`` with
  ``masked_target_values`` = the model's ``masked_targets`` (the text models': PAD, BOS,
  EOS and OOV; PAD alone for a model without them) and ``logits_mask`` -inf at the same
  ids: a target among them counts neither as right nor as wrong, and no prediction is
  one of them (fedjax's ``accuracy_in_vocab`` masks the targets PAD and EOS; TFF's
  Stack Overflow task reports the accuracy without OOV and EOS).
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import jax
import jax.numpy as jnp

PAD, BOS, EOS = 0, 1, 2


def special_tokens(num_classes: int) -> Tuple[int, ...]:
  """(PAD, BOS, EOS, OOV) of a vocabulary of ``num_classes`` ids, OOV the last."""
  return (PAD, BOS, EOS, int(num_classes) - 1)


def masked_targets(apply_flat: Callable) -> Tuple[int, ...]:
  """The target ids ``apply_flat``'s model leaves out of the token accuracy
  (``masked_targets`` of the text models), else ``(PAD,)``."""
  model = getattr(apply_flat, "model", None)
  values = getattr(model, "masked_targets", None)
  return tuple(int(v) for v in values) if values is not None else (PAD,)


def token_weights(labels, rows, masked: Sequence[int] = (PAD,)):
  """bool ``labels.shape``: the tokens of real rows (``rows [B]``) whose target is none of
  ``masked``."""
  w = jnp.broadcast_to(rows.reshape(rows.shape + (1,) * (labels.ndim - 1)), labels.shape)
  for v in masked:
    w = w & (labels != v)
  return w


def cross_entropy(logits, labels):
  """Per-token softmax cross-entropy (one-hot form, as ``client.masked_cross_entropy``)."""
  logp = jax.nn.log_softmax(logits)
  return -jnp.sum(logp * jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype), -1)


def loss_sum(logits, labels, rows):
  """(sum of the cross-entropy over the non-PAD tokens of real rows, their count)."""
  w = token_weights(labels, rows).astype(jnp.float32)
  return jnp.sum(cross_entropy(logits.astype(jnp.float32), labels) * w), jnp.sum(w)


def accuracy_counts(logits, labels, rows, masked: Sequence[int] = (PAD,)):
  """(right, counted) tokens: fedjax's ``SequenceTokenAccuracy`` with
  ``masked_target_values=masked`` and ``logits_mask`` -inf at ``masked``, over the real
  rows (``rows [B]``)."""
  block = jnp.zeros(logits.shape[-1], jnp.float32).at[jnp.asarray(masked)].set(-jnp.inf)
  pred = jnp.argmax(logits.astype(jnp.float32) + block, -1)
  w = token_weights(labels, rows, masked)
  return jnp.sum((pred == labels) & w), jnp.sum(w)
