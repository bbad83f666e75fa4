r"""The PAFed paper's Table V at its own configuration, finished across short device leases.

  python benchmarks/table_v.py --data_dir=.data/fashion-mnist    # whole runs, within 9 min
  python benchmarks/table_v.py --plan_only                       # what the next call would run
  python benchmarks/table_v.py --add_rows=FETCHED/rows.jsonl     # fold a lease's rows in
  python benchmarks/table_v.py --report_only                     # the markdown from the rows

The runs are those of ``experiments/pafed_table.py`` for each of ``--flagfiles`` (the
paper's configuration as printed, then the authors' code's: CNN, N = 100, E = 10, B = 50,
T = 100, 5 seeds, IID delta = 0 and non-IID delta in {0, .3, .5, .7}), each run whole
(no checkpoint has to travel between leases). Run flags given on this command line
(``--precision``, ``--data_dir``, ``--num_seeds``, or a toy ``--model=logreg --rounds=2``)
apply on top of every flag file.

Order: the first seed of non-IID delta in {0, .7} for every algorithm, then the first
seed's other rows, then each further seed; within each of those tiers the flag files in
turn. Runs of one flag file, partition and algorithm run as one vmapped computation
(``sweep.run_sweep``); the runs each call takes are the longest prefix of that order whose
computations fit the time left by a cost model, t = c + n r per computation of n runs, fitted
to the computations timed so far on this device (this call's, and the rows' of earlier
ones). Without one, the first computation is one run: the first timing. The model is
refitted after every computation.

Each finished run is one line of ``--new_rows`` (default: ``--rows``), written as its
computation ends: its flag file, partition, algorithm, delta, seed, precision, a digest of
its configuration, the three accuracy metrics and the test accuracy of each round, its
wall time, the device and the JAX version. A run whose row is in ``--rows`` or ``--new_rows`` (the same digest) is not run
again. ``table_v.md`` beside ``--new_rows`` (``--rows`` with ``--add_rows`` or
``--report_only``) is the table made from the rows: per flag file and precision, each accuracy metric's mean +- std over seeds, the
paper's values beside, the devices named.

Under ``benchmarks/run_all.py`` the suite's deadline (``FEDJAX_ASYNC_DEADLINE``, a Unix time)
bounds ``--time_budget_min`` too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

T_START = time.time()

from absl import app, flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from fedjax_async import cli  # noqa: E402
from fedjax_async import config as config_lib  # noqa: E402
from fedjax_async import loop as loop_lib  # noqa: E402
from fedjax_async.sweeps import store as sweep_store  # noqa: E402

FLAGS = flags.FLAGS
DEADLINE_ENV = "FEDJAX_ASYNC_DEADLINE"
FLAGFILES = ("experiments/flags/pafed_table_paper.flags",
             "experiments/flags/pafed_table_authors.flags")
ROWS = "experiments/results/pafed_table_paper/rows.jsonl"
FIRST_ROWS = (("shards", 0.0), ("shards", 0.7))  # the first tier: non-IID delta 0 and .7
SAFETY = 1.25  # the cost model's estimates are multiplied by this
# Fields that change no result: left out of a run's digest.
NOT_IN_DIGEST = set(config_lib.RESUME_FREE_FIELDS) | set(
    sweep_store.RESULT_FREE_FIELDS) | {"data_dir", "data_source"}
# Fields that set a run's cost: computations of equal signatures share the cost model.
COST_FIELDS = ("dataset", "model", "num_clients", "participation", "local_epochs",
               "batch_size", "rounds", "precision")


def _table():
  """``experiments/pafed_table.py`` as the module ``pafed_table``, loaded once: loading it
  defines the run flags and the table's (so the planning functions here import without
  defining any)."""
  if "pafed_table" not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        "pafed_table", os.path.join(ROOT, "experiments", "pafed_table.py"))
    sys.modules["pafed_table"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["pafed_table"])
  return sys.modules["pafed_table"]


def define_flags():
  """The run flags and the table's (``_table``), then this job's."""
  _table()
  flags.DEFINE_list("flagfiles", list(FLAGFILES), "Flag files of experiments/pafed_table.py, "
                    "in order; each run's row names its file.")
  flags.DEFINE_string("rows", ROWS, "The rows already made (JSONL, one per finished run; "
                      "relative paths from the checkout's root).")
  flags.DEFINE_string("new_rows", "", "Where this call appends its rows (default: --rows).")
  flags.DEFINE_float("time_budget_min", 9.0, "Minutes this call may take, start-up "
                     "included: it starts only computations that its cost model expects to "
                     "end within them.")
  flags.DEFINE_integer("max_runs", 0, "At most this many runs this call (0: no limit).")
  flags.DEFINE_integer("max_runs_per_shard", 20, "At most this many runs in one vmapped "
                       "computation (device memory: ~1.4 GB per PAFed CNN run).")
  flags.DEFINE_bool("plan_only", False, "Print the runs left in order and the next "
                    "computations; run none.")
  flags.DEFINE_bool("report_only", False, "Write table_v.md from the rows; run nothing.")
  flags.DEFINE_string("add_rows", "", "A rows file from another call (a lease's): its rows "
                      "not yet in --rows are appended there, then table_v.md is written.")
  flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")
  flags.register_validator("time_budget_min", lambda v: v > 0,
                           message="--time_budget_min: must be > 0")
  flags.register_validator("max_runs", lambda v: v >= 0,
                           message="--max_runs: must be >= 0 (0: no limit)")
  flags.register_validator("max_runs_per_shard", lambda v: v >= 1,
                           message="--max_runs_per_shard: must be >= 1")
  flags.register_validator("flagfiles", lambda v: bool(v) and all(
      os.path.isfile(_path(f)) for f in v), message="--flagfiles: expected existing flag "
                           "files (comma-separated)")
  flags.register_validator("add_rows", lambda v: not v or os.path.isfile(_path(v)),
                           message="--add_rows: not a file")


def _path(p: str) -> str:
  return p if os.path.isabs(p) else os.path.join(ROOT, p)


# ------------------------------------------------------------------------- the runs


def read_flagfile(path: str, seen=()) -> Dict[str, str]:
  """``--name=value`` lines of a flag file (nested ``--flagfile=`` lines read in place,
  comments and blank lines skipped), later lines winning: name -> the value's text
  (``"true"`` / ``"false"`` for ``--name`` / ``--noname``)."""
  path = _path(path)
  if path in seen:
    raise ValueError(f"--flagfiles: {path} includes itself")
  out: Dict[str, str] = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line or line.startswith("#"):
        continue
      if not line.startswith("--"):
        raise ValueError(f"--flagfiles: {path}: not a flag: {line!r}")
      name, eq, value = line[2:].partition("=")
      if name == "flagfile":
        out.update(read_flagfile(value, seen + (path,)))
      elif eq:
        out[name] = value
      elif name.startswith("no") and name[2:] in FLAGS and name not in FLAGS:
        out[name[2:]] = "false"
      else:
        out[name] = "true"
  return out


def _run_flags() -> List[str]:
  """The run flags (``hp``, the registered algorithms' own hyper-parameters, is no flag)."""
  return [n for n in config_lib.flag_specs(config_lib.RunConfig) if n != "hp"]


def _run_and_table_flags() -> List[str]:
  return _run_flags() + list(_table().TableConfig.keys())


def overrides() -> Dict[str, object]:
  """The run and table flags given on this command line (they apply to every flag file)."""
  return {n: FLAGS[n].value for n in _run_and_table_flags() if FLAGS[n].present}


def settings(flagfile: str, given: Dict[str, object]):
  """``(RunConfig, TableOptions, deltas per partition, partitions)`` of ``flagfile`` as
  ``experiments/pafed_table.py`` reads it (its ``--config`` preset under the file's own
  values), ``given`` on top; ValueError naming the flag."""
  text = read_flagfile(flagfile)
  names = _run_and_table_flags()
  for name in text:
    if name not in names:
      raise ValueError(f"--{name}: in {flagfile}: not a flag of experiments/pafed_table.py")
  values = {n: FLAGS[n].default for n in names}
  values.update(_table().PRESETS[given.get("config", text.get("config", "full"))])
  for name, raw in text.items():
    try:
      values[name] = FLAGS[name].parser.parse(raw)
    except (ValueError, flags.Error) as e:
      raise ValueError(f"--{name}={raw}: in {flagfile}: {e}") from None
  values.update(given)
  try:
    base = config_lib.RunConfig.from_flat({n: values[n] for n in _run_flags()})
    config_lib.validate(base)
  except ValueError as e:
    raise ValueError(f"{cli.as_flags(str(e))} (in {flagfile})") from None
  opts = _table().TableConfig.from_flat(
      {n: values[n] for n in _table().TableConfig.keys()}).table
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top
  deltas_of = {"iid": sweep.parse_values("iid_deltas", opts.iid_deltas),
               "shards": sweep.parse_values("deltas", opts.deltas),
               "dirichlet": sweep.parse_values("deltas", opts.deltas)}
  partitions = [p for p in opts.partitions.split(",") if p]
  for p in partitions:
    cli.check_flag(p in deltas_of, "partitions", f"unknown partition {p!r}")
  cli.check_flag(opts.num_seeds >= 1, "num_seeds", f"must be >= 1, got {opts.num_seeds}")
  return base, opts, deltas_of, partitions


def label(flagfile: str) -> str:
  return os.path.splitext(os.path.basename(flagfile))[0]


@dataclasses.dataclass
class Run:
  """One run of the table."""
  flagfile: str  # its label (file name without .flags)
  partition: str
  algorithm: str
  delta: float
  seed: int
  seed_index: int
  cfg: object  # RunConfig
  extra: dict  # pafed_table.extra_config
  digest: str
  cost: str  # cost signature

  @property
  def group(self) -> Tuple[str, str, str]:
    """Runs of one group can share a computation."""
    return (self.flagfile, self.partition, self.algorithm)

  def key(self) -> Tuple:
    return (self.flagfile, self.partition, self.algorithm, round(self.delta, 6), self.seed,
            self.cfg.local.precision, self.digest)

  def tier(self) -> int:
    if self.seed_index:
      return 1 + self.seed_index
    return 0 if (self.partition, round(self.delta, 2)) in FIRST_ROWS else 1


def _flat(stored: dict) -> dict:
  out = {k: v for k, v in stored.items() if k != "delay"}
  out.update({f"delay.{k}": v for k, v in (stored.get("delay") or {}).items()})
  return out


_DEFAULTS = _flat(config_lib.config_dict(config_lib.RunConfig()))


def digest(stored: dict) -> str:
  """A run's configuration (its ``summary.json`` config) as 12 hex digits: the fields that
  differ from ``RunConfig``'s defaults, those that change no result left out (so a field
  added later at its default leaves the digests of earlier rows as they were)."""
  kept = {k: v for k, v in _flat(stored).items()
          if k.split(".")[0] not in NOT_IN_DIGEST and (k not in _DEFAULTS
                                                        or _DEFAULTS[k] != v)}
  return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def all_runs(flagfiles: Sequence[str], given: Dict[str, object]) -> List[Run]:
  """Every run of the tables of ``flagfiles``, in the order they are run."""
  runs = []
  for fi, flagfile in enumerate(flagfiles):
    base, opts, deltas_of, partitions = settings(flagfile, given)
    extra = _table().extra_config(opts)
    for alg in base.algorithm.name_list():
      for part in partitions:
        for d in deltas_of[part]:
          for s in range(opts.num_seeds):
            seed = base.run.seed + s
            cfg = base.replace(partition=part, delay_fraction=d, seed=seed)
            stored = sweep_store.stored_config(cfg, alg, extra)
            cost = "|".join(f"{k}={cfg.get(k)}" for k in COST_FIELDS)
            runs.append(Run(label(flagfile), part, alg, d, seed, s, cfg, extra,
                            digest(stored), cost))
  index = {f: i for i, f in enumerate(label(f) for f in flagfiles)}
  return sorted(runs, key=lambda r: (r.tier(), index[r.flagfile]))  # stable: alg, part, delta


# ------------------------------------------------------------------------- rows


def read_rows(*paths: str) -> List[dict]:
  """The rows of the files that exist, the first row of each key kept."""
  rows, keys = [], set()
  for path in paths:
    if not path or not os.path.isfile(_path(path)):
      continue
    with open(_path(path)) as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          if row_key(row) not in keys:
            keys.add(row_key(row))
            rows.append(row)
  return rows


def row_key(row: dict) -> Tuple:
  return (row["flagfile"], row["partition"], row["algorithm"], round(row["delta"], 6),
          row["seed"], row["precision"], row["config_digest"])


def append_rows(path: str, rows: Sequence[dict]):
  path = _path(path)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "a") as f:
    for row in rows:
      f.write(json.dumps(row, default=float) + "\n")


# ------------------------------------------------------------------------- planning


@dataclasses.dataclass
class CostModel:
  """Seconds of a computation of n runs: ``overhead_s + n * per_run_s`` (compilation and
  data placement in the overhead), times ``SAFETY`` when planning."""
  overhead_s: float
  per_run_s: float

  def seconds(self, n: int) -> float:
    return SAFETY * (self.overhead_s + n * self.per_run_s)


def fit(timings: Sequence[Tuple[int, float]]) -> Optional[CostModel]:
  """The cost model of computations timed as ``(runs, seconds)``: least squares over
  distinct sizes (overhead >= 0), else no overhead and the slowest seconds per run."""
  if not timings:
    return None
  ns = sorted({n for n, _ in timings})
  slowest = max(t / n for n, t in timings)
  if len(ns) < 2:
    return CostModel(0.0, slowest)
  n_mean = sum(n for n, _ in timings) / len(timings)
  t_mean = sum(t for _, t in timings) / len(timings)
  var = sum((n - n_mean) ** 2 for n, _ in timings)
  r = sum((n - n_mean) * (t - t_mean) for n, t in timings) / var
  c = t_mean - r * n_mean
  if r <= 0 or c < 0:
    return CostModel(0.0, slowest)
  return CostModel(c, r)


def shards_of(runs: Sequence[Run], max_per_shard: int) -> List[List[Run]]:
  """``runs`` as computations: one per group (in the order of their first runs), each
  cut into pieces of at most ``max_per_shard``."""
  groups: Dict[Tuple, List[Run]] = {}
  for r in runs:
    groups.setdefault(r.group, []).append(r)
  return [g[i:i + max_per_shard] for g in groups.values()
          for i in range(0, len(g), max_per_shard)]


def plan(pending: Sequence[Run], seconds_left: float, model: Optional[CostModel],
         max_per_shard: int, max_runs: int = 0) -> List[List[Run]]:
  """The computations to run next: those of the longest prefix of ``pending`` whose
  computations ``model`` expects to take at most ``seconds_left``; without a model, the
  first run alone (the first timing). Empty when nothing fits."""
  if max_runs:
    pending = pending[:max_runs]
  if not pending:
    return []
  if model is None:
    return [[pending[0]]]
  best: List[List[Run]] = []
  for k in range(1, len(pending) + 1):
    shards = shards_of(pending[:k], max_per_shard)
    if sum(model.seconds(len(s)) for s in shards) > seconds_left:
      break
    best = shards
  return best


# ------------------------------------------------------------------------- running


def deadline(budget_min: float) -> float:
  """The Unix time this call must end by: its budget from the process's start, or the
  suite's deadline (``FEDJAX_ASYNC_DEADLINE``) less 20 s if earlier."""
  end = T_START + 60.0 * budget_min
  suite = os.environ.get(DEADLINE_ENV)
  return min(end, float(suite) - 20.0) if suite else end


def device_fields() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import host  # pylint: disable=g-import-not-at-top
  info = host.host()
  return {"device_kind": jax.devices()[0].device_kind, "backend": jax.default_backend(),
          "devices": len(jax.devices()), "jax": jax.__version__,
          "matmul_precision": str(jax.config.jax_default_matmul_precision or "default"),
          "git": info.get("git"), "host_cpu": info.get("cpu")}


def timings_of(rows: Sequence[dict], device_kind: str, cost: str) -> List[Tuple[int, float]]:
  """``(runs, seconds)`` of each computation the rows came from, on this device kind at
  this cost signature."""
  seen = {}
  for r in rows:
    if r.get("device_kind") == device_kind and r.get("cost_signature") == cost:
      seen[r["computation_id"]] = (r["computation_runs"], r["computation_wall_s"])
  return list(seen.values())


class _KeepRows(loop_lib.Callback):
  """Keeps each run's rows of a sweep computation (``sweep.run_sweep(callbacks=...)``)."""

  def __init__(self):
    self.rows: List[List[dict]] = []

  def after_chunk(self, loop, state, rows):
    del state, rows
    self.rows = loop.rows


def run_shard(shard: List[Run], data_cache: dict, mesh, dev: dict) -> List[dict]:
  """Runs one computation; its rows."""
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top
  first = shard[0]
  key = (first.flagfile, first.partition)
  if key not in data_cache:
    print(f"[table_v] loading {first.cfg.data.dataset} ({first.partition}) ...", flush=True)
    fed_data, _ = sweep.load_checked(first.cfg)
    data_cache[key] = _table().subset_test(fed_data, first.extra.get("test_subset", 0))
  kept = _KeepRows()
  t0 = time.perf_counter()
  summaries = sweep.run_sweep([r.cfg for r in shard], first.algorithm, data_cache[key],
                              ["delay_fraction"], None, 0, mesh, quiet=True,
                              extra_config=first.extra, callbacks=[kept])
  wall = time.perf_counter() - t0
  cid = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{id(shard) % 10**6}"
  rows = []
  for r, s, run_rows in zip(shard, summaries, kept.rows):
    curve = [None if x["test_accuracy"] is None else round(float(x["test_accuracy"]), 5)
             for x in run_rows]
    rows.append(dict(
        flagfile=r.flagfile, partition=r.partition, algorithm=r.algorithm, delta=r.delta,
        seed=r.seed, precision=r.cfg.local.precision, config_digest=r.digest,
        cost_signature=r.cost, model=s["model"], rounds=s["rounds"],
        final_accuracy=s["final_accuracy"], last10_mean_accuracy=s["last10_mean_accuracy"],
        average_best_accuracy=s["average_best_accuracy"],
        diverged_round=s.get("diverged_round"), test_accuracy=curve,
        wall_s=wall / len(shard),
        computation_id=cid, computation_runs=len(shard), computation_wall_s=wall,
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), tag=FLAGS.tag,
        overrides={k: v for k, v in overrides().items() if k not in ("data_dir",)}, **dev))
  return rows


def describe(shard: Sequence[Run]) -> str:
  r = shard[0]
  deltas = ",".join(f"{d:g}" for d in sorted({x.delta for x in shard}))
  seeds = ",".join(str(s) for s in sorted({x.seed for x in shard}))
  return (f"{r.flagfile} {r.partition} {r.algorithm} delta={deltas} seeds={seeds} "
          f"({len(shard)} run{'s' * (len(shard) > 1)})")


def run_table(runs: List[Run], done_keys: set, known_rows: List[dict], new_rows: str,
              end: float) -> Tuple[int, List[Run]]:
  """Runs computations while they fit before ``end``: (runs made, runs still pending)."""
  from fedjax_async import sharding  # pylint: disable=g-import-not-at-top
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top
  dev = device_fields()
  pending = [r for r in runs if r.key() not in done_keys]
  timings = {}  # cost signature -> [(runs, seconds)]
  for r in pending:
    timings.setdefault(r.cost, timings_of(known_rows, dev["device_kind"], r.cost))
  mesh = sweep.run_mesh(sharding.select_devices(pending[0].cfg.run.devices)) if pending else None
  data_cache: dict = {}
  made = 0
  while pending:
    left = end - time.time()
    budget = FLAGS.max_runs - made if FLAGS.max_runs else 0
    if FLAGS.max_runs and budget <= 0:
      break
    model = fit(timings[pending[0].cost])
    shards = plan(pending, left, model, FLAGS.max_runs_per_shard, budget)
    if not shards:
      print(f"[table_v] {left:.0f} s left: the next computation "
            f"({describe(shards_of(pending[:1], 1)[0])}) is expected to take "
            f"{model.seconds(1):.0f} s; stopping", flush=True)
      break
    shard = shards[0]
    print(f"[table_v] {describe(shard)}: {left:.0f} s left, "
          + ("first timing" if model is None else
             f"expected {model.seconds(len(shard)):.0f} s (c = {model.overhead_s:.1f} s, "
             f"r = {model.per_run_s:.1f} s per run, x{SAFETY})"), flush=True)
    rows = run_shard(shard, data_cache, mesh, dev)
    append_rows(new_rows, rows)
    made += len(rows)
    timings[shard[0].cost].append((len(shard), rows[0]["computation_wall_s"]))
    done = {r.key() for r in shard}
    pending = [r for r in pending if r.key() not in done]
    print(f"[table_v] done in {rows[0]['computation_wall_s']:.1f} s: "
          + ", ".join(f"δ={r['delta']:g} seed {r['seed']}: {r['average_best_accuracy']:.3f}"
                      for r in rows) + f"; {len(pending)} runs left", flush=True)
  return made, pending


# ------------------------------------------------------------------------- the table


def table_markdown(rows: Sequence[dict], runs: Sequence[Run]) -> str:
  """Per flag file and precision: the three metrics over seeds, the paper's beside (rows
  of the configurations ``runs`` are of; others are counted, not shown)."""
  wanted = {r.key() for r in runs}
  by_file: Dict[Tuple[str, str], List[dict]] = {}
  other = 0
  for row in rows:
    if row_key(row) in wanted:
      by_file.setdefault((row["flagfile"], row["precision"]), []).append(row)
    else:
      other += 1
  total = {}
  for r in runs:
    total[(r.flagfile, r.cfg.local.precision)] = total.get(
        (r.flagfile, r.cfg.local.precision), 0) + 1
  parts = ["# PAFed Table V at the paper's configuration (`benchmarks/table_v.py`)", ""]
  for (flagfile, precision), n_runs in total.items():
    got = by_file.get((flagfile, precision), [])
    first = next(r for r in runs if r.flagfile == flagfile)
    base = first.cfg
    parts += [f"## {flagfile} (precision {precision}): {len(got)} of {n_runs} runs", ""]
    if not got:
      parts += ["No run yet.", ""]
      continue
    devices = sorted({f"{r['device_kind']} (jax {r['jax']}, matmul precision "
                      f"{r['matmul_precision']})" for r in got})
    wall = sum(r["wall_s"] for r in got)
    algs = [a for a in base.algorithm.name_list() if any(r["algorithm"] == a for r in got)]
    parts += [f"Device: {'; '.join(devices)}. Run time {wall / 60:.1f} min for {len(got)} "
              f"runs ({wall / len(got):.1f} s per run; all {n_runs}: "
              f"~{wall / len(got) * n_runs / 60:.0f} min).", ""]
    results = {}
    for r in got:
      summary = {"setting": {"delay_fraction": r["delta"]}, "rounds": r["rounds"],
                 "diverged_round": r.get("diverged_round"),
                 **{k: r[k] for k in ("final_accuracy", "last10_mean_accuracy",
                                      "average_best_accuracy")}}
      curve = [{"test_accuracy": a} for a in r["test_accuracy"]]
      results.setdefault((r["partition"], r["algorithm"]), []).append((summary, curve))
    partitions = [p for p in ("iid", "shards", "dirichlet")
                  if any(p == part for part, _ in results)]
    table = _table().table_rows(results, partitions, algs)
    header = (f"`experiments/flags/{flagfile}.flags`: {base.data.dataset}, model "
              f"{base.model.name}, N={base.data.num_clients}, σ={base.run.participation}, "
              f"E={base.local.local_epochs}, B={base.local.batch_size}, T={base.run.rounds}; "
              "each cell mean ± std (ddof 1) over the seeds run (one seed: its value; "
              "the count below). Paper: Table V (5 seeds). Δ = ours − paper.")
    parts += [_table().markdown_table(table, algs, header), ""]
    seeds = {}
    for r in got:
      seeds.setdefault((r["partition"], r["delta"], r["algorithm"]), set()).add(r["seed"])
    parts += ["Seeds per cell: " + "; ".join(
        f"{_table().PARTITION_LABEL.get(p, p)} δ={d:g} {a}: {len(s)}"
        for (p, d, a), s in sorted(seeds.items())) + ".", ""]
  if other:
    parts += [f"({other} row(s) of other configurations in the rows file are not shown.)", ""]
  return "\n".join(parts)


def write_markdown(rows_path: str, rows: Sequence[dict], runs: Sequence[Run]) -> str:
  path = os.path.join(os.path.dirname(_path(rows_path)), "table_v.md")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(table_markdown(rows, runs))
  return path


def main(argv):
  del argv
  cli.quiet_library_logs(FLAGS)
  try:
    runs = all_runs(FLAGS.flagfiles, overrides())
  except ValueError as e:
    sys.exit(f"error: {cli.as_flags(str(e))}")
  new_rows = FLAGS.new_rows or FLAGS.rows
  if FLAGS.add_rows:
    have = {row_key(r) for r in read_rows(FLAGS.rows)}
    fresh = [r for r in read_rows(FLAGS.add_rows) if row_key(r) not in have]
    append_rows(FLAGS.rows, fresh)
    print(f"[table_v] {len(fresh)} new row(s) appended to {FLAGS.rows}")
  rows = read_rows(FLAGS.rows, new_rows)
  done_keys = {row_key(r) for r in rows}
  pending = [r for r in runs if r.key() not in done_keys]
  print(f"[table_v] {len(runs)} runs in the tables of {', '.join(map(label, FLAGS.flagfiles))}"
        f"; {len(runs) - len(pending)} done (rows in {FLAGS.rows}"
        + (f" and {new_rows}" if new_rows != FLAGS.rows else "") + f"), {len(pending)} to run",
        flush=True)
  if FLAGS.plan_only:
    for r in pending:
      print(f"  tier {r.tier()}: {r.flagfile} {r.partition} {r.algorithm} δ={r.delta:g} "
            f"seed {r.seed}")
    return
  if not (FLAGS.report_only or FLAGS.add_rows) and pending:
    made, pending = run_table(runs, done_keys, rows, new_rows, deadline(FLAGS.time_budget_min))
    print(f"[table_v] {made} run(s) made this call, {len(pending)} left", flush=True)
    rows = read_rows(FLAGS.rows, new_rows)
  # beside the rows this call wrote (with --add_rows / --report_only: beside --rows)
  target = FLAGS.rows if FLAGS.add_rows or FLAGS.report_only else new_rows
  print(f"[table_v] table: {write_markdown(target, rows, runs)}", flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
