"""A ``jax.profiler`` trace summarised as text: where a computation's device time goes.

  PYTHONPATH=. python benchmarks/profile_summary.py TRACE_DIR [--top=25]

``summarize(trace_dir)`` reads the ``*.xplane.pb`` a ``jax.profiler.trace`` wrote (the
newest, through ``jax.profiler.ProfileData``) and adds up the events of the accelerator's
"XLA Ops" lines (on a CPU trace, where there is no device plane, XLA's executor threads on
the host plane) by name and, where the trace carries it, by HLO category (convolution,
fusion, ...). ``format_summary`` prints the busy time and the largest entries with their
share of it.
"""

from __future__ import annotations

import collections
import glob
import os
import sys
from typing import Dict, List, Tuple


def available() -> bool:
  """Whether this JAX can read a trace (``jax.profiler.ProfileData``; None in jax 0.6)."""
  import jax.profiler  # pylint: disable=g-import-not-at-top
  return getattr(jax.profiler, "ProfileData", None) is not None


def _newest_xplane(trace_dir: str) -> str:
  files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  if not files:
    raise FileNotFoundError(f"{trace_dir}: no *.xplane.pb under it (expected the folder "
                            "given to jax.profiler.trace)")
  return max(files, key=os.path.getmtime)


def _stat(event, name: str):
  for key, value in event.stats:
    if key == name:
      return value
  return None


def summarize(trace_dir: str) -> Dict:
  """``summarize_data`` of the newest trace under ``trace_dir``."""
  import jax  # pylint: disable=g-import-not-at-top
  if not available():
    raise RuntimeError(f"jax {jax.__version__} cannot read a profile "
                       "(jax.profiler.ProfileData is None): use a newer jax (0.11 reads it)")
  return summarize_data(jax.profiler.ProfileData.from_file(_newest_xplane(trace_dir)))


def summarize_data(data) -> Dict:
  """``{"source", "busy_ns", "events", "by_name": [(name, ns, count)], "by_category":
  [(category, ns, count)]}`` of a ``jax.profiler.ProfileData``, largest first."""
  device = [p for p in data.planes if p.name.startswith("/device:")]
  lines: List = []
  source = ""
  for plane in device:
    ops = [l for l in plane.lines if l.name == "XLA Ops"]
    if not ops:  # no op line: the streams' kernels
      ops = [l for l in plane.lines if l.name.startswith("Stream")]
    lines += ops
    source = source or plane.name
  if not lines:  # a CPU trace: XLA's executor threads on the host plane
    for plane in data.planes:
      if plane.name == "/host:CPU":
        lines = [l for l in plane.lines if l.name.startswith("tf_XLA")]
        source = "/host:CPU (XLA threads)"
  by_name: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0])
  by_cat: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0])
  busy = 0.0
  events = 0
  for line in lines:
    for ev in line.events:
      ns = float(ev.duration_ns)
      busy += ns
      events += 1
      by_name[ev.name][0] += ns
      by_name[ev.name][1] += 1
      cat = _stat(ev, "hlo_category")
      if cat is not None:
        by_cat[str(cat)][0] += ns
        by_cat[str(cat)][1] += 1

  def ranked(d) -> List[Tuple[str, float, int]]:
    return sorted(((k, v[0], int(v[1])) for k, v in d.items()), key=lambda t: -t[1])

  return dict(source=source or "none", busy_ns=busy, events=events,
              by_name=ranked(by_name), by_category=ranked(by_cat))


def format_summary(s: Dict, top: int = 25, title: str = "") -> str:
  """The summary as a Markdown table of the ``top`` ops (and categories)."""
  busy = s["busy_ns"] or 1.0
  out = [f"### Profile{': ' + title if title else ''}",
         f"{s['events']} events on {s['source']}, {s['busy_ns'] / 1e6:.1f} ms busy "
         "(summed over the lines read)", ""]
  if s["by_category"]:
    out += ["| HLO category | ms | share | events |", "|---|---|---|---|"]
    out += [f"| {k} | {ns / 1e6:.2f} | {ns / busy:.1%} | {n} |"
            for k, ns, n in s["by_category"][:top]]
    out.append("")
  out += ["| op | ms | share | events |", "|---|---|---|---|"]
  out += [f"| {k[:90]} | {ns / 1e6:.2f} | {ns / busy:.1%} | {n} |"
          for k, ns, n in s["by_name"][:top]]
  return "\n".join(out) + "\n"


def stored(s: Dict, top: int = 20, title: str = "") -> Dict:
  """The summary's row as stored beside its Markdown (``paper_shapes_profile.jsonl``): the
  ``top`` entries of each ranking, and the title."""
  return dict(s, title=title, top=top, by_name=[list(r) for r in s["by_name"][:top]],
              by_category=[list(r) for r in s["by_category"][:top]])


def format_file(rows: List[Dict]) -> str:
  """``paper_shapes_profile.md`` of its stored rows (``stored``), one section each."""
  return "".join(format_summary(r, r["top"], r["title"]) + "\n" for r in rows)


def main(argv: List[str]) -> int:
  if len(argv) < 2:
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  top = 25
  for a in argv[2:]:
    if a.startswith("--top="):
      top = int(a.split("=", 1)[1])
  print(format_summary(summarize(argv[1]), top))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
