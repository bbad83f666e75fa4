r"""Reproduces the PAFed paper's Table V and Figs. 5-8 (Fashion-MNIST) with vmapped sweeps.

  # the paper's setting (GPU): N=100, sigma=0.1, E=10, B=50, lr 0.1, momentum 0.5,
  # rho 0.01, alphas 0.8, T=100, CNN, 5 seeds, delta in {0, 0.1, ..., 0.7}
  python experiments/pafed_table.py --flagfile=experiments/flags/pafed_table_full.flags
  # the reduced configuration that fits 2 CPU cores in < 30 minutes
  python experiments/pafed_table.py --flagfile=experiments/flags/pafed_table_reduced.flags
  # only rebuild the table and figures from run directories that already exist
  python experiments/pafed_table.py --config=reduced --output_dir=... --read_only

For each partition (iid, shards) and algorithm, all deltas x seeds run as ONE vmapped
computation (``fedjax_async.sweeps.sweep``). Runs whose directories are complete and were made with
the same flags are read back instead of re-run, so an interrupted driver continues where it
was; runs stored with other flags are re-run (the driver names the flags that differ), and
``--read_only`` refuses them.
Outputs under ``--output_dir``: ``<partition>/runs/<algorithm>/delay_fraction=<d>_seed=<s>/``
(metrics.jsonl, summary.json), ``table.md`` / ``table.csv`` (ours beside the paper's numbers
and the difference) and ``figures/accuracy_<partition>_delta<d>.png`` (test accuracy versus
round, mean ± std over seeds, one curve per algorithm: the paper's Figs. 5-8).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
import time

from absl import app
from absl import flags
import numpy as np

from fedjax_async import interrupts
from fedjax_async import metrics as metrics_lib
from fedjax_async import config as config_lib
from fedjax_async import outputs
from fedjax_async import cli
from fedjax_async import results_table
from fedjax_async import sharding
from fedjax_async.sweeps import sweep
from fedjax_async.sweeps import store as sweep_store

@dataclasses.dataclass(frozen=True)
class TableOptions:
  """The table's own settings (its runs take the run flags, ``config.RunConfig``)."""
  config: str = config_lib.option("full", "full (the paper's setting) | reduced (2 CPU "
                                  "cores, < 30 min): presets for every flag not given "
                                  "explicitly.")
  num_seeds: int = config_lib.option(5, "Seeds per setting (mean reported).")
  partitions: str = config_lib.option("iid,shards", "Partitions (table rows: IID / "
                                      "non-IID).")
  deltas: str = config_lib.option("0,0.1,0.2,0.3,0.4,0.5,0.6,0.7", "Delay fractions for the "
                                  "non-IID (shards) partition.")
  iid_deltas: str = config_lib.option("0,0.1,0.2,0.3,0.4,0.5,0.6,0.7", "Delay fractions for "
                                      "the IID partition.")
  test_subset: int = config_lib.option(0, "Evaluate on the first n test examples (0 = all).")
  max_runs_per_computation: int = config_lib.option(
      0, "At most this many runs per vmapped computation (0 = all deltas x seeds of an "
      "algorithm in one).")
  read_only: bool = config_lib.option(False, "Do not run: build the table and figures from "
                                      "existing run directories.")


@dataclasses.dataclass(frozen=True)
class TableConfig(config_lib.FlatKeys):
  table: TableOptions = TableOptions()


cli.define_run_flags()
cli.define_config_flags(TableConfig)  # one flag per TableOptions field
cli.help.ESSENTIAL[:] = ["config", "output_dir", "num_seeds", "partitions", "deltas",
                         "algorithm", "rounds", "max_runs_per_computation", "read_only",
                         "flagfile"]

FLAGS = flags.FLAGS

PAPER_SETTING = dict(dataset="fashion_mnist", model="cnn", num_clients=100,
                     participation=0.1, local_epochs=10, batch_size=50, lr=0.1,
                     momentum=0.5, rho=0.01, alpha0=0.8, alpha1=0.8, alpha2=0.8,
                     shards_per_client=2, delay_distribution="uniform", max_delay=3,
                     algorithm="fedadmm,fedavg,fedprox,pafed", eval_every=1,
                     checkpoint_every=10, server_lr=1.0, mu=0.01)
PRESETS = {
    "full": dict(PAPER_SETTING, rounds=100, num_seeds=5, rounds_per_call=10,
                 output_dir="runs/pafed_table_full"),
    "reduced": dict(PAPER_SETTING, model="logreg", rounds=40, local_epochs=2, num_seeds=2,
                    deltas="0,0.3,0.5,0.7", iid_deltas="0", test_subset=0,
                    eval_every=5, rounds_per_call=10, output_dir="runs/pafed_table_reduced"),
}

# Table V of the paper (Fashion-MNIST, average best accuracy over the last 10 rounds).
PAPER = {
    ("iid", 0.0): dict(fedadmm=0.906, fedavg=0.899, fedprox=0.898, pafed=0.905),
    ("shards", 0.0): dict(fedadmm=0.842, fedavg=0.835, fedprox=0.836, pafed=0.867),
    ("shards", 0.3): dict(fedadmm=0.833, fedavg=0.812, fedprox=0.812, pafed=0.872),
    ("shards", 0.5): dict(fedadmm=0.812, fedavg=0.787, fedprox=0.802, pafed=0.867),
    ("shards", 0.7): dict(fedadmm=0.781, fedavg=0.732, fedprox=0.741, pafed=0.840),
}
LABELS = {"fedadmm": "FedADMM", "fedavg": "FedAvg", "fedprox": "FedProx", "pafed": "PAFed",
          "fednova": "FedNova"}
PARTITION_LABEL = {"iid": "IID", "shards": "non-IID", "dirichlet": "Dirichlet"}


def apply_preset(name: str):
  """Sets the preset's value of every flag the user did not give (command line/flagfile)."""
  if name not in PRESETS:
    raise ValueError(f"--config: must be one of {sorted(PRESETS)}, got {name!r}")
  for key, value in PRESETS[name].items():
    if not FLAGS[key].present:
      FLAGS[key].value = value


def subset_test(fed_data, n: int):
  """``fed_data`` evaluated on its first ``n`` test examples (n = 0: unchanged)."""
  if n <= 0 or n >= len(fed_data.test_y):
    return fed_data
  fields = dict(test_x=fed_data.test_x[:n], test_y=fed_data.test_y[:n])
  if hasattr(fed_data, "_replace"):
    return fed_data._replace(**fields)
  if dataclasses.is_dataclass(fed_data):
    return dataclasses.replace(fed_data, **fields)
  import copy  # pylint: disable=g-import-not-at-top
  out = copy.copy(fed_data)
  for k, v in fields.items():
    setattr(out, k, v)
  return out


def run_dirs(out_dir: str, partition: str, alg: str, cfgs):
  return [os.path.join(out_dir, partition, "runs", alg, sweep.run_name(c, ["delay_fraction"]))
          for c in cfgs]


def extra_config(opts: TableOptions):
  """Settings outside RunConfig that change the results, stored in each run's config
  (--test_subset only when set, so that runs stored before it was recorded still match)."""
  return {"test_subset": opts.test_subset} if opts.test_subset else {}


def read_runs(dirs, cfgs=None, alg=None, extra=None):
  """(summary, rows) of each run directory; None when any is missing (not run yet).

  With ``cfgs`` (and ``alg``) each stored run's config is checked against them: a run made
  with other flags raises ``sweep.SetupError`` naming the flags and the folder."""
  out, stale = [], []
  for i, d in enumerate(dirs):
    config = ({} if cfgs is None else
              sweep_store.stored_config(cfgs[i], alg, extra or {}))
    stored = sweep_store.read_stored_run(d, config)
    if stored is None:
      return None
    if cfgs is not None and stored[2]:
      stale.append((d, stored[2]))
    out.append(stored[:2])
  if stale:
    diffs = sorted({x for _, ds in stale for x in ds})
    raise sweep.SetupError(
        f"--read_only: {len(stale)} stored run(s) under {os.path.dirname(stale[0][0])} were "
        f"made with other flags: {', '.join(diffs)}; pass the flags they were made with, or "
        "drop --read_only to re-run them")
  return out


def run_table_grid(base: config_lib.RunConfig, opts: TableOptions, partitions, deltas_of,
                   algs, mesh=None) -> dict:
  """{(partition, alg): [(summary, rows), ...]}: runs what is missing or was stored with
  other flags (unless read_only: then a run stored with other flags is a SetupError, and a
  missing (partition, alg) is left out of the table, saying so).

  ``mesh``: the ``('runs',)`` mesh the runs are split over (``sweep.run_mesh``)."""
  out_dir, extra = base.output.output_dir, extra_config(opts)
  results_table.unpack_missing(out_dir)  # a packed folder's runs.jsonl: its run folders
  results = {}
  for part in partitions:
    cfg = base.replace(partition=part)
    fed_data = None
    for alg in algs:
      cfgs = sweep.grid(cfg, {"delay_fraction": deltas_of[part]}, opts.num_seeds)
      dirs = run_dirs(out_dir, part, alg, cfgs)
      if opts.read_only:
        done = read_runs(dirs, cfgs, alg, extra)
        if done is None:
          missing = sum(not os.path.isfile(os.path.join(d, "summary.json")) for d in dirs)
          print(f"[{part}/{alg}] --read_only: {missing} of {len(dirs)} runs missing under "
                f"{os.path.join(out_dir, part, 'runs', alg)}: left out of the table",
                flush=True)
          continue
        results[(part, alg)] = done
        continue
      summaries = [sweep_store.read_stored_run(d, sweep_store.stored_config(c, alg, extra))
                   for d, c in zip(dirs, cfgs)]
      if all(s is not None and not s[2] for s in summaries):
        results[(part, alg)] = [s[:2] for s in summaries]
        continue
      if fed_data is None:
        print(f"loading {cfg.data.dataset} ({part}) ...", flush=True)
        fed_data, _ = sweep.load_checked(cfg)
        fed_data = subset_test(fed_data, opts.test_subset)
      t0 = time.perf_counter()
      sweep.run_sweep(cfgs, alg, fed_data, ["delay_fraction"], os.path.join(out_dir, part),
                      opts.max_runs_per_computation, mesh, resume=True, extra_config=extra)
      print(f"[{part}/{alg}] {len(cfgs)} runs in {time.perf_counter() - t0:.1f}s",
            flush=True)
      done = read_runs(dirs)
      if done is not None:
        results[(part, alg)] = done
  return results


def by_delta(runs):
  """{delta: [(summary, rows), ...]} over seeds."""
  out = {}
  for s, rows in runs:
    out.setdefault(float(s["setting"]["delay_fraction"]), []).append((s, rows))
  return out


def table_rows(results: dict, partitions, algs):
  """One row per (partition, delta): per algorithm and accuracy metric (``metrics.KEYS``)
  the mean/std over seeds, and the paper's average best accuracy."""
  rows = []
  for part in partitions:
    deltas = sorted({d for (p, a), runs in results.items() if p == part
                     for d in by_delta(runs)})
    for d in deltas:
      row = {"partition": part, "delta": d, "cells": {}}
      for alg in algs:
        runs = by_delta(results.get((part, alg), [])).get(d, [])
        # A diverged run (sweep's diverged_round) is left out of the mean and counted.
        # (from the rows: runs stored before a metric existed have it too)
        ok = [metrics_lib.accuracy_summary([r["test_accuracy"] for r in rows])
              for s, rows in runs if s.get("diverged_round") is None]
        paper = PAPER.get((part, round(d, 2)), {}).get(alg)
        cell = {"seeds": len(ok), "paper": paper, "diverged": len(runs) - len(ok),
                "diverged_rounds": sorted(s["diverged_round"] for s, _ in runs
                                          if s.get("diverged_round") is not None),
                "rounds": runs[0][0]["rounds"] if runs else None}
        for key in metrics_lib.KEYS:
          vals = np.array([s[key] for s in ok], float)
          cell[key] = {"mean": float(np.mean(vals)) if len(vals) else float("nan"),
                       # the sample std (ddof 1), as every table of the project
                       "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")}
        mean = cell["average_best_accuracy"]["mean"]
        cell["diff"] = None if paper is None else mean - paper
        row["cells"][alg] = cell
      rows.append(row)
  return rows


def fmt(x, spec=".3f"):
  return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


METRIC_TITLES = {"final_accuracy": "Final accuracy (the last round's model)",
                 "last10_mean_accuracy": "Last-10 mean accuracy (mean over the last 10 rounds)",
                 "average_best_accuracy": "Average best accuracy (the paper's metric: mean "
                                          "over the last 10 rounds of the best so far)"}


def _ours(c, key):
  """A cell: mean ± std over the seeds (the value alone for one seed), with the count of
  diverged runs left out and their rounds; "all diverged" with the rounds the runs
  turned non-finite in, where known."""
  if not c["seeds"]:
    at = c.get("diverged_rounds") or []
    return "all diverged" + (f" (round {', '.join(map(str, at))})" if at else "")
  m = c[key]
  value = fmt(m["mean"]) if c["seeds"] == 1 else f"{fmt(m['mean'])} ± {fmt(m['std'])}"
  text = metrics_lib.mark_short(value, key, c["rounds"] or metrics_lib.LAST + 1)
  at = c.get("diverged_rounds") or []
  where = f" in round {', '.join(map(str, at))}" if len(at) == c.get("diverged") else ""
  return text + (f" ({c['diverged']} diverged{where}, left out)" if c.get("diverged") else "")


def markdown_table(rows, algs, header: str) -> str:
  """The header, then one table per accuracy metric, mean ± std over seeds; the average
  best accuracy beside the paper's Table V and Δ = ours − paper."""
  lines = [header]
  for key in metrics_lib.KEYS:
    paper = key == "average_best_accuracy"
    cols = " | ".join(f"{LABELS.get(a, a)} ours | paper | Δ" if paper else LABELS.get(a, a)
                      for a in algs)
    lines += ["", f"{METRIC_TITLES[key]}:", "", f"| setting | {cols} |",
              "|---" * (1 + (3 if paper else 1) * len(algs)) + "|"]
    for r in rows:
      cells = []
      for a in algs:
        c = r["cells"][a]
        cells.append(f"{_ours(c, key)} | {fmt(c['paper'])} | {fmt(c['diff'], '+.3f')}"
                     if paper else _ours(c, key))
      lines.append(f"| {PARTITION_LABEL.get(r['partition'], r['partition'])} "
                   f"δ={r['delta']:g} | " + " | ".join(cells) + " |")
  if any(metrics_lib.is_short(c["rounds"] or metrics_lib.LAST + 1)
         for r in rows for c in r["cells"].values()):
    lines += ["", metrics_lib.SHORT_RUN_NOTE]
  return "\n".join(lines)


def write_csv(rows, algs, path: str):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    keys = [f"{k}_{s}" for k in metrics_lib.KEYS for s in ("mean", "std")]
    w.writerow(["partition", "delta"] + [f"{a}_{k}" for a in algs
                                         for k in keys + ["seeds", "diverged", "rounds",
                                                          "paper", "diff"]])
    for r in rows:
      vals = []
      for a in algs:
        c = r["cells"][a]
        vals += [c[k][s] for k in metrics_lib.KEYS for s in ("mean", "std")]
        vals += [c["seeds"], c["diverged"], c["rounds"], c["paper"], c["diff"]]
      w.writerow([r["partition"], r["delta"]] + vals)


def seed_curves(runs):
  """[(rounds, test accuracy)] at the evaluated rounds of each run that did not diverge."""
  out = []
  for s, rows in runs:
    if s.get("diverged_round") is not None:
      continue
    points = outputs.curve_points(rows, "test_accuracy")
    if points is not None:
      out.append(points)
  return out


def plot_curves(results: dict, partitions, algs, fig_dir: str, title: str, data_cfg=None):
  """One PNG per (partition, delta): accuracy versus round, per algorithm the mean over
  the seeds that did not diverge with a shaded +-1 std band (numpy's, as the table's);
  titled with the data set, its partition (``data_cfg``'s Dirichlet alpha or shards per
  client) and the model the runs built."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(fig_dir, exist_ok=True)
  data_cfg = data_cfg or config_lib.RunConfig().data
  paths = []
  for part in partitions:
    per_alg = {a: by_delta(results.get((part, a), [])) for a in algs}
    deltas = sorted({d for v in per_alg.values() for d in v})
    for d in deltas:
      fig, ax = plt.subplots(figsize=(5, 3.6))
      first = next(v[d][0][0] for v in per_alg.values() if d in v)  # a summary
      for j, a in enumerate(algs):
        curves = seed_curves(per_alg[a].get(d, []))
        if not curves:
          continue
        color = f"C{j % 10}"
        if len(curves) == 1:
          (x, y), std = curves[0], None
        else:
          band = outputs.seed_band(curves)
          if band is None:
            continue
          x, y, std, _ = band
        ax.plot(x, y, color=color, marker="." if len(x) < 40 else None,
                label=outputs.seeds_label(LABELS.get(a, a), len(curves)))
        if std is not None:
          ax.fill_between(x, y - std, y + std, color=color, alpha=outputs.BAND_ALPHA,
                          linewidth=0)
      ax.set_xlabel("communication round")
      ax.set_ylabel("test accuracy")
      data = outputs.data_label(dataclasses.replace(data_cfg, partition=part),
                                first.get("dataset", data_cfg.dataset))
      ax.set_title(f"{data}, {outputs.model_label(data_cfg, first.get('model', 'auto'))}; "
                   f"δ = {d:g} ({title})", fontsize=8)
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
      path = os.path.join(fig_dir, f"accuracy_{part}_delta{d:g}.png")
      fig.tight_layout()
      fig.savefig(path, dpi=110)
      plt.close(fig)
      paths.append(path)
  return paths


def header_for(base: config_lib.RunConfig, opts: TableOptions) -> str:
  test = f"first {opts.test_subset} test examples" if opts.test_subset else "full test set"
  a, loc = base.algorithm, base.local
  epochs = f"E~U{{1..{loc.local_epochs}}}" if loc.random_local_epochs else f"E={loc.local_epochs}"
  eta = (f"η={a.server_lr}" + (f"→{a.server_lr2} from round {a.server_lr_switch_round}"
                               if a.server_lr_switch_round >= 0 else ""))
  pafed_opts = ("" if a.alpha_decay == 1.0 and a.ducc_projection == "conflicting" else
                f", α decay γ={a.alpha_decay}, DUCC projects the {a.ducc_projection} class")
  return (f"**{opts.config} configuration** — {base.data.dataset} (inputs normalised: "
          f"{base.data.normalize}), model {base.model.name}, "
          f"N={base.data.num_clients}, σ={base.run.participation}, {epochs}, {eta}, "
          f"μ={a.mu}{pafed_opts}, B={loc.batch_size}, lr={loc.lr}, momentum={loc.momentum}, "
          f"ρ={base.algorithm.rho}, α={base.algorithm.alpha0}/{base.algorithm.alpha1}/"
          f"{base.algorithm.alpha2}, ADMM upload (Eq. 16) "
          f"{base.algorithm.admm_upload}, T={base.run.rounds}, delays "
          f"{base.delay.distribution} 1..{base.delay.max_delay} rounds, evaluation every "
          f"{base.run.eval_every} round(s) and in the last 10 on the {test}; each metric mean ± "
          f"std (sample, ddof 1) over {opts.num_seeds} seeds. "
          f"Paper: Table V (CNN, T=100, E=10, 5 seeds). Δ = ours − paper.")


def setup():
  """(RunConfig, TableOptions, mesh, deltas per partition, partitions) of the flags, the
  --config preset applied; ValueError naming the flag."""
  sharding.set_cpu_devices(FLAGS.cpu_devices)
  for name in ("coordinator_address", "num_processes", "process_id", "distributed"):
    cli.check_flag(not FLAGS[name].present, name, "pafed_table.py runs in one process; its "
                   "sweeps run across processes as experiments/sweep.py (docs/distributed.md)")
  apply_preset(FLAGS.config)
  cli.check_sweep_flags(FLAGS)  # its runs are sweeps: no tb/
  cli.check_flag(not FLAGS.seeds, "seeds", "the table runs --num_seeds seeds from --seed")
  base = cli.config_from_flags(FLAGS)
  opts = TableConfig.from_flat({n: FLAGS[n].value for n in TableConfig.keys()}).table
  mesh = sweep.run_mesh(sharding.select_devices(base.run.devices))
  deltas_of = {"iid": sweep.parse_values("iid_deltas", opts.iid_deltas)}
  for part in ("shards", "dirichlet"):
    deltas_of[part] = sweep.parse_values("deltas", opts.deltas)
  partitions = [p for p in opts.partitions.split(",") if p]
  cli.check_flag(bool(partitions), "partitions", "expected a comma list of "
                 f"{', '.join(sorted(deltas_of))}, got {opts.partitions!r}")
  for p in partitions:
    cli.check_flag(p in deltas_of, "partitions", f"unknown partition {p!r}")
    sweep.check_values(base, "delay_fraction", deltas_of[p],
                       "iid_deltas" if p == "iid" else "deltas")
  cli.check_flag(opts.num_seeds >= 1, "num_seeds", f"must be >= 1, got {opts.num_seeds}")
  cli.check_flag(opts.test_subset >= 0, "test_subset", f"must be >= 0, got {opts.test_subset}")
  cli.check_flag(opts.max_runs_per_computation >= 0, "max_runs_per_computation",
                 f"must be >= 0 (0 = all runs in one), got {opts.max_runs_per_computation}")
  return base, opts, mesh, deltas_of, partitions


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(FLAGS)
  with cli.reported():
    base, opts, mesh, deltas_of, partitions = setup()
  algs = base.algorithm.name_list()
  out_dir = base.output.output_dir
  os.makedirs(out_dir, exist_ok=True)
  t0 = time.perf_counter()
  with cli.reported():  # a sweep.SetupError names its flag or file
    results = interrupts.exit_on_interrupt(
        lambda: run_table_grid(base, opts, partitions, deltas_of, algs, mesh),
        f"the runs of every finished computation are stored under {out_dir}/<partition>/runs"
        + (f" and the others checkpointed every --checkpoint_every={base.output.checkpoint_every} "
           f"rounds under {out_dir}/<partition>/checkpoints" if base.output.checkpoint_every > 0
           else "") + ": rerun the same command to continue (finished runs are read back)")
  if not results:
    sys.exit(f"error: --output_dir={out_dir}: no runs found (expected "
             f"<partition>/runs/<algorithm>/delay_fraction=<d>_seed=<s>/summary.json for "
             f"--partitions={','.join(partitions)} and --algorithm={base.algorithm.names}); "
             "run without --read_only to make them")
  wall = time.perf_counter() - t0
  rows = table_rows(results, partitions, algs)
  md = markdown_table(rows, algs, header_for(base, opts))
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(md + "\n")
  write_csv(rows, algs, os.path.join(out_dir, "table.csv"))
  figs = plot_curves(results, partitions, algs, os.path.join(out_dir, "figures"),
                     f"{opts.config} config", base.data)
  with open(os.path.join(out_dir, "table.json"), "w") as f:
    json.dump({"config": opts.config, "num_seeds": opts.num_seeds,
               "driver_wall_time_s": wall, "run_config": config_lib.config_dict(base),
               "rows": rows, "figures": figs}, f, indent=2)
  print(md)
  print(f"driver wall time {wall:.1f}s; {len(figs)} figures under {out_dir}/figures")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
