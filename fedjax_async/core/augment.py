"""Local data augmentation inside the jitted local step (``LocalConfig.augment``).

``crop_flip``: CIFAR's usual training augmentation, per example, as torchvision's
``RandomCrop(H, padding=4)`` and ``RandomHorizontalFlip()`` in pytorch-cifar (the
preprocessing fedjax ``datasets/cifar100.py`` ``preprocess_image`` cites; fedjax draws one
offset and one flip per batch there, on the host): each image of ``[B, H, W, C]`` is padded
by ``pad`` pixels on every side with ``fill`` (per channel: the stored value of a black
pixel, 0 unless the data were normalised, see ``data.loader.black``), cropped back to
``H x W`` at an offset drawn uniformly from {0, ..., 2 pad} in each direction, and mirrored
left-right with probability 1/2.

The draws come from the step's key: ``client.train`` folds the step index into a key of
the client's own (from its training key, itself a function of the dispatch round and the
client id), so a run is reproducible and two clients, or two steps, draw independently.
Off (``"none"``) unless asked: the local step is then the same program as without it.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

AUGMENTATIONS = ("none", "crop_flip")
PAD_PIXELS = 4  # pytorch-cifar's RandomCrop(32, padding=4)


def check(augment: str, feature_shape: Sequence[int], what: str = "local.augment") -> None:
  """ValueError naming ``what`` for an unknown augmentation, or ``crop_flip`` on data
  that are not images ``[H, W, C]``."""
  if augment not in AUGMENTATIONS:
    raise ValueError(f"{what}: unknown augmentation {augment!r}; choose from "
                     f"{list(AUGMENTATIONS)}")
  if augment == "crop_flip" and len(tuple(feature_shape)) != 3:
    raise ValueError(f"{what}=crop_flip: crops and flips images [H, W, C]; the data's "
                     f"examples have shape {tuple(feature_shape)}")


def draw(key, batch: int, pad: int = PAD_PIXELS):
  """(offsets int32 [B, 2] in [0, 2 pad], flips bool [B]) of a batch of ``batch``."""
  k_off, k_flip = jax.random.split(key)
  offsets = jax.random.randint(k_off, (batch, 2), 0, 2 * pad + 1, dtype=jnp.int32)
  return offsets, jax.random.bernoulli(k_flip, 0.5, (batch,))


def crop_flip(x, key, pad: int = PAD_PIXELS, fill: Sequence[float] = ()):
  """``x [B, H, W, C]`` randomly cropped (after padding ``pad`` pixels of ``fill``) and
  flipped per example by the draws of ``draw(key, B, pad)``."""
  b, h, w, c = x.shape
  offsets, flips = draw(key, b, pad)
  value = jnp.asarray(tuple(fill) if len(fill) else 0.0, x.dtype)
  canvas = jnp.broadcast_to(value, (b, h + 2 * pad, w + 2 * pad, c))
  canvas = canvas.at[:, pad:pad + h, pad:pad + w, :].set(x)
  crops = jax.vmap(lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (h, w, c)))(
      canvas, offsets)
  return jnp.where(flips[:, None, None, None], crops[:, :, ::-1, :], crops)


def apply(augment: str, x, key, fill: Sequence[float] = ()):
  """``x`` augmented by ``augment`` (``"none"``: unchanged)."""
  if augment == "none":
    return x
  if augment == "crop_flip":
    return crop_flip(x, key, PAD_PIXELS, fill)
  raise ValueError(f"local.augment: unknown augmentation {augment!r}")
