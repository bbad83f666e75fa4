"""Where the benchmarks write their rows (no JAX import: the crypto benchmarks,
``report.py`` and ``run_all.py`` use it as well as ``common``).

``RESULTS_DIR``: the folder named by ``FEDJAX_ASYNC_BENCH_RESULTS`` when it is set (what
``run_all.py --results_dir`` sets for its steps), else ``benchmarks/results`` of this
checkout, whatever the current directory.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_ENV = "FEDJAX_ASYNC_BENCH_RESULTS"


def results_dir() -> str:
  """``$FEDJAX_ASYNC_BENCH_RESULTS`` when set (and not empty), else
  ``<repo>/benchmarks/results``."""
  return os.environ.get(RESULTS_ENV) or os.path.join(ROOT, "benchmarks", "results")


RESULTS_DIR = results_dir()


def pythonpath(environ=None) -> str:
  """``PYTHONPATH`` for a child process: this checkout first, then the entries the parent
  had (wheels unpacked into a ``--target`` folder on a machine that cannot install)."""
  environ = os.environ if environ is None else environ
  rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
  return os.pathsep.join([ROOT] + rest)


def shown(path: str) -> str:
  """``path`` as the benchmarks print and log it: relative to the checkout's root when it
  lies inside it (``benchmarks/results/peers.jsonl``, ``.venv/bin/python``), else as given."""
  if not os.path.isabs(path):
    return path
  rel = os.path.relpath(path, ROOT)
  return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def shown_argv(argv) -> list:
  """A command line as ``shown``: each absolute path inside the checkout, alone or as a
  flag's value (``--peers_python=...``), relative to its root."""
  out = []
  for a in argv:
    name, eq, value = a.partition("=")
    out.append(f"{name}={shown(value)}" if eq and name.startswith("-") else shown(a))
  return out
