"""FedEDS's encrypted data generation (Alg. 1): pre-train the client model (Eq. 2),
train the encryptor with the stochastic layer on (Eq. 3), share the encrypted data with
soft labels (Eq. 4); ``generate_encrypted`` runs it vmapped over clients."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_async.core import building
from fedjax_async.core import client as client_lib
from fedjax_async.fededs.model import SplitModel
from fedjax_async.fededs.schedule import FedEDSConfig

Array = jax.Array


# ------------------------------------------------------- local training (one client)


def _trainer(loss_fn: Callable, opt, x, y, n, key, epochs: int, batch: int):
  """(static shape, scan step) of ``train_epochs``'s loop: step s takes the minibatch
  ``client.step_minibatch`` draws and returns (loss, whether it ran, its epoch)."""
  cfg = building.local_config(batch_size=batch, max_epochs=epochs, max_examples=x.shape[0])
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

  return cfg, step


def train_epochs(loss_fn: Callable, opt, params, x, y, n, key, epochs: int, batch: int):
  """Minimises ``loss_fn(params, xb, yb, mask)`` for ``epochs`` passes over the client's
  n real rows (minibatches of ``batch``; padding never drawn, as ``client.train``).

  Returns (params, per-epoch mean loss [epochs]). vmap over clients.

  Args:
    loss_fn: ``loss_fn(params, xb, yb, mask)``.
    opt: the optax optimiser.
    params: the parameters to start from.
    x: the client's padded inputs [M, ...].
    y: its labels.
    n: its real rows.
    key: the shuffles' key.
    epochs: the passes.
    batch: the minibatch size.
  """
  cfg, step = _trainer(loss_fn, opt, x, y, n, key, epochs, batch)
  (params, _), (losses, active, ep) = jax.lax.scan(step, (params, opt.init(params)),
                                                   jnp.arange(cfg.max_steps))
  onehot = jax.nn.one_hot(ep, epochs) * active[:, None]
  per_epoch = (losses @ onehot) / jnp.maximum(onehot.sum(0), 1.0)
  return params, per_epoch


class Training(NamedTuple):
  """``train_epochs`` part way, continued chunk by chunk (``train_chunk``)."""
  params: Any
  opt_state: Any
  loss_sum: Array  # [epochs] the losses of each epoch's steps so far
  loss_count: Array  # [epochs] and their number

  @classmethod
  def start(cls, opt, params, epochs: int) -> "Training":
    zeros = jnp.zeros((epochs,), jnp.float32)
    return cls(params, opt.init(params), zeros, zeros)

  def epoch_losses(self):
    """Per-epoch mean loss, as ``train_epochs`` returns it once every chunk ran."""
    return self.loss_sum / jnp.maximum(self.loss_count, 1.0)


def train_chunk(loss_fn: Callable, opt, state: Training, x, y, n, key, epochs: int,
                batch: int, chunk) -> Training:
  """``train_epochs``'s steps chunk * S .. (chunk + 1) * S - 1, S = ceil(M / batch) the
  steps of an epoch over all M rows of ``x``: chunks 0 .. epochs - 1 in turn make the
  same steps as ``train_epochs`` (``chunk`` is traced: one compilation for all).

  Args:
    loss_fn: ``loss_fn(params, xb, yb, mask)``.
    opt: the optax optimiser.
    state: the training so far.
    x: the client's padded inputs [M, ...].
    y: its labels.
    n: its real rows.
    key: the shuffles' key (the same for every chunk).
    epochs: the passes of the whole training.
    batch: the minibatch size.
    chunk: the epoch to run (traced).
  """
  cfg, step = _trainer(loss_fn, opt, x, y, n, key, epochs, batch)
  steps = chunk * cfg.steps_per_epoch + jnp.arange(cfg.steps_per_epoch)
  (p, o), (losses, active, ep) = jax.lax.scan(step, (state.params, state.opt_state), steps)
  onehot = jax.nn.one_hot(ep, epochs) * active[:, None]
  return Training(p, o, state.loss_sum + losses @ onehot,
                  state.loss_count + onehot.sum(0))


def sgd(cfg: FedEDSConfig):
  """SGD with momentum and (coupled, PyTorch-style) weight decay (Sec. VI-A3)."""
  return optax.chain(optax.add_decayed_weights(cfg.weight_decay),
                     optax.sgd(cfg.lr, momentum=cfg.momentum))


def pretrain_loss(model: SplitModel):
  """Eq. 2's loss CE(y, f(x; theta_g, theta_c)), the stochastic layer off."""

  def loss_fn(th, xb, yb, mask):
    return client_lib.masked_cross_entropy(model.forward(th[0], th[1], xb), yb, mask)

  return loss_fn


def pretrain_client(model: SplitModel, theta, x, y, n, key, cfg: FedEDSConfig):
  """Alg. 1 lines 1-4: E_c epochs of SGD on CE(y, f(x; theta_g, theta_c)) (Eq. 2), the
  stochastic layer off. ``theta = (theta_g, theta_c)``; returns (theta, epoch losses).

  Args:
    model: the split model.
    theta: (theta_g, theta_c) to start from.
    x: the client's padded inputs.
    y: its labels.
    n: its real rows.
    key: the shuffles' key.
    cfg: the ``FedEDSConfig`` (E_c, the batch, SGD's settings).
  """
  return train_epochs(pretrain_loss(model), sgd(cfg), theta, x, y, n, key,
                      cfg.pretrain_epochs, cfg.batch_size)


def encryptor_loss(model: SplitModel, encryptor: nn.Module, theta, theta_l):
  """Eq. 3's loss of phi: CE(y, f(g(x; phi); theta, theta_l)), theta frozen."""
  theta = jax.lax.stop_gradient(theta)

  def loss_fn(ph, xb, yb, mask):
    xe = encryptor.apply({"params": ph}, xb)
    return client_lib.masked_cross_entropy(model.forward(theta[0], theta[1], xe, theta_l),
                                           yb, mask)

  return loss_fn


def encryptor_optimizer(cfg: FedEDSConfig):
  return optax.adamw(cfg.encryptor_lr, weight_decay=cfg.encryptor_weight_decay)


def train_encryptor(model: SplitModel, encryptor: nn.Module, theta, theta_l, x, y, n, key,
                    cfg: FedEDSConfig):
  """Alg. 1 lines 5-7: E_g epochs of AdamW on phi for CE(y, f(g(x; phi); theta, theta_l))
  (Eq. 3), theta frozen (stop_gradient), the stochastic layer on (``theta_l=None``: off,
  the "without stochastic layer" row of Fig. 3). Returns (phi, epoch losses).

  Args:
    model: the split model.
    encryptor: the UNet g(x; phi).
    theta: the client's pre-trained (theta_g, theta_c), frozen.
    theta_l: its stochastic layer (None: off).
    x: the client's padded inputs.
    y: its labels.
    n: its real rows.
    key: phi's initialisation and the shuffles' key.
    cfg: the ``FedEDSConfig`` (E_g, the batch, AdamW's settings).
  """
  k_init, k_train = jax.random.split(key)
  phi = encryptor.init(k_init, x[:1])["params"]
  return train_epochs(encryptor_loss(model, encryptor, theta, theta_l),
                      encryptor_optimizer(cfg), phi, x, y, n, k_train, cfg.encryptor_epochs,
                      cfg.batch_size)


def encrypt(model: SplitModel, encryptor: nn.Module, theta, phi, theta_l, x,
            chunk: int = 256):
  """Eq. 4: (g(x; phi), softmax f(g(x); theta, theta_l)) for every row of x (chunked).

  Args:
    model: the split model.
    encryptor: the UNet g(x; phi).
    theta: the client's (theta_g, theta_c).
    phi: its encryptor's parameters.
    theta_l: its stochastic layer (None: off).
    x: the rows to encrypt.
    chunk: the rows encrypted at a time.
  """
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
    """Alg. 1 for one client: (encrypted rows, soft labels, pre-training and encryptor losses,
    theta, phi).

    Args:
      th0: the global (theta_g, theta_c).
      layer: the client's stochastic layer.
      xk: its padded inputs.
      yk: its labels.
      nk: its real rows.
      kk: [2] keys: pre-training's, the encryptor's.
    """
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

  Args:
    model: the split model.
    encryptor: the UNet g(x; phi).
    theta0: the global (theta_g, theta_c).
    layers: the clients' stochastic layers, leaves [N, F].
    x: [N, M, ...] the clients' padded inputs.
    y: [N, M] their labels.
    counts: [N] their real rows.
    key: the key the clients' keys are split from.
    cfg: the ``FedEDSConfig``.
    share_rows: the rows of each client shared (None: all).
    use_layer: train and encrypt with the stochastic layer.
    client_loop: ``vmap`` or ``map``.
  """
  num_clients = x.shape[0]
  keys = jax.random.split(key, 2 * num_clients).reshape(num_clients, 2, -1)
  fn = _generation_fn(model, encryptor, cfg, share_rows, use_layer, client_loop)
  xe, soft, pre_loss, enc_loss, theta, phi = fn(theta0, layers, x, y, counts, keys)
  cnt = counts if share_rows is None else jnp.minimum(counts, share_rows)
  shared = SharedData(xe, soft, cnt.astype(jnp.int32), layers)
  return Generation(shared, pre_loss, enc_loss, theta, phi)
