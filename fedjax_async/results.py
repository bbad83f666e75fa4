"""One ``Result`` for every engine (the round engine, the virtual clock, FedEDS): its runs
(``Run``: summary, rows, final state, model) by name, their rows and summaries as plain
records (one dict per row, scalar values only), a pandas DataFrame of them, a run's final
model as its parameter tree, the comparison table and a figure.

Every summary holds ``final_accuracy``, ``best_accuracy``, ``last10_mean_accuracy`` and
``average_best_accuracy`` (``metrics.accuracy_summary``). A round-based row (the round
engine, FedEDS) holds its ``round`` counted from 1, as the console and the figures count:
row r is the model after r rounds. A virtual-clock row is one kept arrival (``event``,
``virtual_time``, the ``arrival_version`` it met).

Every record and summary record starts with the run's identity (``identity``): ``run``,
``algorithm``, ``seed``, ``data_seed`` (the data's and partition's, the same for every
seed) and each swept field (a run's summary's ``setting``) as its own key.
Tables give a configuration's seeds as ``mean ± std (n)`` (``outputs.seed_cell``: the
sample std, ddof 1, over the n seeds that did not diverge); ``Result.plot`` draws them as
their mean with a ±1 std band, one colour per configuration.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from fedjax_async import outputs


def identity(name: str, summary: dict) -> dict:
  """The columns that tell a run apart: ``run`` (its name), ``algorithm``, ``seed``,
  ``data_seed`` and each swept field of its summary's ``setting``."""
  return {"run": name, "algorithm": summary.get("algorithm", name),
          "seed": outputs.seed_of(summary), "data_seed": outputs.data_seed_of(summary),
          **(summary.get("setting") or {})}


def configuration(name: str, seed: Optional[int]) -> str:
  """A run's name without its seed: ``fedavg/lr=0.1_seed=2`` -> ``fedavg/lr=0.1``,
  ``pafed/seed=1`` -> ``pafed`` (the name of the runs that differ only in the seed)."""
  if seed is None:
    return name
  return re.sub(rf"(^|[/_])seed={seed}(?=$|[/_])", "", name) or name


def _scalar(v):
  return v.item() if isinstance(v, np.generic) else v


class Records:
  """Mixed into a ``Result`` whose ``all_runs()`` maps a run's name to an object with
  ``summary`` and ``rows``."""

  def all_runs(self) -> Dict[str, object]:
    raise NotImplementedError

  def to_records(self) -> List[dict]:
    """One dict per row of every run: the run's ``identity`` (``run``, ``algorithm``,
    ``seed``, each swept field), then the row's scalar values (per-arrival arrays left
    out)."""
    out = []
    for name, run in self.all_runs().items():
      ident = identity(name, run.summary)
      for row in run.rows:
        rec = dict(ident)
        rec.update({k: _scalar(v) for k, v in row.items()
                    if np.ndim(v) == 0 and k not in ident})
        out.append(rec)
    return out

  def summary_records(self) -> List[dict]:
    """One dict per run: its ``identity``, then the summary's scalar values
    (``final_accuracy``, ``last10_mean_accuracy``, ``average_best_accuracy``, ...)."""
    out = []
    for name, run in self.all_runs().items():
      rec = identity(name, run.summary)
      rec.update({k: _scalar(v) for k, v in run.summary.items() if k not in rec and (
          isinstance(v, (int, float, str, bool, np.generic)) or v is None)})
      out.append(rec)
    return out

  def to_pandas(self, summaries: bool = False):
    """``to_records()`` (or ``summary_records()``) as a pandas DataFrame (pandas is not a
    dependency: ImportError saying how to install it)."""
    try:
      import pandas as pd  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("to_pandas needs pandas: pip install pandas (to_records() gives "
                        "the same rows as dicts)") from e
    return pd.DataFrame(self.summary_records() if summaries else self.to_records())


@dataclasses.dataclass
class Run:
  """One run: ``summary`` (summary.json), ``rows`` (metrics.jsonl, one dict per evaluated
  round or update), the final engine state (``state.w`` the global model; None for a run
  read back from its folder) and ``model`` (name, initial flat weights, ``apply_flat``)."""
  summary: dict
  rows: List[dict]
  state: Any = None
  model: Optional[tuple] = None


@dataclasses.dataclass
class Result(Records):
  """The runs of one ``simulate`` call by name (``runs``: the first seed's with several);
  ``by_seed[seed][name]`` when the call ran several seeds one after the other (the
  virtual clock, FedEDS, the round engine with ``output_dir``); ``diverged`` "run (seed
  s)" -> why; ``figure`` the curves' PNG when written; ``title`` the figure's (what was
  run). ``to_records()`` / ``to_pandas()``: every run's rows; ``final_model(name)``: a
  run's final global model as its parameter tree."""
  config: Any
  runs: Dict[str, Run]
  by_seed: Dict[int, Dict[str, Run]] = dataclasses.field(default_factory=dict)
  diverged: Dict[str, str] = dataclasses.field(default_factory=dict)
  figure: Optional[str] = None
  title: str = ""
  tabulate: Optional[Callable[["Result"], str]] = dataclasses.field(default=None, repr=False)

  def all_runs(self) -> Dict[str, Run]:
    if len(self.by_seed) <= 1:
      return self.runs
    return {f"{name}/seed={seed}": run for seed, runs in self.by_seed.items()
            for name, run in runs.items()}

  def summaries(self) -> List[dict]:
    return [r.summary for r in self.all_runs().values()]

  def final_model(self, name: Optional[str] = None):
    """The final global model of run ``name`` (default: the first) as the model's
    parameter tree (its variables, batch statistics included, for a model with them)."""
    runs = self.all_runs()
    run = runs[name if name is not None else next(iter(runs))]
    if run.state is None or run.model is None:
      raise ValueError(f"run {name!r}: no final model (read back from its folder, or an "
                       "engine that keeps none); rerun it in memory")
    return run.model[2].params(run.state.w)

  def table(self) -> str:
    """The comparison table (markdown)."""
    if self.tabulate is None:
      raise ValueError("this Result has no table")
    return self.tabulate(self)

  def configurations(self) -> Dict[str, List[Run]]:
    """The runs by configuration (``configuration``: a run's name without its seed), each
    its seeds' runs in order."""
    out: Dict[str, List[Run]] = {}
    for name, run in self.all_runs().items():
      out.setdefault(configuration(name, outputs.seed_of(run.summary)), []).append(run)
    return out

  def plot(self, path: str, title: Optional[str] = None) -> str:
    """Test accuracy and train loss against the round (or the virtual clock's time),
    written to ``path`` (PNG): one colour per configuration, the mean over its seeds with
    a shaded ±1 std band (ddof 1, as ``table()``) where it has several. ``title``
    defaults to ``self.title`` (the data, model and runs). Returns ``path``."""
    runs = self.configurations()
    x_key = "round" if all("round" in r for group in runs.values() for run in group
                           for r in run.rows[:1]) else "virtual_time"
    seeds = sorted({s for s in (outputs.seed_of(r.summary) for group in runs.values()
                                for r in group) if s is not None})
    if title is None:
      title = self.title or "; ".join(filter(None, [", ".join(runs), outputs.seeds_note(
          seeds)]))
    outputs.plot_curves({n: [r.rows for r in group] if len(group) > 1 else group[0].rows
                         for n, group in runs.items()}, path, x_key=x_key, title=title,
                        ddof=outputs.DDOF)
    self.figure = path
    return path
