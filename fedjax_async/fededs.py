"""FedEDS: federated learning with encrypted data sharing (Li et al., "Efficient Federated
Learning with Encrypted Data Sharing for Data-Heterogeneous Edge Devices").

The parts, each a small pure function (see docs/fededs.md for the full story):

* the split client model f(x; theta_g, theta_c, theta_l) (``SplitModel``): a feature
  extractor theta_g, a classifier theta_c and a frozen, client-specific **stochastic layer**
  theta_l between them that can be switched off (``forward(..., stochastic_layer=None)``);
* encrypted data generation (Alg. 1): pre-train the client model on local data with the
  stochastic layer off (Eq. 2, ``pretrain_clients``), freeze it, switch the layer on and
  train a UNet data encryptor g(x; phi_k) so that f(g(x)) still classifies x (Eq. 3,
  ``train_encryptors``), then share D_k^F = {(g(x), softmax f(g(x)))} with theta_l^k
  (Eq. 4, ``encrypt``); ``generate_encrypted`` runs all of it vmapped over clients;
* piecewise epoch annealing (Eq. 5, ``annealed_epochs``) and the transfer weights
  lambda_c, lambda_dis (Eqs. 9-10, ``transfer_weights``); ``round_hparams`` turns them into
  the engine's per-round ``hp``;
* knowledge transfer (Alg. 2, Eqs. 6-8): ``wrap(base_algorithm, model, shared)`` returns an
  ``Algorithm`` whose ``local_penalty`` adds lambda_dis * KL(soft label || f(x; theta_k,
  theta_l^i)) on encrypted data of another client i (with *client i's* stochastic layer);
* ``run`` drives the round engine round by round with those per-round hyperparameters;
* ``save_encryption_grid`` / ``privacy_report`` (PSNR, Gaussian-window SSIM): Fig. 3.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_async import client as client_lib
from fedjax_async import layers
from fedjax_async import models
from fedjax_async.algorithms import base

Array = jax.Array
ID_KEY = "fededs_id"  # client-state key holding a one-hot of the client's own index


# ------------------------------------------------------------------------ schedules


def annealed_epochs(t, e_max, e_min, t_alpha, t_beta):
  """Local epochs E_t of round t (1-based) by piecewise epoch annealing (Eq. 5).

  E_t = E_max for t <= T_alpha; E_max - floor((E_max - E_min)(t - T_alpha) /
  (T_beta - T_alpha)) for T_alpha < t <= T_beta; E_min for t > T_beta. Works on Python
  ints (host) and on traced scalars.
  """
  if isinstance(t, (int, np.integer)):
    if t <= t_alpha:
      return int(e_max)
    if t <= t_beta:
      return int(e_max - ((e_max - e_min) * (t - t_alpha)) // (t_beta - t_alpha))
    return int(e_min)
  t = jnp.asarray(t)
  span = max(t_beta - t_alpha, 1)
  mid = e_max - jnp.floor_divide((e_max - e_min) * (t - t_alpha), span)
  return jnp.where(t <= t_alpha, e_max, jnp.where(t <= t_beta, mid, e_min)).astype(jnp.int32)


def transfer_weights(t, m: float = 3.0, eps: float = 0.01) -> Tuple[float, float]:
  """(lambda_c, lambda_dis) of round t (1-based), Eqs. 9-10.

  lambda_c = sigmoid(m (t - 1)), lambda_dis = 1 - lambda_c; once lambda_dis < eps it is
  set to 0 and lambda_c to 1. Round 1 gives (0.5, 0.5).
  """
  z = math.exp(-m * (t - 1))
  lam_dis = z / (1.0 + z)
  if lam_dis < eps:
    return 1.0, 0.0
  return 1.0 / (1.0 + z), lam_dis


def equal_work_epochs(num_rounds: int, cfg: "FedEDSConfig") -> list:
  """Per-round local epochs of the equal-work baseline: the same total as FedEDS's
  annealed E_1..E_T (Eq. 5), spread as evenly as integers allow (floor(total / T) each,
  one more in the rounds where floor(r * extra / T) steps up). Every client takes
  ceil(n_i / B) steps per epoch, so the baseline takes exactly FedEDS's local steps."""
  total = sum(annealed_epochs(t, cfg.e_max, cfg.e_min, cfg.t_alpha, cfg.t_beta)
              for t in range(1, num_rounds + 1))
  base, extra = divmod(total, num_rounds)
  return [base + ((r + 1) * extra // num_rounds - r * extra // num_rounds)
          for r in range(num_rounds)]


@dataclasses.dataclass(frozen=True)
class FedEDSConfig:
  """The paper's Sec. VI-A3 settings (defaults) plus this implementation's choices."""

  e_max: int = 5  # E_max (Eq. 5)
  e_min: int = 1  # E_min
  t_alpha: int = 1  # T_alpha^turn
  t_beta: int = 3  # T_beta^turn
  m: float = 3.0  # speed of lambda_c / lambda_dis (Eqs. 9-10)
  eps: float = 0.01  # lambda_dis below eps is switched off
  lr: float = 0.01  # client SGD
  momentum: float = 0.9
  weight_decay: float = 1e-4
  batch_size: int = 50
  pretrain_epochs: int = 5  # E_c of Alg. 1 (not given in the paper)
  encryptor_epochs: int = 20  # E_g of Alg. 1 (Sec. VI-D: 20 epochs)
  encryptor_lr: float = 1e-3  # AdamW
  encryptor_weight_decay: float = 1e-2  # AdamW's usual default (not given in the paper)
  unet_width: int = 16  # channels of the UNet's first level (doubled per level)
  transfer_batch: int = 50  # encrypted rows per local step in the KL term
  layer_gain_std: float = 1.0  # s: theta_l gain = 1 + s * A_k, A_k ~ N(0, 1)
  layer_bias_std: float = 1.0  # theta_l bias = b * B_k, B_k ~ N(0, 1)

  def __post_init__(self):
    checks = [
        ("e_min", self.e_min >= 1, ">= 1"),
        ("e_max", self.e_max >= self.e_min, ">= e_min"),
        ("t_alpha", self.t_alpha >= 0, ">= 0"),
        ("t_beta", self.t_beta > self.t_alpha, "> t_alpha"),
        ("eps", 0.0 <= self.eps < 0.5, "in [0, 0.5)"),
        ("batch_size", self.batch_size >= 1, ">= 1"),
        ("transfer_batch", self.transfer_batch >= 1, ">= 1"),
        ("pretrain_epochs", self.pretrain_epochs >= 1, ">= 1"),
        ("encryptor_epochs", self.encryptor_epochs >= 1, ">= 1"),
    ]
    for name, ok, what in checks:
      if not ok:
        raise ValueError(f"FedEDSConfig.{name} must be {what}, got {getattr(self, name)}")


def round_hparams(base_hp: Dict[str, float], t: int, cfg: FedEDSConfig, *, anneal: bool,
                  share: bool, fixed_epochs: int = 1) -> Dict[str, float]:
  """The engine ``hp`` of round t (1-based) for FedEDS / its ablations (Alg. 2, l. 2-3).

  ``local_epochs`` is E_t (Eq. 5) with ``anneal`` else ``fixed_epochs`` (an int, or a
  per-round sequence indexed by t - 1, e.g. ``equal_work_epochs``); with ``share``
  the transfer weights come from Eqs. 9-10, else (1, 0). The engine's loss is
  CE + local_penalty, so ``wrap``'s penalty divides by lambda_c and the learning rate is
  scaled by lambda_c here: lr * lambda_c * (CE + pen / lambda_c) = lr * (lambda_c CE + pen),
  the gradient of Eq. 8 (Eq. 11 for FedProx) exactly.
  """
  lam_c, lam_dis = transfer_weights(t, cfg.m, cfg.eps) if share else (1.0, 0.0)
  hp = dict(base_hp)
  hp["local_epochs"] = (annealed_epochs(t, cfg.e_max, cfg.e_min, cfg.t_alpha, cfg.t_beta)
                        if anneal else int(fixed_epochs) if np.ndim(fixed_epochs) == 0
                        else int(fixed_epochs[t - 1]))
  hp["fededs_lambda_c"] = lam_c
  hp["fededs_lambda_dis"] = lam_dis
  hp["lr"] = base_hp["lr"] * lam_c
  return hp


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
    """Logits; ``stochastic_layer=None`` skips theta_l (Eq. 2), else uses it (Eq. 3/6)."""
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
  """Module-level alias of ``model.forward`` (pure; vmap over clients freely)."""
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
  (seed, k), as if the server drew it with the client's seed (Alg. 3, line 1)."""
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


# ------------------------------------------------------- local training (one client)


def _train_epochs(loss_fn: Callable, opt, params, x, y, n, key, epochs: int, batch: int):
  """Minimises ``loss_fn(params, xb, yb, mask)`` for ``epochs`` passes over the client's
  n real rows (minibatches of ``batch``; padding never drawn, as ``client.train``).

  Returns (params, per-epoch mean loss [epochs]). vmap over clients.
  """
  cfg = client_lib.LocalConfig(batch_size=batch, max_epochs=epochs, max_examples=x.shape[0])
  init = client_lib.client_init(key, n, cfg)
  budget = init.num_epochs * init.spe
  grad_fn = jax.value_and_grad(loss_fn)

  def step(carry, s):
    p, o = carry
    epoch = jnp.minimum(s // init.spe, epochs - 1)
    rows, mask = client_lib.step_minibatch(init, s, n, cfg)
    loss, g = grad_fn(p, x[rows], y[rows], mask)
    updates, new_o = opt.update(g, o, p)
    active = s < budget
    p = jax.tree.map(lambda a, b: jnp.where(active, a, b), optax.apply_updates(p, updates), p)
    o = jax.tree.map(lambda a, b: jnp.where(active, a, b), new_o, o)
    return (p, o), (loss, active, epoch)

  (params, _), (losses, active, ep) = jax.lax.scan(step, (params, opt.init(params)),
                                                   jnp.arange(cfg.max_steps))
  onehot = jax.nn.one_hot(ep, epochs) * active[:, None]
  per_epoch = (losses @ onehot) / jnp.maximum(onehot.sum(0), 1.0)
  return params, per_epoch


def _sgd(cfg: FedEDSConfig):
  """SGD with momentum and (coupled, PyTorch-style) weight decay (Sec. VI-A3)."""
  return optax.chain(optax.add_decayed_weights(cfg.weight_decay),
                     optax.sgd(cfg.lr, momentum=cfg.momentum))


def pretrain_client(model: SplitModel, theta, x, y, n, key, cfg: FedEDSConfig):
  """Alg. 1 lines 1-4: E_c epochs of SGD on CE(y, f(x; theta_g, theta_c)) (Eq. 2), the
  stochastic layer off. ``theta = (theta_g, theta_c)``; returns (theta, epoch losses)."""

  def loss_fn(th, xb, yb, mask):
    return client_lib.masked_cross_entropy(model.forward(th[0], th[1], xb), yb, mask)

  return _train_epochs(loss_fn, _sgd(cfg), theta, x, y, n, key, cfg.pretrain_epochs,
                       cfg.batch_size)


def train_encryptor(model: SplitModel, encryptor: nn.Module, theta, theta_l, x, y, n, key,
                    cfg: FedEDSConfig):
  """Alg. 1 lines 5-7: E_g epochs of AdamW on phi for CE(y, f(g(x; phi); theta, theta_l))
  (Eq. 3), theta frozen (stop_gradient), the stochastic layer on (``theta_l=None``: off,
  the "without stochastic layer" row of Fig. 3). Returns (phi, epoch losses)."""
  theta = jax.lax.stop_gradient(theta)
  k_init, k_train = jax.random.split(key)
  phi = encryptor.init(k_init, x[:1])["params"]

  def loss_fn(ph, xb, yb, mask):
    xe = encryptor.apply({"params": ph}, xb)
    return client_lib.masked_cross_entropy(model.forward(theta[0], theta[1], xe, theta_l),
                                           yb, mask)

  opt = optax.adamw(cfg.encryptor_lr, weight_decay=cfg.encryptor_weight_decay)
  return _train_epochs(loss_fn, opt, phi, x, y, n, k_train, cfg.encryptor_epochs,
                       cfg.batch_size)


def encrypt(model: SplitModel, encryptor: nn.Module, theta, phi, theta_l, x,
            chunk: int = 256):
  """Eq. 4: (g(x; phi), softmax f(g(x); theta, theta_l)) for every row of x (chunked)."""
  m = x.shape[0]
  chunk = min(chunk, m)
  nb = -(-m // chunk)
  xp = jnp.concatenate([x, jnp.zeros((nb * chunk - m,) + x.shape[1:], x.dtype)])

  def one(xb):
    xe = encryptor.apply({"params": phi}, xb)
    return xe, jax.nn.softmax(model.forward(theta[0], theta[1], xe, theta_l), -1)

  xe, soft = jax.lax.map(one, xp.reshape((nb, chunk) + x.shape[1:]))
  return (xe.reshape((nb * chunk,) + x.shape[1:])[:m],
          soft.reshape(nb * chunk, -1)[:m])


class SharedData(NamedTuple):
  """What every client receives (Alg. 3 line 6): D_i^F and theta_l^i of all clients."""

  x: Array  # [N, S, ...] encrypted inputs g(x; phi_i)
  soft: Array  # [N, S, C] soft labels softmax f(g(x); theta_i, theta_l^i)
  counts: Array  # int32 [N] real rows per client (the rest is padding)
  layers: Dict[str, Array]  # theta_l^i, leaves [N, F]


class Generation(NamedTuple):
  shared: SharedData
  pretrain_loss: Array  # [N, E_c] per-epoch mean CE of Alg. 1 step 1
  encryptor_loss: Array  # [N, E_g] per-epoch mean CE of Alg. 1 step 2
  theta: Any  # the pre-trained (theta_g, theta_c) of each client (discarded by Alg. 1 l. 9)
  phi: Any  # the encryptors


@functools.lru_cache(maxsize=16)
def _generation_fn(model, encryptor, cfg, share_rows, use_layer, client_loop="vmap"):
  """jit(vmap(Alg. 1 of one client)) (``client_loop="map"``: a sequential ``lax.map``
  over clients, faster on CPU where batched-weight convolutions are slow), cached so
  repeated calls do not recompile."""

  def one(th0, layer, xk, yk, nk, kk):
    theta, pre_loss = pretrain_client(model, th0, xk, yk, nk, kk[0], cfg)
    lay = layer if use_layer else None
    phi, enc_loss = train_encryptor(model, encryptor, theta, lay, xk, yk, nk, kk[1], cfg)
    rows = xk if share_rows is None else xk[:share_rows]
    xe, soft = encrypt(model, encryptor, theta, phi, lay, rows)
    return xe, soft, pre_loss, enc_loss, theta, phi

  if client_loop == "map":
    return jax.jit(lambda th0, *args: jax.lax.map(lambda a: one(th0, *a), args))
  if client_loop != "vmap":
    raise ValueError(f"client_loop must be 'vmap' or 'map', got {client_loop!r}")
  return jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0, 0, 0)))


def generate_encrypted(model: SplitModel, encryptor: nn.Module, theta0, layers, x, y, counts,
                       key, cfg: FedEDSConfig, *, share_rows: Optional[int] = None,
                       use_layer: bool = True, client_loop: str = "vmap") -> Generation:
  """Alg. 1 for all clients at once (vmapped): pre-train from the global theta0, train the
  encryptor with the client's own stochastic layer, encrypt the client's data.

  ``share_rows``: share only the first S rows of each client's (padded) set (default all);
  the client's local model is restored afterwards (line 9): nothing but ``shared`` is
  meant to leave this function for training. ``client_loop``: "vmap" (default) or
  "map" (sequential over clients; faster on CPU).
  """
  num_clients = x.shape[0]
  keys = jax.random.split(key, 2 * num_clients).reshape(num_clients, 2, -1)
  fn = _generation_fn(model, encryptor, cfg, share_rows, use_layer, client_loop)
  xe, soft, pre_loss, enc_loss, theta, phi = fn(theta0, layers, x, y, counts, keys)
  cnt = counts if share_rows is None else jnp.minimum(counts, share_rows)
  shared = SharedData(xe, soft, cnt.astype(jnp.int32), layers)
  return Generation(shared, pre_loss, enc_loss, theta, phi)


# -------------------------------------------------------------- knowledge transfer


def kl_soft(p, logits, mask=None):
  """Mean over rows of KL(p || softmax(logits)) = sum_c p_c (log p_c - log q_c) (Eq. 6);
  0 log 0 = 0; rows with ``mask`` False are left out."""
  logq = jax.nn.log_softmax(logits, -1)
  per_row = jnp.sum(jax.scipy.special.xlogy(p, p) - p * logq, -1)
  if mask is None:
    return jnp.mean(per_row)
  mask = mask.astype(per_row.dtype)
  return jnp.sum(per_row * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def transfer_loss(model: SplitModel, theta_g, theta_c, x_enc, soft, theta_l, mask=None):
  """L_dis (Eq. 6): KL between sender i's soft labels and f(x; theta_k, theta_l^i)."""
  return kl_soft(soft, model.forward(theta_g, theta_c, x_enc, theta_l), mask)


def sample_sender(key, own, num_clients):
  """i* ~ U({0..N-1} \\ {own}) (Eq. 8): draw j in 0..N-2 and skip over ``own``."""
  j = jax.random.randint(key, (), 0, num_clients - 1)
  return jnp.where(j >= own, j + 1, j)


def step_key(w, own, seed: int = 0):
  """A PRNG key that changes every local step: ``local_penalty`` gets no key, so one is
  derived from (seed, client, a hash of the current parameters w). Workaround until the
  engine passes the step key to ``local_penalty`` (docs/fededs.md)."""
  bits = jax.lax.bitcast_convert_type(jax.lax.stop_gradient(w), jnp.uint32)
  mult = jnp.arange(bits.shape[0], dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
  h = jnp.sum(bits * mult, dtype=jnp.uint32)
  k = jax.random.fold_in(jax.random.PRNGKey(seed), own)
  return jax.random.fold_in(k, h)


def _take_layer(layers, i):
  return jax.tree.map(lambda a: a[i], layers)


def transfer_penalty(model: SplitModel, split: Callable, shared: SharedData, w, own, key,
                     batch: int, mode: str = "sample"):
  """The knowledge-transfer term for client ``own`` at parameters w.

  mode "sample" (Eq. 8): one sender i* != own, ``batch`` rows of D_{i*}^F drawn
  uniformly from its real rows, scored with theta_l^{i*}. mode "all" (Eq. 7): the sum of
  that term over every sender i != own.
  """
  theta_g, theta_c = split(w)
  num_clients = shared.counts.shape[0]

  def one_sender(i, k):
    rows = jax.random.randint(k, (batch,), 0, jnp.maximum(shared.counts[i], 1))
    return transfer_loss(model, theta_g, theta_c, shared.x[i][rows], shared.soft[i][rows],
                         _take_layer(shared.layers, i))

  if mode == "sample":
    k_i, k_rows = jax.random.split(key)
    return one_sender(sample_sender(k_i, own, num_clients), k_rows)
  if mode == "all":
    ids = jnp.arange(num_clients)
    per = jax.vmap(one_sender)(ids, jax.random.split(key, num_clients))
    return jnp.sum(jnp.where(ids != own, per, 0.0))
  raise ValueError(f"transfer mode must be 'sample' or 'all', got {mode!r}")


def wrap(base_algorithm: base.Algorithm, model: Optional[SplitModel] = None,
         split: Optional[Callable] = None, shared: Optional[SharedData] = None, *,
         batch: int = 50, mode: str = "sample", seed: int = 0,
         name: Optional[str] = None) -> base.Algorithm:
  """FedEDS on top of ``base_algorithm`` (Alg. 2; Alg. 3 for FedAvg/FedProx, Alg. 4 for
  FedNova: uploads and server update are the base algorithm's).

  ``local_penalty`` = (base penalty + lambda_dis * L_dis + wd/2 ||w||^2) / lambda_c with
  lambda_c, lambda_dis, wd from hp (``fededs_lambda_c``, ``fededs_lambda_dis``,
  ``weight_decay``); together with ``round_hparams``'s lr * lambda_c this is Eq. 8 / 11.
  With ``shared=None`` there is no transfer term (baselines and ablation S1 keep the same
  weight decay). The shared data is closed over (device arrays); the client's own index
  comes from the per-client state ``fededs_id`` (a one-hot, see ``install_client_ids``).
  """
  if shared is not None and (model is None or split is None):
    raise ValueError("wrap: shared data needs the SplitModel and its split function")
  if mode not in ("sample", "all"):
    raise ValueError(f"wrap: mode must be 'sample' or 'all', got {mode!r}")
  base_keys = tuple(base_algorithm.client_state_keys)
  num_clients = 0 if shared is None else int(shared.counts.shape[0])

  def base_state(cs):
    return {k: cs[k] for k in base_keys}

  def init_client_state(w0):
    st = dict(base_algorithm.init_client_state(w0))
    st[ID_KEY] = jnp.zeros_like(w0)
    return st

  def local_penalty(w, w_start, cs, hp):
    lam_c = hp.get("fededs_lambda_c", 1.0)
    pen = base_algorithm.local_penalty(w, w_start, base_state(cs), hp)
    pen = pen + 0.5 * hp.get("weight_decay", 0.0) * jnp.vdot(w, w)
    if shared is not None:
      lam_dis = hp.get("fededs_lambda_dis", 0.0)
      own = jnp.argmax(cs[ID_KEY][:num_clients])
      key = step_key(w, own, seed)
      kl = jax.lax.cond(
          jnp.asarray(lam_dis) > 0,
          lambda: transfer_penalty(model, split, shared, w, own, key, batch, mode),
          lambda: jnp.float32(0.0))
      pen = pen + lam_dis * kl
    return pen / lam_c

  def client_final(w_start, w_end, cs, num_steps, hp):
    out = base_algorithm.client_final(w_start, w_end, base_state(cs), num_steps, hp)
    st = dict(out.state)
    st[ID_KEY] = cs[ID_KEY]
    return base.ClientOutput(upload=out.upload, state=st)

  return base.Algorithm(
      name=name or f"fededs+{base_algorithm.name}",
      local_penalty=local_penalty,
      client_final=client_final,
      server_update=base_algorithm.server_update,
      client_state_keys=base_keys + (ID_KEY,),
      init_client_state=init_client_state,
      init_server_state=base_algorithm.init_server_state,
      streamed_server=base_algorithm.streamed_server,
  )


def client_id_rows(num_clients: int, dim: int) -> Array:
  """[N, d] with row k the one-hot e_k (needs d >= N)."""
  if dim < num_clients:
    raise ValueError(f"client ids need d >= N, got d={dim} < N={num_clients}")
  return jnp.eye(num_clients, dim, dtype=jnp.float32)


def install_client_ids(state):
  """``engine.SimState`` with ``client_state['fededs_id']`` set to each client's one-hot
  (``init_state`` broadcasts one initial state to all clients, so this runs after it)."""
  cs = dict(state.client_state)
  n, d = cs[ID_KEY].shape
  cs[ID_KEY] = client_id_rows(n, d)
  return state._replace(client_state=cs)


# ------------------------------------------------------------------------- driver


def hp_schedule(base_hp, num_rounds: int, cfg: FedEDSConfig, *, anneal: bool, share: bool,
                fixed_epochs: int = 1):
  """(hp, round_hp): the hp of round 1 and, for the keys that change from round to round,
  their values over engine rounds 0 .. num_rounds - 1 (paper round t = engine round + 1):
  E_t (Eq. 5), lambda_c, lambda_dis (Eqs. 9-10) and lr * lambda_c (``round_hparams``)."""
  per_round = [round_hparams(base_hp, r + 1, cfg, anneal=anneal, share=share,
                             fixed_epochs=fixed_epochs) for r in range(num_rounds)]
  keys = ("local_epochs", "fededs_lambda_c", "fededs_lambda_dis", "lr")
  return per_round[0], {k: np.asarray([hp[k] for hp in per_round], np.float32)
                        for k in keys}


def init_state(algorithm: base.Algorithm, w0, num_clients: int, ring_size: int = 2,
               seed: int = 0):
  """``engine.init_state`` with the client ids a wrapped algorithm keeps installed: the
  state ``run`` starts from, and the template a checkpoint is restored into."""
  from fedjax_async import engine  # pylint: disable=g-import-not-at-top
  state = engine.init_state(algorithm, w0, num_clients, ring_size, seed)
  if ID_KEY in state.client_state:
    state = install_client_ids(state)
  return state


def run(apply_flat, algorithm: base.Algorithm, w0, data, timeline, base_hp,
        cfg: FedEDSConfig, *, anneal: bool, share: bool, fixed_epochs: int = 1,
        ring_size: int = 2, seed: int = 0, eval_every: int = 1, rounds_per_call: int = 10,
        on_chunk=None, state=None):
  """Runs the round engine with per-round hp (Eq. 5, Eqs. 9-10) passed as
  ``engine.simulate``'s ``round_hp``: one runner, compiled for the largest E_t (the
  local loop runs each round's traced E_t * ceil(n_i / B) steps, not the largest), so
  the schedule does not recompile. Returns (state, rows) of the rounds it ran.

  ``state``: where to start (default ``init_state``); a state restored from a checkpoint
  of round t continues with round t, as the uninterrupted run would. Each row carries the
  round's ``local_epochs`` (E_t) and ``lambda_dis`` already when ``on_chunk(state, rows)``
  sees it (so a checkpoint stores them)."""
  from fedjax_async import engine  # pylint: disable=g-import-not-at-top
  num_clients = int(data.counts.shape[0])
  max_examples = int(data.x.shape[1])
  if state is None:
    state = init_state(algorithm, w0, num_clients, ring_size, seed)
  hp, round_hp = hp_schedule(base_hp, timeline.num_rounds, cfg, anneal=anneal, share=share,
                             fixed_epochs=fixed_epochs)
  ecfg = engine.EngineConfig(
      local=client_lib.LocalConfig(batch_size=cfg.batch_size,
                                   max_epochs=int(round_hp["local_epochs"].max()),
                                   max_examples=max_examples), ring_size=ring_size)
  runner = engine.make_runner(apply_flat, algorithm, ecfg)

  def annotated(chunk_state, rows):
    for r in rows:
      r["local_epochs"] = int(round_hp["local_epochs"][r["round"]])
      r["lambda_dis"] = float(round_hp["fededs_lambda_dis"][r["round"]])
    if on_chunk is not None:
      on_chunk(chunk_state, rows)

  return engine.simulate(runner, state, timeline, hp, data, eval_every=eval_every,
                         rounds_per_call=rounds_per_call, on_chunk=annotated,
                         round_hp=round_hp)


def accuracy(model: SplitModel, theta, x, y, chunk: int = 1000) -> float:
  """Top-1 accuracy of f(x; theta_g, theta_c) with the stochastic layer off."""
  fn = jax.jit(lambda th, xb: jnp.argmax(model.forward(th[0], th[1], xb), -1))
  hits = sum(int(jnp.sum(fn(theta, x[i:i + chunk]) == y[i:i + chunk]))
             for i in range(0, len(y), chunk))
  return hits / max(len(y), 1)


def shared_set_utility(model: SplitModel, shared: SharedData, theta0, test_x, test_y, key,
                       cfg: FedEDSConfig, epochs: int) -> float:
  """What the shared sets teach on their own: test accuracy (layer off) of a model trained
  from ``theta0`` on the union of every client's D_i^F alone, each row scored with its
  sender's theta_l^i under L_dis (Eq. 6, as a receiving client uses it in Eq. 8), for
  ``epochs`` epochs of the clients' SGD (lr, momentum, weight decay of ``cfg``)."""
  num, rows = shared.x.shape[:2]
  valid = np.flatnonzero((np.arange(rows)[None, :] < np.asarray(shared.counts)[:, None])
                         .reshape(-1))
  x = jnp.asarray(shared.x).reshape((num * rows,) + shared.x.shape[2:])[valid]
  soft = jnp.asarray(shared.soft).reshape(num * rows, -1)[valid]
  sender = jnp.asarray(np.repeat(np.arange(num), rows)[valid])

  def loss_fn(th, xb, ib, mask):
    return transfer_loss(model, th[0], th[1], xb, soft[ib], _take_layer(shared.layers,
                                                                        sender[ib]), mask)

  theta, _ = jax.jit(lambda th, k: _train_epochs(
      loss_fn, _sgd(cfg), th, x, jnp.arange(len(valid)), len(valid), k, epochs,
      cfg.batch_size))(theta0, key)
  return accuracy(model, theta, test_x, test_y)


def rounds_to_target(accuracies, target: float) -> Optional[int]:
  """The first (1-based) round whose test accuracy reaches ``target`` (None if never)."""
  for i, a in enumerate(accuracies):
    if a is not None and a >= target:
      return i + 1
  return None


# ---------------------------------------------------------------- privacy / Fig. 3


def psnr(a, b, data_range: float = 1.0) -> float:
  """10 log10(L^2 / MSE) in dB over all pixels (inf for identical inputs)."""
  mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
  return float("inf") if mse == 0 else 10.0 * math.log10(data_range ** 2 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
  r = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
  g = np.exp(-r ** 2 / (2 * sigma ** 2))
  return g / g.sum()


def _filter2(img: np.ndarray, g: np.ndarray) -> np.ndarray:
  """Separable 'valid' filtering of [H, W] with the 1-D window g on both axes."""
  rows = np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 1, img)
  return np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 0, rows)


def ssim(a, b, data_range: float = 1.0, win: int = 11, sigma: float = 1.5) -> float:
  """Mean SSIM (Wang et al., 2004) with a Gaussian window, K1 = 0.01, K2 = 0.03, over
  images [..., H, W, C] (every image and channel, then averaged); the window shrinks to
  the image's smaller side when needed (odd size)."""
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  if a.ndim == 2:
    a, b = a[None, ..., None], b[None, ..., None]
  elif a.ndim == 3:
    a, b = a[None], b[None]
  a = a.reshape((-1,) + a.shape[-3:])
  b = b.reshape((-1,) + b.shape[-3:])
  win = min(win, a.shape[1], a.shape[2])
  win -= (win + 1) % 2
  g = _gaussian_window(win, sigma)
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  vals = []
  for i in range(a.shape[0]):
    for c in range(a.shape[-1]):
      x, y = a[i, ..., c], b[i, ..., c]
      mx, my = _filter2(x, g), _filter2(y, g)
      sxx = _filter2(x * x, g) - mx ** 2
      syy = _filter2(y * y, g) - my ** 2
      sxy = _filter2(x * y, g) - mx * my
      m = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2))
      vals.append(m.mean())
  return float(np.mean(vals))


def privacy_report(originals, encrypted_with, encrypted_without,
                   data_range: float = 1.0) -> Dict[str, float]:
  """PSNR / SSIM of encrypted vs original images, with and without the stochastic layer
  (Fig. 3: lower = less recognisable)."""
  return {
      "psnr_with_layer": psnr(originals, encrypted_with, data_range),
      "ssim_with_layer": ssim(originals, encrypted_with, data_range),
      "psnr_without_layer": psnr(originals, encrypted_without, data_range),
      "ssim_without_layer": ssim(originals, encrypted_without, data_range),
  }


def save_encryption_grid(originals, encrypted, path: str, encrypted_without=None,
                         titles: Sequence[str] = ("original", "encrypted (layer on)",
                                                  "encrypted (layer off)"),
                         title: str = "") -> None:
  """PNG grid as Fig. 3: row 1 originals, row 2 encrypted (row 3: without the layer);
  ``title`` above it (the data set and setting)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = [np.asarray(originals), np.asarray(encrypted)]
  if encrypted_without is not None:
    rows.append(np.asarray(encrypted_without))
  n = rows[0].shape[0]
  fig, axes = plt.subplots(len(rows), n, figsize=(1.2 * n, 1.3 * len(rows)), squeeze=False)
  for r, imgs in enumerate(rows):
    for c in range(n):
      ax = axes[r, c]
      img = np.clip(imgs[c], 0.0, 1.0)
      if img.ndim == 3 and img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
      else:
        ax.imshow(img)
      ax.set_xticks([])
      ax.set_yticks([])
      if c == 0:
        ax.set_ylabel(titles[r], fontsize=7)
  if title:
    fig.suptitle(title, fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
