"""Flax (linen) models for the simulator, with a vmap-friendly convolution.

The engine trains every client of a round inside one ``jax.vmap`` over a client axis
(or, for large models on CPU, one client per ``lax.scan`` step: ``client_chunk=1``), each
client with its own flat parameter vector, and always inside ``lax.scan`` loops (local
steps, rounds). Convolutions are where XLA:CPU is fragile there, so the convolutional
models take ``impl``:

* ``"vjp"`` (default): ``lax.conv_general_dilated`` in NHWC/HWIO with a hand-written
  backward (:func:`canonical_conv`) whose two convolutions are again plain NHWC/HWIO
  convolutions. XLA:CPU runs a convolution inside a while loop 14-40x slower than at top
  level unless its operands are in the default layout (jax-ml/jax#12868); autodiff's
  backward convolutions (swapped dimension numbers) are not, these are. Strided
  convolutions take the "slices" route;
* ``"slices"``: :class:`PatchConv` with im2col built from kh*kw shifted slices, then one
  GEMM against the kernel (the default before "vjp");
* ``"patches"``: :class:`PatchConv` with ``lax.conv_general_dilated_patches``;
* ``"lax"``: ``flax.linen.Conv`` (autodiff backward: the slow case above).

All four have the same parameter names, shapes and initialisers, so parameters are
interchangeable. Measured on the 2-core AVX-512 CPU, jax 0.6.2 (docs/performance.md):
one client per scan step, a simple_cnn round (50 clients, 2 steps) took 1.42 s with
"vjp", 2.73 s with "slices", 40 s with "lax"; the Fashion-MNIST CNN 48 vs 38 GFLOP/s.
Vmapped over 10 clients with their own kernels (a grouped convolution) "vjp" and
"slices" were equal. Re-measure with ``benchmarks/conv_in_scan.py`` and
``benchmarks/fraction_of_peak.py --impl=...`` on another machine or jax version.

The dense layers of the convolutional models take ``dense``: ``"fast"`` (default,
:class:`Dense`: the input gradient ``g @ W^T`` computed as ``(W g^T)^T``, 4-12x faster
on XLA:CPU for the CNN's fc1; :func:`dense_matmul`) or ``"flax"`` (``nn.Dense``,
autodiff backward). Same parameters, same values.

Public API:

* layers: :class:`PatchConv`, :class:`Dense` (:func:`dense_matmul`), :class:`BatchStatNorm`;
* models: :class:`LogisticRegression`, :class:`MLP`, :class:`CNN`,
  :class:`CIFAR10CNN`, :class:`CIFAR100CNN`, :class:`SimpleCNN`, :class:`ResNet18`;
* :func:`get_model`, :func:`default_model_for`, :data:`MODEL_NAMES`;
* :func:`flat_model` (what the engine uses): ``(w0_flat, apply_flat)``, ``apply_flat`` a
  :class:`FlatApply` (it also takes the per-leaf pieces that local training carries);
* :func:`count_params`, :func:`count_flops`, :func:`train_step_flops`,
  :func:`analytic_flops`.

Every model's ``__call__(x, train=False)`` maps ``x [N, *input_shape]`` to logits
``[N, num_classes]``; dropout draws from the ``'dropout'`` rng when ``train=True``.
No model has state besides ``'params'``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

Array = jax.Array
Padding = str | Sequence[tuple[int, int]]

# "vjp": canonical_conv; "patches": PatchConv via lax.conv_general_dilated_patches;
# "slices": PatchConv with im2col by shifted slices; "lax": flax.linen.Conv.
CONV_IMPLS = ("vjp", "patches", "slices", "lax")
# "fast": Dense (input gradient as (W g^T)^T); "flax": flax.linen.Dense.
DENSE_IMPLS = ("fast", "flax")


# ----------------------------------------------------------------------------- layers


def patch_kernel(kernel: Array) -> Array:
  """Reshapes an HWIO kernel [kh, kw, cin, cout] to [cin*kh*kw, cout].

  ``lax.conv_general_dilated_patches`` orders its output feature dimension as
  (cin, kh, kw) with cin slowest, so the kernel is transposed to IHW-O first.
  """
  kh, kw, cin, cout = kernel.shape
  return jnp.transpose(kernel, (2, 0, 1, 3)).reshape(cin * kh * kw, cout)


def _patches_xla(x: Array, ksize, strides, padding) -> Array:
  """``lax.conv_general_dilated_patches``: features ordered (cin, kh, kw)."""
  return lax.conv_general_dilated_patches(
      x, tuple(ksize), tuple(strides), padding,
      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _patches_slices(x: Array, ksize, strides, padding) -> Array:
  """im2col by kh*kw strided slices of the padded input: features ordered (kh, kw, cin)."""
  (kh, kw), (sh, sw) = ksize, strides
  n, h, w, cin = x.shape
  pads = (lax.padtype_to_pads((h, w), (kh, kw), (sh, sw), padding)
          if isinstance(padding, str) else [tuple(p) for p in padding])
  xp = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  ho = (h + sum(pads[0]) - kh) // sh + 1
  wo = (w + sum(pads[1]) - kw) // sw + 1
  cols = [lax.slice(xp, (0, i, j, 0), (n, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, cin),
                    (1, sh, sw, 1))
          for i in range(kh) for j in range(kw)]
  return jnp.concatenate(cols, axis=-1)


PATCH_EXTRACTORS = ("xla", "slices", "vjp")

_DN = ("NHWC", "HWIO", "NHWC")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def canonical_conv(x: Array, kernel: Array, pads) -> Array:
  """Stride-1 NHWC x HWIO convolution (``pads`` ((top, bottom), (left, right))) whose
  backward is two more NHWC/HWIO convolutions, so every convolution keeps XLA's default
  layouts (see the module docstring)."""
  return lax.conv_general_dilated(x, kernel, (1, 1), pads, dimension_numbers=_DN)


def _canonical_conv_fwd(x, kernel, pads):
  return canonical_conv(x, kernel, pads), (x, kernel)


def _canonical_conv_bwd(pads, res, g):
  x, kernel = res
  kh, kw = kernel.shape[:2]
  # dx: correlation of g (padded by k-1-p) with the flipped kernel, in/out swapped.
  flipped = jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2))
  gpads = ((kh - 1 - pads[0][0], kh - 1 - pads[0][1]),
           (kw - 1 - pads[1][0], kw - 1 - pads[1][1]))
  dx = lax.conv_general_dilated(g, flipped, (1, 1), gpads, dimension_numbers=_DN)
  # dk[i, j, ci, co] = sum_{n,h,w} xpad[n, h+i, w+j, ci] g[n, h, w, co]: a convolution of
  # x viewed as [ci, H, W, n] with g viewed as the kernel [Ho, Wo, n, co].
  dk = lax.conv_general_dilated(jnp.transpose(x, (3, 1, 2, 0)),
                                jnp.transpose(g, (1, 2, 0, 3)), (1, 1), pads,
                                dimension_numbers=_DN)
  return dx, jnp.transpose(dk, (1, 2, 0, 3))


canonical_conv.defvjp(_canonical_conv_fwd, _canonical_conv_bwd)


def patch_conv(x: Array, kernel: Array, strides=(1, 1), padding: Padding = "SAME",
               extract: str = "xla") -> Array:
  """2-D convolution of NHWC ``x`` with an HWIO ``kernel`` as patches + one GEMM.

  ``extract="xla"`` uses ``lax.conv_general_dilated_patches`` (features (cin, kh, kw),
  kernel transposed by :func:`patch_kernel`); ``extract="slices"`` builds the patches
  from kh*kw shifted slices (features (kh, kw, cin), the kernel's own HWIO order);
  ``extract="vjp"`` is no patches at all: :func:`canonical_conv` (strided convolutions
  take the "slices" route).
  """
  kh, kw, cin, cout = kernel.shape
  if extract == "vjp" and tuple(strides) == (1, 1):
    pads = (lax.padtype_to_pads(x.shape[1:3], (kh, kw), (1, 1), padding)
            if isinstance(padding, str) else padding)
    return canonical_conv(x, kernel, tuple(tuple(p) for p in pads))
  if extract == "vjp":  # strided: the patches route
    extract = "slices"
  if extract == "xla":
    patches, kmat = _patches_xla(x, (kh, kw), strides, padding), patch_kernel(kernel)
  elif extract == "slices":
    patches = _patches_slices(x, (kh, kw), tuple(strides), padding)
    kmat = kernel.reshape(kh * kw * cin, cout)
  else:
    raise ValueError(f"unknown patch extractor {extract!r}; choose from {PATCH_EXTRACTORS}")
  return jnp.einsum("nhwp,pc->nhwc", patches, kmat)


class PatchConv(nn.Module):
  """Drop-in for ``nn.Conv`` (2-D, NHWC, groups=1, no dilation) via patches + GEMM.

  Parameters are ``kernel [kh, kw, cin, cout]`` and ``bias [cout]`` with ``nn.Conv``'s
  default initialisers (LeCun normal, zeros), so ``nn.Conv`` parameters can be swapped
  in unchanged.
  """

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: tuple[int, int] = (1, 1)
  padding: Padding = "SAME"
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros_init()
  extract: str = "xla"  # "xla", "slices" (patches + GEMM) or "vjp" (see patch_conv)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kh, kw = self.kernel_size
    cin = x.shape[-1]
    kernel = self.param("kernel", self.kernel_init, (kh, kw, cin, self.features))
    y = patch_conv(x, kernel.astype(x.dtype), self.strides, self.padding, self.extract)
    if self.use_bias:
      bias = self.param("bias", self.bias_init, (self.features,))
      y = y + bias.astype(y.dtype)
    return y


def make_conv(impl: str, features: int, kernel_size, strides=(1, 1), padding="SAME",
              use_bias=True, name=None, **kw) -> nn.Module:
  """``PatchConv`` (impl "patches" / "slices" / "vjp") or ``nn.Conv`` ("lax"), same params."""
  kernel_size, strides = tuple(kernel_size), tuple(strides)
  if impl in ("patches", "slices", "vjp"):
    extract = {"patches": "xla", "slices": "slices", "vjp": "vjp"}[impl]
    return PatchConv(features, kernel_size, strides, padding, use_bias, name=name,
                     extract=extract, **kw)
  if impl == "lax":
    return nn.Conv(features, kernel_size, strides, padding, use_bias=use_bias, name=name,
                   **kw)
  raise ValueError(f"unknown conv impl {impl!r}; choose from {CONV_IMPLS}")


@jax.custom_vjp
def dense_matmul(x: Array, kernel: Array) -> Array:
  """``x [..., n] @ kernel [n, m]`` whose input gradient is computed as ``(kernel g^T)^T``.

  Autodiff's input gradient ``g @ kernel^T`` contracts the kernel on its minor axis, and
  XLA:CPU's GEMM runs that layout 4-12x slower than ``kernel @ g^T`` (the CNN's fc1,
  [10, 512] x [512, 3136]: 9.3 vs 1.9 ms jitted alone, 29.9 vs 2.5 ms in a vmap;
  docs/performance.md, "The CNN round against the roofline"). XLA's algebraic
  simplifier folds a plain ``(kernel @ g.T).T`` back into the slow form; the
  optimisation barrier stops that, leaving the fast dot and a transpose of the small
  ``[n, batch]`` result. Same values as ``x @ kernel`` and its autodiff gradients.
  """
  return x @ kernel


def _dense_matmul_fwd(x, kernel):
  return x @ kernel, (x, kernel)


def _dense_matmul_bwd(res, g):
  x, kernel = res
  g2 = g.reshape(-1, g.shape[-1])
  dx_t = lax.optimization_barrier(kernel @ g2.T)  # [n, batch]: kernel contracted on m
  dkernel = x.reshape(-1, x.shape[-1]).T @ g2
  return dx_t.T.reshape(x.shape), dkernel


dense_matmul.defvjp(_dense_matmul_fwd, _dense_matmul_bwd)


class Dense(nn.Module):
  """Drop-in for ``nn.Dense`` (same ``kernel [n, m]`` / ``bias [m]`` parameters and
  initialisers) whose backward uses :func:`dense_matmul`'s fast input gradient."""

  features: int
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
    y = dense_matmul(x, kernel.astype(x.dtype))
    if self.use_bias:
      y = y + self.param("bias", self.bias_init, (self.features,)).astype(y.dtype)
    return y


def make_dense(dense: str, features: int, name=None, **kw) -> nn.Module:
  """The dense layer of the convolutional models: :class:`Dense` ("fast") or flax's
  ``nn.Dense`` ("flax", autodiff backward); same parameters either way."""
  if dense not in DENSE_IMPLS:
    raise ValueError(f"unknown dense impl {dense!r}; choose from {DENSE_IMPLS}")
  return (Dense if dense == "fast" else nn.Dense)(features, name=name, **kw)


class BatchStatNorm(nn.Module):
  """BatchNorm that always normalises with the statistics of the batch it sees.

  Mean and (biased) variance over every axis but the last, then a learnable per-channel
  ``scale`` (ones) and ``bias`` (zeros), named as in ``nn.BatchNorm``. There are no
  running averages, hence no ``'batch_stats'`` collection: the layer is a pure function
  of its parameters and the current batch, in training and in evaluation alike.
  """

  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = x.shape[-1]
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean), axis=axes)
    scale = self.param("scale", nn.initializers.ones_init(), (c,))
    bias = self.param("bias", nn.initializers.zeros_init(), (c,))
    return (x - mean) * lax.rsqrt(var + self.epsilon) * scale + bias


def max_pool2(x: Array) -> Array:
  """2x2 max pooling with stride 2 (VALID), as a reshape and a max over the two 2-wide
  axes. Same values as ``nn.max_pool`` (``max_pool2_window``); its gradient is a
  reduce-max backward instead of XLA's select-and-scatter, which on CPU under ``vmap``
  was 12-19x slower (``benchmarks/cnn_profile.py``). Gradients differ only where a window
  has tied maxima (measure zero, except zeros after a ReLU, whose gradient is 0 anyway)."""
  n, h, w, c = x.shape
  x = x[:, :h - h % 2, :w - w % 2]
  return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def max_pool2_window(x: Array) -> Array:
  """``nn.max_pool`` 2x2 / stride 2: the reference ``max_pool2`` is checked against."""
  return nn.max_pool(x, (2, 2), strides=(2, 2))


def flatten(x: Array) -> Array:
  """[N, ...] -> [N, prod(...)]."""
  return x.reshape(x.shape[0], -1)


# ----------------------------------------------------------------------------- models


class LogisticRegression(nn.Module):
  """Multinomial logistic regression: flatten + Dense."""

  num_classes: int

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    return nn.Dense(self.num_classes)(flatten(x))


class MLP(nn.Module):
  """Fully connected ReLU network, hidden widths ``hidden`` (FedAvg's 2NN by default)."""

  num_classes: int
  hidden: tuple[int, ...] = (200, 200)

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    x = flatten(x)
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
  """PAFed's MNIST / Fashion-MNIST CNN (Table II; the FedAvg "CNN" of McMahan et al., 2017).

  conv 5x5x32 SAME, ReLU, maxpool 2 -> conv 5x5x64 SAME, ReLU, maxpool 2 -> flatten
  (7*7*64 = 3136 for 28x28 inputs) -> Dense ``hidden`` (512), ReLU -> Dense num_classes.
  1,663,370 parameters for 28x28x1 inputs and 10 classes.
  """

  num_classes: int = 10
  impl: str = "vjp"
  dense: str = "fast"
  hidden: int = 512  # FC_1's out_features

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    x = max_pool2(nn.relu(make_conv(self.impl, 32, (5, 5), name="conv1")(x)))
    x = max_pool2(nn.relu(make_conv(self.impl, 64, (5, 5), name="conv2")(x)))
    x = nn.relu(make_dense(self.dense, self.hidden, name="fc1")(flatten(x)))
    return make_dense(self.dense, self.num_classes, name="fc2")(x)


class CIFAR10CNN(CNN):
  """PAFed's CIFAR-10 CNN (Table II): :class:`CNN`'s layers on 32x32x3 inputs with FC_1
  4096 -> 256 (conv 5x5x32 pad 2, pool, conv 5x5x64 pad 2, pool, flatten 8*8*64 = 4096,
  Dense 256, Dense 10): 1,105,098 parameters. (Until 2026-11-25 FC_1 had 512 outputs,
  McMahan et al.'s width: 2,156,490 parameters.)"""

  hidden: int = 256


class CIFAR100CNN(nn.Module):
  """PAFed's CIFAR-100 CNN (Table IV), with batch-statistics normalisation and dropout.

  conv 3x3x32 pad 1, BN, ReLU -> conv 3x3x64, ReLU, maxpool 2 -> conv 3x3x128, BN, ReLU,
  maxpool 2, dropout 0.05 -> conv 3x3x256, BN, ReLU, maxpool 2, dropout 0.1 -> flatten
  (2*2*256 = 1024 for 32x32 inputs) -> Dense 512, ReLU -> dropout 0.1 -> Dense
  num_classes; convs 2-4 unpadded. 965,348 parameters for 100 classes.

  Table IV prints one "ReLU inplace=True" row, after conv1's BatchNorm, and none after
  convs 2-4: read as PyTorch's one shared ``nn.ReLU(inplace=True)`` module listed once,
  every conv here is followed by a ReLU (after its BN where it has one). Without them
  convs 2-4 would be one linear map between max-pools.

  Design decision: the BatchNorm layers (:class:`BatchStatNorm`) keep NO running
  statistics. They always normalise with the mean/variance of the batch they see (the
  local training minibatch, or the evaluation batch), and their scale/bias are ordinary
  parameters federated by the algorithm like any weight. The model thus has only a
  ``'params'`` collection and every client is a pure function of one flat parameter
  vector. Consequences: evaluation outputs depend on the composition of the evaluation
  batch (use reasonably large batches), and every row fed in (including rows masked
  out of the loss) contributes to the statistics. (Until 2026-11-25 this was a VGG-style
  network, convs 64/64/128/128 SAME, Dense 256, dropout 0.25 / 0.5, not Table IV's.)
  """

  num_classes: int = 100
  impl: str = "vjp"
  dense: str = "fast"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    x = make_conv(self.impl, 32, (3, 3), padding="SAME", name="conv1")(x)
    x = nn.relu(BatchStatNorm(name="bn1")(x))
    x = max_pool2(nn.relu(make_conv(self.impl, 64, (3, 3), padding="VALID",
                                    name="conv2")(x)))
    x = make_conv(self.impl, 128, (3, 3), padding="VALID", name="conv3")(x)
    x = max_pool2(nn.relu(BatchStatNorm(name="bn3")(x)))
    x = nn.Dropout(0.05, deterministic=not train)(x)
    x = make_conv(self.impl, 256, (3, 3), padding="VALID", name="conv4")(x)
    x = max_pool2(nn.relu(BatchStatNorm(name="bn4")(x)))
    x = nn.Dropout(0.1, deterministic=not train)(x)
    x = nn.relu(make_dense(self.dense, 512, name="fc1")(flatten(x)))
    x = nn.Dropout(0.1, deterministic=not train)(x)
    return make_dense(self.dense, self.num_classes, name="fc2")(x)


class SimpleCNN(nn.Module):
  """pfl-research's benchmark ``simple_cnn`` (benchmarks/model/*/cnn.py), e.g. CIFAR-10.

  conv 3x3x32 VALID, ReLU -> conv 3x3x64 VALID, ReLU -> maxpool 2 -> dropout 0.25 ->
  flatten ((H-4)//2)^2*64 -> Dense 128, ReLU -> dropout 0.5 -> Dense num_classes.
  pfl-research initialises kernels Glorot-uniform (biases zero); so does this module.
  """

  num_classes: int = 10
  impl: str = "vjp"
  dense: str = "fast"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    glorot = nn.initializers.xavier_uniform()
    x = nn.relu(make_conv(self.impl, 32, (3, 3), padding="VALID", kernel_init=glorot,
                          name="conv1")(x))
    x = nn.relu(make_conv(self.impl, 64, (3, 3), padding="VALID", kernel_init=glorot,
                          name="conv2")(x))
    x = nn.Dropout(0.25, deterministic=not train)(max_pool2(x))
    x = nn.relu(make_dense(self.dense, 128, kernel_init=glorot, name="fc1")(flatten(x)))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return make_dense(self.dense, self.num_classes, kernel_init=glorot, name="fc2")(x)


def make_norm(norm: str, groups: int, name: str) -> Callable[[Array], Array]:
  """GroupNorm(groups) for norm="group", identity for norm="none"."""
  if norm == "group":
    return nn.GroupNorm(num_groups=groups, name=name)
  if norm == "none":
    return lambda x: x
  raise ValueError(f"unknown norm {norm!r}; choose from ('group', 'none')")


class BasicBlock(nn.Module):
  """ResNet basic block: two 3x3 convs, norm, projection shortcut when shapes change."""

  features: int
  strides: int = 1
  impl: str = "vjp"
  norm: str = "group"
  groups: int = 2

  @nn.compact
  def __call__(self, x: Array) -> Array:
    s = (self.strides, self.strides)
    y = make_conv(self.impl, self.features, (3, 3), s, use_bias=False, name="conv1")(x)
    y = nn.relu(make_norm(self.norm, self.groups, "norm1")(y))
    y = make_conv(self.impl, self.features, (3, 3), use_bias=False, name="conv2")(y)
    y = make_norm(self.norm, self.groups, "norm2")(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      x = make_conv(self.impl, self.features, (1, 1), s, use_bias=False,
                    name="shortcut")(x)
      x = make_norm(self.norm, self.groups, "shortcut_norm")(x)
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """CIFAR-style ResNet-18 without BatchNorm (GroupNorm, or no normalisation).

  3x3x64 stem (stride 1, no max-pool), stages of two basic blocks with 64/128/256/512
  channels (stride 2 from the second stage), global average pool, Dense num_classes.
  Convs have no bias; ``norm="group"`` uses GroupNorm with ``groups`` groups (2 by
  default, as in Hsieh et al. 2020), ``norm="none"`` drops normalisation. With
  GroupNorm it has the parameter count of the usual BN version: 11,173,962 for 10
  classes.
  """

  num_classes: int = 10
  impl: str = "vjp"
  dense: str = "fast"
  norm: str = "group"
  groups: int = 2
  include_top: bool = True  # False: return the 512 global-pooled features (FedEDS's theta_g)

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    x = make_conv(self.impl, 64, (3, 3), use_bias=False, name="stem")(x)
    x = nn.relu(make_norm(self.norm, self.groups, "stem_norm")(x))
    for stage, width in enumerate((64, 128, 256, 512)):
      for block in range(2):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(width, strides, self.impl, self.norm, self.groups,
                       name=f"layer{stage + 1}_{block}")(x)
    pooled = jnp.mean(x, axis=(1, 2))
    if not self.include_top:
      return pooled
    return make_dense(self.dense, self.num_classes, name="fc")(pooled)


# --------------------------------------------------------------------------- registry

MODEL_NAMES = ("logreg", "mlp", "cnn", "cifar10_cnn", "cifar100_cnn", "simple_cnn",
               "resnet18")
_CONV_MODELS = {
    "cnn": CNN,
    "cifar10_cnn": CIFAR10CNN,
    "cifar100_cnn": CIFAR100CNN,
    "simple_cnn": SimpleCNN,
    "resnet18": ResNet18,
}


def get_model(name: str, num_classes: int, input_shape: Sequence[int] = (),
              impl: str = "vjp", dense: str = "fast") -> nn.Module:
  """The model called ``name`` for per-example inputs of ``input_shape``.

  ``impl`` ("patches", "slices", "lax" or "vjp") selects the convolution of conv models,
  ``dense`` ("fast" or "flax") their dense layers. Raises ValueError for an unknown name,
  impl or dense, or a non-HWC shape for a conv model.
  """
  if impl not in CONV_IMPLS:
    raise ValueError(f"unknown conv impl {impl!r}; choose from {CONV_IMPLS}")
  if dense not in DENSE_IMPLS:
    raise ValueError(f"unknown dense impl {dense!r}; choose from {DENSE_IMPLS}")
  if name == "logreg":
    return LogisticRegression(num_classes)
  if name == "mlp":
    return MLP(num_classes)
  if name in _CONV_MODELS:
    if input_shape and len(input_shape) != 3:
      raise ValueError(f"{name} needs [H, W, C] inputs, got input_shape={input_shape}")
    return _CONV_MODELS[name](num_classes=num_classes, impl=impl, dense=dense)
  raise ValueError(f"unknown model {name!r}; choose from {MODEL_NAMES}")


def default_model_for(dataset_name: str) -> str:
  """Default model name for a dataset (synthetic* -> logreg, MNISTs -> cnn, CIFARs)."""
  name = dataset_name.lower().replace("-", "_")
  if name.startswith("synthetic"):
    return "logreg"
  table = {"mnist": "cnn", "fashion_mnist": "cnn", "fmnist": "cnn",
           "cifar10": "cifar10_cnn", "cifar_10": "cifar10_cnn",
           "cifar100": "cifar100_cnn", "cifar_100": "cifar100_cnn"}
  if name in table:
    return table[name]
  raise ValueError(f"no default model for dataset {dataset_name!r}; known: "
                   f"synthetic*, {sorted(table)}")


# ----------------------------------------------------------------------- flat models


def init_params(model: nn.Module, input_shape: Sequence[int], key) -> Any:
  """``model``'s parameter pytree for per-example ``input_shape`` (batch of 1)."""
  x = jnp.zeros((1, *input_shape), jnp.float32)
  variables = jax.jit(lambda k, x: model.init({"params": k}, x, train=False))(key, x)
  extra = set(variables) - {"params"}
  if extra:
    raise ValueError(f"model has non-parameter state {sorted(extra)}; only 'params' "
                     "can be federated as a flat vector")
  return variables["params"]


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, like a function
class FlatApply:
  """``apply_flat(w, x, train=False, rng=None)``: the model on flat parameters.

  ``w`` is the flat vector ``[d]`` (``ravel_pytree`` order), or ``split(w)``: the tuple
  of its per-leaf pieces, each 1-D. Local training carries the pieces through its steps
  (``client.train``): from ``[d]`` every step copies the large kernels out of the vector
  and concatenates their gradients back into one (two parameter-sized copies per step
  that the pieces avoid; one client's 6-step CNN scan ran 1.14-1.17x faster with
  the pieces).
  """

  model: nn.Module
  unravel: Callable
  treedef: Any
  shapes: tuple  # each leaf's shape, in ravel order

  def split(self, w_flat) -> tuple:
    """``w [d]`` as one 1-D piece per leaf (concatenated, they are ``w`` again)."""
    offsets = np.cumsum([int(np.prod(s)) for s in self.shapes])[:-1]
    return tuple(jnp.split(w_flat, offsets))

  def params(self, w):
    """The parameter pytree of ``w`` (flat vector or ``split`` pieces)."""
    if isinstance(w, tuple):
      return jax.tree.unflatten(self.treedef,
                                [p.reshape(s) for p, s in zip(w, self.shapes)])
    return self.unravel(w)

  def __call__(self, w, x, train: bool = False, rng=None):
    rngs = {"dropout": rng} if rng is not None else None
    return self.model.apply({"params": self.params(w)}, x, train=train, rngs=rngs)


def flat_model(model: nn.Module, input_shape: Sequence[int], key):
  """Initial flat parameters ``w0 [d]`` and ``apply_flat(w, x, train=False, rng=None)``.

  ``apply_flat`` (a :class:`FlatApply`) unravels ``w`` into the parameter pytree
  (``ravel_pytree``) and returns logits; ``rng`` seeds dropout when ``train=True``.
  Both are vmap/jit friendly.
  """
  params = init_params(model, input_shape, key)
  w0, unravel = ravel_pytree(params)
  leaves, treedef = jax.tree.flatten(params)
  return w0, FlatApply(model, unravel, treedef, tuple(leaf.shape for leaf in leaves))


def count_params(model: nn.Module, input_shape: Sequence[int]) -> int:
  """Number of parameters, from abstract shapes (no compute)."""
  x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), x)
  return sum(int(leaf.size) for leaf in jax.tree.leaves(shapes))


def _flops(fn: Callable, *args) -> float:
  """FLOPs of ``jit(fn)(*args)`` from XLA's cost analysis (dict or list of dicts)."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    return float(sum(c.get("flops", 0.0) for c in cost if c))
  return float((cost or {}).get("flops", 0.0))


def _product_flops(eqn) -> float:
  """2 x output size x contraction length of one ``dot_general`` / convolution."""
  out = eqn.outvars[0].aval.shape
  if eqn.primitive.name == "dot_general":
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * np.prod(out) * np.prod([lhs[d] for d in lhs_contract])
  # conv_general_dilated: every output position against the whole kernel (in-features of
  # its group x window), whether or not a tap falls on padding.
  rhs, rhs_spec = eqn.invars[1].aval.shape, eqn.params["dimension_numbers"].rhs_spec
  return 2.0 * np.prod(out) * rhs[rhs_spec[1]] * np.prod([rhs[d] for d in rhs_spec[2:]])


def _jaxpr_product_flops(jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in ("dot_general", "conv_general_dilated"):
      total += _product_flops(eqn)
      continue
    if name == "while":
      raise ValueError("analytic FLOP count: a while loop's trip count is not static")
    subs = []
    for value in eqn.params.values():
      for v in value if isinstance(value, (tuple, list)) else (value,):
        v = getattr(v, "jaxpr", v)  # ClosedJaxpr -> Jaxpr
        if hasattr(v, "eqns"):
          subs.append(_jaxpr_product_flops(v))
    if name == "cond":  # one branch runs: count the dearest
      total += max(subs, default=0.0)
    else:  # scan runs its body `length` times; pjit, custom_jvp/vjp calls once
      total += eqn.params.get("length", 1) * sum(subs)
  return total


def analytic_flops(fn: Callable, *args) -> float:
  """FLOPs of the matrix products in ``fn(*args)``, counted from its jaxpr.

  Each ``dot_general`` and ``conv_general_dilated`` counts 2 x output size x contraction
  length, a convolution's every output position against its whole kernel (taps on SAME
  padding included); element-wise work is not counted. This is the analytic convention of
  model-FLOP counts (PyTorch's ``torch.utils.flop_counter``, MFU). XLA's cost analysis
  (:func:`count_flops`) leaves out the taps on padding and adds the element-wise ops: for
  the Fashion-MNIST CNN's training step it is 0.87x this count.
  """
  return _jaxpr_product_flops(jax.make_jaxpr(fn)(*args).jaxpr)


FLOP_COUNTS = ("xla", "analytic")


def _count(count: str) -> Callable:
  if count not in FLOP_COUNTS:
    raise ValueError(f"unknown FLOP count {count!r}; choose from {FLOP_COUNTS}")
  return _flops if count == "xla" else analytic_flops


def count_flops(model: nn.Module, input_shape: Sequence[int], batch: int,
                count: str = "xla") -> float:
  """Forward (evaluation) FLOPs for a batch of ``batch`` examples, per XLA's cost
  analysis (``count="xla"``) or :func:`analytic_flops` (``"analytic"``)."""
  w, apply_flat = flat_model(model, input_shape, jax.random.key(0))
  x = jnp.zeros((batch, *input_shape), jnp.float32)
  return _count(count)(lambda w, x: apply_flat(w, x), w, x)


def train_step_flops(model: nn.Module, input_shape: Sequence[int], batch: int,
                     count: str = "xla") -> float:
  """Forward+backward FLOPs (value_and_grad of mean cross-entropy) for one minibatch,
  ``count`` as in :func:`count_flops`."""
  w, apply_flat = flat_model(model, input_shape, jax.random.key(0))
  x = jnp.zeros((batch, *input_shape), jnp.float32)
  y = jnp.zeros((batch,), jnp.int32)

  def loss(w, x, y, rng):
    logits = apply_flat(w, x, train=True, rng=rng)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  return _count(count)(jax.value_and_grad(loss), w, x, y, jax.random.key(1))
