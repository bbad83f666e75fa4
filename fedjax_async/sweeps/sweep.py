"""Several runs of one configuration as ONE vmapped computation.

Runs that share everything static (algorithm, model, data, local epochs, batch size, ring
size, rounds) but differ in their seed and/or scalar hyperparameters (lr, rho, alphas, mu,
momentum, server lr) or delay fraction are stacked along a leading *run* axis:

* states: ``engine.init_state`` per run (its own initial model from its seed), stacked;
* timelines: ``timeline.build`` per run (its own seed and delay fraction), each padded to
  the largest K of all runs with ``valid=False`` slots (``pad_slots``), stacked;
* hyperparameters: a dict of ``[S]`` arrays.

``make_sweep_runner`` is ``jit(vmap(engine.run_chunk, in_axes=(0, 0, None, 0, None)))``
over (state, slots, eval mask, hp, data): the data set and the evaluation schedule are
shared. With several devices the run axis is sharded over a 1-D mesh ``('runs',)``
(``NamedSharding(mesh, P('runs'))``); the number of runs is padded to a multiple of the
device count with copies of the first run, whose results are dropped.

The data and partition come from the base's data seed (``data.data_seed``, default the
base ``run.seed``; shared by all runs of one computation); a sweep's seeds vary the model
initialisation, the round timeline (who is sampled and delayed) and the clients' shuffles.

Each computation's runs are written (``runs/<algorithm>/<setting>_seed=<s>/``) as soon as it
finishes; with ``resume`` (``output.resume``) the runs found there with the same configuration
are read back instead of run again (``read_stored_run``). While it runs, a computation is
checkpointed every ``output.checkpoint_every`` rounds (``ComputationCheckpoint``: the stacked
state and every run's rows, under ``checkpoints/<algorithm>/<key>/``, removed once its runs
are written); with ``resume`` an interrupted computation continues from its latest
checkpoint, to the rows and states of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_async import algorithms
from fedjax_async import compilation
from fedjax_async import config as config_lib
from fedjax_async import console
from fedjax_async import distributed
from fedjax_async import loop
from fedjax_async import outputs
from fedjax_async.algorithms import base as base_lib
from fedjax_async.algorithms import server_optimizers
from fedjax_async.core import building
from fedjax_async.core import divergence
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.rounds import engine
from fedjax_async.rounds import experiment
from fedjax_async.sweeps import store as sweep_store

# Swept names that set several fields at once: ``alpha`` is PAFed's three Eq. 17 weights.
TIED = {"alpha": ("alpha0", "alpha1", "alpha2")}
# Common fields that only enter the traced hp dict or the timeline.
COMMON = ("lr", "momentum", "server_lr", "delay_fraction")


def sweepable() -> tuple:
  """The --sweep_<name> names: ``COMMON``, ``TIED``, and every float hyper-parameter the
  round engine's algorithms declare (``base.HParam``; those registered so far too)."""
  own = [n for n, pairs in algorithms.declared("rounds").items()
         if pairs[0][1].kind == "float"]
  return tuple(dict.fromkeys(COMMON[:2] + tuple(own) + tuple(TIED) + COMMON[2:]))


class SetupError(ValueError):
  """A sweep cannot start (data, model, stored runs): the message names the flag or file."""


# ---------------------------------------------------------------------------- grid


def parse_values(flag: str, text: str) -> List[float]:
  """``"0.05,0.1"`` -> [0.05, 0.1]; ValueError naming ``--<flag>``."""
  if not text:
    return []
  try:
    values = [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"--{flag}: expected comma-separated numbers, got {text!r}") from None
  if not values:
    raise ValueError(f"--{flag}: expected comma-separated numbers, got {text!r}")
  return values


def with_value(cfg: config_lib.RunConfig, name: str, value: float) -> config_lib.RunConfig:
  """``cfg`` with one sweepable field set, by its flat key (``lr``, ``delay_fraction``),
  the fields a ``TIED`` name stands for, or (a name that is no field) an algorithm's own
  hyper-parameter in ``algorithm.hp``."""
  if name not in TIED and name not in cfg.keys():
    return cfg.replace(hp=dict(config_lib.parse_hp(cfg.algorithm.hp), **{name: value}))
  return cfg.replace(**{n: value for n in TIED.get(name, (name,))})


def check_values(base: config_lib.RunConfig, name: str, values: Sequence[float],
                 flag: str) -> None:
  """Each of ``values`` is a valid ``name`` on top of ``base``; otherwise a ValueError
  naming ``--flag``, the value and what the field requires (``--sweep_delay_fraction=2``
  and pafed_table's ``--deltas=2`` are refused before any run, under their own names)."""
  repeated = sorted({v for v in values if list(values).count(v) > 1})
  if repeated:  # the same run twice: one folder, counted as two seeds in the means
    raise ValueError(f"--{flag}: lists {', '.join(f'{v:g}' for v in repeated)} more than "
                     "once")
  for v in values:
    try:
      config_lib.validate(with_value(base, name, v))  # with_value checks the delay too
    except ValueError as e:
      raise ValueError(f"--{flag}: {v:g} is not a valid {name} ({e})") from None


def grid(base: config_lib.RunConfig, sweeps: Dict[str, Sequence[float]],
         num_seeds: int = 1, seeds: Optional[Sequence[int]] = None
         ) -> List[config_lib.RunConfig]:
  """The cartesian product of the swept values and ``seeds`` (default ``base.run.seed +
  0..num_seeds-1``; seeds vary fastest), the data of every run from ``base``'s data seed.
  Each config is validated (errors name the flag)."""
  for name in sweeps:
    if name not in sweepable():
      raise ValueError(f"--sweep_{name}: not sweepable; choices: {', '.join(sweepable())}")
    check_values(base, name, sweeps[name], f"sweep_{name}")
  if num_seeds < 1:
    raise ValueError(f"--num_seeds: must be >= 1, got {num_seeds}")
  names = list(sweeps)
  out = []
  for values in itertools.product(*(sweeps[n] for n in names)):
    for s in (range(base.run.seed, base.run.seed + num_seeds) if seeds is None else seeds):
      cfg = config_lib.with_seed(base, s)
      for n, v in zip(names, values):
        cfg = with_value(cfg, n, v)
      try:
        config_lib.validate(cfg)
        timeline_lib.DelayConfig(**dataclasses.asdict(cfg.delay))
      except ValueError as e:
        raise ValueError(f"{e} (swept value)") from None
      out.append(cfg)
  return out


def setting_of(cfg: config_lib.RunConfig, names: Sequence[str]) -> Dict[str, float]:
  """The swept values of ``cfg`` (its hyperparameter setting, without the seed)."""
  own = config_lib.parse_hp(cfg.algorithm.hp)
  return {n: own[n] if n not in TIED and n not in cfg.keys() else cfg.get(TIED.get(n, (n,))[0])
          for n in names}


def run_name(cfg: config_lib.RunConfig, names: Sequence[str]) -> str:
  parts = [f"{n}={v:g}" for n, v in setting_of(cfg, names).items()]
  return "_".join(parts + [f"seed={cfg.run.seed}"])


# Swept names the engine reads for every algorithm: the clients' optimiser (core.client)
# and the round timeline. Any other swept name reaches an algorithm only through its
# ``hp`` (``hparams_read``).
ENGINE_FIELDS = ("lr", "momentum", "delay_fraction")


def hparams_read(algorithm, hp: Dict[str, float]) -> Optional[set]:
  """The keys of ``hp`` that ``algorithm``'s functions (client penalty and upload, server
  rule) compute with: those its traced program (``jax.make_jaxpr`` on a 3-parameter model,
  two arrivals) takes as an input of some operation. None when it cannot be traced so."""
  d, k = 3, 2
  w = jnp.zeros(d, jnp.float32)
  keys = sorted(hp)

  def program(values):
    h = dict(zip(keys, values))
    ss = algorithm.init_server_state(w)
    cs = {**algorithm.init_client_state(w), **base_lib.server_reads(algorithm, ss)}
    out = [algorithm.local_penalty(w, w, cs, h),
           algorithm.client_final(w, w, cs, jnp.float32(1.0), h)]
    if algorithm.server_update is not None:
      one = jnp.ones(k, bool)
      out.append(algorithm.server_update(
          w, ss, jnp.zeros((k, d)), base_lib.Arrivals(one, one, ~one, jnp.zeros(k, jnp.int32),
                                                      jnp.ones(k), jnp.ones(k),
                                                      jnp.zeros((k, d)), jnp.zeros((k, d)),
                                                      jnp.full(k, 2.0 * k)), jnp.int32(0), h))
    if algorithm.server_step is not None:
      out.append(algorithm.server_step(w, ss, w, base_lib.Arrival(
          jnp.bool_(True), jnp.int32(0), jnp.bool_(True), w, jnp.ones(d), jnp.float32(1.0),
          jnp.float32(1.0)), h))
    return out

  try:
    jaxpr = jax.make_jaxpr(program)([jnp.float32(hp[n]) for n in keys]).jaxpr
  except Exception:  # pylint: disable=broad-except
    return None  # (an algorithm of the user's needing other inputs: every name is used)
  read = {id(v) for e in jaxpr.eqns for v in e.invars} | {id(v) for v in jaxpr.outvars}
  return {n for n, v in zip(keys, jaxpr.invars) if id(v) in read}


def unread(algorithm, hp: Dict[str, float], names: Sequence[str]) -> List[str]:
  """The ``names`` among ``hp``'s keys that ``algorithm`` neither declares nor computes
  with (``hparams_read``), ``ENGINE_FIELDS`` aside; none when it cannot be traced."""
  own = {h.name for h in algorithm.hparams}
  maybe = [n for n in names if n in hp and n not in own and n not in ENGINE_FIELDS]
  read = hparams_read(algorithm, hp) if maybe else set()
  return [] if read is None else [n for n in maybe if n not in read]


def traced(cfg: config_lib.RunConfig, algorithm_name: str):
  """(the algorithm as the round engine runs it, with its server optimiser; its traced
  hyper-parameters ``cfg.hparams``)."""
  algorithm = server_optimizers.configured(
      algorithms.get(algorithm_name, cfg.algorithm.admm_upload), cfg.algorithm)
  return algorithm, cfg.hparams(algorithm)


def used_names(cfg: config_lib.RunConfig, algorithm_name: str,
               names: Sequence[str]) -> List[str]:
  """The swept ``names`` that change ``algorithm_name``'s runs: its own hyper-parameters
  (``Algorithm.hparams``), the ``ENGINE_FIELDS``, the traced hyper-parameters its functions
  read (``hparams_read``; a ``TIED`` name when one of its fields is read) and any other
  field. Another algorithm's own hyper-parameter, or ``mu`` for FedAvg, is not swept for
  it."""
  algorithm, hp = traced(cfg, algorithm_name)
  own, read = {h.name for h in algorithm.hparams}, None
  out = []
  for n in names:
    fields = TIED.get(n, (n,))
    if n in own or n in ENGINE_FIELDS:
      out.append(n)
    elif not all(f in hp for f in fields):  # another algorithm's own, or a field
      if n in cfg.keys():
        out.append(n)
    else:
      read = hparams_read(algorithm, hp) if read is None else read
      if read is None or any(f in read for f in fields):
        out.append(n)
  return out


# ---------------------------------------------------------------------------- stacking


def pad_slots(slots: dict, k: int, num_clients: int, start: int = 0) -> dict:
  """Timeline slots ``[T, K0]`` padded to ``[T, k]`` with ``valid=False`` slots (client id
  ``num_clients``, dispatched in their own round, as ``timeline.build`` pads)."""
  t, k0 = slots["client"].shape
  if k0 > k:
    raise ValueError(f"cannot pad {k0} slots down to {k}")
  extra = k - k0
  rounds = np.arange(start, start + t, dtype=np.int32)[:, None]
  return {
      "client": np.concatenate([slots["client"],
                                np.full((t, extra), num_clients, np.int32)], 1),
      "dispatch": np.concatenate([slots["dispatch"],
                                  np.broadcast_to(rounds, (t, extra)).astype(np.int32)], 1),
      "online": np.concatenate([slots["online"], np.zeros((t, extra), bool)], 1),
      "valid": np.concatenate([slots["valid"], np.zeros((t, extra), bool)], 1),
      "dropped": np.asarray(slots["dropped"]),
      "lost": np.concatenate([slots.get("lost", np.zeros_like(slots["valid"])),
                              np.zeros((t, extra), bool)], 1),
  }


def stack_timelines(timelines: Sequence[timeline_lib.Timeline], num_clients: int) -> dict:
  """Every run's full slots padded to the largest K and stacked: ``[S, T, K]``."""
  k = max(tl.client.shape[1] for tl in timelines)
  padded = [pad_slots(tl.slice(0, tl.num_rounds), k, num_clients) for tl in timelines]
  return {key: np.stack([p[key] for p in padded]) for key in padded[0]}


def stack_trees(trees: Sequence):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def stack_hparams(cfgs: Sequence[config_lib.RunConfig], algorithm=None,
                  num_clients: Optional[int] = None) -> Dict[str, jax.Array]:
  hps = [c.hparams(algorithm, num_clients) for c in cfgs]
  return {k: jnp.asarray([h[k] for h in hps], jnp.float32) for k in hps[0]}


def unstack(tree, i: int):
  return jax.tree.map(lambda x: x[i], tree)


# ---------------------------------------------------------------------------- devices


def run_mesh(devices=None) -> Optional[Mesh]:
  """A 1-D mesh ``('runs',)`` over all devices, or None with a single device."""
  devices = jax.devices() if devices is None else devices
  if len(devices) < 2:
    return None
  return Mesh(np.asarray(devices), ("runs",))


def padded_count(num_runs: int, mesh: Optional[Mesh]) -> int:
  """Runs rounded up to a multiple of the mesh size (padding runs copy run 0)."""
  if mesh is None:
    return num_runs
  n = mesh.devices.size
  return -(-num_runs // n) * n


def pad_runs(tree, total: int):
  """Pads the leading run axis to ``total`` with copies of run 0."""

  def pad(x):
    x = jnp.asarray(x)
    extra = total - x.shape[0]
    if extra <= 0:
      return x
    return jnp.concatenate([x, jnp.broadcast_to(x[:1], (extra,) + x.shape[1:])])

  return jax.tree.map(pad, tree)


def shard_runs(tree, mesh: Optional[Mesh]):
  """device_put with the run axis split over the mesh (a no-op without a mesh)."""
  if mesh is None:
    return tree
  sharding = NamedSharding(mesh, P("runs"))
  return jax.device_put(tree, sharding)


def replicate(tree, mesh: Optional[Mesh]):
  if mesh is None:
    return tree
  return jax.device_put(tree, NamedSharding(mesh, P()))


# ---------------------------------------------------------------------------- running


def make_sweep_runner(apply_flat: Callable, algorithm, cfg: engine.EngineConfig):
  """``jit(vmap(run_chunk))`` over (state, slots, eval mask, hp, data) with in_axes
  (0, 0, None, 0, None); the stacked state is donated."""
  compilation.enable()
  fn = functools.partial(engine.run_chunk, apply_flat=apply_flat, algorithm=algorithm,
                         cfg=cfg)
  return jax.jit(jax.vmap(fn, in_axes=(0, 0, None, 0, None)), donate_argnums=(0,))


@dataclasses.dataclass
class SweepResult:
  states: engine.SimState  # stacked [S, ...] (host arrays), padding runs dropped
  rows: List[List[dict]]  # per run: one dict per round
  diverged_round: List[Optional[int]]  # per run: first non-finite round, or None
  wall_time_s: float


def _first_bad_round(rows: List[dict]) -> Optional[int]:
  for r in rows:
    loss = r["test_loss"]
    if r["nonfinite"] or (loss is not None and not np.isfinite(loss)):
      return r["round"]
  return None


def diverged_fields(rows: List[dict], bad: Optional[int], name: Optional[str]) -> dict:
  """A summary's ``diverged_round`` (the first non-finite round, or None) and, for a run
  that diverged, ``diverged_cause``: what the clients' health says went wrong first
  (``divergence.cause``: the first non-finite or far-out client, its round), said on the
  console under the run's ``name`` (None: not said)."""
  found = None if bad is None else divergence.cause([r for r in rows if r["round"] <= bad])
  if found and name is not None:
    console.say(outputs.name_fields(f"[{name}] diverged in round {bad}: {found[0]}"),
                console.RESULT)
  return {"diverged_round": bad, **({"diverged_cause": found[0]} if found else {})}


def simulate_sweep(runner, states, slots: dict, hp: Dict[str, jax.Array],
                   data: engine.DeviceData, *, num_rounds: int, eval_every: int = 1,
                   rounds_per_call: int = 10, mesh: Optional[Mesh] = None,
                   on_chunk: Optional[Callable] = None, start_round: int = 0,
                   rows_before: Optional[List[List[dict]]] = None,
                   wall_before: float = 0.0) -> SweepResult:
  """Runs S stacked runs for ``num_rounds`` rounds in chunks of at most ``rounds_per_call``
  (fewer where a chunk would run past ``loop.CHUNK_SECONDS``: ``loop.ChunkLengths``).

  ``slots``: numpy ``[S, T, K]`` (``stack_timelines``). A run that turns non-finite is not
  stopped (the others continue; vmap keeps them independent): its ``diverged_round`` is
  set and its later accuracies are reported as None.
  ``on_chunk(rounds_done, seconds, states, rows)`` after each chunk: ``states`` the
  stacked state before round ``rounds_done`` (padding runs included), ``rows`` each run's
  rows so far. ``start_round`` / ``rows_before`` / ``wall_before``: continue a computation
  from a checkpoint of round ``start_round`` (``states`` restored from it).

  Args:
    runner: the jitted, vmapped chunk of rounds.
    states: the S runs' stacked states.
    slots: numpy ``[S, T, K]`` timeline fields.
    hp: the S runs' stacked hyper-parameters.
    data: the device data (shared by the runs).
    num_rounds: the rounds of every run.
    eval_every: evaluate every this many rounds (and in the last 10).
    rounds_per_call: the most rounds of a chunk.
    mesh: the ``('runs',)`` mesh to split the runs over (None: one device).
    on_chunk: called as ``on_chunk(rounds_done, seconds, states, rows)`` after each chunk.
    start_round: the round to continue from.
    rows_before: each run's rows before ``start_round``.
    wall_before: the seconds spent before ``start_round``.
  """
  num_runs = jax.tree.leaves(states)[0].shape[0]
  total = padded_count(num_runs, mesh)
  states = shard_runs(pad_runs(states, total), mesh)
  hp = shard_runs(pad_runs({k: jnp.asarray(v, jnp.float32) for k, v in hp.items()}, total),
                  mesh)
  data = jax.block_until_ready(replicate(data, mesh))  # see sharding.shard_clients
  schedule = engine.eval_schedule(num_rounds, eval_every)
  per_run: List[List[dict]] = ([list(r) for r in rows_before] if rows_before is not None
                               else [[] for _ in range(num_runs)])
  t0 = time.perf_counter() - wall_before
  lengths = loop.ChunkLengths(rounds_per_call, loop.CHUNK_SECONDS)
  start = start_round
  while start < num_rounds:
    end = start + lengths.next(num_rounds - start, start)
    chunk = {k: v[:, start:end] for k, v in slots.items()}
    chunk = shard_runs(pad_runs(chunk, total), mesh)
    c0 = time.perf_counter()
    # in a helper thread: a signal's handler runs meanwhile
    (states, metrics), running, compiled = loop.call(
        runner, states, chunk, jnp.asarray(schedule[start:end]), hp, data)
    lengths.ran(end - start, running, compiled)
    host = distributed.to_host(metrics)  # gathered from every process's runs
    elapsed = time.perf_counter() - c0
    for i in range(num_runs):
      rows = engine.metrics_to_rows(unstack(host, i))
      for r in rows:
        r["wall_time"] = elapsed / (len(rows) * num_runs)
      per_run[i].extend(rows)
    if on_chunk is not None:
      on_chunk(end, time.perf_counter() - t0, states, per_run)
    start = end
  wall = time.perf_counter() - t0
  diverged = [_first_bad_round(rows) for rows in per_run]
  for rows, bad in zip(per_run, diverged):
    if bad is not None:
      for r in rows:
        if r["round"] >= bad:
          r["test_accuracy"] = None
  host_states = distributed.to_host(jax.tree.map(lambda x: x[:num_runs], states))
  return SweepResult(host_states, per_run, diverged, wall)


@dataclasses.dataclass
class Prepared:
  """Everything a sweep computation needs (built on the host)."""

  runner: Callable
  states: engine.SimState
  slots: dict
  hp: Dict[str, jax.Array]
  data: engine.DeviceData
  timelines: List[timeline_lib.Timeline]
  model_name: str
  num_params: int
  algorithm: base_lib.Algorithm  # as the round engine runs it (its server optimiser)


def check_same_static(cfgs: Sequence[config_lib.RunConfig], names: Sequence[str]):
  """All runs of one computation must agree outside the swept fields and the seed (an
  algorithm's own hyper-parameters in ``algorithm.hp`` are swept by their names)."""
  def static(c):
    d = config_lib.config_dict(c)
    d["hp"] = {k: v for k, v in config_lib.parse_hp(d["hp"]).items() if k not in names}
    for n in list(names) + ["seed", "output_dir"]:
      for key in TIED.get(n, (n,)):
        d.pop(key, None)
    d["delay"] = {k: v for k, v in d["delay"].items() if k != "fraction"}
    return d
  first = static(cfgs[0])
  for c in cfgs[1:]:
    if static(c) != first:
      raise ValueError("runs of one sweep differ in a non-swept (static) setting")


def prepare(cfgs: Sequence[config_lib.RunConfig], algorithm_name: str,
            fed_data, model_fn: Optional[Callable] = None) -> Prepared:
  """Per-run initial states (model init from each run's seed) and timelines, stacked.
  ``model_fn(cfg) -> (name, w0, apply_flat)`` builds each run's model (default:
  ``experiment.build_model`` of the configuration's model name)."""
  base = cfgs[0]
  algorithm = server_optimizers.configured(
      algorithms.get(algorithm_name, base.algorithm.admm_upload), base.algorithm)
  ecfg = engine.EngineConfig(
      building.local_config(base, fed_data,
                            momentum=any(c.local.momentum > 0 for c in cfgs)),
      base.delay.ring_size)
  states, timelines, apply_flat, model_name, num_params = [], [], None, None, 0
  for c in cfgs:
    model_name, w0, fn = (model_fn(c) if model_fn is not None else
                          experiment.build_model(c, fed_data))
    apply_flat = apply_flat or fn
    num_params = int(np.size(w0))
    states.append(engine.init_state(algorithm, w0, fed_data.num_clients, ecfg.ring_size,
                                    c.run.seed))
    timelines.append(timeline_lib.build(fed_data.num_clients, c.run.rounds, c.run.participation,
                                        c.delay, c.run.seed))
  return Prepared(make_sweep_runner(apply_flat, algorithm, ecfg), stack_trees(states),
                  stack_timelines(timelines, fed_data.num_clients), stack_hparams(cfgs, algorithm, fed_data.num_clients),
                  engine.DeviceData.from_federated(fed_data), timelines, model_name,
                  num_params, algorithm)


def run_in_memory(cfgs: Sequence[config_lib.RunConfig], algorithm_name: str, fed_data,
                  names: Sequence[str], model_fn: Optional[Callable] = None,
                  callbacks: Sequence = (), quiet: bool = False):
  """``cfgs`` of one algorithm as ONE vmapped computation, nothing written: per run
  ``(summary, rows, state)`` in ``cfgs``' order (``state``: that run's final state).

  Args:
    cfgs: the runs' configurations (one static setting).
    algorithm_name: the algorithm's name.
    fed_data: the federated data.
    names: the swept fields.
    model_fn: ``model_fn(cfg) -> (name, w0, apply_flat)`` (None: the configured model).
    callbacks: ``loop.Callback``s after every compiled chunk.
    quiet: no progress lines.
  """
  check_same_static(cfgs, names)
  prep = prepare(cfgs, algorithm_name, fed_data, model_fn)
  host = sweep_store.SweepLoop(None, 0, 0.0, callbacks,
                               None if quiet else f"{algorithm_name} x{len(cfgs)}",
                               cfgs[0].run.rounds)
  res = simulate_sweep(prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                       num_rounds=cfgs[0].run.rounds, eval_every=cfgs[0].run.eval_every,
                       rounds_per_call=cfgs[0].run.rounds_per_call, on_chunk=host)
  out = []
  for i, c in enumerate(cfgs):
    s = experiment.summarize(res.rows[i], prep.timelines[i], name=algorithm_name,
                             dataset=fed_data.name, model=prep.model_name,
                             num_params=prep.num_params, rounds=c.run.rounds,
                             wall=res.wall_time_s / len(cfgs),
                             config=config_lib.run_config_for(c, algorithm_name),
                             target=c.run.target_accuracy)
    s["seed"], s["setting"] = c.run.seed, setting_of(c, names)
    s.update(diverged_fields(res.rows[i], res.diverged_round[i],
                             None if quiet else f"{algorithm_name}/{run_name(c, names)}"))
    s.update(experiment.privacy_fields(prep.algorithm, c.hparams(prep.algorithm,
                                       fed_data.num_clients), fed_data.num_clients,
                                       res.rows[i]))
    out.append((s, res.rows[i], unstack(res.states, i)))
  return out


# ---------------------------------------------------------------------------- outputs


def run_sweep(cfgs: Sequence[config_lib.RunConfig], algorithm_name: str, fed_data,
              names: Sequence[str], out_dir: Optional[str] = None,
              max_runs_per_computation: int = 0, mesh: Optional[Mesh] = None,
              quiet: bool = False, resume: bool = False,
              extra_config: Optional[dict] = None, callbacks: Sequence = ()) -> List[dict]:
  """Runs ``cfgs`` of one algorithm as vmapped computations (at most
  ``max_runs_per_computation`` runs each; 0 = all in one) and writes per-run outputs under
  ``<out_dir>/runs/<algorithm>/<setting>_seed=<s>/`` as each computation finishes.

  ``resume``: runs already stored there with the same configuration are read back, not
  run; stored runs made with other flags are run again (and say which flags differ).
  ``extra_config``: settings outside RunConfig that change the results (stored in and
  compared with each summary's config). ``callbacks``: ``loop.Callback``s after every
  compiled chunk (``state``: the stacked states, ``rows``: each run's rows so far).
  Returns the run summaries in ``cfgs``' order.

  Args:
    cfgs: the runs' configurations (one static setting).
    algorithm_name: the algorithm's name.
    fed_data: the federated data.
    names: the swept fields.
    out_dir: where the runs' files go (None: nowhere).
    max_runs_per_computation: the most runs of one computation (0: all).
    mesh: the ``('runs',)`` mesh to split the runs over (None: one device).
    quiet: no progress lines.
    resume: read back the runs already stored, and continue from checkpoints.
    extra_config: settings outside RunConfig that change the results.
    callbacks: ``loop.Callback``s after every compiled chunk.
  """
  check_same_static(cfgs, names)
  run_dir = lambda c: os.path.join(out_dir, "runs", algorithm_name, run_name(c, names))
  found = (sweep_store.read_back(cfgs, algorithm_name, run_dir, out_dir, extra_config, quiet)
           if resume and out_dir is not None else {})
  todo = [c for i, c in enumerate(cfgs) if i not in found]
  size = max_runs_per_computation or len(todo) or 1
  done: List[dict] = []
  for g in range(0, len(todo), size):
    group = list(todo[g:g + size])
    prep = prepare(group, algorithm_name, fed_data)
    ckpt = sweep_store.ComputationCheckpoint(out_dir, algorithm_name, group,
                                             [run_name(c, names) for c in group], extra_config,
                                 resume, quiet) if out_dir is not None else None
    start, rows_before, wall_before, states = 0, None, 0.0, prep.states
    resumed = ckpt.restore(prep.states) if ckpt is not None else None
    if resumed is not None:
      start, rows_before, wall_before, states = (resumed.position, resumed.rows,
                                                 resumed.wall_before, resumed.state)
      if not quiet:
        console.say(f"[{algorithm_name} x{len(group)}] resuming from the checkpoint of round "
                    f"{start} ({ckpt.directory})")
    host = sweep_store.SweepLoop(ckpt, start, wall_before, callbacks,
                     None if quiet else f"{algorithm_name} x{len(group)}", group[0].run.rounds)
    try:
      res = simulate_sweep(prep.runner, states, prep.slots, prep.hp, prep.data,
                           num_rounds=group[0].run.rounds, eval_every=group[0].run.eval_every,
                           rounds_per_call=group[0].run.rounds_per_call, mesh=mesh,
                           on_chunk=host, start_round=start, rows_before=rows_before,
                           wall_before=wall_before)
    finally:
      if ckpt is not None:
        ckpt.close()
    for i, c in enumerate(group):
      s = experiment.summarize(res.rows[i], prep.timelines[i], name=algorithm_name,
                               dataset=fed_data.name, model=prep.model_name,
                               num_params=prep.num_params, rounds=c.run.rounds,
                               wall=res.wall_time_s / len(group),
                               config=sweep_store.stored_config(c, algorithm_name,
                                                                extra_config),
                               target=c.run.target_accuracy)
      s["seed"], s["setting"] = c.run.seed, setting_of(c, names)
      s.update(diverged_fields(res.rows[i], res.diverged_round[i],
                               f"{algorithm_name}/{run_name(c, names)}"))
      s.update(experiment.privacy_fields(prep.algorithm, c.hparams(prep.algorithm,
                                         fed_data.num_clients), fed_data.num_clients,
                                         res.rows[i]))
      s["runs_in_computation"] = len(group)
      s["computation_wall_time_s"] = res.wall_time_s
      if out_dir is not None and distributed.is_main():
        sweep_store.write_run(run_dir(c), res.rows[i], s)
      done.append(s)
    if ckpt is not None:
      ckpt.remove()  # its runs are stored: the checkpoint has served
  left = (os.path.join(out_dir, "checkpoints", algorithm_name) if out_dir is not None
          else None)
  if left is not None and os.path.isdir(left) and os.listdir(left) and not quiet:
    # each finished computation removed its own: these were made for other groupings of
    # runs (another grid, or --max_runs_per_computation) and were not used
    console.say(f"[{algorithm_name}] {len(os.listdir(left))} checkpoint(s) of computations "
                f"this command does not run are left under {left}; delete them to free the "
                "space")
  fresh = iter(done)
  return [found[i] if i in found else next(fresh) for i in range(len(cfgs))]


# What a sweep writes in output.output_dir: refused there without output.resume (read the finished
# runs back) or output.overwrite (delete these first), as experiments/run.py does.
SWEEP_OUTPUTS = ("runs", "checkpoints", "sweep.json", "aggregate.csv", "aggregate.md",
                 "aggregate.png")


def load_checked(cfg: config_lib.RunConfig):
  """``(fed_data, model)`` of ``cfg`` (``experiment.load_data`` / ``build_model``); the
  model's error a SetupError naming the flag. (The data's errors name their flag or file
  already; the CLI tells them from a bug's, ``cli.errors``.)"""
  fed_data = experiment.load_data(cfg)
  try:
    model = experiment.build_model(cfg, fed_data)
  except (ValueError, KeyError, TypeError) as e:
    msg = str(e).strip("'\"")
    named = msg.startswith("model.name")  # build_model names the field already
    raise SetupError(msg if named else f"model.name={cfg.model.name}: {msg}") from None
  return fed_data, model


def interrupted_message(out_dir: str, checkpoint_every: int, how: str) -> str:
  """What an interrupted sweep kept and how to continue (``how``: the flag to rerun with,
  or '' where the driver always reads its runs back)."""
  kept = f"the runs of every finished computation are stored under {os.path.join(out_dir, 'runs')}"
  if checkpoint_every > 0:
    kept += (f" and the others checkpointed every --checkpoint_every={checkpoint_every} "
             f"rounds under {os.path.join(out_dir, 'checkpoints')}")
  rerun = "rerun the same command" + (f" with {how}" if how else "")
  return f"{kept}: {rerun} to continue (finished runs are read back)"


def run_grid(base: config_lib.RunConfig, cfgs: Sequence[config_lib.RunConfig],
             names: Sequence[str], fed_data, devices, num_seeds: int,
             max_runs_per_computation: int = 0) -> Optional[str]:
  """Every algorithm of ``base.algorithm.names`` over ``cfgs`` (``grid``), the runs split over
  ``devices``; writes ``sweep.json`` and the aggregate (csv, md, png) under
  ``base.output.output_dir`` and returns the aggregate table (process 0; None elsewhere).

  Args:
    base: the sweep's base configuration.
    cfgs: the grid's configurations (``grid``).
    names: the swept fields.
    fed_data: the federated data.
    devices: the devices the runs are split over.
    num_seeds: the seeds per setting.
    max_runs_per_computation: the most runs of one computation (0: all).
  """
  mesh = run_mesh(devices)
  console.say(f"sweep: {len(cfgs)} runs per algorithm ({', '.join(names) or 'seeds only'} x "
              f"{num_seeds} seeds) on {len(devices)} device(s)")
  os.makedirs(base.output.output_dir, exist_ok=True)
  summaries = []
  for alg in base.algorithm.name_list():
    used = used_names(base, alg, names)
    unused = [n for n in names if n not in used]
    # a name the algorithm does not use is not swept for it: its first value's runs only
    first = setting_of(cfgs[0], unused)
    mine = [c for c in cfgs if setting_of(c, unused) == first]
    if unused:
      console.say(f"[{alg}] does not use {', '.join(unused)}: not swept for it ({len(mine)} of "
                  f"{len(cfgs)} runs)", console.WARNING)
    summaries += run_sweep(mine, alg, fed_data, used, base.output.output_dir,
                           max_runs_per_computation, mesh, resume=base.output.resume)
  agg = sweep_store.aggregate(summaries, names)
  if not distributed.is_main():  # process 0 writes the sweep's files
    return None
  with open(os.path.join(base.output.output_dir, "sweep.json"), "w") as f:
    json.dump({"names": names, "runs": summaries, "aggregate": agg}, f, indent=2)
  figure = os.path.join(base.output.output_dir, "aggregate.png")
  model = summaries[0]["model"] if summaries else base.model.name  # as built ("auto" resolved)
  swept = {n: sorted({r[n] for r in agg if r[n] is not None}) for n in names}
  sweep_store.plot_aggregate(agg, names, figure, title=outputs.figure_title(
      base, fed_data.name, model, base.algorithm.name_list(), swept=swept))
  console.say(f"figure: {figure}", console.RESULT)
  return sweep_store.write_aggregate(agg, names, base.output.output_dir)
