"""What a virtual-clock run reports: its progress lines, ``summary.json``, its DP
accounting, and the tables of several runs (``comparison.md``) or seeds."""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from fedjax_async import console
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
    version = min(rows[-1]["arrival_version"] + 1, self.num_updates)
    timing = " | ETA after the first steady call" if version < self.num_updates else ""
    if self.steady is None:
      self.steady = (now, self.done, version)
    elif version > self.steady[2]:
      elapsed = max(now - self.steady[0], 1e-9)
      rate = (self.done - self.steady[1]) / elapsed
      eta = (self.num_updates - version) * elapsed / (version - self.steady[2])
      timing = f" | {rate:.1f} arrivals/s ETA {eta:.0f}s"
    console.say(f"[{self.name}] version {version}/{self.num_updates}"
                f" arrivals {self.done} acc {self.last_acc:.4f} "
                f"loss {np.mean([r['train_loss'] for r in rows]):.4f} "
                f"staleness {np.mean([r['staleness'] for r in rows]):.2f}{timing}",
                console.PROGRESS)


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
  summary.update(target_summary(rows, schedule.num_updates, cfg.run.target_accuracy,
                                cfg.clock.time_budget, schedule.stopped_at_budget))
  if privacy_report is not None:
    summary["privacy"] = privacy_report
  return summary


TARGET_KEYS = ("target_accuracy", "time_to_target_s", "updates_to_target",
               "arrivals_to_target")


def target_summary(rows: List[dict], server_updates: int, target: float,
                   budget: float = 0.0, stopped_at_budget: bool = False) -> dict:
  """A run's summary keys of run.target_accuracy and clock.time_budget (none without them).

  Args:
    rows: the run's rows, one per kept arrival.
    server_updates: its server updates (the version after its last row).
    target: a (0: none): at the first evaluated row with test accuracy >= a, its virtual
      time, the server updates made (the next row's arrival version) and the arrivals
      (dropped ones included: its event + 1); None each where never reached.
    budget: T (0: none): the last evaluated accuracy at virtual time <= T.
    stopped_at_budget: the run stopped at T (not at its server updates before).
  """
  out = {}
  if target:
    i = metrics_lib.first_reaching(rows, target)
    done = i is not None
    version = (rows[i + 1]["arrival_version"] if i + 1 < len(rows) else server_updates
               ) if done else None
    out.update(target_accuracy=target,
               time_to_target_s=rows[i]["virtual_time"] if done else None,
               updates_to_target=version,
               arrivals_to_target=rows[i]["event"] + 1 if done else None)
  if budget:
    accs = [r["test_accuracy"] for r in rows
            if r["test_accuracy"] is not None and r["virtual_time"] <= budget]
    out.update(time_budget_s=budget, accuracy_at_budget=accs[-1] if accs else None,
               stopped_at_budget=stopped_at_budget)
  return out


def retarget(summary: dict, rows: List[dict], target: float) -> dict:
  """``summary`` (a finished run's, read back) with the target keys of ``target``
  (run.target_accuracy changes no row: such a run is not run again)."""
  out = {k: v for k, v in summary.items() if k not in TARGET_KEYS}
  out.update(target_summary(rows, summary["server_updates"], target))
  return out


def result_line(s: dict) -> str:
  """One run's result on the console."""
  eps = s.get("privacy", {}).get("epsilon_spent_max")
  reach = ""
  if "target_accuracy" in s:
    t = s["time_to_target_s"]
    reach = f", {s['target_accuracy']:g} " + ("not reached" if t is None else (
        f"reached at {t:.2f} virtual s ({s['updates_to_target']} updates, "
        f"{s['arrivals_to_target']} arrivals)"))
  if s.get("accuracy_at_budget") is not None:
    reach += f", accuracy at {s['time_budget_s']:g} virtual s {s['accuracy_at_budget']:.4f}"
  return (f"[{s['run']}] final accuracy {s['final_accuracy']:.4f}, "
          f"{s['updates_per_virtual_second']:.3f} updates per virtual s, mean staleness "
          f"{s['mean_staleness']:.2f}{reach}, {s['wall_time_s']:.1f}s wall"
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


def target_columns(summaries: List[dict]) -> List[tuple]:
  """(header, summary key) of the columns of run.target_accuracy and clock.time_budget
  that ``summaries`` carry (none without them)."""
  a = next((s["target_accuracy"] for s in summaries if "target_accuracy" in s), None)
  t = next((s["time_budget_s"] for s in summaries if "time_budget_s" in s), None)
  return ([(f"time to {a:g} (virtual s)", "time_to_target_s"),
           (f"updates to {a:g}", "updates_to_target"),
           (f"arrivals to {a:g}", "arrivals_to_target")] if a else []) + (
               [(f"acc at {t:g} virtual s", "accuracy_at_budget")] if t else [])


def _target_cell(key: str, values: List[Optional[float]]) -> str:
  """One run's cell of ``target_columns`` over its seeds (one value: its own)."""
  if key == "accuracy_at_budget":
    return outputs.seed_cell(values)
  return outputs.reach_cell(values, integer=key != "time_to_target_s")


def target_note(summaries: List[dict], over_seeds: bool = False) -> str:
  """What ``target_columns`` mean, and the runs that ended before clock.time_budget."""
  cols = [k for _, k in target_columns(summaries)]
  lines = []
  if "time_to_target_s" in cols:
    a = next(s["target_accuracy"] for s in summaries if "target_accuracy" in s)
    lines.append(f"To {a:g}: at the first evaluation (every eval_every server updates) "
                 f"whose test accuracy is >= {a:g}; arrivals include dropped ones"
                 + ("; mean ± std over the seeds that reached it" if over_seeds else "")
                 + "; not reached: not within the run.")
  if "accuracy_at_budget" in cols:
    t = next(s["time_budget_s"] for s in summaries if "time_budget_s" in s)
    short = sorted({s["run"] for s in summaries if not s.get("stopped_at_budget", True)})
    lines.append(f"Acc at {t:g} virtual s: the model at simulated second {t:g} (every run "
                 "stops there)" + (f"; {', '.join(short)} ended before it, at num_updates"
                                   if short else "") + ".")
  return " ".join(lines)


def clock_table(summaries: List[dict], diverged: Optional[Dict[str, str]] = None) -> str:
  """Markdown: one line per run (accuracy, with run.target_accuracy and clock.time_budget
  ``target_columns``, arrivals, server updates, staleness, virtual throughput, epsilon
  spent, wall time), a line per run of ``diverged`` (its name -> the divergence error,
  whose first clause names the group), ``arrivals_note`` and ``target_note``."""
  cols = target_columns(summaries)
  lines = ["| run | final acc | best acc | " + "".join(f"{h} | " for h, _ in cols)
           + "arrivals | server updates | mean staleness | upd/virtual s | eps spent | "
           "wall s |", "|---|---|---|" + "---|" * (len(cols) + 6)]
  for name, message in (diverged or {}).items():
    lines.append(f"| {name} | diverged ({message.split(':')[0]}) |" + " – |" * (7 + len(cols)))
  for s in summaries:
    eps = s.get("privacy", {}).get("epsilon_spent_max", "")
    lines.append(f"| {s['run']} | {s['final_accuracy']:.4f} | {s['best_accuracy']:.4f} | "
                 + "".join(f"{_target_cell(k, [s.get(k)])} | " for _, k in cols) +
                 f"{s['arrivals']} | {s['server_updates']} | "
                 f"{s['mean_staleness']:.2f} | {s['updates_per_virtual_second']:.3f} | "
                 f"{eps if eps == '' else f'{eps:.3g}'} | {s['wall_time_s']:.1f} |")
  notes = [n for n in (arrivals_note(summaries), target_note(summaries) if cols else "") if n]
  return "\n".join(lines) + "".join(f"\n\n{n}" for n in notes)


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
  every = [s for runs in by_seed.values() for s in runs]
  cols = target_columns(every)
  lines = [f"Seeds {', '.join(map(str, seeds))}; {outputs.SEEDS_NOTE}.", "",
           "| run | final acc | best acc | " + "".join(f"{h} | " for h, _ in cols)
           + "mean staleness | " + " | ".join(f"final, seed {sd}" for sd in seeds) + " |",
           "|---|---|---|---|" + "---|" * (len(seeds) + len(cols))]
  for name in names:
    got = {sd: next((s for s in by_seed[sd] if s["run"] == name), None) for sd in seeds}
    done = [s for s in got.values() if s is not None]
    stat = lambda key: outputs.seed_cell([s[key] for s in done])  # pylint: disable=cell-var-from-loop
    lines.append(f"| {name} | {stat('final_accuracy')} | {stat('best_accuracy')} | "
                 + "".join(f"{_target_cell(k, [s.get(k) for s in done])} | " for _, k in cols)
                 + f"{np.mean([s['mean_staleness'] for s in done]):.2f} | "
                 + " | ".join("diverged" if got[sd] is None else
                              f"{got[sd]['final_accuracy']:.4f}" for sd in seeds) + " |")
  return "\n".join(lines) + (f"\n\n{target_note(every, True)}" if cols else "")
