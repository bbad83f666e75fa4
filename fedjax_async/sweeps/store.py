"""A sweep's files: each run's metrics and summary, the grid's table (mean and std over
seeds) and figure, the runs stored by an earlier sweep read back when their configuration
matches (``read_stored_run``, ``config_differences``), and the checkpoints of one vmapped
computation (``ComputationCheckpoint``) and its host loop (``SweepLoop``).
``sweep.run_sweep`` / ``sweep.run_grid`` use them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
from typing import Callable, Dict, List, Optional, Sequence

import jax
import numpy as np

from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import config as config_lib
from fedjax_async import console
from fedjax_async import distributed
from fedjax_async import figures
from fedjax_async import loop
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs

# Config fields that do not change a stored run's results (beyond those a resumption may
# change, config_lib.RESUME_FREE_FIELDS): a run stored under other values is still reused.
RESULT_FREE_FIELDS = ("rounds_per_call", "client_chunk")
# The delay's fields under their flag names (config differences are named by flag).

def write_run(out_dir: str, rows: List[dict], summary: dict):
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    for r in rows:
      f.write(outputs.json_row(r) + "\n")
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)


def aggregate(summaries: List[dict], names: Sequence[str]) -> List[dict]:
  """Mean and sample std (``outputs.DDOF``) over seeds of average best / final accuracy per
  (algorithm, setting), the settings of an algorithm in numeric order; a name the
  algorithm was not swept over (``sweep.used_names``) is None.

  Diverged runs (``diverged_round`` set) are left out of the means and stds and counted in
  ``diverged``; a setting whose runs all diverged has NaN means and stds."""
  groups: Dict[tuple, List[dict]] = {}
  for s in summaries:
    key = (s["algorithm"],) + tuple(s["setting"].get(n) for n in names)
    groups.setdefault(key, []).append(s)
  order = list(dict.fromkeys(k[0] for k in groups))
  out = []
  for key in sorted(groups, key=lambda k: (order.index(k[0]),) + tuple(
      (v is not None, v) for v in k[1:])):
    group = groups[key]
    ok = [g for g in group if g["diverged_round"] is None]
    row = {"algorithm": key[0]}
    row.update(dict(zip(names, key[1:])))
    row.update({"num_seeds": len(group), "seeds": [g["config"]["seed"] for g in group],
                "rounds": group[0].get("rounds")})
    for k in metrics_lib.KEYS:  # a summary stored before a key existed has NaN there
      mean, std, _ = outputs.mean_std([g.get(k, np.nan) for g in ok])
      row[k + "_mean"], row[k + "_std"] = mean, std
    row["diverged"] = len(group) - len(ok)
    out.append(row)
  return out


def write_aggregate(rows: List[dict], names: Sequence[str], out_dir: str) -> str:
  """aggregate.csv and aggregate.md (Markdown returned)."""
  cols = (["algorithm"] + list(names) + ["num_seeds"] +
          [k + s for k in metrics_lib.KEYS for s in ("_mean", "_std")] + ["diverged"])
  with open(os.path.join(out_dir, "aggregate.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
      w.writerow([r[c] for c in cols])
  header = ["algorithm", *names, "seeds", "final accuracy¹", "last-10 mean accuracy¹",
            "average best accuracy¹", "diverged"]
  lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
  rounds = lambda r: int(r.get("rounds") or metrics_lib.LAST + 1)
  cell = lambda r, k: ("all diverged" if r["diverged"] >= r["num_seeds"] else
                       metrics_lib.mark_short(f"{r[k + '_mean']:.4f} ± {r[k + '_std']:.4f}",
                                              k, rounds(r)))
  for r in rows:
    cells = [r["algorithm"], *("–" if r[n] is None else f"{r[n]:g}" for n in names),
             str(r["num_seeds"]),
             *(cell(r, k) for k in metrics_lib.KEYS), str(r["diverged"])]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", f"¹ mean ± std over the seeds whose run did not diverge (a non-finite loss; "
            f"the sample std, ddof {outputs.DDOF}); the diverged runs, counted in `diverged`, "
            "are left out."]
  if any(r[n] is None for r in rows for n in names):
    lines.append("–: a field the algorithm does not use, not swept for it.")
  if any(metrics_lib.is_short(rounds(r)) for r in rows):
    lines.append(metrics_lib.SHORT_RUN_NOTE)
  md = "\n".join(lines)
  with open(os.path.join(out_dir, "aggregate.md"), "w") as f:
    f.write(md + "\n")
  return md


def plot_aggregate(rows: List[dict], names: Sequence[str], path: str, title: str = "") -> int:
  """``path`` (PNG): two panels, the final and the average best accuracy against the first
  swept value (log x when every value is positive and they span 10x or more), one curve
  per algorithm and setting of the other swept values: the mean over the seeds that did
  not diverge with a shaded +-1 std band ("mean ± std over N seeds" in the legend), a
  dashed level for an algorithm that does not use the first swept name; without swept
  values, one bar per algorithm with its std. Returns the number of curves
  (or bars) per panel."""
  fig = figures.new_figure((10.0, 4.0))
  kept = lambda pts: "/".join(  # seeds in the means (the diverged ones left out)
      map(str, sorted({r["num_seeds"] - r.get("diverged", 0) for r in pts})))
  drawn = 0
  for i, (key, label) in enumerate((("final_accuracy", "final accuracy"),
                                    ("average_best_accuracy", "average best accuracy"))):
    ax = fig.add_subplot(1, 2, i + 1)
    mean = lambda r, k=key: r[k + "_mean"]
    std = lambda r, k=key: r[k + "_std"]
    if not names:
      ax.bar([r["algorithm"] for r in rows], [mean(r) for r in rows],
             yerr=[std(r) for r in rows], capsize=4)
      ax.set_xlabel("algorithm")
      drawn = len(rows)
    else:
      x_name, others = names[0], list(names[1:])
      lines: Dict[tuple, List[dict]] = {}
      for r in rows:
        lines.setdefault((r["algorithm"],) + tuple(r[n] for n in others), []).append(r)
      xs = [r[x_name] for r in rows if r[x_name] is not None]
      for j, (k, pts) in enumerate(lines.items()):
        name = " ".join([k[0]] + [f"{n}={v:g}" for n, v in zip(others, k[1:])
                                  if v is not None])
        color = f"C{j % 10}"
        n = kept(pts)
        line_label = name if n == "1" else f"{name} (mean ± std over {n} seeds)"
        if pts[0][x_name] is None:  # the algorithm does not use x: one level across
          ax.axhline(mean(pts[0]), color=color, linestyle="--",
                     label=f"{line_label}, no {x_name}")
          continue
        pts = sorted(pts, key=lambda r: r[x_name])
        x = np.array([r[x_name] for r in pts], float)
        y = np.array([mean(r) for r in pts], float)
        sd = np.array([std(r) for r in pts], float)
        ax.plot(x, y, marker="o", color=color, label=line_label)
        if n != "1":
          ax.fill_between(x, y - sd, y + sd, color=color, alpha=outputs.BAND_ALPHA,
                          linewidth=0)
      if xs and min(xs) > 0 and max(xs) >= 10 * min(xs):
        ax.set_xscale("log")
      ax.set_xlabel(x_name)
      if i == 0:
        ax.legend(fontsize=7)
      drawn = len(lines)
    ax.set_ylabel(label if kept(rows) == "1" else
                  f"{label}\n(mean ± std over {kept(rows)} seeds)")
    ax.grid(True, alpha=0.3)
  fig.suptitle(outputs.wrap_title(title or (f"swept {', '.join(names)}" if names else
                                            "per algorithm"), 125), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return drawn


def config_differences(saved: dict, current: dict) -> List[str]:
  """``--flag=<stored> (now <current>)`` for each flag whose value differs between a stored
  run's config and ``current`` (``config_lib.config_mismatch``, by flag name, ignoring the
  RESULT_FREE_FIELDS)."""
  saved = config_lib.flat_stored(saved)
  current = config_lib.flat_stored(json.loads(json.dumps(current)))
  bad = [k for k in config_lib.config_mismatch(saved, current) if k not in RESULT_FREE_FIELDS]
  def stored(k):
    return (repr(saved[k]) if k in saved else
            f"{config_lib.STORED_BEFORE.get(k)!r}, stored before the flag existed")
  return [f"--{k}={stored(k)} (now {current.get(k)!r})" for k in bad]


def read_stored_run(run_dir: str, config: dict):
  """``(summary, rows, differences)`` of the finished run under ``run_dir`` (summary.json is
  written last), or None when there is none; ``differences``: ``config_differences``
  against ``config`` (empty: the stored run is the one ``config`` asks for)."""
  s_path = os.path.join(run_dir, "summary.json")
  if not (os.path.isfile(s_path) and os.path.isfile(os.path.join(run_dir, "metrics.jsonl"))):
    return None
  try:
    with open(s_path) as f:
      summary = json.load(f)
    rows = outputs.read_metrics(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      first = next((json.loads(line) for line in f if line.strip()), {})
  except (OSError, ValueError):  # unreadable: treated as not run
    return None
  if first.get("round") == 0 and summary.get("diverged_round") is not None:
    # rows stored counting from 0 (read_metrics shifts them): the round of divergence too
    summary = dict(summary, diverged_round=summary["diverged_round"] + 1)
  if not isinstance(summary.get("config"), dict):
    return summary, rows, ["(no configuration stored)"]
  return summary, rows, config_differences(summary["config"], config)


def stored_config(cfg: config_lib.RunConfig, algorithm_name: str,
                  extra_config: Optional[dict] = None) -> dict:
  """The config a run of ``cfg`` stores in its summary.json (plus ``extra_config``)."""
  return dict(config_lib.run_config_for(cfg, algorithm_name), **(extra_config or {}))


def computation_mismatch(saved: dict, now: dict) -> List[str]:
  """What differs between a computation's stored checkpoint config and ``now``: its runs,
  or the flags of one of their configurations (``config_differences``)."""
  if saved.get("runs") != now["runs"]:
    return ["(other runs)"]
  return sorted({d for a, b in zip(saved.get("configs", []), now["configs"])
                 for d in config_differences(a, b)})


class ComputationCheckpoint(loop.Checkpoints):
  """Checkpoints of one vmapped computation (its runs' stacked state and rows) under
  ``<out_dir>/checkpoints/<algorithm>/<key>/``, ``key`` naming the computation's runs, every
  ``checkpoint_every`` rounds of the first config (0: none): ``loop.Checkpoints`` with
  ``discard``, so with ``resume`` a checkpoint made with other flags, or that cannot be
  read, is discarded (saying why) and the computation starts over, as a stored run made
  with other flags is run again. One is saved at a signal; none at the end: the runs are
  written then."""

  def __init__(self, out_dir: str, algorithm_name: str, group, run_names, extra_config,
               resume: bool, quiet: bool):
    base = group[0]
    key = hashlib.sha1("\n".join(run_names).encode()).hexdigest()[:12]
    config = {"runs": run_names, "configs": [
        checkpoint_lib.to_json_ready(stored_config(c, algorithm_name, extra_config))
        for c in group]}
    super().__init__(os.path.join(out_dir, "checkpoints", algorithm_name, key), config,
                     every=base.output.checkpoint_every, total=base.run.rounds,
                     resume=resume, mismatch=computation_mismatch,
                     keep=base.output.keep_checkpoints, discard=True,
                     label="" if quiet else f"{algorithm_name} x{len(group)}",
                     grid=base.run.rounds_per_call)

  def due(self, position: int, stopping: bool = False) -> bool:
    return self.every > 0 and position < self.total and super().due(position, stopping)

  def save(self, position: int, state, rows, wall_time_s: float):
    """The stacked state without the padding runs, gathered to the host."""
    num_runs = len(rows)
    super().save(position, distributed.to_host(jax.tree.map(lambda x: x[:num_runs], state)),
                 rows, wall_time_s)

  def remove(self):
    self.close()
    distributed.sync(f"remove {self.directory}")
    if not distributed.is_main():
      return
    shutil.rmtree(self.directory, ignore_errors=True)
    parent = os.path.dirname(self.directory)
    for d in (parent, os.path.dirname(parent)):  # checkpoints/<alg>, checkpoints if empty
      if os.path.isdir(d) and not os.listdir(d):
        os.rmdir(d)


def read_back(cfgs, algorithm_name: str, run_dir: Callable, out_dir: str,
               extra_config: Optional[dict], quiet: bool) -> Dict[int, dict]:
  """``{index: summary}`` of the runs of ``cfgs`` stored under ``out_dir`` with the same
  configuration; the stored runs made with other flags are named (they run again).

  Args:
    cfgs: the runs' configurations.
    algorithm_name: the algorithm's name.
    run_dir: ``run_dir(cfg)``, a run's directory.
    out_dir: the sweep's output directory (named in the messages).
    extra_config: settings outside RunConfig compared with the stored ones.
    quiet: no messages.
  """
  found: Dict[int, dict] = {}
  stale = []
  for i, c in enumerate(cfgs):
    stored = read_stored_run(run_dir(c), stored_config(c, algorithm_name, extra_config))
    if stored is not None and not stored[2]:  # (run.target_accuracy changes no row)
      found[i] = metrics_lib.retarget_rounds(stored[0], stored[1], c.run.target_accuracy)
    elif stored is not None:
      stale.append((run_dir(c), stored[2]))
  if not quiet and found:
    console.say(f"[{algorithm_name}] {len(found)} of {len(cfgs)} runs read back from "
                f"{os.path.join(out_dir, 'runs', algorithm_name)} (same configuration)")
  if not quiet and stale:
    diffs = sorted({d for _, ds in stale for d in ds})
    console.say(f"[{algorithm_name}] re-running {len(stale)} stored run(s) made with other flags "
                f"({', '.join(diffs)}) under {os.path.join(out_dir, 'runs', algorithm_name)}: "
                f"{', '.join(os.path.basename(d) for d, _ in stale)}")
  return found


class SweepLoop(loop.HostLoop):
  """The host loop of one vmapped computation: ``on_chunk(rounds_done, seconds, states,
  rows)`` of ``simulate_sweep`` (``rows``: each run's rows so far) through ``HostLoop``'s
  callbacks: the caller's, the checkpoint when due or at a signal, the progress line
  (``label``; None: none), the signal check."""

  def __init__(self, checkpoints, start: int, wall_before: float, callbacks, label, rounds):
    self.start, self.end, self.seconds, self.per_run = start, start, wall_before, []
    self.wall_start = wall_before
    progress = None if label is None else lambda rows: self.progress(label, rounds, rows)
    # no metrics file (each run's rows are written when its computation ends), and no
    # divergence stop: a run that diverges is marked, the others go on (simulate_sweep)
    super().__init__(None, checkpoints, lambda _: self.end, progress, wall_before, callbacks,
                     stop_on_divergence=False)

  @property
  def rows(self):
    return self.per_run

  def wall(self) -> float:
    return self.seconds

  def progress(self, label: str, rounds: int, rows):
    rate = (self.end - self.start) / max(self.seconds - self.wall_start, 1e-9)
    console.say(f"[{label}] round {self.end}/{rounds} {rate:.2f} rounds/s "
                f"({rate * len(rows):.2f} run-rounds/s) "
                f"ETA {(rounds - self.end) / max(rate, 1e-9):.0f}s", console.PROGRESS)

  def save(self, state, position=None):
    self.checkpoints.save(self.end, state, self.per_run, self.seconds)

  def __call__(self, end, seconds, states, rows):
    self.end, self.seconds, self.per_run = end, seconds, rows
    for callback in self.callbacks:
      callback.after_chunk(self, states, rows)
