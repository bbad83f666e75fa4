"""The data set and the model a configuration names (any engine's: its ``data`` and
``model`` parts), loaded and built the same way everywhere."""

from __future__ import annotations

import jax
from fedjax_async import data as data_lib
from fedjax_async import models
from fedjax_async.core import augment as augment_lib
from fedjax_async.core import client as client_lib
from fedjax_async.core import tokens
from fedjax_async.data import federated, loader


def data_seed_of(cfg) -> int:
  """The seed of ``cfg``'s data and partition: ``data.data_seed``, None (or no such
  field) meaning ``run.seed``."""
  seed = getattr(cfg.data, "data_seed", None)
  return cfg.run.seed if seed is None else seed


def load_data(cfg):
  """The federated data set of ``cfg.data`` (any engine's configuration), drawn from
  ``data_seed_of(cfg)``."""
  d = cfg.data
  return data_lib.load(d.dataset, partition=d.partition, num_clients=d.num_clients,
                       alpha=d.dirichlet_alpha, shards_per_client=d.shards_per_client,
                       seed=data_seed_of(cfg), data_dir=d.data_dir, data_source=d.data_source,
                       normalize=d.normalize,
                       max_client_examples=getattr(d, "max_client_examples", 0),
                       max_test_examples=getattr(d, "max_test_examples", 0))


def augmentation(cfg, fed_data) -> dict:
  """``client.LocalConfig``'s augmentation fields for ``cfg.local.augment`` on
  ``fed_data`` (crop_flip's padding: a black pixel under ``cfg.data.normalize``); a
  ValueError names local.augment when the data are not images."""
  kind = getattr(cfg.local, "augment", "none")
  if kind == "none":
    return {}
  augment_lib.check(kind, fed_data.feature_shape)
  return {"augment": kind,
          "augment_fill": loader.black(cfg.data.normalize, fed_data.feature_shape[-1])}


def local_config(cfg=None, fed_data=None, **fields) -> client_lib.LocalConfig:
  """``client.LocalConfig``, the static part of local training, of every engine: from
  ``cfg.local`` (batch_size, local_epochs, random_local_epochs, momentum > 0,
  local_steps, precision, client_grad_clip and augment on ``fed_data``; a field the part
  lacks at LocalConfig's default) and ``fed_data``'s padded client size, ``fields``
  (LocalConfig's) replacing them; without ``cfg`` (FedEDS's own settings), ``fields``
  alone."""
  if cfg is None:
    return client_lib.LocalConfig(**fields)
  loc = cfg.local
  made = {"batch_size": loc.batch_size, "max_epochs": loc.local_epochs,
          "max_examples": int(fed_data.x.shape[1]),
          "random_epochs": getattr(loc, "random_local_epochs", False),
          "momentum": loc.momentum > 0, "local_steps": loc.local_steps,
          "precision": getattr(loc, "precision", "float32"),
          "grad_clip": getattr(loc, "client_grad_clip", 0.0),
          **augmentation(cfg, fed_data)}
  return client_lib.LocalConfig(**{**made, **fields})


def build_model(cfg, fed_data):
  """(name, flat initial weights, apply) of ``cfg.model`` for ``fed_data``; a ValueError
  names model.name."""
  input_shape = tuple(fed_data.x.shape[2:])
  label_shape = tuple(fed_data.y.shape[2:])  # () classes, (T,) token sequences
  vocab = getattr(fed_data, "input_vocab", 0)
  try:
    name = (models.default_model_for(cfg.data.dataset) if cfg.model.name == "auto"
            else cfg.model.name)
    model = models.get_model(name, fed_data.num_classes, input_shape, input_vocab=vocab)
  except ValueError as e:
    raise ValueError(f"model.name: {e} (data.dataset={cfg.data.dataset})") from None
  token_loss = getattr(cfg.data, "token_loss", "per_token")
  if token_loss not in tokens.TOKEN_LOSSES:
    raise ValueError(f"data.token_loss: must be one of {', '.join(tokens.TOKEN_LOSSES)}, "
                     f"got {token_loss!r}")
  if label_shape and hasattr(model, "token_loss"):  # sequence labels (else a no-op)
    model = model.clone(token_loss=token_loss)
  elif label_shape and token_loss != "per_token":
    raise ValueError(f"data.token_loss={token_loss}: model {name} has no token_loss "
                     "field; use --token_loss=per_token")
  what = f"model.name={name}"
  try:  # (init is a forward pass on the data's example shape)
    w0, apply_flat = models.flat_model(model, input_shape, jax.random.PRNGKey(cfg.run.seed))
  except Exception as e:  # pylint: disable=broad-except
    detail = ("a layer of zero size (an initialiser's division by zero): the examples are "
              "too small for it" if isinstance(e, ZeroDivisionError) else models.one_line(e))
    raise ValueError(f"{what}: does not take the examples of data.dataset={cfg.data.dataset}"
                     f" (shape {input_shape}): {detail}") from None
  key = (name, fed_data.num_classes, input_shape, vocab, label_shape, token_loss)
  if key not in _APPLY:  # its output against the data's classes, once per model
    models.check_output(lambda w, x: apply_flat(w, x, train=False), w0, input_shape,
                        fed_data.num_classes, name, what=what, shapes=apply_flat.shapes,
                        label_shape=label_shape,
                        labels=lambda: federated.largest_label(fed_data))
  # the same apply for the same model: later runs reuse its compiled rounds (make_runner)
  apply_flat = _APPLY.setdefault(key, apply_flat)
  return name, w0, apply_flat


_APPLY = {}
