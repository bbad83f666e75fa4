"""A run's files: output folders (refused, cleared, checked writable), metrics rows as
JSON lines, TensorBoard scalars, the comparison table and the curves' figure.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import tempfile
import time
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import metrics as metrics_lib


# How a console message names a configuration field: by its path (``delay.buffer_size``),
# or by its flag when the command line runs (``cli`` sets ``config.as_flags`` here).
name_fields: Callable[[str], str] = lambda message: message


def warn(message: str):
  """A warning line on stderr, its fields named as ``name_fields`` says."""
  print(name_fields(message), file=sys.stderr, flush=True)


def json_row(row: dict) -> str:
  return json.dumps(checkpoint_lib.to_json_ready(row))


class TensorBoard:
  """Per-round scalars under ``<out_dir>/tb`` (tensorboardX's event files); a no-op when
  disabled.

  Written synchronously (tensorboardX's ``EventsWriter``, not ``SummaryWriter``, whose
  ``flush`` leaves the events still queued for its writer thread behind: a killed run lost
  its last rounds). ``purge_step``: the file starts with a session restart at that step,
  which makes TensorBoard discard the steps >= it of the earlier files (a resumed run
  writes them again).
  """

  _files = itertools.count(1)  # event file names have 1 s resolution: a suffix each

  def __init__(self, out_dir: str, enabled: bool, purge_step: Optional[int] = None):
    self.directory = os.path.join(out_dir, "tb") if enabled else None
    self.purge_step, self.writer = purge_step, None

  def _open(self):
    from tensorboardX import event_file_writer  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    os.makedirs(self.directory, exist_ok=True)
    self.writer = event_file_writer.EventsWriter(
        os.path.join(self.directory, "events"), f".{os.getpid()}.{next(self._files)}")
    if self.purge_step is not None:
      self.writer.write_event(event_pb2.Event(
          wall_time=time.time(), step=self.purge_step,
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  def write(self, rows: List[dict]):
    """Appends the rows' numeric fields (step = the 0-based round) and syncs the file."""
    if self.directory is None or not rows:
      return
    from tensorboardX import summary  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    if self.writer is None:
      self._open()
    now = time.time()
    for r in rows:
      for k, v in r.items():
        if k != "round" and isinstance(v, (int, float)) and v is not None:
          self.writer.write_event(event_pb2.Event(
              wall_time=now, step=int(r["round"]), summary=summary.scalar(k, float(v))))
    self.sync()

  def sync(self):
    """Puts every scalar written so far on disk (flush and fsync)."""
    if self.writer is not None:
      self.writer.flush()

  def close(self):
    if self.writer is not None:
      self.writer.close()
      self.writer = None


# What a run writes in its directory (``output.overwrite`` deletes these and nothing else);
# a multi-algorithm run also writes COMPARISON_OUTPUTS in output.output_dir.
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", "tb", "curves.png")


COMPARISON_OUTPUTS = ("comparison.md", "comparison.csv", "curves.png")


def previous_outputs(directory: str, outputs=RUN_OUTPUTS) -> List[str]:
  return [n for n in outputs if os.path.lexists(os.path.join(directory, n))]


def check_writable(directory: str, flag: str = "output.output_dir"):
  """Creates ``directory`` and writes (then removes) a file in it; a ValueError of one line
  naming ``flag``, the path and the cause (not a directory, permission, read-only or full
  disk) when it cannot."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
      pass
  except OSError as e:
    where = e.filename or directory
    raise ValueError(f"{flag}={directory}: cannot write there ({e.strerror or e}: {where}); "
                     f"give a writable {flag}") from None


def prepare_output_dir(directory: str, resume: bool, overwrite: bool,
                       outputs=RUN_OUTPUTS):
  """Refuses (ValueError naming output.output_dir) a directory that cannot be written, or one
  that holds a previous run unless ``resume``; with ``overwrite`` deletes that run's
  outputs first. Across processes (``fedjax_async.distributed``) every process checks the
  folder as it was and process 0 alone deletes."""
  from fedjax_async import distributed  # pylint: disable=g-import-not-at-top
  distributed.sync(f"prepare {directory}")  # no process has written into it yet
  _prepare(directory, resume, overwrite, outputs, delete=distributed.is_main())
  distributed.sync(f"prepared {directory}")


def _prepare(directory: str, resume: bool, overwrite: bool, outputs, delete: bool):
  found = previous_outputs(directory, outputs)
  if found and not (resume or overwrite):
    raise ValueError(f"output.output_dir: {directory} already holds a run ({', '.join(found)}): "
                     "pass output.resume to continue it, output.overwrite to start over, or "
                     "another "
                     "output.output_dir")
  check_writable(directory)  # after the refusal above: a refused folder is not touched
  if not found or resume or not delete:
    return
  for n in found:
    path = os.path.join(directory, n)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


INSECURE_CKKS = "INSECURE (crypto.ckks_preset=insecure_test: ring 2^11, no security level)"


def ckks_security(preset: str) -> str:
  """summary.json's ``ckks_security`` of a crypto.secure_aggregation=ckks run."""
  return INSECURE_CKKS if preset == "insecure_test" else "128-bit (HEStd_128_classic)"


def algorithm_label(summary: dict) -> str:
  """The algorithm's name in tables, marked when its CKKS preset is not secure."""
  insecure = summary.get("ckks_security", "").startswith("INSECURE")
  return summary["algorithm"] + (" [INSECURE CKKS]" if insecure else "")


def comparison_table(summaries: List[dict]) -> str:
  """Markdown: per run its three accuracy metrics (``metrics.KEYS``; the last-10 ones
  marked for runs of T <= 10 rounds) and wall time."""
  lines = ["| algorithm | final accuracy | last-10 mean accuracy | average best accuracy | "
           "wall time (s) |", "|---|---|---|---|---|"]
  short = False
  for s in summaries:
    rounds = int(s.get("rounds", metrics_lib.LAST + 1))
    short |= metrics_lib.is_short(rounds)
    cells = [metrics_lib.mark_short(f"{s.get(k, float('nan')):.4f}", k, rounds)
             for k in metrics_lib.KEYS]
    lines.append(f"| {algorithm_label(s)} | " + " | ".join(cells) +
                 f" | {s['wall_time_s']:.1f} |")
  if short:
    lines += ["", metrics_lib.SHORT_RUN_NOTE]
  return "\n".join(lines)


def write_comparison(summaries: List[dict], out_dir: str) -> str:
  table = comparison_table(summaries)
  with open(os.path.join(out_dir, "comparison.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(out_dir, "comparison.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["algorithm", *metrics_lib.KEYS, "rounds", "wall_time_s"])
    for s in summaries:
      w.writerow([algorithm_label(s), *(s.get(k) for k in metrics_lib.KEYS),
                  s.get("rounds"), s["wall_time_s"]])
  return table


def read_metrics(run_dir: str) -> List[dict]:
  """The rows of ``run_dir/metrics.jsonl``."""
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(runs: Dict[str, List[dict]], path: str, x_key: str = "round",
                loss_window: int = 1, title: str = "") -> int:
  """``path`` (PNG): test accuracy (where evaluated) and train loss against ``x_key``
  (the 1-based round, or the virtual clock's ``virtual_time``), one line per run of
  ``runs`` (name -> its metrics.jsonl rows); the loss as a running mean over
  ``loss_window`` rows (one arrival's loss is noisy). Returns the number of lines drawn."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10.0, 3.8))
  FigureCanvasAgg(fig)
  lines = 0
  for i, (key, label) in enumerate((("test_accuracy", "test accuracy"),
                                    ("train_loss", "train loss"))):
    ax = fig.add_subplot(1, 2, i + 1)
    for name, rows in runs.items():
      xy = [(r[x_key] + (x_key == "round"), r[key]) for r in rows
            if r.get(key) is not None and np.isfinite(r[key])]
      if key == "train_loss" and loss_window > 1:  # a running mean; none if too few rows
        ys = [y for _, y in xy]
        xy = [] if len(ys) < loss_window else list(zip(
            [x for x, _ in xy][loss_window - 1:],
            np.convolve(ys, np.ones(loss_window) / loss_window, "valid")))
      if xy:
        ax.plot(*zip(*xy), marker="." if len(xy) < 40 else None, label=name)
        lines += 1
    if key == "train_loss" and ax.lines and all(
        min(line.get_ydata()) > 0 for line in ax.lines):
      ax.set_yscale("log")  # FedADMM's loss can grow by orders of magnitude
    ax.set_xlabel(x_key.replace("_", " "))
    ax.set_ylabel(label if key != "train_loss" or loss_window == 1
                  else f"{label} (mean of {loss_window})")
    ax.grid(True, alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return lines


def figure_title(cfg, dataset: str, model: str, names: List[str],
                 swept: Sequence[str] = ()) -> str:
  """The data set, partition, model, delays and algorithms of a figure; a ``swept`` field
  is named as swept, not by its base value."""
  d = cfg.delay
  law = f"mean {d.mean:g}" if d.distribution == "geometric" else f"max {d.max_delay}"
  fraction = "δ swept" if "delay_fraction" in swept else f"δ = {d.fraction:g}"
  delays = (f"{fraction}, {d.distribution} delays ({law})"
            if d.fraction or "delay_fraction" in swept else "δ = 0")
  if model == "auto":
    from fedjax_async import models  # pylint: disable=g-import-not-at-top
    model = models.default_model_for(cfg.data.dataset)
  others = [n for n in swept if n != "delay_fraction"]
  return (f"{dataset} ({cfg.data.partition}, N = {cfg.data.num_clients}), {model}; {delays}; "
          f"{', '.join(names)}" + (f"; swept: {', '.join(others)}" if others else ""))
