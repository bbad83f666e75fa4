"""FedEDS's client model: the split model f(x; theta_g, theta_c, theta_l) with its frozen,
client-specific stochastic layer theta_l, and the UNet data encryptor g(x; phi)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Sequence, Tuple

import flax.linen as nn
import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp

from fedjax_async import layers
from fedjax_async import models

Array = jax.Array


# ---------------------------------------------------------------------- client model


def _flatten(x):
  return x.reshape(x.shape[0], -1)


class CNNFeatures(nn.Module):
  """theta_g of the PAFed CNN: conv5x5x32-pool-conv5x5x64-pool-FC(hidden), ReLUs (the
  vmap-friendly convolution and pooling of ``fedjax_async.models``; same parameters as
  ``nn.Conv``)."""

  hidden: int = 512

  @nn.compact
  def __call__(self, x):
    x = layers.max_pool2(nn.relu(layers.make_conv("vjp", 32, (5, 5), name="conv1")(x)))
    x = layers.max_pool2(nn.relu(layers.make_conv("vjp", 64, (5, 5), name="conv2")(x)))
    return nn.relu(nn.Dense(self.hidden, name="fc1")(_flatten(x)))


class MLPFeatures(nn.Module):
  """theta_g of a tiny MLP (tests): flatten-FC(hidden)-ReLU."""

  hidden: int = 16

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(self.hidden, name="fc1")(_flatten(x)))


class Classifier(nn.Module):
  """theta_c: one linear layer on the (perturbed) features."""

  num_classes: int

  @nn.compact
  def __call__(self, h):
    return nn.Dense(self.num_classes, name="fc2")(h)


@dataclasses.dataclass(frozen=True)
class SplitModel:
  """f(x; theta_g, theta_c, theta_l) = classifier(layer(features(x))) (Sec. IV, Fig. 2).

  The split is after the penultimate ReLU layer (FC 512 for the CNN), where ResNet-18 has
  its global-pooled features: theta_l perturbs the representation the linear classifier
  reads.
  """

  kind: str  # "cnn" | "mlp" | "resnet18"
  num_classes: int
  input_shape: Tuple[int, ...]
  hidden: int = 512

  def __post_init__(self):
    if self.kind not in ("cnn", "mlp", "resnet18"):
      raise ValueError(f"SplitModel.kind must be 'cnn', 'mlp' or 'resnet18', got "
                       f"{self.kind!r}")
    if self.kind == "resnet18" and self.hidden != 512:
      raise ValueError(f"resnet18's pooled features are 512 wide; got hidden={self.hidden}")

  @property
  def feature_dim(self) -> int:
    return self.hidden

  def _modules(self):
    if self.kind == "resnet18":  # the paper's model: ResNet-18 without BatchNorm
      feats = models.ResNet18(self.num_classes, norm="none", include_top=False)
    elif self.kind == "cnn":
      feats = CNNFeatures(self.hidden)
    else:
      feats = MLPFeatures(self.hidden)
    return feats, Classifier(self.num_classes)

  def init(self, key) -> Tuple[Any, Any]:
    """(theta_g, theta_c) parameter pytrees."""
    feats, clf = self._modules()
    kg, kc = jax.random.split(key)
    theta_g = feats.init(kg, jnp.zeros((1,) + tuple(self.input_shape)))["params"]
    theta_c = clf.init(kc, jnp.zeros((1, self.hidden)))["params"]
    return theta_g, theta_c

  def features(self, theta_g, x):
    return self._modules()[0].apply({"params": theta_g}, x)

  def classify(self, theta_c, h):
    return self._modules()[1].apply({"params": theta_c}, h)

  def forward(self, theta_g, theta_c, x, stochastic_layer=None, *, rng=None,
              noise_std: float = 0.0):
    """Logits; ``stochastic_layer=None`` skips theta_l (Eq. 2), else uses it (Eq. 3/6).

    Args:
      theta_g: the feature extractor's parameters.
      theta_c: the classifier's.
      x: the inputs.
      stochastic_layer: theta_l (None: skipped).
      rng: the layer's fresh noise key (None: no noise).
      noise_std: the std of that noise.
    """
    h = self.features(theta_g, x)
    if stochastic_layer is not None:
      h = apply_stochastic_layer(stochastic_layer, h, rng=rng, noise_std=noise_std)
    return self.classify(theta_c, h)

  def flat(self, key):
    """(w0 [d], apply_flat, split): the engine's flat view of (theta_g, theta_c).

    ``apply_flat(w, x, train=False, rng=None)`` is f with the stochastic layer off (how
    the engine trains on local data and evaluates); ``split(w) -> (theta_g, theta_c)``.
    """
    w0, unravel = ravel_pytree(self.init(key))

    def split(w):
      return unravel(w)

    def apply_flat(w, x, train: bool = False, rng=None):
      del train, rng
      theta_g, theta_c = unravel(w)
      return self.forward(theta_g, theta_c, x)

    return w0, apply_flat, split


def forward(model: SplitModel, theta_g, theta_c, x, stochastic_layer=None, **kw):
  """Module-level alias of ``model.forward`` (pure; vmap over clients freely).

  Args:
    model: the split model.
    theta_g: the feature extractor's parameters.
    theta_c: the classifier's.
    x: the inputs.
    stochastic_layer: theta_l (None: skipped).
    **kw: ``rng``, ``noise_std`` (``SplitModel.forward``).
  """
  return model.forward(theta_g, theta_c, x, stochastic_layer, **kw)


# ------------------------------------------------------------------- stochastic layer


def make_stochastic_layer(key, feature_dim: int, gain_std: float = 1.0,
                          bias_std: float = 1.0) -> Dict[str, Array]:
  """theta_l = {gain: 1 + s A, bias: b B}, A, B ~ N(0, I_F) drawn once from ``key``."""
  ka, kb = jax.random.split(key)
  return {"gain": 1.0 + gain_std * jax.random.normal(ka, (feature_dim,)),
          "bias": bias_std * jax.random.normal(kb, (feature_dim,))}


def client_stochastic_layers(seed: int, num_clients: int, feature_dim: int,
                             gain_std: float = 1.0, bias_std: float = 1.0):
  """Stacked theta_l^k for k = 0..N-1 ([N, F] leaves): client k's layer depends only on
  (seed, k), as if the server drew it with the client's seed (Alg. 3, line 1).

  Args:
    seed: the server's seed.
    num_clients: N.
    feature_dim: F, the features' size.
    gain_std: s, the gain's spread.
    bias_std: b, the bias's spread.
  """
  root = jax.random.PRNGKey(seed)
  keys = jax.vmap(lambda k: jax.random.fold_in(root, k))(jnp.arange(num_clients))
  return jax.vmap(lambda k: make_stochastic_layer(k, feature_dim, gain_std, bias_std))(keys)


def apply_stochastic_layer(theta_l, h, *, rng=None, noise_std: float = 0.0):
  """h -> h * gain + bias (+ noise_std * fresh N(0, 1) when ``rng`` is given).

  theta_l is wrapped in ``stop_gradient``: it is frozen wherever it is used.
  """
  theta_l = jax.lax.stop_gradient(theta_l)
  out = h * theta_l["gain"] + theta_l["bias"]
  if rng is not None and noise_std:
    out = out + noise_std * jax.random.normal(rng, out.shape, out.dtype)
  return out


# ---------------------------------------------------------------------- encryptor


class _DoubleConv(nn.Module):
  features: int

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(self.features, (3, 3))(x))
    return nn.relu(nn.Conv(self.features, (3, 3))(x))


class UNet(nn.Module):
  """Data encryptor g(x; phi) (Sec. VI-A2): two down blocks (max-pool + double 3x3 conv),
  two up blocks (2x2 transposed conv, concat skip, double conv), a 1x1 output conv and a
  sigmoid onto the image range [lo, hi]. No BatchNorm (see docs/fededs.md)."""

  out_channels: int
  width: int = 16
  lo: float = 0.0
  hi: float = 1.0

  @nn.compact
  def __call__(self, x):
    w = self.width
    x1 = _DoubleConv(w)(x)
    x2 = _DoubleConv(2 * w)(layers.max_pool2(x1))
    x3 = _DoubleConv(4 * w)(layers.max_pool2(x2))
    u2 = nn.ConvTranspose(2 * w, (2, 2), strides=(2, 2))(x3)
    u2 = _DoubleConv(2 * w)(jnp.concatenate([u2, x2], -1))
    u1 = nn.ConvTranspose(w, (2, 2), strides=(2, 2))(u2)
    u1 = _DoubleConv(w)(jnp.concatenate([u1, x1], -1))
    out = nn.Conv(self.out_channels, (1, 1))(u1)
    return self.lo + (self.hi - self.lo) * nn.sigmoid(out)


def make_encryptor(input_shape: Sequence[int], width: int = 16, lo: float = 0.0,
                   hi: float = 1.0) -> UNet:
  h, w_, c = input_shape
  if h % 4 or w_ % 4:
    raise ValueError(f"the UNet encryptor needs H and W divisible by 4, got {input_shape}")
  return UNet(out_channels=c, width=width, lo=lo, hi=hi)
