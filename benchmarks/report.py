"""Markdown tables of the benchmarks' rows (``benchmarks/results/*.jsonl``), by machine.

  PYTHONPATH=. .venv/bin/python benchmarks/report.py                       # every row
  ... --tag=epyc_fast_ringslot,epyc_fast_ringslot_2dev --output=report.md  # some runs

One table per benchmark (fraction of peak, throughput, scaling, multidevice, peers). For
each machine, tag and configuration the newest row is shown (rows carry a UTC ``time``;
older rows without one count in file order). The machine is the accelerator
(``device_kind`` x devices) or, on CPU, the CPU model and its widest vector ISA. No JAX
import: it reads files only.
"""

from __future__ import annotations

import glob
import json
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


from absl import app, flags  # noqa: E402

from benchmarks import flagcheck  # noqa: E402
from benchmarks import paths  # noqa: E402

# As common.RESULTS_DIR (not imported from there: common imports JAX)
RESULTS_DIR = paths.RESULTS_DIR


def _num(v) -> Optional[float]:
  try:
    v = float(v)
  except (TypeError, ValueError):
    return None
  return None if math.isnan(v) else v


def fmt(kind: str) -> Callable[[Any], str]:
  """A cell formatter: "pct" 0.285 -> "28.5 %", "x" 1.1 -> "1.10x", "int", "g3" (3
  significant digits), "ms" seconds -> milliseconds, "mib" bytes -> MiB ("mib3": 3
  significant digits), "str"."""

  def f(v):
    if kind == "str":
      return "" if v is None else str(v)
    x = _num(v)
    if x is None:
      return "-"
    if kind == "pct":
      return f"{100 * x:.1f} %"
    if kind == "x":
      return f"{x:.2f}x"
    if kind == "int":
      return f"{x:,.0f}"
    if kind == "ms":
      return f"{1e3 * x:.3g}"
    if kind == "mib":
      return f"{x / 2**20:,.0f}"
    if kind == "mib3":
      return f"{x / 2**20:.3g}"
    return f"{x:.3g}"

  return f


def _clients_per_s(r) -> Optional[float]:
  """Clients trained per second: K x rounds per timed call / seconds (fraction_of_peak's
  rows), or client-steps/s / local steps (throughput's)."""
  steps_per_s, steps = _num(r.get("engine_steps_per_s")), _num(r.get("local_steps"))
  if steps_per_s is not None and steps:
    return steps_per_s / steps
  k, rounds, secs = (_num(r.get(f)) for f in ("clients_per_round", "rounds", "engine_s"))
  return k * rounds / secs if k and rounds and secs else None


def _not_run(r) -> str:
  """Why a system has no time (peers.py's ``note``), else empty."""
  if _num(r.get("s_per_round")) is not None:
    return ""
  note = str(r.get("note", "")).replace("|", "/")
  return f"NOT RUN: {note[:160]}" if note else "NOT RUN"


def _s_per_round_or_why_not(r) -> str:
  """A peer's seconds per round, or why it has none (``_not_run``)."""
  return _not_run(r) or fmt("g3")(r.get("s_per_round"))


def _uploads(r) -> str:
  """How a row's round held its uploads: "summed" chunk by chunk (``stream_uploads``),
  "[K, d]", or "" where the row does not say (rows before the field)."""
  if "stream_uploads" not in r:
    return ""
  return "summed" if r["stream_uploads"] else "[K, d]"


def _peak_memory(r) -> Optional[float]:
  """``common.peak_memory`` without its JAX import (None where a row has neither)."""
  dev = _num(r.get("peak_device_bytes"))
  return dev if dev is not None else _num(r.get("peak_rss"))


# benchmark -> (title, row filter, [(header, key or function, format)], number of leading
# columns that identify a configuration)
Column = Tuple[str, Any, str]
SPECS: Dict[str, Tuple[str, Callable[[dict], bool], List[Column], int]] = {
    "peaks": (
        "Dense matmul peak per precision, beside the datasheet (`peaks.py`)",
        lambda r: True,
        [("precision", "precision", "str"), ("n", "n", "int"),
         ("measured GFLOP/s", "peak_gflops", "g3"),
         ("datasheet TFLOP/s", lambda r: r.get("datasheet_tflops") or "unknown", "str"),
         ("of the datasheet", "fraction_of_datasheet", "pct")], 1),
    "paper_shapes": (
        "The CNN round at Table V's shapes, runs vmapped, per precision "
        "(`paper_shapes.py`)",
        lambda r: True,
        [("model", "model", "str"), ("convolutions", "impl", "str"),
         ("precision", "precision", "str"),
         ("runs", "runs", "int"), ("local steps", "local_steps", "int"),
         ("batch", "batch", "int"), ("examples/s", "examples_per_s", "g3"),
         ("GFLOP/s", "gflops_analytic", "g3"), ("peak", "peak_precision", "str"),
         ("peak GFLOP/s", "peak_gflops", "g3"),
         ("fraction of peak (counted from the model)", "fraction_of_peak_analytic", "pct"),
         ("FLOP/byte (model FLOPs / XLA bytes)", "arithmetic_intensity", "g3"),
         ("bound", "roofline_bound", "str"),
         ("roofline GFLOP/s", "roofline_gflops", "g3"),
         ("fraction of roofline", "fraction_of_roofline", "pct"),
         ("s per paper run (T = 100)", "projected_run_s", "g3")], 6),
    "bandwidth": (
        "Device memory bandwidth, bytes read + written (`peaks.py`)",
        lambda r: True,
        [("MiB streamed", lambda r: r["nbytes"] / 2**20, "g3"),
         ("GB/s", "gbytes_per_s", "g3")], 1),
    "fraction_of_peak": (
        "A round's FLOP/s as a fraction of the matmul peak (`fraction_of_peak.py`)",
        lambda r: True,
        [("model", "model", "str"), ("K", "clients_per_round", "int"),
         ("local steps", "local_steps", "int"), ("client_chunk", "client_chunk", "str"),
         ("clients/s", _clients_per_s, "g3"),
         ("GFLOP/s", "gflops", "g3"), ("peak GFLOP/s", "peak_gflops", "g3"),
         ("fraction of peak (XLA's FLOP count)", "fraction_of_peak", "pct"),
         ("fraction of peak (counted from the model)", "fraction_of_peak_analytic", "pct"),
         ("engine / loop", "speedup_vs_loop", "x")], 4),
    "throughput": (
        "Engine vs per-client loops (`throughput.py`)",
        lambda r: True,
        [("model", "model", "str"), ("K", "clients_per_round", "int"),
         ("engine devices", lambda r: r.get("engine_devices", 1), "int"),
         ("engine client-steps/s", "engine_steps_per_s", "int"),
         ("engine clients/s", _clients_per_s, "int"),
         ("engine / jit loop", "speedup_vs_loop", "x"),
         ("engine / fedjax loop", "speedup_vs_fedjax_loop", "x"),
         ("sharded engine / jit loop", "speedup_sharded_vs_loop", "x")], 3),
    "scaling": (
        "Time and peak memory per round (`scaling.py`)",
        lambda r: r.get("sweep") in ("k", "k_kept", "n", "verify") and "failed" not in r,
        [("model", "model", "str"), ("sweep", "sweep", "str"),
         ("K", "clients_per_round", "int"), ("N", "num_clients", "int"),
         ("uploads", _uploads, "str"),
         ("s/round", "s_per_round", "g3"), ("peak memory (MiB)", _peak_memory, "mib"),
         ("memory", lambda r: "device" if _num(r.get("peak_device_bytes")) is not None
          else "RSS", "str")], 5),
    "scaling_fit": (
        "Bytes per simulated client and the largest N that fits (`scaling.py --sweep=n`)",
        lambda r: r.get("sweep") == "n_fit",
        [("model", "model", "str"), ("K", "clients_per_round", "int"),
         ("bytes/client", "bytes_per_client", "int"),
         ("strict bytes/client", "strict_bytes_per_client", "int"),
         ("measured / strict", "ratio_to_strict", "x"),
         ("largest N", "max_clients_in_budget", "int"), ("budget GiB", "budget_gib", "g3")],
        2),
    "scaling_k_fit": (
        "Memory per client slot and the largest K per round that fits "
        "(`scaling.py --sweep=k_fit`)",
        lambda r: r.get("sweep") == "k_fit",
        [("model", "model", "str"), ("uploads", _uploads, "str"),
         ("MiB per client slot", "bytes_per_slot", "mib3"),
         ("one upload (MiB)", "upload_bytes", "mib3"),
         ("intercept (MiB)", "intercept_bytes", "mib"),
         ("largest K", "max_k_in_budget", "int"), ("budget GiB", "budget_gib", "g3")], 2),
    "multidevice": (
        "Client axis sharded over devices (`multidevice.py`)",
        lambda r: True,
        [("scaling", "scaling", "str"), ("model", "model", "str"),
         ("devices", "devices", "int"),
         ("forced host devices", lambda r: "yes" if r.get("forced_host_devices") else "no",
          "str"),
         ("K", "clients_per_round", "int"), ("ms/round", "s_per_round", "ms"),
         ("efficiency", "efficiency", "g3"),
         ("max abs diff vs unsharded", "max_abs_diff_vs_unsharded", "g3")], 4),
    "multiprocess": (
        "Client axis sharded over processes, localhost (`multiprocess_scaling.py`)",
        lambda r: True,
        [("scaling", "scaling", "str"), ("model", "model", "str"),
         ("processes", "processes", "int"), ("devices each", "devices_per_process", "int"),
         ("client data", "client_data", "str"), ("K", "clients_per_round", "int"),
         ("ms/round", "s_per_round", "ms"), ("efficiency", "efficiency", "g3")], 4),
    "peers": (
        "pfl-research's CIFAR-10 workload, four systems in one run (`peers.py`)",
        lambda r: True,
        [("system", "system", "str"), ("K", "clients_per_round", "int"),
         ("s/round", _s_per_round_or_why_not, "str"), ("GFLOP/s", "gflops", "g3"),
         ("fraction of peak", "fraction_of_peak", "pct"),
         ("engine speed-up over it", "engine_speedup", "x")], 2),
}
SOURCE = {"scaling_fit": "scaling", "scaling_k_fit": "scaling"}


def machine_label(r: dict) -> str:
  """``"NVIDIA H100 80GB HBM3 x1 (gpu)"``, or the CPU model on CPU; with the allocator
  when it is not the system's (``"AMD EPYC [avx512f], tcmalloc"``)."""
  backend = r.get("backend", "cpu")
  if backend != "cpu" and r.get("device_kind"):
    label = f"{r['device_kind']} x{r.get('devices', 1)} ({backend})"
  else:
    label = str(r.get("cpu", "?"))
  alloc = r.get("allocator", "system")
  return label if alloc == "system" else f"{label}, {alloc}"


def load(results_dir: str = RESULTS_DIR) -> List[dict]:
  """Every row of ``results_dir/*.jsonl``, in file order, each with ``bench`` set."""
  rows = []
  for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
    bench = os.path.basename(path)[:-len(".jsonl")]
    with open(path) as f:
      for i, line in enumerate(f):
        if not line.strip():
          continue
        try:
          r = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{i + 1}: not a JSON line ({e})") from None
        r.setdefault("bench", bench)
        rows.append(r)
  return rows


def _cell(r: dict, key, kind: str) -> str:
  return fmt(kind)(key(r) if callable(key) else r.get(key))


def newest(rows: Sequence[dict], ident: Callable[[dict], tuple]) -> List[dict]:
  """The newest row for each ``ident(row)``, in the order the identities first appear.
  Newer: a later ``time`` (rows without one are older than rows with one), then a later
  position."""
  best: Dict[tuple, Tuple[tuple, dict]] = {}
  order: List[tuple] = []
  for pos, r in enumerate(rows):
    k = ident(r)
    rank = (r.get("time") or "", pos)
    if k not in best:
      order.append(k)
    if k not in best or rank >= best[k][0]:
      best[k] = (rank, r)
  return [best[k][1] for k in order]


def select(rows: Sequence[dict], tag: Optional[str] = None,
           tags: Optional[Sequence[str]] = None, machine: str = "") -> List[dict]:
  """Only tag ``tag`` (or those in ``tags``) and machines whose label contains
  ``machine``, when given."""
  wanted = set(tags or ()) | ({tag} if tag is not None else set())
  return [r for r in rows if (not wanted or r.get("tag", "") in wanted)
          and machine.lower() in machine_label(r).lower()]


def render(rows: Sequence[dict], tag: Optional[str] = None,
           tags: Optional[Sequence[str]] = None, machine: str = "") -> str:
  """The markdown report of ``rows`` (``select``ed by ``tag`` / ``tags`` / ``machine``)."""
  rows = select(rows, tag, tags, machine)
  out = []
  for name, (title, keep, cols, n_ident) in SPECS.items():
    mine = [r for r in rows if r.get("bench") == SOURCE.get(name, name) and keep(r)]
    if not mine:
      continue

    def ident(r, cols=cols, n_ident=n_ident):
      return (machine_label(r), r.get("tag", "")) + tuple(
          _cell(r, key, kind) for _, key, kind in cols[:n_ident])

    heads = ["machine", "tag"] + [h for h, _, _ in cols]
    out += [f"### {title}", "", "| " + " | ".join(heads) + " |",
            "|" + "---|" * len(heads)]
    for r in newest(mine, ident):
      cells = [machine_label(r), r.get("tag", "")] + [_cell(r, k, kind) for _, k, kind in cols]
      out.append("| " + " | ".join(cells) + " |")
    out.append("")
  return "\n".join(out) if out else "(no rows)\n"


# Figures: (file, title, benchmark, row filter, x key (log scale), [(y label, y value,
# log y[, the target: a dashed line])])
PLOTS = (
    ("fraction_of_peak.png", "A round's FLOP/s as a fraction of the matmul peak",
     "fraction_of_peak", lambda r: True, "clients_per_round",
     [("fraction of peak (XLA's FLOP count)", lambda r: _num(r.get("fraction_of_peak")),
       False, 0.40),
      ("fraction of peak (counted from the model)",
       lambda r: _num(r.get("fraction_of_peak_analytic")), False, 0.40),
      ("engine / per-client jit loop", lambda r: _num(r.get("speedup_vs_loop")), False,
       1.0)]),
    ("throughput.png", "Logistic regression: engine vs the per-client jit loop",
     "throughput", lambda r: r.get("model") == "logreg", "clients_per_round",
     [("engine / jit loop, one device", lambda r: _num(r.get("speedup_vs_loop")), False,
       10.0),
      ("engine over all devices / jit loop",
       lambda r: _num(r.get("speedup_sharded_vs_loop")), False, 10.0)]),
    ("scaling_n.png", "PAFed: round time and peak memory vs total clients N", "scaling",
     lambda r: r.get("sweep") == "n" and "failed" not in r, "num_clients",
     [("seconds per round", lambda r: _num(r.get("s_per_round")), True),
      ("peak memory (GiB)", lambda r: (_peak_memory(r) or 0) / 2**30 or None, True)]),
    ("scaling_k.png", "FedAvg: round time and peak memory vs clients per round K",
     "scaling", lambda r: r.get("sweep") in ("k", "k_kept") and "failed" not in r,
     "clients_per_round",
     [("seconds per round", lambda r: _num(r.get("s_per_round")), True),
      ("peak memory (GiB)", lambda r: (_peak_memory(r) or 0) / 2**30 or None, True)]),
)


def _series(r: dict) -> str:
  """A figure line's name after machine and tag: the model, and how the round held its
  uploads where the K sweep ran both ways (``scaling.py --sweep=k_fit``)."""
  return f"{r.get('model')}, uploads [K, d]" if r.get("sweep") == "k_kept" else str(
      r.get("model"))


# At most this many lines are named in a figure's legend (below its panels); the others
# are drawn and counted in one more entry (many tags: choose some with --tag).
LEGEND_MAX = 12
_MARKERS = "osv^D<>ph*"


def _legend(fig, handles: Dict[str, Any], targets: Dict[str, Any], width: float,
            height: float) -> None:
  """One legend for the whole figure, below its panels, in small print: the first
  ``LEGEND_MAX`` lines' names, the targets, and how many lines are not named."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  names = list(handles)[:LEGEND_MAX]
  entries = [(handles[n], n) for n in names] + [(h, n) for n, h in targets.items()]
  if len(handles) > LEGEND_MAX:
    entries.append((Line2D([], [], linestyle="none"),
                    f"... and {len(handles) - LEGEND_MAX} more lines, not named here "
                    "(choose runs with --tag)"))
  ncol = max(1, int(width // 3.3))
  legend_h = 0.14 * -(-len(entries) // ncol) + 0.15  # inches: rows of 6 pt text
  fig.set_size_inches(width, height + legend_h)
  fig.tight_layout(rect=(0, legend_h / (height + legend_h), 1, 1))
  fig.legend(*zip(*entries), loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
             fontsize=6, frameon=False)


def plot(rows: Sequence[dict], out_dir: str) -> Dict[str, int]:
  """Line plots of ``rows`` (already filtered) into ``out_dir``: for each figure of
  ``PLOTS`` with data, one panel per quantity, one line per (machine, tag, ``_series``),
  x on a log scale, and one legend below the panels (``_legend``: at most ``LEGEND_MAX``
  lines named). Returns {file: number of lines} for the figures written."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  written = {}
  for fname, title, bench, keep, xkey, panels in PLOTS:
    mine = [r for r in rows if r.get("bench") == bench and keep(r)]
    series: Dict[tuple, Dict[float, dict]] = {}
    for r in newest(mine, lambda r: (machine_label(r), r.get("tag", ""), _series(r),
                                     r.get(xkey))):
      x = _num(r.get(xkey))
      if x:
        series.setdefault((machine_label(r), r.get("tag", ""), _series(r)), {})[x] = r
    if not series:
      continue
    width, height = 5.0 * len(panels), 3.8
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    lines = 0
    handles: Dict[str, Any] = {}  # line name -> its first line (same style in every panel)
    targets: Dict[str, Any] = {}
    for i, (ylabel, yfn, logy, *target) in enumerate(panels):
      ax = fig.add_subplot(1, len(panels), i + 1)
      for j, ((mach, tag, model), pts) in enumerate(series.items()):
        xy = [(x, yfn(r)) for x, r in sorted(pts.items()) if yfn(r) is not None]
        if xy:
          name = " ".join(filter(None, (mach, tag, model)))
          line, = ax.plot(*zip(*xy), color=f"C{j % 10}",
                          marker=_MARKERS[j // 10 % len(_MARKERS)], label=name)
          handles.setdefault(name, line)
          lines += 1
      if target and ax.lines:
        name = f"the issue's target ({target[0]:g})"
        targets.setdefault(name, ax.axhline(target[0], color="gray", linestyle="--",
                                            linewidth=1, label=name))
      ax.set_xscale("log")
      if logy:
        ax.set_yscale("log")
      ax.set_xlabel(xkey.replace("_", " "))
      ax.set_ylabel(ylabel)
      ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    if handles:
      _legend(fig, handles, targets, width, height)
    else:
      fig.tight_layout()
    fig.savefig(os.path.join(out_dir, fname), dpi=100)
    written[fname] = lines
  return written


FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags (not defined on import: ``run_all.py`` imports this module
  and has a ``--results_dir`` of its own)."""
  flags.DEFINE_string("results_dir", RESULTS_DIR, "Folder of the benchmarks' *.jsonl rows.")
  flags.DEFINE_list("tag", [], "Only rows with one of these tags.")
  flags.DEFINE_string("machine", "", "Only machines whose label contains this (any case).")
  flags.DEFINE_string("output", "", "Also write the report to this file.")
  flags.DEFINE_string("plots", "", "Also draw the figures (PNG) into this folder.")


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  if not os.path.isdir(FLAGS.results_dir):
    raise app.UsageError(f"--results_dir: {FLAGS.results_dir} is not a folder")
  folder = os.path.dirname(os.path.abspath(FLAGS.output)) if FLAGS.output else ""
  if folder and not os.path.isdir(folder):
    raise app.UsageError(f"--output: cannot write {FLAGS.output}: folder {folder} does not "
                         "exist")
  try:
    rows = load(FLAGS.results_dir)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  chosen = select(rows, tags=FLAGS.tag, machine=FLAGS.machine)
  if rows and not chosen:  # a filter that matches nothing: say what there is
    tags = sorted({r.get("tag", "") for r in rows} - {""})
    labels = sorted({machine_label(r) for r in rows})
    raise app.UsageError(
        f"--tag / --machine: no rows under {FLAGS.results_dir} match (tags there: "
        f"{', '.join(tags) or 'none'}; machines: {'; '.join(labels)})")
  rows = chosen
  text = render(rows)
  print(text)
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      f.write(text)
  if FLAGS.plots:
    for fname, lines in plot(rows, FLAGS.plots).items():
      print(f"wrote {os.path.join(FLAGS.plots, fname)} ({lines} lines)")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=flagcheck.parse_flags)
