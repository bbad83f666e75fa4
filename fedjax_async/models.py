"""Flax (linen) models for the simulator, with a vmap-friendly convolution.

The layers (the four convolution formulations, the fast dense layer, pooling) are in
``fedjax_async.layers``; the convolutional models take ``impl`` and ``dense`` to choose
among them.

Public API:

* models: :class:`LogisticRegression`, :class:`MLP`, :class:`CNN`, :class:`CNNFedADMM`,
  :class:`CIFAR10CNN`, :class:`CIFAR100CNN`, :class:`SimpleCNN`, :class:`ResNet18`, and
  the text benchmarks' LSTMs (``text_models``: logits per position ``[N, T, V]`` for
  next-token labels);
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
import inspect
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from fedjax_async import layers
from fedjax_async import text_models

Array = jax.Array
Padding = str | Sequence[tuple[int, int]]

class LogisticRegression(nn.Module):
  """Multinomial logistic regression: flatten + Dense."""

  num_classes: int

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    return nn.Dense(self.num_classes)(layers.flatten(x))


class MLP(nn.Module):
  """Fully connected ReLU network, hidden widths ``hidden`` (FedAvg's 2NN by default)."""

  num_classes: int
  hidden: tuple[int, ...] = (200, 200)

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    x = layers.flatten(x)
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
    x = layers.max_pool2(nn.relu(layers.make_conv(self.impl, 32, (5, 5), name="conv1")(x)))
    x = layers.max_pool2(nn.relu(layers.make_conv(self.impl, 64, (5, 5), name="conv2")(x)))
    x = nn.relu(layers.make_dense(self.dense, self.hidden, name="fc1")(layers.flatten(x)))
    return layers.make_dense(self.dense, self.num_classes, name="fc2")(x)


class CNNFedADMM(nn.Module):
  """``Model1`` of Gong et al.'s FedADMM code (YonghaiGong/FedADMM, src/models.py), whose
  layer sizes are PAFed's Table II: conv 5x5x32 pad 2, maxpool 2, conv 5x5x64 pad 2,
  maxpool 2, flatten 3136, Dense 512, ReLU, Dense num_classes, softmax. As written there,
  the convolutions have no ReLU and the output is the softmax, which the training loss
  (PyTorch's CrossEntropyLoss there, the engine's softmax cross-entropy here) treats as
  logits: a second softmax. 1,663,370 parameters for 28x28x1 inputs, as :class:`CNN`."""

  num_classes: int = 10
  impl: str = "vjp"
  dense: str = "fast"
  hidden: int = 512

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    del train
    x = layers.max_pool2(layers.make_conv(self.impl, 32, (5, 5), name="conv1")(x))
    x = layers.max_pool2(layers.make_conv(self.impl, 64, (5, 5), name="conv2")(x))
    x = nn.relu(layers.make_dense(self.dense, self.hidden, name="fc1")(layers.flatten(x)))
    return nn.softmax(layers.make_dense(self.dense, self.num_classes, name="fc2")(x))


class CIFAR10CNN(CNN):
  """PAFed's CIFAR-10 CNN (Table II): :class:`CNN`'s layers on 32x32x3 inputs with FC_1
  4096 -> 256 (conv 5x5x32 pad 2, pool, conv 5x5x64 pad 2, pool, flatten 8*8*64 = 4096,
  Dense 256, Dense 10): 1,105,098 parameters."""

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

  Design decision: the BatchNorm layers (:class:`layers.BatchStatNorm`) keep NO running
  statistics. They always normalise with the mean/variance of the batch they see (the
  local training minibatch, or the evaluation batch), and their scale/bias are ordinary
  parameters federated by the algorithm like any weight. The model thus has only a
  ``'params'`` collection and every client is a pure function of one flat parameter
  vector. Consequences: evaluation outputs depend on the composition of the evaluation
  batch (use reasonably large batches), and every row fed in (including rows masked
  out of the loss) contributes to the statistics.
  """

  num_classes: int = 100
  impl: str = "vjp"
  dense: str = "fast"

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    x = layers.make_conv(self.impl, 32, (3, 3), padding="SAME", name="conv1")(x)
    x = nn.relu(layers.BatchStatNorm(name="bn1")(x))
    x = layers.max_pool2(nn.relu(layers.make_conv(self.impl, 64, (3, 3), padding="VALID",
                                    name="conv2")(x)))
    x = layers.make_conv(self.impl, 128, (3, 3), padding="VALID", name="conv3")(x)
    x = layers.max_pool2(nn.relu(layers.BatchStatNorm(name="bn3")(x)))
    x = nn.Dropout(0.05, deterministic=not train)(x)
    x = layers.make_conv(self.impl, 256, (3, 3), padding="VALID", name="conv4")(x)
    x = layers.max_pool2(nn.relu(layers.BatchStatNorm(name="bn4")(x)))
    x = nn.Dropout(0.1, deterministic=not train)(x)
    x = nn.relu(layers.make_dense(self.dense, 512, name="fc1")(layers.flatten(x)))
    x = nn.Dropout(0.1, deterministic=not train)(x)
    return layers.make_dense(self.dense, self.num_classes, name="fc2")(x)


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
    x = nn.relu(layers.make_conv(self.impl, 32, (3, 3), padding="VALID", kernel_init=glorot,
                          name="conv1")(x))
    x = nn.relu(layers.make_conv(self.impl, 64, (3, 3), padding="VALID", kernel_init=glorot,
                          name="conv2")(x))
    x = nn.Dropout(0.25, deterministic=not train)(layers.max_pool2(x))
    x = nn.relu(layers.make_dense(self.dense, 128, kernel_init=glorot, name="fc1")(layers.flatten(x)))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return layers.make_dense(self.dense, self.num_classes, kernel_init=glorot, name="fc2")(x)


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
    y = layers.make_conv(self.impl, self.features, (3, 3), s, use_bias=False, name="conv1")(x)
    y = nn.relu(make_norm(self.norm, self.groups, "norm1")(y))
    y = layers.make_conv(self.impl, self.features, (3, 3), use_bias=False, name="conv2")(y)
    y = make_norm(self.norm, self.groups, "norm2")(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      x = layers.make_conv(self.impl, self.features, (1, 1), s, use_bias=False,
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
    x = layers.make_conv(self.impl, 64, (3, 3), use_bias=False, name="stem")(x)
    x = nn.relu(make_norm(self.norm, self.groups, "stem_norm")(x))
    for stage, width in enumerate((64, 128, 256, 512)):
      for block in range(2):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(width, strides, self.impl, self.norm, self.groups,
                       name=f"layer{stage + 1}_{block}")(x)
    pooled = jnp.mean(x, axis=(1, 2))
    if not self.include_top:
      return pooled
    return layers.make_dense(self.dense, self.num_classes, name="fc")(pooled)


# --------------------------------------------------------------------------- registry

MODEL_NAMES = ("logreg", "mlp", "cnn", "cnn_fedadmm", "cifar10_cnn", "cifar100_cnn",
               "simple_cnn", "resnet18") + text_models.NAMES
_CONV_MODELS = {
    "cnn": CNN,
    "cnn_fedadmm": CNNFedADMM,
    "cifar10_cnn": CIFAR10CNN,
    "cifar100_cnn": CIFAR100CNN,
    "simple_cnn": SimpleCNN,
    "resnet18": ResNet18,
}


def get_model(name: str, num_classes: int, input_shape: Sequence[int] = (),
              impl: str = "vjp", dense: str = "fast", input_vocab: int = 0) -> nn.Module:
  """The model called ``name`` for per-example inputs of ``input_shape`` (the text models,
  ``text_models``: token ids in [0, ``input_vocab``), 0: ``num_classes``).

  ``impl`` ("patches", "slices", "lax" or "vjp") selects the convolution of conv models,
  ``dense`` ("fast" or "flax") their dense layers. Raises ValueError for an unknown name,
  impl or dense, or a non-HWC shape for a conv model.

  Args:
    name: one of ``MODEL_NAMES``.
    num_classes: the output classes.
    input_shape: one example's shape (conv models: [H, W, C]; () skips the check).
    impl: the convolution: ``patches``, ``slices``, ``lax`` or ``vjp``.
    dense: the dense layers: ``fast`` or ``flax``.
    input_vocab: the text models' input vocabulary (0: ``num_classes``).
  """
  if impl not in layers.CONV_IMPLS:
    raise ValueError(f"unknown conv impl {impl!r}; choose from {layers.CONV_IMPLS}")
  if dense not in layers.DENSE_IMPLS:
    raise ValueError(f"unknown dense impl {dense!r}; choose from {layers.DENSE_IMPLS}")
  if name in text_models.NAMES:
    return text_models.get(name, num_classes, input_vocab)
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
  if name.startswith("synthetic") or name == "leaf_synthetic":
    return "logreg"
  natural = {"fedjax_emnist": "cnn", "fedjax_emnist_digits": "cnn", "tff_emnist": "cnn",
             "tff_emnist_digits": "cnn", "leaf_femnist": "cnn",
             "fedjax_cifar100": "cifar100_cnn", "tff_cifar100": "cifar100_cnn",
             "fedjax_shakespeare": "shakespeare_lstm", "tff_shakespeare": "shakespeare_lstm",
             "fedjax_stackoverflow": "stackoverflow_lstm",
             "tff_stackoverflow": "stackoverflow_lstm",
             "leaf_shakespeare": "leaf_shakespeare_lstm", "leaf_sent140": "sent140_lstm"}
  if name in natural:
    return natural[name]
  table = {"mnist": "cnn", "fashion_mnist": "cnn", "fmnist": "cnn",
           "cifar10": "cifar10_cnn", "cifar_10": "cifar10_cnn",
           "cifar100": "cifar100_cnn", "cifar_100": "cifar100_cnn"}
  if name in table:
    return table[name]
  raise ValueError(f"no default model for data set {dataset_name!r}; name one of "
                   f"{', '.join(MODEL_NAMES)} (or, from Python, model=<a flax.linen.Module>)")


# ----------------------------------------------------------------------- flat models


def init_variables(model: nn.Module, input_shape: Sequence[int], key) -> Any:
  """``model``'s variables (``params`` and any mutable collections, e.g.
  ``batch_stats``) for per-example ``input_shape`` (batch of 1)."""
  x = jnp.zeros((1, *input_shape), jnp.float32)
  return jax.jit(lambda k, x: model.init({"params": k}, x, train=False))(key, x)


def init_params(model: nn.Module, input_shape: Sequence[int], key) -> Any:
  """``model``'s parameter pytree for per-example ``input_shape`` (batch of 1); a model
  with mutable collections is refused (``flat_model`` federates those)."""
  variables = init_variables(model, input_shape, key)
  extra = set(variables) - {"params"}
  if extra:
    raise ValueError(f"model has non-parameter state {sorted(extra)}; only 'params' "
                     "can be federated here (flat_model carries the state in w)")
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

  A model with mutable collections (BatchNorm's ``batch_stats``) carries them in ``w``
  too: ``state_leaves`` are their leaves' indices, a training pass returns ``(logits,
  new state leaves)`` and local training writes those into ``w`` after each step
  (``set_state``; no gradient reaches them). The server then aggregates them with the
  parameters, by the algorithm's rule (FedAvg averages them, as most FL code does).
  """

  model: nn.Module
  unravel: Callable
  treedef: Any
  shapes: tuple  # each leaf's shape, in ravel order
  collections: tuple = ()  # the mutable collections, e.g. ("batch_stats",)
  state_leaves: tuple = ()  # indices of their leaves in ravel order

  def split(self, w_flat) -> tuple:
    """``w [d]`` as one 1-D piece per leaf (concatenated, they are ``w`` again)."""
    offsets = np.cumsum([int(np.prod(s)) for s in self.shapes])[:-1]
    return tuple(jnp.split(w_flat, offsets))

  def params(self, w):
    """The parameter pytree of ``w`` (flat vector or ``split`` pieces); with mutable
    collections, the variables dict (``{"params": ..., "batch_stats": ...}``)."""
    if isinstance(w, tuple):
      return jax.tree.unflatten(self.treedef,
                                [p.reshape(s) for p, s in zip(w, self.shapes)])
    return self.unravel(w)

  def set_state(self, w, state_leaves):
    """``w`` (flat or pieces) with the state leaves replaced by ``state_leaves``."""
    pieces = list(w) if isinstance(w, tuple) else list(self.split(w))
    for i, leaf in zip(self.state_leaves, state_leaves):
      pieces[i] = jax.lax.stop_gradient(leaf).reshape(-1).astype(pieces[i].dtype)
    return tuple(pieces) if isinstance(w, tuple) else jnp.concatenate(pieces)

  def __call__(self, w, x, train: bool = False, rng=None):
    rngs = {"dropout": rng} if rng is not None else None
    if not self.collections:
      return self.model.apply({"params": self.params(w)}, x, train=train, rngs=rngs)
    if not train:
      return self.model.apply(self.params(w), x, train=False, rngs=rngs)
    logits, new = self.model.apply(self.params(w), x, train=True, rngs=rngs,
                                   mutable=list(self.collections))
    return logits, tuple(jax.tree.leaves(new))


def flat_model(model: nn.Module, input_shape: Sequence[int], key):
  """Initial flat parameters ``w0 [d]`` and ``apply_flat(w, x, train=False, rng=None)``.

  ``apply_flat`` (a :class:`FlatApply`) unravels ``w`` into the parameter pytree
  (``ravel_pytree``) and returns logits; ``rng`` seeds dropout when ``train=True``.
  Mutable collections (batch statistics) travel in ``w`` (see ``FlatApply``). Both are
  vmap/jit friendly.
  """
  variables = dict(init_variables(model, input_shape, key))
  collections = tuple(sorted(set(variables) - {"params"}))
  tree = variables if collections else variables["params"]
  w0, unravel = ravel_pytree(tree)
  with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
  state = tuple(i for i, (path, _) in enumerate(with_paths)
                if collections and path[0].key in collections)
  return w0, FlatApply(model, unravel, treedef, tuple(leaf.shape for _, leaf in with_paths),
                       collections, state)


def one_line(e: Exception) -> str:
  """The first non-empty line of ``e``'s message, at most 160 characters."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  text = lines[0] if lines else type(e).__name__
  return text if len(text) <= 160 else text[:157] + "..."


def check_output(apply, params, data_shape: Sequence[int], num_classes: int, name: str,
                 input_shape: Optional[Sequence[int]] = None, what: str = "model",
                 shapes: Sequence[Sequence[int]] = (), label_shape: Sequence[int] = (),
                 labels: Optional[Callable[[], str]] = None) -> None:
  """One forward pass of ``apply(params, x)`` on two examples of the data's shape,
  abstract (``jax.eval_shape``: traced, not run): ValueError naming ``what`` (or
  ``input_shape`` when the model was built for another shape) when the model does not take
  the data's examples or its output is not ``[2, *label_shape, num_classes]`` (sequence
  labels ``[T]``: logits at every position), or when one of its
  parameters' ``shapes`` is empty (a layer the examples are too small for).

  Args:
    apply: ``apply(params, x)``, the model's forward pass.
    params: its parameters (arrays or ``ShapeDtypeStruct``s).
    data_shape: one example's shape in the data.
    num_classes: the classes of the data's labels.
    name: the model's name, for the errors.
    input_shape: the shape the model was built for (None: ``data_shape``).
    what: the setting the errors name.
    shapes: the model's parameters' shapes (an empty one is an error).
    label_shape: a label's shape (``[T]``: sequence labels; (): one class per example).
    labels: where the data's largest label is, for the error (called only on one).
  """
  data_shape = tuple(int(d) for d in data_shape)
  empty = [tuple(s) for s in shapes if 0 in tuple(s)]
  if empty:
    raise ValueError(f"{what}: {name} has a layer of zero size for the data's examples of "
                     f"shape {data_shape} (a parameter of shape {empty[0]}); the examples "
                     "are too small for it")
  x = jax.ShapeDtypeStruct((2, *data_shape), jnp.float32)
  built = tuple(input_shape) if input_shape is not None else data_shape
  try:
    out = jax.eval_shape(apply, params, x)
  except Exception as e:  # pylint: disable=broad-except  (whatever the module raises)
    if built != data_shape:
      raise ValueError(f"input_shape={built}: {name} built for it does not take the data's "
                       f"examples of shape {data_shape} ({one_line(e)}); leave "
                       "input_shape out to use the data's") from None
    raise ValueError(f"{what}: {name} does not take the data's examples of shape "
                     f"{data_shape}: {one_line(e)}") from None
  shape = getattr(out, "shape", None)
  if label_shape and shape != (2, *label_shape, int(num_classes)):
    raise ValueError(f"{what}: {name} gives outputs of shape {shape} for a batch of 2, but "
                     f"the data's labels are sequences {tuple(label_shape)} of "
                     f"{num_classes} ids: give [batch, {', '.join(map(str, label_shape))}, "
                     f"{num_classes}] logits")
  if not label_shape and shape != (2, int(num_classes)):
    if shape and len(shape) == 2 and shape[0] == 2:
      got = f"{shape[1]} outputs per example"
    elif shape and shape[0] == 2:
      got = f"outputs of shape {tuple(shape[1:])} per example"
    else:
      got = f"{type(out).__name__} {shape or ''} for a batch of 2".replace("  ", " ")
    n = shape[1] if shape and len(shape) == 2 and shape[0] == 2 else None
    found = labels() if labels is not None and n and n < num_classes else ""
    where = (f": {found} is outside the model's {n}; fix the label if it is wrong "
             f"(fa.data.from_arrays / from_clients with num_classes={n} refuse it) or"
             if found else
             f"; pass num_classes={n} if the data have {n} classes, or" if n else ";")
    raise ValueError(f"{what}: {name} gives {got}, but the data have num_classes="
                     f"{num_classes} (labels 0..{int(num_classes) - 1}){where} give the "
                     f"model's last layer {num_classes} outputs ([batch, {num_classes}] logits)")


def _with_train_argument(module: nn.Module) -> nn.Module:
  """``module``, wrapped to take (and ignore) ``train`` when its ``__call__`` does not."""
  if "train" in inspect.signature(module.__call__).parameters:
    return module

  class NoTrainArgument(nn.Module):
    inner: nn.Module

    def __call__(self, x, train: bool = False):
      del train
      return self.inner(x)

  return NoTrainArgument(module)


def check_module(module: nn.Module, input_shape: Sequence[int], num_classes: int,
                 data_shape: Optional[Sequence[int]] = None,
                 labels: Optional[Callable[[], str]] = None) -> None:
  """:func:`check_output` of a user's flax module, built abstractly for ``input_shape``
  (nothing is compiled or run); ValueError naming ``model`` or ``input_shape``
  (``labels()``: where the data's largest label is, for that error).

  Args:
    module: the user's flax module.
    input_shape: one example's shape the module is built for.
    num_classes: the classes of the data's labels.
    data_shape: one example's shape in the data (None: ``input_shape``).
    labels: where the data's largest label is, for the error.
  """
  name, module = type(module).__name__, _with_train_argument(module)
  x = jnp.zeros((1, *tuple(input_shape)), jnp.float32)
  try:
    variables = jax.eval_shape(lambda k: module.init({"params": k}, x, train=False),
                               jax.random.PRNGKey(0))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"model: {name}: {one_line(e)}") from None
  check_output(lambda v, x: module.apply(v, x, train=False), variables,
               input_shape if data_shape is None else data_shape, num_classes, name,
               input_shape, shapes=[leaf.shape for leaf in jax.tree.leaves(variables)],
               labels=labels)


def user_model(module: nn.Module, input_shape: Sequence[int], seed: int,
               num_classes: Optional[int] = None,
               data_shape: Optional[Sequence[int]] = None):
  """The engines' ``(name, w0, apply_flat)`` of a user's flax module (one whose
  ``__call__`` takes no ``train`` argument is wrapped to ignore it); ValueError naming
  the module when it cannot be federated, and (given ``num_classes``) when it does not
  map the data's examples (``data_shape``, default ``input_shape``) to ``num_classes``
  logits (:func:`check_output`).

  Args:
    module: the user's flax module.
    input_shape: one example's shape the module is built for.
    seed: the seed of its initialisation.
    num_classes: the classes of the data's labels (None: no check).
    data_shape: one example's shape in the data (None: ``input_shape``).
  """
  name, module = type(module).__name__, _with_train_argument(module)
  try:
    w0, apply_flat = flat_model(module, tuple(input_shape), jax.random.PRNGKey(seed))
  except Exception as e:  # pylint: disable=broad-except  (whatever the module raises)
    raise ValueError(f"model: {name}: {one_line(e)}") from None
  if num_classes is not None:
    check_output(lambda w, x: apply_flat(w, x, train=False), w0,
                 input_shape if data_shape is None else data_shape, num_classes, name,
                 input_shape, shapes=apply_flat.shapes)
  return name, w0, apply_flat


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
    logits = logits[0] if apply_flat.collections else logits  # (logits, new batch stats)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  return _count(count)(jax.value_and_grad(loss), w, x, y, jax.random.key(1))
