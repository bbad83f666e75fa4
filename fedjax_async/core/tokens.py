"""Per-token loss and accuracy of sequence labels (next-character / next-word models).

Labels of a sequence data set are ``[T]`` token ids per example (a batch ``[B, T]``, the
model's logits ``[B, T, V]``). The reserved ids are fedjax's and TFF's (fedjax
``datasets/shakespeare.py`` and ``datasets/stackoverflow.py``: PAD 0, BOS 1, EOS 2; the
out-of-vocabulary id is the last, ``V - 1``, with one OOV bucket).

* loss (local training and ``test_loss``), by ``token_loss`` (``TOKEN_LOSSES``; the
  model's attribute, ``--token_loss``): the softmax cross-entropy of the non-PAD targets
  of the real rows, ``per_token``: their mean (fedjax ``core/metrics.py``
  ``SequenceTokenCrossEntropyLoss(masked_target_values=(PAD,))``); ``per_sequence``: its
  sum over a sequence, mean over the sequences with a non-PAD target (fedjax
  ``SequenceCrossEntropyLoss``, its ``models/stackoverflow.py`` ``train_loss``);
  ``per_position``: that sum over the ``T`` positions (PAD counting 0), the same mean
  (fedjax ``models/shakespeare.py`` ``train_loss``: ``jnp.mean(per_token_loss, -1)``);
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
import numpy as np

PAD, BOS, EOS = 0, 1, 2
TOKEN_LOSSES = ("per_token", "per_sequence", "per_position")


def special_tokens(num_classes: int) -> Tuple[int, ...]:
  """(PAD, BOS, EOS, OOV) of a vocabulary of ``num_classes`` ids, OOV the last."""
  return (PAD, BOS, EOS, int(num_classes) - 1)


def accuracy_kind(fed) -> str:
  """What ``test_accuracy`` measures on the ``FederatedData`` ``fed`` where it is no share
  of test examples classified right, for the console: sequence labels (``[T]`` token ids
  per example) give the share of target tokens predicted right (the masked ones not
  counted), named 'next-character' (Shakespeare), 'next-word' (Stack Overflow) or
  'next-token'; '' for one class per example."""
  if np.ndim(fed.test_y) < 2:
    return ""
  name = str(fed.name).lower()
  return ("next-character" if "shakespeare" in name else
          "next-word" if "stackoverflow" in name else "next-token")


def accuracy_note(fed) -> str:
  """``; acc: next-character accuracy (per target token)`` for a run's header line, or
  '' (``accuracy_kind``)."""
  kind = accuracy_kind(fed)
  return f"; acc: {kind} accuracy (per target token)" if kind else ""


def masked_targets(apply_flat: Callable) -> Tuple[int, ...]:
  """The target ids ``apply_flat``'s model leaves out of the token accuracy
  (``masked_targets`` of the text models), else ``(PAD,)``."""
  model = getattr(apply_flat, "model", None)
  values = getattr(model, "masked_targets", None)
  return tuple(int(v) for v in values) if values is not None else (PAD,)


def token_loss(apply_flat: Callable) -> str:
  """``apply_flat``'s model's ``token_loss`` (``TOKEN_LOSSES``), else ``per_token``."""
  value = getattr(getattr(apply_flat, "model", None), "token_loss", None) or "per_token"
  if value not in TOKEN_LOSSES:
    raise ValueError(f"data.token_loss: unknown {value!r}; use one of "
                     f"{', '.join(TOKEN_LOSSES)} (--token_loss)")
  return value


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


def reduce_loss(losses, w, kind: str = "per_token"):
  """(numerator, denominator) of the ``kind`` loss (``TOKEN_LOSSES``) of the per-token
  ``losses [B, T]`` under the weights ``w [B, T]`` (1: a non-PAD target of a real row):
  per_token (sum, tokens); per_sequence (sum, sequences with a weight); per_position
  (sum / T, the same sequences)."""
  if kind == "per_token":
    return jnp.sum(losses * w), jnp.sum(w)
  rows = w.reshape(w.shape[0], -1)
  per_row = jnp.sum((losses * w).reshape(rows.shape), -1)
  if kind == "per_position":
    per_row = per_row / rows.shape[1]
  return jnp.sum(per_row), jnp.sum(jnp.any(rows > 0, -1).astype(w.dtype))


def loss_sum(logits, labels, rows, kind: str = "per_token"):
  """(numerator, denominator) of the ``kind`` loss over the non-PAD tokens of real rows
  (``reduce_loss``): per_token (cross-entropy sum, token count)."""
  w = token_weights(labels, rows).astype(jnp.float32)
  return reduce_loss(cross_entropy(logits.astype(jnp.float32), labels), w, kind)


def accuracy_counts(logits, labels, rows, masked: Sequence[int] = (PAD,)):
  """(right, counted) tokens: fedjax's ``SequenceTokenAccuracy`` with
  ``masked_target_values=masked`` and ``logits_mask`` -inf at ``masked``, over the real
  rows (``rows [B]``)."""
  block = jnp.zeros(logits.shape[-1], jnp.float32).at[jnp.asarray(masked)].set(-jnp.inf)
  pred = jnp.argmax(logits.astype(jnp.float32) + block, -1)
  w = token_weights(labels, rows, masked)
  return jnp.sum((pred == labels) & w), jnp.sum(w)
