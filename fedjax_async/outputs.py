"""A run's files: output folders (refused, cleared, checked writable, locked while a run
writes them), metrics rows as JSON lines, TensorBoard scalars, the comparison table and
the curves' figure.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import itertools
import json
import os
import shutil
import socket
import tempfile
import textwrap
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import console
from fedjax_async import distributed
from fedjax_async import figures
from fedjax_async import metrics as metrics_lib
from fedjax_async import models
from fedjax_async import results_table


# How a console message names a configuration field: by its path (``delay.buffer_size``),
# or by its flag when the command line runs (``cli`` sets ``cli.run_flags.as_flags`` here).
name_fields: Callable[[str], str] = lambda message: message


def warn(message: str):
  """A warning line on stderr, its fields named as ``name_fields`` says."""
  console.warn(name_fields(message))


def json_row(row: dict) -> str:
  return json.dumps(checkpoint_lib.to_json_ready(row))


def _tensorboardx():
  """(event_file_writer, summary, event_pb2) of tensorboardX, imported on first use."""
  from tensorboardX import event_file_writer, summary  # pylint: disable=g-import-not-at-top
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  return event_file_writer, summary, event_pb2


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
    event_file_writer, _, event_pb2 = _tensorboardx()
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
    _, summary, event_pb2 = _tensorboardx()
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
FINAL_MODEL = "final_model.npy"  # the final global model w, flat [d] float32
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "checkpoints", "tb", "curves.png", FINAL_MODEL)


COMPARISON_OUTPUTS = ("comparison.md", "comparison.csv", "curves.png")


def previous_outputs(directory: str, outputs=RUN_OUTPUTS) -> List[str]:
  return [n for n in outputs if os.path.lexists(os.path.join(directory, n))]


def _holds_a_run(path: str, depth: int = 3) -> bool:
  """A folder a run wrote: its files (``RUN_OUTPUTS``, a comparison) in it or in a
  subfolder up to ``depth`` levels down (``seed<s>/<algorithm>/``, ``runs/...``)."""
  if not os.path.isdir(path) or os.path.islink(path):
    return False
  if previous_outputs(path, RUN_OUTPUTS + COMPARISON_OUTPUTS):
    return True
  return depth > 0 and any(_holds_a_run(os.path.join(path, n), depth - 1)
                           for n in sorted(os.listdir(path)))


def stale_outputs(directory: str, keeps: Sequence[str]) -> List[str]:
  """What a previous run of any layout left in ``directory`` that a run writing ``keeps``
  (its top-level names) would not replace: run files and folders holding a run."""
  if not os.path.isdir(directory):
    return []
  top = RUN_OUTPUTS + COMPARISON_OUTPUTS
  return [n for n in sorted(os.listdir(directory)) if n not in keeps and (
      n in top or _holds_a_run(os.path.join(directory, n)))]


def clear_stale(directory: str, keeps: Sequence[str], resume: bool, overwrite: bool):
  """A previous run's files of another layout in ``directory`` (``stale_outputs``):
  refused (ValueError naming output.output_dir) unless ``overwrite``, which deletes them
  (process 0). ``resume`` continues a run of the same layout only."""
  stale = stale_outputs(directory, keeps)
  if stale and (resume or not overwrite):
    raise ValueError(f"output.output_dir: {directory} holds a run of another layout "
                     f"({', '.join(stale)}), which this run would not replace: pass "
                     "output.overwrite to delete it, or another output.output_dir")
  if stale and distributed.is_main():
    for n in stale:
      path = os.path.join(directory, n)
      shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


# ------------------------------------------------------------- one run per output folder

LOCK = ".fedjax_async.lock"
_locks: Dict[str, int] = {}  # real path -> the open, flock-ed lock file
_scopes: List[List[str]] = []  # the folders each active run_scope locked


@contextlib.contextmanager
def run_scope():
  """The output folders prepared inside (``prepare_output_dir``) are locked until it
  ends: ``simulate`` and each driver's entry point run in one. Outside any scope (a
  driver's parts called directly) nothing is locked."""
  _scopes.append([])
  try:
    yield
  finally:
    for key in _scopes.pop():
      fd = _locks.pop(key)
      with contextlib.suppress(OSError):
        os.remove(os.path.join(key, LOCK))  # (before the unlock)
      os.close(fd)


def lock_output_dir(directory: str):
  """An advisory lock (``flock`` of the folder itself, so a refused folder is not
  touched) on ``directory`` for the active ``run_scope``; a folder locked by another run:
  ValueError naming output.output_dir and that run (its ``LOCK`` note). Process 0 alone
  locks (the others write nothing)."""
  key = os.path.realpath(directory)
  if not _scopes or key in _locks or not distributed.is_main():
    return
  try:
    os.makedirs(key, exist_ok=True)
    fd = os.open(key, os.O_RDONLY)
  except OSError:
    return  # not a folder one can write: check_writable says why
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    try:
      with open(os.path.join(key, LOCK)) as f:
        other = f.read().strip()
    except OSError:
      other = ""
    raise ValueError(f"output.output_dir: {directory} is in use by another run "
                     f"({other or 'a process holding its lock'}): wait for it to end, or "
                     "give another output.output_dir") from None
  _locks[key] = fd
  _scopes[-1].append(key)


def note_lock_holder(directory: str):
  """``LOCK``: who holds ``directory``'s lock (once it is not refused; removed at the
  scope's end)."""
  key = os.path.realpath(directory)
  if key in _locks:
    with open(os.path.join(key, LOCK), "w") as f:
      f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}")


def write_final_model(directory: str, w) -> None:
  """``FINAL_MODEL``: the final global model (a replicated array: its local copy); none
  when the run ended in a signal that took its last state with it (donated)."""
  if getattr(w, "is_deleted", lambda: False)():
    return
  if getattr(w, "is_fully_addressable", True) is False:
    w = w.addressable_data(0)
  np.save(os.path.join(directory, FINAL_MODEL), np.asarray(w, np.float32))


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
  folder as it was and process 0 alone deletes. The runs of a packed folder
  (``results_table``) are written back first; ``overwrite`` deletes its runs.jsonl."""
  lock_output_dir(directory)  # first: a folder in use is neither refused nor cleared
  packed = os.path.join(directory, results_table.FILE)
  if distributed.is_main() and not overwrite:
    results_table.unpack_missing(directory)
  distributed.sync(f"prepare {directory}")  # no process has written into it yet
  _prepare(directory, resume, overwrite, outputs, delete=distributed.is_main())
  note_lock_holder(directory)
  if distributed.is_main() and overwrite and os.path.isfile(packed):
    os.remove(packed)
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


# The sample standard deviation of a configuration's seeds in every table.
DDOF = 1
SEEDS_NOTE = (f"mean ± std (n): over the n seeds of a configuration that did not diverge, "
              f"the sample std (ddof {DDOF})")


def seed_of(summary: dict) -> Optional[int]:
  """A run's seed: its summary's ``seed``, else its stored configuration's."""
  seed = summary.get("seed", (summary.get("config") or {}).get("seed"))
  return None if seed is None else int(seed)


def data_seed_of(summary: dict) -> Optional[int]:
  """The seed a run's data and partition were drawn from: its summary's ``data_seed``,
  else its stored configuration's (None there: its ``seed``); None when not stored."""
  config = summary.get("config") or {}
  seed = summary.get("data_seed")
  if seed is None and "data_seed" in config:
    seed = config["data_seed"] if config["data_seed"] is not None else config.get("seed")
  return None if seed is None else int(seed)


def mean_std(values: Sequence[float]) -> Tuple[float, float, int]:
  """(mean, sample std of ``DDOF``, n) of the finite ``values``; (nan, nan, 0) of none,
  std 0 of one."""
  v = np.array([x for x in values if x is not None and np.isfinite(x)], float)
  if not v.size:
    return float("nan"), float("nan"), 0
  return float(v.mean()), float(v.std(ddof=DDOF)) if v.size > DDOF else 0.0, int(v.size)


def seed_cell(values: Sequence[float], fmt: str = ".4f") -> str:
  """A table's cell of one configuration's seeds: the value of one, ``mean ± std (n)`` of
  several (``mean_std``)."""
  mean, std, n = mean_std(values)
  return f"{mean:{fmt}}" if n <= 1 else f"{mean:{fmt}} ± {std:{fmt}} ({n})"


def reach_cell(values: Sequence[Optional[float]], fmt: str = ".2f",
               integer: bool = False) -> str:
  """A table's cell of the time (or the count, ``integer``) to a target over seeds, None
  where not reached: the value of one, ``seed_cell`` of those that reached it and how many
  did not; "not reached" when none did."""
  reached = [v for v in values if v is not None]
  if not reached:
    return "not reached"
  cell = (str(int(reached[0])) if integer and len(reached) == 1
          else seed_cell(reached, ".1f" if integer else fmt))
  missing = len(values) - len(reached)
  return cell + (f", {missing} not reached" if missing else "")


def comparison_table(summaries: List[dict]) -> str:
  """Markdown: one line per configuration, its algorithm and each swept field of its
  summaries' ``setting`` ("–" where the algorithm does not use it; values in numeric
  order), with its three accuracy metrics (``metrics.KEYS``; the last-10 ones marked for
  runs of T <= 10 rounds) and mean wall time: the value of its one seed, or mean ± std (n)
  over its seeds (``seed_cell``; diverged runs left out and named); with run.target_accuracy
  a, the rounds to a (``reach_cell``)."""
  names = list(dict.fromkeys(n for s in summaries for n in (s.get("setting") or {})))
  target = next((s["target_accuracy"] for s in summaries if "target_accuracy" in s), None)
  groups: Dict[tuple, List[dict]] = {}
  for s in summaries:
    setting = s.get("setting") or {}
    groups.setdefault((algorithm_label(s),) + tuple(setting.get(n) for n in names),
                      []).append(s)
  order = list(dict.fromkeys(k[0] for k in groups))
  keys = sorted(groups, key=lambda k: (order.index(k[0]),) + tuple(
      (v is not None, v) for v in k[1:]))
  lines = ["| algorithm | " + "".join(f"{n} | " for n in names) + "final accuracy | "
           "last-10 mean accuracy | average best accuracy | "
           + (f"rounds to {target:g} | " if target else "") + "wall time (s) |",
           "|---" * (len(names) + 5 + bool(target)) + "|"]
  short = several = False
  diverged = []
  for key in keys:
    group = groups[key]
    ok = [s for s in group if s.get("diverged_round") is None]
    diverged += [" ".join([key[0], *(f"{n}={v:g}" for n, v in zip(names, key[1:])
                                      if v is not None), f"seed {seed_of(s)}"])
                 for s in group if s.get("diverged_round") is not None]
    rounds = int(group[0].get("rounds", metrics_lib.LAST + 1))
    short |= metrics_lib.is_short(rounds)
    several |= len(ok) > 1
    cells = [metrics_lib.mark_short(seed_cell([s.get(k, float("nan")) for s in ok]),
                                    k, rounds) if ok else "diverged" for k in metrics_lib.KEYS]
    if target:
      cells.append(reach_cell([s.get("rounds_to_target") for s in ok], integer=True)
                   if ok else "diverged")
    lines.append("| " + " | ".join([key[0], *("–" if v is None else f"{v:g}" for v in key[1:]),
                                    *cells]) +
                 f" | {np.mean([s['wall_time_s'] for s in group]):.1f} |")
  if short or several or diverged or target:
    lines.append("")
  if several:
    lines.append(SEEDS_NOTE + ".")
  if target:
    lines.append(f"Rounds to {target:g}: the first evaluated round whose test accuracy is "
                 f">= {target:g}" + ("; mean ± std over the seeds that reached it" if several
                                     else "") + ".")
  if diverged:
    lines.append(f"Diverged (a non-finite loss), left out: {', '.join(diverged)}.")
  if short:
    lines.append(metrics_lib.SHORT_RUN_NOTE)
  return "\n".join(lines)


def write_comparison(summaries: List[dict], out_dir: str) -> str:
  table = comparison_table(summaries)
  with open(os.path.join(out_dir, "comparison.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(out_dir, "comparison.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["algorithm", *metrics_lib.KEYS, "rounds", "wall_time_s", "seed",
                "data_seed"])
    for s in summaries:
      w.writerow([algorithm_label(s), *(s.get(k) for k in metrics_lib.KEYS),
                  s.get("rounds"), s["wall_time_s"], seed_of(s), data_seed_of(s)])
  return table


def read_metrics(run_dir: str) -> List[dict]:
  """The rows of ``run_dir/metrics.jsonl``."""
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return metrics_lib.count_from_one([json.loads(line) for line in f if line.strip()])


# ------------------------------------------------------------------------- figures

RAW_ALPHA = 0.25  # the raw loss, drawn faint behind its smoothed curve
BAND_ALPHA = 0.2  # the shaded +-1 std band over seeds


def ema(values: Sequence[float], weight: float) -> np.ndarray:
  """Exponential moving average: s_0 = v_0, s_t = weight * s_(t-1) + (1 - weight) * v_t."""
  v = np.asarray(values, float)
  out = np.empty_like(v)
  for t, x in enumerate(v):
    out[t] = x if t == 0 else weight * out[t - 1] + (1.0 - weight) * x
  return out


def ema_weight(num_points: int) -> float:
  """The loss curves' EMA weight for ``num_points`` points: 1 - 1/span with a span of
  1/20 of the points (at most 200); 0 (no smoothing) under 40 points."""
  span = min(num_points / 20, 200.0)
  return 0.0 if span < 2 else round(1.0 - 1.0 / span, 3)


def seed_band(curves: Sequence[tuple], ddof: int = 0):
  """``(x, mean, std, interpolated)`` of several seeds' curves ``[(xs, ys), ...]``: numpy's
  mean and std (``ddof``) over the seeds at each x. Curves at the same xs are combined as
  they are; otherwise each is interpolated linearly at every curve's xs inside the range
  all of them cover (``interpolated``: True). None when they share no x range."""
  curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves]
  x0 = curves[0][0]
  if all(len(x) == len(x0) and np.array_equal(x, x0) for x, _ in curves):
    ys, interpolated = np.stack([y for _, y in curves]), False
  else:
    lo, hi = max(x.min() for x, _ in curves), min(x.max() for x, _ in curves)
    x0 = np.unique(np.concatenate([x for x, _ in curves]))
    x0 = x0[(x0 >= lo) & (x0 <= hi)]
    if not len(x0):
      return None
    ys, interpolated = np.stack([np.interp(x0, x, y) for x, y in curves]), True
  return x0, ys.mean(axis=0), ys.std(axis=0, ddof=ddof), interpolated


def wrap_title(title: str, width: int = 115) -> str:
  """``title`` broken at spaces into lines of at most ``width`` characters (a 10-inch
  figure's suptitle at font size 9-10)."""
  return "\n".join(textwrap.wrap(title, width)) if len(title) > width else title


def seeds_note(seeds: Sequence[int]) -> str:
  """A figure title's note of the seeds averaged ('' for one): which ones, and the band's
  std (``DDOF``, as the tables')."""
  return (f"seeds {', '.join(map(str, seeds))}: mean ± sample std (ddof {DDOF})"
          if len(seeds) > 1 else "")


def seeds_label(name: str, num_seeds: int) -> str:
  """A curve's legend: ``name``, with "mean ± std over N seeds" when N > 1."""
  return name if num_seeds <= 1 else f"{name} (mean ± std over {num_seeds} seeds)"


def curve_points(rows: List[dict], key: str, x_key: str = "round"):
  """``(xs, ys)`` of the rows where ``key`` is finite (None: none): x the 1-based round
  (rows stored counting from 0 shifted by one) or the row's ``x_key``."""
  shift = x_key == "round" and bool(rows) and rows[0].get("round") == 0
  xy = [(r[x_key] + shift, r[key]) for r in rows
        if r.get(key) is not None and np.isfinite(r[key])]
  return tuple(np.array(v, float) for v in zip(*xy)) if xy else None


X_LABELS = {"virtual_time": "virtual time (simulated s)"}  # curves' x axes, by row key


def plot_curves(runs: Dict[str, list], path: str, x_key: str = "round", title: str = "",
                loss_ema: Optional[float] = None, ddof: int = 0) -> int:
  """``path`` (PNG): test accuracy (where evaluated) and train loss against ``x_key`` (the
  1-based round, or the virtual clock's ``virtual_time``), one curve per run of ``runs``
  (name -> its metrics.jsonl rows, or a list of several seeds' rows: their mean with a
  shaded +-1 std band of ``ddof``, "mean ± std over N seeds" in the legend). The loss is
  smoothed, an EMA of weight ``loss_ema`` (None: ``ema_weight`` of the longest run), the
  raw loss faint behind it. Returns the number of curves drawn (faint raw losses not
  counted).

  Args:
    runs: a run's name -> its metrics rows, or a list of several seeds' rows.
    path: the PNG to write.
    x_key: the x axis: ``round`` or ``virtual_time``.
    title: the figure's title.
    loss_ema: the train loss's EMA weight (None: ``ema_weight`` of the longest run).
    ddof: the seeds' std's delta degrees of freedom.
  """
  fig = figures.new_figure((10.0, 3.8))
  per_run = {n: v if v and isinstance(v[0], list) else [v] for n, v in runs.items()}
  if loss_ema is None:
    loss_ema = ema_weight(max([sum(r.get("train_loss") is not None for r in rows)
                               for seeds in per_run.values() for rows in seeds] or [0]))
  drawn = 0
  for i, (key, label) in enumerate((("test_accuracy", "test accuracy"),
                                    ("train_loss", "train loss"))):
    ax = fig.add_subplot(1, 2, i + 1)
    smooth = key == "train_loss" and loss_ema > 0
    interpolated, positive = False, True
    for j, (name, seeds) in enumerate(per_run.items()):
      raw = [c for c in (curve_points(rows, key, x_key) for rows in seeds) if c is not None]
      if not raw:
        continue
      positive &= all(np.all(y > 0) for _, y in raw)
      curves = [(x, ema(y, loss_ema)) for x, y in raw] if smooth else raw
      if len(curves) == 1:
        (x, y), std = curves[0], None
        raw_line = raw[0]
      else:
        band = seed_band(curves, ddof)
        if band is None:
          continue
        x, y, std, interp = band
        interpolated |= interp
        raw_line = seed_band(raw)[:2]
      color = f"C{j % 10}"
      if smooth:
        ax.plot(*raw_line, color=color, alpha=RAW_ALPHA, linewidth=0.8)
      ax.plot(x, y, color=color, marker="." if len(x) < 40 else None,
              label=seeds_label(name, len(curves)))
      if std is not None:
        ax.fill_between(x, y - std, y + std, color=color, alpha=BAND_ALPHA, linewidth=0)
      drawn += 1
    if key == "train_loss" and ax.lines and positive:
      ax.set_yscale("log")  # FedADMM's loss can grow by orders of magnitude
    ax.set_xlabel(X_LABELS.get(x_key, x_key.replace("_", " ")) + (
        "\n(seeds interpolated linearly to common points)" if interpolated else ""))
    ax.set_ylabel(f"{label}, EMA (weight {loss_ema:g}); raw faint" if smooth else label)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.suptitle(wrap_title(title or ", ".join(per_run)), fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return drawn


def data_label(data_cfg, dataset: str) -> str:
  """The data set and its partition as loaded: the synthetic sets have their natural
  partition (``data.partition`` does not apply to them), image sets ``data.partition``."""
  name = dataset.lower()
  if name.startswith("synthetic_iid"):
    part = "IID by construction"
  elif name.startswith("synthetic"):
    part = "natural partition, one generator per client"
  elif data_cfg.partition == "dirichlet":
    part = f"Dirichlet α = {data_cfg.dirichlet_alpha:g}"
  elif data_cfg.partition == "shards":
    part = f"shards, {data_cfg.shards_per_client} per client"
  else:
    part = {"iid": "IID"}.get(data_cfg.partition, data_cfg.partition)
  return f"{dataset} ({part}, N = {data_cfg.num_clients})"


def model_label(data_cfg, model: str) -> str:
  """The model built: ``model``, or for "auto" the data set's default model."""
  if model != "auto":
    return model
  try:
    return models.default_model_for(data_cfg.dataset)
  except ValueError:
    return "the data set's default model"


def _values(values) -> str:
  return ", ".join(f"{v:g}" for v in sorted(values))


def figure_title(cfg, dataset: str, model: str, names: List[str],
                 swept=()) -> str:
  """The data set, partition, model, delays and algorithms of a figure. ``swept``: the
  swept fields (names, or name -> values): each is named as swept, with its values when
  given, never by its base value.

  Args:
    cfg: the run's config (its ``data`` and ``delay``).
    dataset: the data set's name.
    model: the model's name.
    names: the algorithms drawn.
    swept: the swept fields: names, or name -> values.
  """
  swept = swept if isinstance(swept, dict) else {n: () for n in swept}
  d = cfg.delay
  law = f"mean {d.mean:g}" if d.distribution == "geometric" else f"max {d.max_delay}"
  if "delay_fraction" in swept:
    values = swept["delay_fraction"]
    fraction = "δ swept" + (f": {_values(values)}" if len(values) else "")
    delays = f"{fraction}, {d.distribution} delays ({law})"
  else:
    delays = f"δ = {d.fraction:g}, {d.distribution} delays ({law})" if d.fraction else "δ = 0"
  others = [n + (f" {_values(v)}" if len(v) else "") for n, v in swept.items()
            if n != "delay_fraction"]
  return (f"{data_label(cfg.data, dataset)}, {model_label(cfg.data, model)}; {delays}; "
          f"{', '.join(names)}" + (f"; swept: {'; '.join(others)}" if others else ""))
