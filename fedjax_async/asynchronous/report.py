"""What a virtual-clock run reports: its progress lines, ``summary.json``, its DP
accounting, and the tables of several runs (``comparison.md``) or seeds."""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async import privacy
from fedjax_async.core import building
from fedjax_async.core import progress


class ArrivalProgress:
  """A console line per compiled call: server version, arrivals, the last accuracy seen,
  loss, staleness, arrivals per second and the ETA from the versions still to come. The
  first call's time holds the compilation, so the rate and ETA are measured over the
  calls after it ("ETA after the first steady call" until one is back). ``clock``: the
  time in seconds (tests pass a fake one); ``health``: the clients' health lines
  (``progress.HealthWatch``)."""

  def __init__(self, run_name: str, num_updates: int, rows_before,
               clock: Optional[Callable[[], float]] = None,
               health: Optional[progress.HealthWatch] = None):
    self.name, self.num_updates = run_name, num_updates
    self.health = health  # (``loop.HostLoop`` calls it first with every chunk's rows)
    self.done, self.last_acc = len(rows_before), float("nan")
    self.clock = clock or time.perf_counter
    self.steady = None  # (time, arrivals, version) when the first call came back

  def __call__(self, rows):
    now = self.clock()
    self.done += len(rows)
    acc = [r["test_accuracy"] for r in rows
           if r["test_accuracy"] is not None and np.isfinite(r["test_accuracy"])]
    if acc:
      self.last_acc = acc[-1]
    version = rows[-1]["arrival_version"] + 1
    timing = " | ETA after the first steady call" if version < self.num_updates else ""
    if self.steady is None:
      self.steady = (now, self.done, version)
    elif version > self.steady[2]:
      elapsed = max(now - self.steady[0], 1e-9)
      rate = (self.done - self.steady[1]) / elapsed
      eta = (self.num_updates - version) * elapsed / (version - self.steady[2])
      timing = f" | {rate:.1f} arrivals/s ETA {eta:.0f}s"
    print(f"[{self.name}] version {version}/{self.num_updates}"
          f" arrivals {self.done} acc {self.last_acc:.4f} "
          f"loss {np.mean([r['train_loss'] for r in rows]):.4f} "
          f"staleness {np.mean([r['staleness'] for r in rows]):.2f}{timing}", flush=True)


def dp_report(cfg, steps, counts, hp) -> dict:
  """The DP accounting of a run of a DP algorithm (``privacy.report``; no noise at an
  infinite privacy.dp_epsilon)."""
  p = cfg.privacy
  if not math.isfinite(p.dp_epsilon):
    return {"epsilon_spent_max": math.inf, "seed_per_step_epsilon": math.inf}
  return privacy.report(steps, counts, lr=cfg.local.lr, clip=p.dp_clip, epsilon=p.dp_epsilon,
                        delta=p.dp_delta, batch_size=cfg.local.batch_size,
                        clip_mode=p.dp_clip_mode, noise_multiplier=hp["dp_noise_multiplier"])


def dp_notice(run_name: str, cfg, privacy_report: dict) -> str:
  """One line before a DP run trains: the epsilon every client will spend (the RDP
  accountant over its steps, ``privacy.report``), a warning when that exceeds
  privacy.dp_epsilon (privacy.dp_noise=alg1: the paper's per-step sigma)."""
  p = cfg.privacy
  spent, steps = privacy_report["epsilon_spent_max"], max(privacy_report["steps_per_client"])
  z = max(privacy_report["noise_multiplier"])
  if spent <= p.dp_epsilon * (1 + 1e-6):
    return (f"[{run_name}] DP: noise multiplier {z:.3g} per step, so that every client "
            f"spends at most epsilon {spent:.3g} (delta {p.dp_delta:g}) over its <= {steps} "
            f"steps (privacy.dp_epsilon={p.dp_epsilon:g})")
  return (f"[{run_name}] warning: privacy.dp_noise={p.dp_noise} spends epsilon {spent:.3g} "
          f"(delta {p.dp_delta:g}, RDP over up to {steps} steps per client), not "
          f"privacy.dp_epsilon={p.dp_epsilon:g}: the paper's sigma = lr 2C/(|D_k| eps) is one "
          f"full-batch step's budget; privacy.dp_noise=calibrated spends {p.dp_epsilon:g}")


def run_summary(cfg, run_name: str, algo_name: str, fed, model_name: str, num_params: int,
                hp: dict, rows: List[dict], wall: float, schedule, num_groups: int,
                group_size: int, config: dict, privacy_report: Optional[dict]) -> dict:
  """summary.json of one run (``privacy_report``: its DP accounting, or None).

  Args:
    cfg: the ``AsyncRunConfig``.
    run_name: the run's name (the algorithm's, or a swept setting's).
    algo_name: the algorithm's name.
    fed: the federated data.
    model_name: the model's name.
    num_params: the model's parameter count.
    hp: the hyper-parameters.
    rows: the run's metrics rows, one per kept arrival.
    wall: the run's wall time, seconds.
    schedule: the virtual clock's ``Schedule``.
    num_groups: the groups the arrivals ran in.
    group_size: G, the groups' padded size.
    config: the run's configuration, as a dict.
    privacy_report: its DP accounting, or None.
  """
  accs = [r["test_accuracy"] for r in rows if r["test_accuracy"] is not None]
  loc = cfg.local
  summary = {
      "run": run_name, "algorithm": algo_name, "seed": cfg.run.seed,
      "data_seed": building.data_seed_of(cfg),
      # the swept field: run_list names a run apart from its algorithm by its own a only
      "setting": {"mix_alpha": float(hp["mix_alpha"])} if run_name != algo_name else {},
      "dataset": getattr(fed, "name", cfg.data.dataset),
      "model": model_name, "num_params": num_params,
      "local_work": {"local_epochs": loc.local_epochs, "local_steps": loc.local_steps,
                     "batch_size": loc.batch_size},
      **metrics_lib.accuracy_summary(accs),
      "best_accuracy": max(accs) if accs else float("nan"),
      "accuracy_curve": [(r["arrival_version"] + 1, r["test_accuracy"]) for r in rows
                         if r["test_accuracy"] is not None],
      "wall_time_s": wall, "kept_arrivals_per_wall_second": len(rows) / max(wall, 1e-9),
      "groups": num_groups, "group_size": group_size,
      "hparams": {k: float(v) for k, v in hp.items()},
      "config": config,
  }
  summary.update(schedule.summary())
  if privacy_report is not None:
    summary["privacy"] = privacy_report
  return summary


def result_line(s: dict) -> str:
  """One run's result on the console."""
  eps = s.get("privacy", {}).get("epsilon_spent_max")
  return (f"[{s['run']}] final accuracy {s['final_accuracy']:.4f}, "
          f"{s['updates_per_virtual_second']:.3f} updates per virtual s, mean staleness "
          f"{s['mean_staleness']:.2f}, {s['wall_time_s']:.1f}s wall"
          + (f", epsilon spent {eps:.3g}" if eps is not None else ""))


def curves_title(cfg, dataset: str, model: str, names, seeds=()) -> str:
  """curves.png's title: the data set and its partition, the model built, the clock and
  the runs; with several ``seeds``, which ones and the band's std (ddof 1, as
  ``seed_table``).

  Args:
    cfg: the ``AsyncRunConfig``.
    dataset: the data set's name.
    model: the model's name.
    names: the runs drawn.
    seeds: the seeds averaged.
  """
  over = f"; {outputs.seeds_note(seeds)}" if len(seeds) > 1 else ""
  return (f"{outputs.data_label(cfg.data, dataset)}, {outputs.model_label(cfg.data, model)}; "
          f"virtual clock, concurrency {cfg.clock.concurrency}; {', '.join(names)}{over}")


def clock_table(summaries: List[dict], diverged: Optional[Dict[str, str]] = None) -> str:
  """Markdown: one line per run (accuracy, arrivals, server updates, staleness, virtual
  throughput, epsilon spent, wall time), a line per run of ``diverged`` (its name -> the
  divergence error, whose first clause names the group), and ``arrivals_note``."""
  lines = ["| run | final acc | best acc | arrivals | server updates | mean staleness | "
           "upd/virtual s | eps spent | wall s |", "|---|---|---|---|---|---|---|---|---|"]
  for name, message in (diverged or {}).items():
    lines.append(f"| {name} | diverged ({message.split(':')[0]}) |" + " – |" * 7)
  for s in summaries:
    eps = s.get("privacy", {}).get("epsilon_spent_max", "")
    lines.append(f"| {s['run']} | {s['final_accuracy']:.4f} | {s['best_accuracy']:.4f} | "
                 f"{s['arrivals']} | {s['server_updates']} | "
                 f"{s['mean_staleness']:.2f} | {s['updates_per_virtual_second']:.3f} | "
                 f"{eps if eps == '' else f'{eps:.3g}'} | {s['wall_time_s']:.1f} |")
  note = arrivals_note(summaries)
  return "\n".join(lines) + (f"\n\n{note}" if note else "")


def arrivals_note(summaries: List[dict]) -> str:
  """A line saying so when the runs of a comparison took different numbers of client
  arrivals (FedBuff takes clock.buffer_k per server update), else ''."""
  arrivals = {s["run"]: s["arrivals"] for s in summaries}
  if len(set(arrivals.values())) <= 1:
    return ""
  each = ", ".join(f"{r} {a}" for r, a in arrivals.items())
  return (f"Note: the runs took different numbers of client arrivals ({each}): "
          "--num_updates counts server updates; --num_arrivals=N gives every run N.")


def seed_table(by_seed: Dict[int, List[dict]]) -> str:
  """Markdown: per run, the final and best accuracy as mean ± std (n) over the seeds where
  it did not diverge (``outputs.seed_cell``: the sample std, ddof 1), and each seed's final
  accuracy."""
  seeds = list(by_seed)
  names = list(dict.fromkeys(s["run"] for runs in by_seed.values() for s in runs))
  lines = [f"Seeds {', '.join(map(str, seeds))}; {outputs.SEEDS_NOTE}.", "",
           "| run | final acc | best acc | mean staleness | "
           + " | ".join(f"final, seed {sd}" for sd in seeds) + " |",
           "|---|---|---|---|" + "---|" * len(seeds)]
  for name in names:
    got = {sd: next((s for s in by_seed[sd] if s["run"] == name), None) for sd in seeds}
    done = [s for s in got.values() if s is not None]
    stat = lambda key: outputs.seed_cell([s[key] for s in done])  # pylint: disable=cell-var-from-loop
    lines.append(f"| {name} | {stat('final_accuracy')} | {stat('best_accuracy')} | "
                 f"{np.mean([s['mean_staleness'] for s in done]):.2f} | "
                 + " | ".join("diverged" if got[sd] is None else
                              f"{got[sd]['final_accuracy']:.4f}" for sd in seeds) + " |")
  return "\n".join(lines)
