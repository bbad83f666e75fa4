"""PrivaAsyncFed (Cheng, Xue, Zhu): pruned sub-models, hinge staleness, client-side DP.

Pruning (Sec. III-A, Eq. 10): with the scale table S = {1, 0.75, 0.5, 0.25}, a client of
pruning level p trains the first floor(S[p] d) input and floor(S[p] k) output channels
(units) of every hidden layer; the input layer keeps all its inputs and the output layer
all its outputs. Here a sub-model is a 0/1 MASK over the flat parameter vector
(``scale_masks``), so pruned and full clients train inside one vmap: the client trains
w * mask with masked gradients and noise (``async_engine.train_local``); a zeroed hidden
unit has no input weights and no bias, so ReLU gives 0 and the masked full network
computes exactly the pruned network.

Client DP (Alg. 1 lines 15-24): per step, clip the gradient to norm C, SGD step, add
N(0, (Delta f / epsilon)^2) to the held parameters, Delta f = lr 2C / |D_k|.

Server (Eqs. 12-16, Alg. 1 lines 4-9): on an update from client k dispatched at tau,

    W_{G,p} <- (1 - alpha) W_{G,p} + alpha W_{k,p}   for p held by the client (Eq. 12),
    W_{G,q} unchanged                                 otherwise (Eq. 13),
    alpha = beta S(t - tau)                                           (Eq. 15)

with the hinge S (Eq. 16). Eq. 16 prints 1 / (a (t - tau - b)) beyond b, which exceeds 1
for a (t - tau - b) < 1 and is discontinuous at b; we use FedAsync's hinge
1 / (a (t - tau - b) + 1), which the paper cites (see docs/async.md).
Hyperparameters: ``beta``, ``hinge_a``, ``hinge_b``, ``dp_epsilon``, ``dp_clip``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedasync

SCALES = (1.0, 0.75, 0.5, 0.25)
# What ``paper_defaults`` gives, said when it does.
PAPER_SETTING = ("the paper's 4 device tiers 3/3/2/2 with slow-downs 1/2/4/8 and sub-model "
                 "scales clock.scales; a model with hidden units to prune")


def paper_defaults(device_classes: str, model: str, auto_model: Callable[[], str]
                   ) -> Dict[str, str]:
  """The paper's setting (Sec. IV-A) for the fields a run of PrivaAsyncFed leaves unset
  (flat keys): the four device tiers (``device_classes``), whose sub-models are pruned
  (Eq. 10), and a model with hidden units to prune, the MLP where ``model`` auto would
  build logistic regression (``auto_model()``, the data set's; the paper's is LeNet)."""
  out = {}
  if not device_classes:
    out["device_classes"] = "privaasyncfed"
  if model == "auto" and auto_model() == "logreg":
    out["model"] = "mlp"
  return out


def kept(size: int, scale: float) -> int:
  """floor(S[p] * size) (Eq. 10), at least 1 so that no layer vanishes."""
  return max(1, int(math.floor(scale * size + 1e-9)))


def call_order(model, input_shape: Sequence[int]) -> list:
  """The paths of ``model``'s submodules (tuples of names, as in its params tree) in the
  order its forward pass calls them: the order of the layers, which the params tree does
  not keep (``models.init_params`` returns it with its keys sorted, so ``fc`` would come
  before ``stem``). Traced abstractly (no FLOPs).

  Raises ValueError for a model with GroupNorm: a group's statistics would mix the zeroed
  channels in, so the masked layer would not compute the pruned one.
  """
  calls = []

  def record(next_fun, args, kwargs, context):
    if context.method_name == "__call__":
      if isinstance(context.module, nn.GroupNorm):
        raise ValueError(
            f"--model: PrivaAsyncFed prunes channels by masking (HeteroFL, Eq. 10), which "
            f"equals the pruned network only for conv / dense layers, ReLU, pooling and "
            f"per-channel norms; layer {'/'.join(context.module.path)} is a GroupNorm "
            f"(use a model without it, e.g. --model=cnn or mlp)")
      calls.append(tuple(context.module.path))
    return next_fun(*args, **kwargs)

  x = jnp.zeros((1, *input_shape), jnp.float32)
  with nn.intercept_methods(record):
    jax.eval_shape(lambda: model.init({"params": jax.random.PRNGKey(0)}, x, train=False))
  return list(dict.fromkeys(calls))  # first call of each module


def _is_layer(node) -> bool:
  return hasattr(node, "items") and not any(hasattr(v, "items") for v in node.values())


def _layer_paths(params, prefix=()) -> list:
  out = []
  for name, sub in params.items():
    path = prefix + (name,)
    out.extend([path] if _is_layer(sub) else _layer_paths(sub, path))
  return out


def _at(params, path):
  for name in path:
    params = params[name]
  return params


def layer_masks(params, order: Sequence[tuple], scale: float) -> Any:
  """The 0/1 mask pytree of the sub-model at ``scale`` (same structure as ``params``).

  ``order``: the layers' paths in call order (``call_order``). A layer with a ``kernel``
  [..., in, out] keeps inputs < floor(s in) unless it is the first layer (data inputs)
  and outputs < floor(s out) unless it is the last (classes); its bias follows the
  outputs. A dense layer fed by a flattened conv output (its in a multiple of that conv's
  channels) keeps the rows whose channel (row % C) is kept. Other 1-D leaves (norm
  scale/bias) follow the previous layer's outputs. In a residual network every layer
  keeps its leading channels, so a skip connection adds kept channels to kept ones.
  """
  paths = set(_layer_paths(params))
  layers = [(p, _at(params, p)) for p in order if p in paths]
  missing = paths - {p for p, _ in layers}
  if missing:
    raise ValueError(f"layers {sorted(missing)} are not in the call order {list(order)}")
  kernel_layers = [i for i, (_, leaves) in enumerate(layers) if "kernel" in leaves]
  first, last = kernel_layers[0], kernel_layers[-1]
  masks = {}
  prev_out, prev_kept, prev_conv = None, None, False
  for i, (path, leaves) in enumerate(layers):
    m = {}
    if "kernel" in leaves:
      k = np.asarray(leaves["kernel"])
      cin, cout = k.shape[-2], k.shape[-1]
      rows = np.ones(cin, bool)
      if i != first:
        if k.ndim == 2 and prev_conv and cin != prev_out and cin % prev_out == 0:
          rows = (np.arange(cin) % prev_out) < prev_kept  # NHWC flatten: channel fastest
        else:
          rows = np.arange(cin) < kept(cin, scale)
      out_keep = cout if i == last else kept(cout, scale)
      cols = np.arange(cout) < out_keep
      m["kernel"] = np.broadcast_to(rows[:, None] & cols[None, :], k.shape).astype(np.float32)
      for leaf in leaves:
        if leaf != "kernel":
          m[leaf] = np.broadcast_to(cols, np.shape(leaves[leaf])).astype(np.float32)
      prev_out, prev_kept, prev_conv = cout, out_keep, k.ndim > 2
    else:
      for leaf, v in leaves.items():
        size = np.shape(v)[-1]
        keep = prev_kept if prev_out == size else kept(size, scale)
        m[leaf] = np.broadcast_to(np.arange(size) < keep, np.shape(v)).astype(np.float32)
    masks[path] = m
  return _rebuild(params, masks)


def _rebuild(params, masks, prefix=()):
  return {name: masks[prefix + (name,)] if _is_layer(sub) else
          _rebuild(sub, masks, prefix + (name,)) for name, sub in params.items()}


def scale_masks(params, order: Sequence[tuple], scales: Sequence[float] = SCALES
                ) -> np.ndarray:
  """Flat masks ``[len(scales), d]`` aligned with ``ravel_pytree(params)``; ``order``: the
  layers' paths in call order (``call_order``)."""
  rows = []
  for s in scales:
    flat, _ = ravel_pytree(layer_masks(params, order, s))
    rows.append(np.asarray(flat, np.float32))
  return np.stack(rows)


def server_step(w, server_state, upload, arrival, hp):
  """Eqs. 12-15: mix only the held parameters with alpha = beta S_hinge(t - tau).

  t - tau = staleness (0 for an update trained from the current model): Eq. 15 requires
  S(0) = 1 and Fig. 2 gives a client with t - tau ~ 0 the weight alpha_k = beta.

  Args:
    w: [d] the model current at the arrival.
    server_state: the server's state.
    upload: [d] the client's trained model (zero where pruned).
    arrival: the ``Arrival``.
    hp: the hyper-parameters.
  """
  alpha = hp["beta"] * fedasync.hinge_staleness(arrival.staleness, hp["hinge_a"],
                                                hp["hinge_b"])
  return w + alpha * arrival.mask * (upload - w), server_state


ALGORITHM = base.Algorithm(
    name="privaasyncfed",
    local_penalty=base.no_penalty,
    client_final=base.model_upload,
    server_step=server_step,
    dp=True,
    pruned=True,
    hparams=(base.HParam("beta", 0.6, "beta of Eq. 15.",
                         bounds="(0, 1]"), fedasync.HINGE_A, fedasync.HINGE_B),
)
