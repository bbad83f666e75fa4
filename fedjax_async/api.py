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

import dataclasses
import difflib
import functools
import itertools
import json
import os
import types
from typing import Dict, List, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

from fedjax_async import algorithms
from fedjax_async import config as config_lib
from fedjax_async import console
from fedjax_async import distributed
from fedjax_async import interrupts
from fedjax_async import models
from fedjax_async import outputs
from fedjax_async import results
from fedjax_async import sharding
from fedjax_async.algorithms import base
from fedjax_async.asynchronous import config as async_config
from fedjax_async.asynchronous import experiment as async_experiment
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.core import tokens
from fedjax_async.data import FederatedData, federated
from fedjax_async.fededs import config as fededs_config
from fedjax_async.fededs import experiment as fededs
from fedjax_async.rounds import experiment
from fedjax_async.sweeps import sweep


Result = results.Result


def _table(result: Result) -> str:
  """The round engine's comparison table (markdown): the accuracy metrics, wall time."""
  return outputs.comparison_table(result.summaries())


def output_dirs(cfg: config_lib.RunConfig) -> Dict[str, str]:
  """Each algorithm's directory, ``<output_dir>/<algorithm>/`` however many there are;
  none without ``output_dir``."""
  if cfg.output.output_dir is None:
    return {}
  return {n: os.path.join(cfg.output.output_dir, n) for n in cfg.algorithm.name_list()}


def seed_config(cfg: config_lib.RunConfig, seed: int) -> config_lib.RunConfig:
  """One seed's configuration of a run of several seeds with ``output_dir``: its files
  under ``<output_dir>/seed<s>/``, its data from ``cfg``'s data seed."""
  return config_lib.with_seed(cfg, seed, output_dir=os.path.join(cfg.output.output_dir,
                                                                 f"seed{seed}"))


def prepare(cfg: config_lib.RunConfig, seeds: Sequence[int] = ()):
  """Before any work: a directory in use by another run, or holding a previous run (of any
  layout: one algorithm, several, several seeds), is refused or cleared (ValueError /
  OSError naming it); with several ``seeds``, each seed's folder and the comparison over
  them."""
  if cfg.output.output_dir is None:
    return
  keeps = outputs.COMPARISON_OUTPUTS + (tuple(f"seed{s}" for s in seeds) if len(seeds) > 1
                                        else tuple(cfg.algorithm.name_list()))
  outputs.lock_output_dir(cfg.output.output_dir)
  if cfg.output.resume and len(seeds) <= 1:
    _resumes_its_algorithms(cfg, keeps)
  outputs.clear_stale(cfg.output.output_dir, keeps, cfg.output.resume, cfg.output.overwrite)
  outputs.prepare_output_dir(cfg.output.output_dir, cfg.output.resume, cfg.output.overwrite,
                             outputs.COMPARISON_OUTPUTS)
  if len(seeds) > 1:
    for seed in seeds:
      prepare(seed_config(cfg, seed))
    return
  for d in output_dirs(cfg).values():
    outputs.prepare_output_dir(d, cfg.output.resume, cfg.output.overwrite)


def _resumes_its_algorithms(cfg: config_lib.RunConfig, keeps: Sequence[str]):
  """``output.resume`` into a folder whose runs are only other algorithms' (folders named
  after algorithms): a ValueError naming algorithm.names, not the folder's layout."""
  out = cfg.output.output_dir
  stale = outputs.stale_outputs(out, keeps)
  if stale and all(n in algorithms.names() for n in stale) and not any(
      os.path.isdir(os.path.join(out, n)) for n in cfg.algorithm.name_list()):
    raise ValueError(f"output.resume: the runs under {out} were made with other flags: "
                     f"algorithm.names={','.join(stale)!r} (now {cfg.algorithm.names!r}); "
                     "resume with those, or pass output.overwrite to start over")


def _algorithm_names(value, config) -> str:
  """``algorithm=`` as the configuration's comma list: a name, a list of names, or
  ``base.Algorithm`` objects (registered by their names, ``algorithms.register``)."""
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
  hyper-parameter each, values in numeric order) times every seed as ONE vmapped
  computation, in memory. A name the algorithm does not use (``sweep.used_names``: ``mu``
  for FedAvg) is not swept for it, said once on the console. The runs are keyed
  ``<algorithm>/<setting>_seed=<s>``; each summary holds its ``seed`` and ``setting``."""
  if cfg.output.output_dir is not None:
    raise config_lib.ConfigError("output.output_dir", "simulate's sweeps run in memory; "
                                 "experiments/sweep.py writes a sweep's files")
  seeds = [cfg.run.seed] if seeds is None else seeds
  if not isinstance(grid, dict):
    raise config_lib.ConfigError("sweep", f"expected {{name: [values]}}, got {grid!r}")
  for n, values in grid.items():
    values = list(values) if isinstance(values, (list, tuple, range, np.ndarray)) else None
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                         for v in values) or len(set(values)) < len(values):
      raise config_lib.ConfigError(f"sweep[{n!r}]", "expected a list of distinct numbers, "
                                   f"got {grid[n]!r}")
  runs: Dict[str, results.Run] = {}
  todo, skipped = [], []
  for name in cfg.algorithm.name_list():
    names = sweep.used_names(cfg, name, list(grid))
    if len(names) < len(grid):
      skipped.append(f"{name} does not use {', '.join(n for n in grid if n not in names)}")
    cfgs = []
    for values in itertools.product(*(sorted(grid[n]) for n in names)):
      for seed in seeds:
        c = config_lib.with_seed(cfg, seed)  # the data: one data seed
        for n, v in zip(names, values):
          c = sweep.with_value(c, n, v)
        config_lib.validate(c)
        cfgs.append(c)
    todo.append((name, names, cfgs))
  unused = [n for n in grid if not any(n in names for _, names, _ in todo)]
  if unused:
    raise config_lib.ConfigError(f"sweep[{unused[0]!r}]", f"no algorithm of "
                                 f"{cfg.algorithm.names} uses it: expected a field's flat key "
                                 f"({', '.join(sweep.sweepable())}) or an algorithm's own "
                                 "hyper-parameter")
  if skipped:
    console.say(f"sweep: {'; '.join(skipped)}: its runs are not repeated over those values")
  for name, names, cfgs in todo:
    for c, (summary, rows, state) in zip(cfgs, sweep.run_in_memory(
        cfgs, name, fed_data, names, model_fn, callbacks, cfg.output.quiet)):
      model = (model_fn(c) if model_fn is not None else experiment.build_model(c, fed_data))
      runs[f"{name}/{sweep.run_name(c, names)}"] = results.Run(summary, rows, state, model)
  return Result(cfg, runs, tabulate=_table)


def _seed_list(cfg: config_lib.RunConfig, seeds) -> Optional[List[int]]:
  """``simulate``'s ``seeds=`` (distinct ints: else a ``ConfigError`` naming it), else
  those of ``run.seeds`` (the CLI's ``--seeds``); None without either."""
  if seeds is None:
    return config_lib.seeds_of(cfg) if cfg.run.seeds.strip() else None
  seeds = list(seeds)
  if not seeds or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                      for s in seeds) or len(set(seeds)) < len(seeds):
    raise config_lib.ConfigError("seeds", f"expected a list of distinct ints, got {seeds!r}")
  return [int(s) for s in seeds]


def _run_seeds(cfg: config_lib.RunConfig, seeds: List[int], fed_data, model_fn, callbacks,
               title: str) -> Result:
  """Every seed of ``seeds`` in turn (``_run_each``, files under ``<output_dir>/seed<s>/``),
  all from ``cfg``'s data seed; then in ``output_dir`` the comparison over the seeds (mean ±
  std (n)) and ``curves.png``, a band per algorithm (``Result.plot``).

  Args:
    cfg: the configuration (``output.output_dir`` set).
    seeds: the seeds, two or more.
    fed_data: the federated data.
    model_fn: ``model_fn(cfg) -> (name, w0, apply_flat)``, a seed's model.
    callbacks: ``loop.Callback``s after every compiled chunk.
    title: the figures' title (the data, model, delays and algorithms).
  """
  result = Result(cfg, {}, tabulate=_table, title=f"{title}; {outputs.seeds_note(seeds)}")
  for seed in seeds:
    c = seed_config(cfg, seed)
    console.say(f"seed {seed} of {', '.join(map(str, seeds))} (data seed "
                f"{config_lib.data_seed_of(c)}) -> {c.output.output_dir}")
    result.by_seed[seed] = _run_each(c, fed_data, model_fn(c), callbacks,
                                     f"{title}; seed {seed}").runs
  result.runs = result.by_seed[seeds[0]]
  if distributed.is_main():
    outputs.write_comparison(result.summaries(), cfg.output.output_dir)
    result.plot(os.path.join(cfg.output.output_dir, "curves.png"))
  return result


def _own_data_and_model(fields: dict):
  """(FederatedData, flax module, input_shape) given to ``simulate`` in place of a data set's
  and a model's names (``data=``, ``dataset=``, ``model=``, ``input_shape=``), popped from
  ``fields``; None for those not given. A wrong kind is a ``ConfigError``."""
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
  if input_shape is not None:
    try:
      input_shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError):
      raise config_lib.ConfigError("input_shape", "expected a tuple of ints (one example's "
                                   f"shape), got {input_shape!r}") from None
  if module is not None and fed_data is not None:  # one abstract forward pass, at build time
    _checked(lambda: models.check_module(module, input_shape or fed_data.feature_shape,
                                         fed_data.num_classes, fed_data.feature_shape,
                                         labels=lambda: federated.largest_label(fed_data)))
  return fed_data, module, input_shape


def _checked(build):
  """``build()``, its ValueError from ``models`` a ``ConfigError`` naming ``model`` (or
  ``input_shape``)."""
  try:
    return build()
  except ValueError as e:
    field, _, message = str(e).partition(": ")
    if field.startswith("input_shape"):
      raise config_lib.ConfigError(field, message) from None
    raise config_lib.ConfigError("model", str(e).removeprefix("model: ")) from None


def _user_model(module, input_shape, seed: int, num_classes=None, data_shape=None):
  """``models.user_model`` (checked against ``num_classes`` and the data's
  ``data_shape`` when given), its ValueError a ``ConfigError`` naming ``model``."""
  return _checked(lambda: models.user_model(module, input_shape, seed, num_classes,
                                            data_shape))


# The fields that pick and split a named data set: data= (your own) leaves them unused.
_DATA_KEYS = tuple(f.name for f in dataclasses.fields(config_lib.DataConfig))
# A round-engine field given with a virtual-clock algorithm: the clock's counterpart.
_ON_THE_CLOCK = {"rounds": "num_updates", "participation": "concurrency",
                 "rounds_per_call": "groups_per_call"}


def _refuse_overridden(fields: dict, keys, config_class, part=None, default=None):
  """With ``data=`` (or ``dataset=``) your own data, a field it leaves unused (``keys``)
  given too is a ``ConfigError`` naming it; one the configuration ``part`` sets away from
  its default is warned once."""
  data = next((fields[k] for k in ("data", "dataset")
               if isinstance(fields.get(k), FederatedData)), None)
  if data is None:
    return
  own = f"data= brings its own data ({data.num_clients} clients)"
  for k in keys:
    if k in fields and fields[k] is not data:
      hint = (f"; fa.data.from_arrays(..., num_clients={fields[k]!r}) splits arrays over "
              "that many" if k == "num_clients" else "")
      raise config_lib.ConfigError(".".join(config_class.keys()[k]), f"{own}, which "
                                   f"{k}={fields[k]!r} would not change: leave it out{hint}")
  if part is not None and default is not None:
    unused = [f"data.{f.name}={getattr(part, f.name)!r}" for f in dataclasses.fields(part)
              if f.name != "dataset" and getattr(part, f.name) != getattr(default, f.name)]
    if unused:
      outputs.warn(f"{own}: the configuration's {', '.join(unused)} not used")


def _clock_for(fields: dict):
  """``AsyncRunConfig()``, said on the console, for the ``fields["algorithm"]`` that
  ``algorithms.engine_of`` puts on the virtual clock; a field the clock lacks
  (``rounds``) is a ``ConfigError`` naming it."""
  names = fields["algorithm"].split(",")
  clock = [n for n in names if n in algorithms.names("virtual_clock")]
  cls = async_config.AsyncRunConfig
  parts = {f.name for f in dataclasses.fields(cls)}
  for k in fields:
    if k not in cls.keys() and k not in parts and k not in ("input_shape", "sweep"):
      close = difflib.get_close_matches(k, list(cls.keys()), n=2, cutoff=0.6)
      like = _ON_THE_CLOCK.get(k) or " or ".join(close)
      raise config_lib.ConfigError(k, f"not a field of the virtual clock, which "
                                   f"{', '.join(clock)} runs on (AsyncRunConfig, "
                                   "docs/async.md)" + (f"; did you mean {like}?" if like
                                                       else ""))
  console.say(f"{', '.join(names)}: on the virtual clock (fa.AsyncRunConfig()'s defaults, "
              "docs/async.md)")
  return cls()


def _delay_note(cfg: config_lib.RunConfig, grid=()) -> Optional[str]:
  """A line saying the delays a round-engine run has (None without any)."""
  d = cfg.delay
  if isinstance(grid, dict) and "delay_fraction" in grid:
    share = "a swept fraction (delay_fraction)"
  elif d.fraction:
    share = f"{d.fraction:.0%}"
  else:
    return None
  late = (f"exactly {d.max_delay}" if d.distribution == "fixed" else
          f"1-{d.max_delay}" if d.distribution == "uniform" else
          f"a geometric number (mean {d.mean:g}) of")
  return (f"delays on: {share} of each round's sampled clients arrive {late} rounds late "
          "(delay_fraction=0: none)")


# Besides the hyper-parameters the algorithms declare (``base.HParam``), the fields a note
# may name when an algorithm does not read them: the server's step size and rules.
_SERVER_FIELDS = {"rounds": ("server_lr",),
                  "virtual_clock": ("server_lr", "mix_alpha", "staleness_fn", "example_weight")}


def _traced(cfg, name: str, engine: str):
  """(algorithm, traced hyper-parameters) of ``name`` as ``engine`` runs it."""
  if engine == "rounds":
    return sweep.traced(cfg, name)
  algorithm = algorithms.get(name)
  alpha = async_config.parse_floats(cfg.algorithm.mix_alpha, "algorithm.mix_alpha")[0]
  return algorithm, async_experiment.hparams(cfg, alpha, algorithm)


def unread_note(cfg, given: Sequence[str]) -> Optional[str]:
  """The console's note on the hyper-parameters among ``given`` (the flat keys a user set:
  ``simulate``'s keywords, the CLI's given flags) that the algorithms of ``cfg`` (a
  ``RunConfig`` or ``AsyncRunConfig``) do not read, by their traced programs
  (``sweep.unread``): ``note: fedavg does not read mu, rho (algorithm.mu, algorithm.rho):
  they change nothing``, a line per set of algorithms; None when there are none, or when
  ``cfg`` does not validate (its error says what is wrong)."""
  clock = isinstance(cfg, async_config.AsyncRunConfig)
  engine = "virtual_clock" if clock else "rounds"
  names = [n for n in dict.fromkeys(given) if isinstance(n, str) and (
      n in algorithms.declared(engine) or n in _SERVER_FIELDS[engine])]
  if not names:
    return None
  try:
    (async_config.validate if clock else config_lib.validate)(cfg)
  except ValueError:
    return None
  algs = cfg.algorithm.names.split(",")
  unread = {a: sweep.unread(*_traced(cfg, a, engine), names) for a in algs}
  by_algorithms: Dict[tuple, list] = {}  # the algorithms that do not read them: the names
  for n in names:
    who = tuple(a for a in algs if n in unread[a])
    if who:
      by_algorithms.setdefault(who, []).append(n)
  keys, lines = type(cfg).keys(), []
  for who, ns in by_algorithms.items():
    paths = ", ".join(".".join(keys[n]) if n in keys else f"algorithm.hp.{n}" for n in ns)
    where = "" if len(who) == len(algs) else " in its runs" if len(who) == 1 else (
        " in their runs")
    lines.append(f"note: {', '.join(who)} {'does' if len(who) == 1 else 'do'} not read "
                 f"{', '.join(ns)} ({paths}): "
                 f"{'it changes' if len(ns) == 1 else 'they change'} nothing{where}")
  return "\n".join(lines) or None


def print_unread_note(cfg, given: Sequence[str]) -> None:
  """``unread_note``'s lines on the console (their fields named as ``outputs.name_fields``
  says: by their flags on the command line)."""
  note = unread_note(cfg, given)
  if note:
    console.say(outputs.name_fields(note), console.WARNING)  # on stdout, beside the run


def _given(fields: dict) -> list:
  """The names a ``simulate`` call sets: its keywords, the entries of ``hp={...}``."""
  hp = fields.get("hp")
  return list(fields) + (list(hp) if isinstance(hp, dict) else [])


def _table_and_note(tabulate, note: str, result: Result) -> str:
  return f"{tabulate(result)}\n\n{note}."


def _noted(result: Result, note: Optional[str]) -> Result:
  """``result`` whose ``table()`` ends with ``note``."""
  if note:
    result.tabulate = functools.partial(_table_and_note, result.tabulate, note)
  return result


def simulate(config: Optional[config_lib.RunConfig] = None, callbacks: Sequence = (),
             **fields) -> Result:
  """Runs ``config.algorithm.names`` (a comma-separated list) on the round engine; with an
  ``AsyncRunConfig``, or without a config ``algorithm=`` naming one of the virtual clock's
  own (``fedasync``; ``algorithms.engine_of`` decides), on the virtual clock
  (``asynchronous.experiment.run_virtual_clock``); with a ``FedEDSRunConfig``, FedEDS
  (``fededs.experiment.run_fededs_grid``, ``data=`` too).

  ``config`` defaults to ``RunConfig()``, the README's main job (PAFed, FedADMM, FedAvg
  and FedProx on Synthetic(1,1), a fraction 0.3 of the clients delayed 1-3 rounds);
  ``fields`` replace its fields by their flat keys (``simulate(rounds=20)``, as
  ``RunConfig.replace``); ``algorithm`` may be a list. Your own data and model:
  ``data=fa.data.from_arrays(...)`` (or ``from_clients``) instead of a data set's name,
  ``model=<flax.linen.Module>`` (its ``params`` only; ``input_shape`` defaults to the
  data's example shape) instead of a model's name (a data field given beside ``data=``,
  ``num_clients=50``, is a ``ConfigError``). ``seeds=[0, 1, 2]`` and
  ``sweep={"lr": [0.05, 0.1], "beta": [...]}`` (fields or an algorithm's own
  hyper-parameters) run every setting and seed of an algorithm as one vmapped
  computation, keyed ``<algorithm>/<setting>_seed=<s>``; ``seeds`` (also ``"0,1,2"``, the
  CLI's ``--seeds``) with ``output_dir`` run one after the other under ``seed<s>/``.
  Every seed's data come from one data seed (``data_seed``, default ``seed``). Raises
  ``config.ConfigError`` (a ValueError) naming the field at fault, ``engine.Diverged``
  naming the round, and ``interrupts.Interrupted`` on Ctrl-C / SIGTERM (with
  ``output_dir``, after saving a checkpoint). ``callbacks``:
  ``loop.Callback``s, each called after every compiled chunk of rounds of every run
  (``after_chunk(loop, state, rows)``). Delays, when on, are said on the console and
  under ``table()``; a keyword the algorithms do not read is named on the console
  (``unread_note``). ``quiet=True`` (``output.quiet``) prints nothing.
  """
  quiet = fields.get("quiet", getattr(getattr(config, "output", None), "quiet", False))
  with console.silenced(bool(quiet)), outputs.run_scope():
    return _simulate(config, callbacks, fields)


def _simulate(config, callbacks, fields: dict) -> Result:
  """``simulate``'s dispatch (``_ENGINES``): the engine of ``config``'s class; without a
  config, the one ``algorithms.engine_of`` picks for ``algorithm=`` (the virtual clock
  with ``AsyncRunConfig()``'s defaults, ``_clock_for``); else the round engine."""
  engine = next((e for cls, e in _ENGINE_OF_CONFIG if isinstance(config, cls)), "rounds")
  if config is None and "algorithm" in fields:
    fields["algorithm"] = _algorithm_names(fields["algorithm"], None)
    engine = algorithms.engine_of(fields["algorithm"])
    if engine == "virtual_clock":
      config = _clock_for(fields)
  return _ENGINES[engine](config, callbacks, fields)


def _read_run(run_dir: str) -> Optional[results.Run]:
  """The finished run under ``run_dir`` (summary.json, written last), or None."""
  if not os.path.isfile(os.path.join(run_dir, "summary.json")):
    return None
  with open(os.path.join(run_dir, "summary.json")) as f:
    summary = json.load(f)
  final = os.path.join(run_dir, outputs.FINAL_MODEL)
  state = types.SimpleNamespace(w=np.load(final)) if os.path.isfile(final) else None
  return results.Run(summary, outputs.read_metrics(run_dir), state)


def _read_runs(folder: str) -> Dict[str, results.Run]:
  """One run's folder, or a subfolder per algorithm: ``{algorithm: Run}``."""
  one = _read_run(folder)
  if one is not None:
    return {one.summary.get("algorithm", os.path.basename(folder)): one}
  found = {n: _read_run(os.path.join(folder, n)) for n in sorted(os.listdir(folder))
           if os.path.isdir(os.path.join(folder, n))}
  return {n: r for n, r in found.items() if r is not None}


def load(path: str) -> Result:
  """A run's folder (the CLI's, or ``simulate(output_dir=...)``'s) read back as the
  ``Result`` the run returned: each run's summary, metrics rows and final global model
  (``runs[name].state.w``, from ``final_model.npy``; no ``model``: ``final_model()``
  needs the run in memory): an invocation's folder (``<algorithm>/`` each,
  ``seed<s>/<algorithm>/`` with several seeds) or one run's; ``table()`` and ``figure``
  as the run's. FileNotFoundError naming the folder when it holds no finished run."""
  seeds = sorted((int(n[4:]), n) for n in (os.listdir(path) if os.path.isdir(path) else [])
                 if n.startswith("seed") and n[4:].isdigit())
  by_seed = {s: _read_runs(os.path.join(path, n)) for s, n in seeds}
  runs = next(iter(by_seed.values())) if by_seed else (
      _read_runs(path) if os.path.isdir(path) else {})
  if not runs:
    raise FileNotFoundError(f"{path}: no finished run there (a run's folder holds "
                            "summary.json, or a subfolder per algorithm or seed<s>/ with it)")
  clock = any("event" in r.rows[0] for r in runs.values() if r.rows)
  first = next(iter(runs.values())).summary
  figure = os.path.join(path, "curves.png")
  return Result(first.get("config"), runs, by_seed if len(by_seed) > 1 else {},
                figure=figure if os.path.isfile(figure) else None,
                tabulate=async_experiment.table_of if clock else _table)


def _own_hparams(fields: dict, config_class):
  """``simulate(beta=0.9)``, an algorithm's own hyper-parameter that is no field of
  ``config_class``, moved into ``hp`` (a mapping, as ``hp={"beta": 0.9}``)."""
  keys, declared = config_class.keys(), algorithms.declared()
  moved = {k: fields.pop(k) for k in list(fields) if k not in keys and k in declared}
  if moved:
    fields["hp"] = {**config_lib.parse_hp(fields.get("hp") or {}), **moved}


def _simulate_fededs(config, callbacks, fields: dict) -> Result:
  """``simulate`` with a ``FedEDSRunConfig``: FedEDS's grid (``data=`` too)."""
  data = fields.get("data")  # (a FashionMNIST part is a field of its own)
  data = None if isinstance(data, (type(None), fededs_config.FashionMNIST)) else fields.pop(
      "data")
  _refuse_overridden(dict(fields, data=data), fededs.FASHION_MNIST_FIELDS, type(config))
  if not isinstance(fields.get("model", ""), str):
    raise config_lib.ConfigError("model", "FedEDS builds its split model (cnn, mlp or "
                                 "resnet18: model='mlp'); a flax module runs on the round "
                                 "engine and the virtual clock")
  return fededs.run_fededs_grid(config.replace(**fields) if fields else config, callbacks,
                                data=data)


def _simulate_virtual_clock(config, callbacks, fields: dict) -> Result:
  """``simulate`` with an ``AsyncRunConfig``: the virtual clock, seeds in turn."""
  given = _given(fields)
  if "algorithm" in fields:
    fields["algorithm"] = _algorithm_names(fields["algorithm"], config)
  _own_hparams(fields, async_config.AsyncRunConfig)
  if isinstance(fields.get("seeds"), (list, tuple)):  # the virtual clock runs them in turn
    fields["seeds"] = ",".join(str(int(s)) for s in fields["seeds"])
  if fields.pop("sweep", None):
    raise config_lib.ConfigError("sweep", "the virtual clock sweeps with comma lists of "
                                 "its fields (mix_alpha=\"0.2,0.6\") and seeds=[...]")
  _refuse_overridden(fields, _DATA_KEYS, type(config), config.data,
                     async_config.AsyncRunConfig().data)
  fed_data, module, input_shape = _own_data_and_model(fields)
  if fed_data is not None and "dataset" not in fields:
    fields["dataset"] = fed_data.name
  print_unread_note(config.replace(**fields), given)
  return async_experiment.run_virtual_clock(config, callbacks, fed_data=fed_data,
                                            module=module, input_shape=input_shape, **fields)


def _simulate_rounds(config, callbacks, fields: dict) -> Result:
  """``simulate`` on the round engine: a sweep, or seeds without ``output_dir``, as one
  vmapped computation; several seeds with ``output_dir`` one after the other
  (``_run_seeds``); else each algorithm in turn (``_run_each``)."""
  given = _given(fields)
  fields["algorithm"] = _algorithm_names(fields.get("algorithm"), config)
  _own_hparams(fields, config_lib.RunConfig)
  _refuse_overridden(fields, _DATA_KEYS, config_lib.RunConfig, getattr(config, "data", None),
                     config_lib.DataConfig())
  fed_data, module, input_shape = _own_data_and_model(fields)
  seeds, grid = fields.pop("seeds", None), fields.pop("sweep", None) or {}
  if isinstance(seeds, str):  # the field run.seeds (the CLI's --seeds), a comma list
    fields["seeds"], seeds = seeds, None
  if fed_data is not None and "dataset" not in fields:
    fields["dataset"] = fed_data.name  # names the runs; PAFed's alphas: the image default
  cfg = (config or config_lib.RunConfig()).replace(**fields)
  config_lib.validate(cfg)
  seeds = _seed_list(cfg, seeds)
  written = seeds is not None and not grid and cfg.output.output_dir is not None
  if written and len(seeds) == 1:  # one seed: the run itself, in output_dir
    cfg, seeds, written = config_lib.with_seed(cfg, seeds[0]), None, False
  if cfg.crypto.secure_aggregation == "ckks" and distributed.joined() and jax.process_count() > 1:
    raise ValueError("crypto.secure_aggregation=ckks: the encrypted server (OpenFHE, on the "
                     "host) runs in one process; run it without --coordinator_address / "
                     "--distributed")
  devices = sharding.select_devices(cfg.run.devices)
  print_unread_note(cfg, given)
  prepare(cfg, seeds if written else ())
  if fed_data is None:
    console.say(f"loading {cfg.data.dataset} (data seed {config_lib.data_seed_of(cfg)}) ...")
    fed_data = experiment.load_data(cfg)
  shape = input_shape or tuple(fed_data.x.shape[2:])
  model_fn = (functools.partial(experiment.build_model, fed_data=fed_data) if module is None
              else lambda c: _user_model(module, shape, c.run.seed, fed_data.num_classes,
                                         fed_data.feature_shape))
  model = model_fn(cfg)
  title = outputs.figure_title(cfg, fed_data.name, model[0], cfg.algorithm.name_list(),
                               swept=grid)
  delays = _delay_note(cfg, grid)  # said on the console and under table()
  if (seeds is not None or grid) and not written:
    if delays:
      console.say(delays)
    result = _sweep(cfg, seeds, grid, fed_data, None if module is None else model_fn,
                    callbacks)
    result.title = "; ".join(filter(None, [title, outputs.seeds_note(seeds or [])]))
    return _noted(result, delays)
  console.say(f"data: {fed_data.num_clients} clients, {int(fed_data.counts.sum())} train / "
              f"{len(fed_data.test_y)} test examples; model {model[0]} with {np.size(model[1])} "
              f"parameters; jax devices: {jax.devices()}{tokens.accuracy_note(fed_data)}")
  if delays:
    console.say(delays)
  if len(devices) > 1:
    console.say(f"each round's clients split over {len(devices)} devices (run.devices)")
  if written:
    return _noted(_run_seeds(cfg, seeds, fed_data, model_fn, callbacks, title), delays)
  return _noted(_run_each(cfg, fed_data, model, callbacks, title), delays)


# ``simulate``'s engines: a configuration's class names its own; the functions that run them.
_ENGINE_OF_CONFIG = ((fededs_config.FedEDSRunConfig, "fededs"),
                     (async_config.AsyncRunConfig, "virtual_clock"))
_ENGINES = {"rounds": _simulate_rounds, "virtual_clock": _simulate_virtual_clock,
            "fededs": _simulate_fededs}


def _run_each(cfg: config_lib.RunConfig, fed_data, model, callbacks, title: str = ""
              ) -> Result:
  """Each algorithm of ``cfg`` on the round engine in turn, on one timeline; the curves
  (titled ``title``) and the comparison under ``output_dir``."""
  names = cfg.algorithm.name_list()
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
    console.say(f"[{outputs.algorithm_label(s)}] final accuracy {s['final_accuracy']:.4f}, "
                f"last-10 mean {s['last10_mean_accuracy']:.4f}, average best "
                f"{s['average_best_accuracy']:.4f}"
                + (f", rounds to {s['target_accuracy']:g}: {s['rounds_to_target'] or 'not reached'}"
                   if "target_accuracy" in s else "") + f", {s['wall_time_s']:.1f}s{where}",
                console.RESULT)
  result = Result(cfg, runs, tabulate=_table, title=title)
  if cfg.output.output_dir is not None:
    result.figure = os.path.join(cfg.output.output_dir, "curves.png")
    outputs.plot_curves({n: r.rows for n, r in runs.items()}, result.figure, title=title)
    outputs.write_comparison(result.summaries(), cfg.output.output_dir)
  return result
