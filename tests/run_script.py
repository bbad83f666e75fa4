"""Shared by the tests that run experiments/run.py in a subprocess."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "experiments", "run.py")


def env():
  """The subprocess environment: CPU, this checkout, and the test run's compilation cache.

  ``FEDJAX_ASYNC_TEST_JAX_CACHE`` (made by ``tests/conftest.py``) becomes JAX's persistent
  compilation cache, with no minimum compile time, so that the runs of the same tiny
  configuration compile their programs once per test run.
  """
  e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  cache = os.environ.get("FEDJAX_ASYNC_TEST_JAX_CACHE")
  if cache:
    e.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return e


def xla_flags(*flags):
  """``XLA_FLAGS`` for a subprocess: ``flags`` after the test run's own (``conftest.py``'s
  compile-for-size option), not instead of them."""
  return " ".join([os.environ.get("XLA_FLAGS", "")] + list(flags)).strip()


def run(args, timeout=900):
  """experiments/run.py with ``args``; returns the CompletedProcess (text output).

  ``timeout`` only guards against a hang; it is not a speed check. On the 2-core EPYC VM,
  with the other xdist worker busy, the FedEDS quick run took over 300 s (126 s alone).
  """
  return subprocess.run([sys.executable, RUN] + list(args), env=env(), capture_output=True,
                        text=True, timeout=timeout)


def read_rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def without_wall(rows):
  return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]
