"""Recurrent models of the text benchmarks (flax), in the configurations fedjax and LEAF
run them. Inputs are token ids ``[B, T]`` (int, or float holding ints: cast here).

* :class:`ShakespeareLSTM` (``shakespeare_lstm``): fedjax ``models/shakespeare.py``
  ``create_lstm_model`` (McMahan et al. 2017's; TFF's tutorial the same): embedding 8, two
  LSTM layers of 256 each followed by tanh (haiku ``DeepRNN([LSTM, tanh] * 2)``), a dense
  layer to the 90 ids, at every position: logits ``[B, T, V]``;
* :class:`StackOverflowLSTM` (``stackoverflow_lstm``): fedjax ``models/stackoverflow.py``
  (Reddi et al. 2021's): embedding 96, one LSTM of 670, tanh, a dense projection to 96,
  a dense layer to the vocabulary (10,000 words + 4), at every position;
* :class:`LeafLSTM` (``leaf_shakespeare_lstm``, ``sent140_lstm``): LEAF
  ``models/shakespeare/stacked_lstm.py`` (embedding 8, two LSTM layers of 256, dense on
  the last position to the 80 characters) and ``models/sent140/stacked_lstm.py``
  (embedding 100, two LSTM layers of 100, dense 128 without activation, dense 2):
  logits ``[B, V]``.

The LSTM cell is haiku's ``hk.LSTM`` (gates i, g, f, o from one dense layer of
``[x, h]``; forget gate sigmoid(f + 1)), which is also TF's ``BasicLSTMCell`` (LEAF's)
with its forget bias 1. Initialisation: haiku's (dense kernels truncated normal of
std 1/sqrt(fan in), embeddings truncated normal of std 1, biases 0) for fedjax's models,
TF 1's Glorot uniform for LEAF's. The sequence models' ``masked_targets`` (PAD, BOS, EOS,
OOV) are what their token accuracy leaves out, their ``token_loss`` how their loss reduces
the tokens' cross-entropy (``core.tokens.TOKEN_LOSSES``, ``--token_loss``).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async.core import tokens

Array = jax.Array


def _haiku_dense(fan_in: int) -> Callable:
  return nn.initializers.truncated_normal(1.0 / np.sqrt(fan_in))


class LSTM(nn.Module):
  """One LSTM layer over ``x [B, T, E]`` from a zero state: ``[B, T, hidden]``."""

  hidden: int
  glorot: bool = False  # TF 1's initialisation (LEAF) instead of haiku's

  @nn.compact
  def __call__(self, x: Array) -> Array:
    e, h = x.shape[-1], self.hidden
    init = nn.initializers.xavier_uniform() if self.glorot else _haiku_dense(e + h)
    kernel = self.param("kernel", init, (e + h, 4 * h))
    bias = self.param("bias", nn.initializers.zeros, (4 * h,))
    kernel, bias = kernel.astype(x.dtype), bias.astype(x.dtype)
    inputs = jnp.swapaxes(x @ kernel[:e] + bias, 0, 1)  # [T, B, 4h]: all steps at once

    def step(carry, z):
      h_prev, c_prev = carry
      i, g, f, o = jnp.split(z + h_prev @ kernel[e:], 4, axis=-1)
      c = jax.nn.sigmoid(f + 1.0) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
      out = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (out, c), out

    zero = jnp.zeros((x.shape[0], h), x.dtype)
    _, outputs = jax.lax.scan(step, (zero, zero), inputs)
    return jnp.swapaxes(outputs, 0, 1)


def _ids(x: Array) -> Array:
  return x.astype(jnp.int32)


class _NextToken:
  """A next-token model's masked targets: pad, BOS, EOS and OOV (``tokens``)."""

  @property
  def masked_targets(self) -> Tuple[int, ...]:
    return tokens.special_tokens(self.num_classes)


def _embed(module, x: Array) -> Array:
  """``module``'s token embedding of ``x`` (fedjax's truncated-normal init), inside its
  compact ``__call__``."""
  vocab = module.vocab_size or module.num_classes
  return nn.Embed(vocab, module.embed, embedding_init=nn.initializers.truncated_normal(1.0),
                  name="embed")(_ids(x))


class ShakespeareLSTM(_NextToken, nn.Module):
  """fedjax's / TFF's character LSTM (module docstring)."""

  num_classes: int = 90
  vocab_size: int = 0  # input ids (0: num_classes)
  embed: int = 8
  hidden: int = 256
  layers: int = 2
  token_loss: str = "per_token"  # core.tokens.TOKEN_LOSSES (fedjax's: docs/api.md)

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    h = _embed(self, x)
    for layer in range(self.layers):
      h = jnp.tanh(LSTM(self.hidden, name=f"lstm{layer}")(h))
    return nn.Dense(self.num_classes, kernel_init=_haiku_dense(self.hidden),
                    name="logits")(h)


class StackOverflowLSTM(_NextToken, nn.Module):
  """fedjax's Stack Overflow next-word LSTM (module docstring)."""

  num_classes: int = 10_004
  vocab_size: int = 0
  embed: int = 96
  hidden: int = 670
  token_loss: str = "per_token"  # core.tokens.TOKEN_LOSSES (fedjax's: docs/api.md)

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    h = _embed(self, x)
    h = jnp.tanh(LSTM(self.hidden, name="lstm")(h))
    h = nn.Dense(self.embed, kernel_init=_haiku_dense(self.hidden), name="projection")(h)
    return nn.Dense(self.num_classes, kernel_init=_haiku_dense(self.embed), name="logits")(h)


class LeafLSTM(nn.Module):
  """LEAF's stacked LSTM classifiers (module docstring): the last position's output."""

  num_classes: int
  vocab_size: int = 0
  embed: int = 8
  hidden: int = 256
  dense: Optional[int] = None  # sent140's linear layer before the logits

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    glorot = nn.initializers.xavier_uniform()
    h = nn.Embed(self.vocab_size or self.num_classes, self.embed, embedding_init=glorot,
                 name="embed")(_ids(x))
    for layer in range(2):
      h = LSTM(self.hidden, glorot=True, name=f"lstm{layer}")(h)
    h = h[:, -1, :]
    if self.dense:
      h = nn.Dense(self.dense, kernel_init=glorot, name="fc1")(h)
    return nn.Dense(self.num_classes, kernel_init=glorot, name="logits")(h)


NAMES = ("shakespeare_lstm", "stackoverflow_lstm", "leaf_shakespeare_lstm", "sent140_lstm")


def get(name: str, num_classes: int, input_vocab: int = 0) -> nn.Module:
  """The text model ``name`` for ``num_classes`` outputs and ``input_vocab`` input ids (0:
  ``num_classes``)."""
  if name == "shakespeare_lstm":
    return ShakespeareLSTM(num_classes, input_vocab)
  if name == "stackoverflow_lstm":
    return StackOverflowLSTM(num_classes, input_vocab)
  if name == "leaf_shakespeare_lstm":
    return LeafLSTM(num_classes, input_vocab, embed=8, hidden=256)
  if name == "sent140_lstm":
    return LeafLSTM(num_classes, input_vocab, embed=100, hidden=100, dense=128)
  raise ValueError(f"unknown text model {name!r}; choose from {NAMES}")
