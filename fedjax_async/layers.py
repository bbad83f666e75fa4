"""Layers of the models: a vmap-friendly convolution, a dense layer with a fast input
gradient, batch-statistics norm and pooling.

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
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

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

  Args:
    x: the input, NHWC.
    kernel: the HWIO kernel ``[kh, kw, cin, cout]``.
    strides: the (row, column) strides.
    padding: ``"SAME"``, ``"VALID"`` or explicit ``((lo, hi), (lo, hi))`` pads.
    extract: ``"xla"``, ``"slices"`` or ``"vjp"`` (``PATCH_EXTRACTORS``).
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
  """``PatchConv`` (impl "patches" / "slices" / "vjp") or ``nn.Conv`` ("lax"), same params.

  Args:
    impl: ``"patches"``, ``"slices"``, ``"vjp"`` or ``"lax"`` (``CONV_IMPLS``).
    features: the output channels.
    kernel_size: the (height, width) of the kernel.
    strides: the (row, column) strides.
    padding: as ``nn.Conv``'s.
    use_bias: whether to add a bias.
    name: the module's name.
    **kw: passed on to the module (initialisers).
  """
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
