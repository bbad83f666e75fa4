"""``simulate``: the round engine's algorithms from Python, with the CLI's defaults.

  import fedjax_async as fa
  result = fa.simulate(algorithm="pafed,fedavg", rounds=20)      # nothing written
  print(result.table())
  result.runs["pafed"].rows[-1]["test_accuracy"]
  result.runs["pafed"].state.w                                     # the global model

``simulate(RunConfig(...))`` and ``experiments/run.py`` with the same values run the same
simulation (the flags are made from ``RunConfig``'s defaults); ``output_dir`` writes what
the CLI writes (metrics.jsonl, summary.json, checkpoints, TensorBoard, curves.png,
comparison.md).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

import jax
import numpy as np

from fedjax_async import outputs
from fedjax_async import results
from fedjax_async import config as config_lib
from fedjax_async import distributed
from fedjax_async.rounds import experiment
from fedjax_async import interrupts
from fedjax_async import sharding
from fedjax_async.rounds import timeline as timeline_lib


Result = results.Result


def _table(result: Result) -> str:
  """The round engine's comparison table (markdown): the accuracy metrics, wall time."""
  return outputs.comparison_table(result.summaries())


def output_dirs(cfg: config_lib.RunConfig) -> Dict[str, str]:
  """Each algorithm's directory: ``output_dir`` itself for one, a subfolder each for
  several; none without ``output_dir``."""
  if cfg.output.output_dir is None:
    return {}
  names = cfg.algorithm.name_list()
  return {n: os.path.join(cfg.output.output_dir, n) if len(names) > 1 else cfg.output.output_dir
          for n in names}


def prepare(cfg: config_lib.RunConfig):
  """Before any work: a directory holding a previous run is refused or cleared
  (ValueError / OSError naming it)."""
  if cfg.output.output_dir is None:
    return
  if "," in cfg.algorithm.names:
    outputs.prepare_output_dir(cfg.output.output_dir, cfg.output.resume, cfg.output.overwrite,
                                  outputs.COMPARISON_OUTPUTS)
  for d in output_dirs(cfg).values():
    outputs.prepare_output_dir(d, cfg.output.resume, cfg.output.overwrite)


def _algorithm_names(value, config) -> str:
  """``algorithm=`` as the configuration's comma list: a name, a list of names, or
  ``base.Algorithm`` objects (registered by their names, ``algorithms.register``)."""
  from fedjax_async import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_async.algorithms import base  # pylint: disable=g-import-not-at-top
  if value is None:
    return (config or config_lib.RunConfig()).algorithm.names
  items = list(value) if isinstance(value, (list, tuple)) else [value]
  for item in items:
    if isinstance(item, base.Algorithm):
      algorithms.register(item, replace=True)
  return ",".join(i.name if isinstance(i, base.Algorithm) else str(i) for i in items)


def _sweep(cfg, seeds, grid: dict, fed_data, model_fn, callbacks) -> Result:
  """``simulate(..., seeds=[...], sweep={name: values})``: per algorithm, every setting
  (the cartesian product of ``grid``, a field's flat key or an algorithm's own
  hyper-parameter each) times every seed as ONE vmapped computation, in memory. The runs
  are keyed ``<algorithm>/<setting>_seed=<s>``."""
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top
  import itertools  # pylint: disable=g-import-not-at-top
  if cfg.output.output_dir is not None:
    raise config_lib.ConfigError("output.output_dir", "simulate's sweeps run in memory; "
                                 "experiments/sweep.py writes a sweep's files")
  seeds = [cfg.run.seed] if seeds is None else list(seeds)
  if not seeds or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                      for s in seeds):
    raise config_lib.ConfigError("seeds", f"expected a list of ints, got {seeds!r}")
  if not isinstance(grid, dict):
    raise config_lib.ConfigError("sweep", f"expected {{name: [values]}}, got {grid!r}")
  names = list(grid)
  cfgs = []
  for values in itertools.product(*(list(grid[n]) for n in names)):
    for seed in seeds:
      c = cfg.replace(seed=int(seed))
      for n, v in zip(names, values):
        c = sweep.with_value(c, n, v)
      config_lib.validate(c)
      cfgs.append(c)
  runs: Dict[str, results.Run] = {}
  for name in cfg.algorithm.name_list():
    for c, (summary, rows, state) in zip(cfgs, sweep.run_in_memory(
        cfgs, name, fed_data, names, model_fn, callbacks, cfg.output.quiet)):
      model = (model_fn(c) if model_fn is not None else experiment.build_model(c, fed_data))
      runs[f"{name}/{sweep.run_name(c, names)}"] = results.Run(summary, rows, state, model)
  return Result(cfg, runs, tabulate=_table)


def _own_data_and_model(fields: dict):
  """(FederatedData, flax module, input_shape) given to ``simulate`` in place of a data set's
  and a model's names (``data=``, ``dataset=``, ``model=``, ``input_shape=``), popped from
  ``fields``; None for those not given. A wrong kind is a ``ConfigError``."""
  from fedjax_async.data import FederatedData  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  fed_data = None
  for key in ("data", "dataset"):
    if isinstance(fields.get(key), FederatedData):
      fed_data = fields.pop(key)
    elif key == "data" and key in fields and not isinstance(fields[key], config_lib.DataConfig):
      raise config_lib.ConfigError("data", "expected a FederatedData (fa.data.from_arrays, "
                                   "fa.data.from_clients) or a DataConfig, got "
                                   f"{type(fields[key]).__name__}")
  module = fields.pop("model") if isinstance(fields.get("model"), nn.Module) else None
  input_shape = fields.pop("input_shape", None)
  if input_shape is not None and module is None:
    raise config_lib.ConfigError("input_shape", "only with model=<a flax.linen.Module>")
  return fed_data, module, None if input_shape is None else tuple(input_shape)


def _user_model(module, input_shape, seed: int):
  """``models.user_model``, its ValueError a ``ConfigError`` naming ``model``."""
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  try:
    return models.user_model(module, input_shape, seed)
  except ValueError as e:
    raise config_lib.ConfigError("model", str(e).removeprefix("model: ")) from None


def simulate(config: Optional[config_lib.RunConfig] = None, callbacks: Sequence = (),
             **fields) -> Result:
  """Runs ``config.algorithm.names`` (a comma-separated list) on the round engine; with an
  ``AsyncRunConfig``, on the virtual clock (``asynchronous.experiment.run_virtual_clock``).

  ``config`` defaults to ``RunConfig()``, the README's main job (PAFed, FedADMM, FedAvg
  and FedProx on Synthetic(1,1), a fraction 0.3 of the clients delayed 1-3 rounds);
  ``fields`` replace its fields by their flat keys (``simulate(rounds=20)``, as
  ``RunConfig.replace``); ``algorithm`` may be a list. Your own data and model:
  ``data=fa.data.from_arrays(...)`` (or ``from_clients``) instead of a data set's name,
  ``model=<flax.linen.Module>`` (its ``params`` only; ``input_shape`` defaults to the
  data's example shape) instead of a model's name. ``seeds=[0, 1, 2]`` and
  ``sweep={"lr": [0.05, 0.1], "beta": [...]}`` (fields or an algorithm's own
  hyper-parameters) run every setting and seed of an algorithm as one vmapped
  computation, keyed ``<algorithm>/<setting>_seed=<s>``. Raises ``config.ConfigError``
  (a ValueError) naming the field at fault, ``engine.Diverged`` naming the round, and ``interrupts.Interrupted`` on
  Ctrl-C / SIGTERM (with ``output_dir``, after saving a checkpoint). ``callbacks``:
  ``loop.Callback``s, each called after every compiled chunk of rounds of every run
  (``after_chunk(loop, state, rows)``).
  """
  from fedjax_async.asynchronous import config as async_config  # pylint: disable=g-import-not-at-top
  from fedjax_async.fededs import config as fededs_config  # pylint: disable=g-import-not-at-top
  if isinstance(config, fededs_config.FedEDSRunConfig):
    from fedjax_async.fededs import experiment as fededs  # pylint: disable=g-import-not-at-top
    return fededs.run_grid(config.replace(**fields) if fields else config, callbacks)
  if isinstance(config, async_config.AsyncRunConfig):
    from fedjax_async.asynchronous import experiment as async_experiment  # pylint: disable=g-import-not-at-top
    if "algorithm" in fields:
      fields["algorithm"] = _algorithm_names(fields["algorithm"], config)
    if isinstance(fields.get("hp"), dict):
      fields["hp"] = ",".join(f"{k}={v!r}" for k, v in fields["hp"].items())
    if isinstance(fields.get("seeds"), (list, tuple)):  # the virtual clock runs them in turn
      fields["seeds"] = ",".join(str(int(s)) for s in fields["seeds"])
    if fields.pop("sweep", None):
      raise config_lib.ConfigError("sweep", "the virtual clock sweeps with comma lists of "
                                   "its fields (mix_alpha=\"0.2,0.6\") and seeds=[...]")
    fed_data, module, input_shape = _own_data_and_model(fields)
    if fed_data is not None and "dataset" not in fields:
      fields["dataset"] = fed_data.name
    return async_experiment.run_virtual_clock(config, callbacks, fed_data=fed_data, module=module,
                           input_shape=input_shape, **fields)
  fields["algorithm"] = _algorithm_names(fields.get("algorithm"), config)
  if isinstance(fields.get("hp"), dict):  # {"beta": 0.9}
    fields["hp"] = ",".join(f"{k}={v!r}" for k, v in fields["hp"].items())
  fed_data, module, input_shape = _own_data_and_model(fields)
  seeds, grid = fields.pop("seeds", None), fields.pop("sweep", None) or {}
  if fed_data is not None and "dataset" not in fields:
    fields["dataset"] = fed_data.name  # names the runs; PAFed's alphas: the image default
  cfg = (config or config_lib.RunConfig()).replace(**fields)
  config_lib.validate(cfg)
  if cfg.crypto.secure_aggregation == "ckks" and distributed.joined() and jax.process_count() > 1:
    raise ValueError("crypto.secure_aggregation=ckks: the encrypted server (OpenFHE, on the "
                     "host) runs in one process; run it without --coordinator_address / "
                     "--distributed")
  devices = sharding.select_devices(cfg.run.devices)
  prepare(cfg)
  names = cfg.algorithm.name_list()
  if fed_data is None:
    print(f"loading {cfg.data.dataset} ...", flush=True)
    fed_data = experiment.load_data(cfg)
  shape = input_shape or tuple(fed_data.x.shape[2:])
  model = (experiment.build_model(cfg, fed_data) if module is None else
           _user_model(module, shape, cfg.run.seed))
  if seeds is not None or grid:
    model_fn = (None if module is None else
                lambda c: _user_model(module, shape, c.run.seed))
    return _sweep(cfg, seeds, grid, fed_data, model_fn, callbacks)
  print(f"data: {fed_data.num_clients} clients, {int(fed_data.counts.sum())} train / "
        f"{len(fed_data.test_y)} test examples; model {model[0]} with {np.size(model[1])} "
        f"parameters; jax devices: {jax.devices()}", flush=True)
  if len(devices) > 1:
    print(f"each round's clients split over {len(devices)} devices (run.devices)", flush=True)
  tl = timeline_lib.build(fed_data.num_clients, cfg.run.rounds, cfg.run.participation, cfg.delay,
                          cfg.run.seed)
  for warning in filter(None, [timeline_lib.dropped_warning(cfg.delay, tl),
                               timeline_lib.delayed_only_warning(tl)
                               if "pafed" in names else None]):
    outputs.warn(warning)
  dirs = output_dirs(cfg)
  runs: Dict[str, results.Run] = {}
  overall = experiment.Overall(len(names), cfg.run.rounds)
  for i, name in enumerate(names):
    runs[name] = experiment.run(cfg, name, fed_data, model, dirs.get(name),
                                position=(i + 1, len(names)), overall=overall,
                                callbacks=callbacks)
    interrupts.check_interrupted()
    s = runs[name].summary
    where = f" -> {dirs[name]}" if name in dirs else ""
    print(f"[{outputs.algorithm_label(s)}] final accuracy {s['final_accuracy']:.4f}, "
          f"last-10 mean {s['last10_mean_accuracy']:.4f}, average best "
          f"{s['average_best_accuracy']:.4f}, {s['wall_time_s']:.1f}s{where}", flush=True)
  result = Result(cfg, runs, tabulate=_table)
  if cfg.output.output_dir is not None:
    result.figure = os.path.join(cfg.output.output_dir, "curves.png")
    outputs.plot_curves({n: r.rows for n, r in runs.items()}, result.figure,
                           title=outputs.figure_title(cfg, fed_data.name, model[0], names))
    if len(names) > 1:
      outputs.write_comparison(result.summaries(), cfg.output.output_dir)
  return result
