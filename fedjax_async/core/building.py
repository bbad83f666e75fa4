"""The data set and the model a configuration names (any engine's: its ``data`` and
``model`` parts), loaded and built the same way everywhere."""

from __future__ import annotations

import jax


def load_data(cfg):
  """The federated data set of ``cfg.data`` (any engine's configuration)."""
  from fedjax_async import data as data_lib  # pylint: disable=g-import-not-at-top
  d = cfg.data
  return data_lib.load(d.dataset, partition=d.partition, num_clients=d.num_clients,
                       alpha=d.dirichlet_alpha, shards_per_client=d.shards_per_client,
                       seed=cfg.run.seed, data_dir=d.data_dir, data_source=d.data_source,
                       normalize=d.normalize)


def build_model(cfg, fed_data):
  """(name, flat initial weights, apply) of ``cfg.model`` for ``fed_data``; a ValueError
  names model.name."""
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  input_shape = tuple(fed_data.x.shape[2:])
  try:
    name = (models.default_model_for(cfg.data.dataset) if cfg.model.name == "auto"
            else cfg.model.name)
    model = models.get_model(name, fed_data.num_classes, input_shape)
  except ValueError as e:
    raise ValueError(f"model.name: {e} (data.dataset={cfg.data.dataset})") from None
  w0, apply_flat = models.flat_model(model, input_shape, jax.random.PRNGKey(cfg.run.seed))
  # the same apply for the same model: later runs reuse its compiled rounds (make_runner)
  apply_flat = _APPLY.setdefault((name, fed_data.num_classes, input_shape), apply_flat)
  return name, w0, apply_flat


_APPLY = {}
