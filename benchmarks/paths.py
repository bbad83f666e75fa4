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
