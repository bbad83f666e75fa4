"""Where and how a benchmark row was measured, without importing JAX (the crypto
benchmarks record it too): CPU model and ISA, cores, load, malloc, the command, this
checkout's commit, versions and the time. ``common.machine()`` adds JAX's side."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from typing import Any, Dict, Optional

import numpy as np

from benchmarks import paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model() -> str:
  """CPU model name and its widest vector ISA (rows from different hosts differ 2x)."""
  name, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, val = line.partition(":")
        if key.strip() == "model name":
          name = val.strip()
        elif key.strip() == "flags":
          flags = set(val.split())
          break
  except OSError:
    pass
  isa = next((i for i in ("avx512f", "avx2", "avx") if i in flags), "")
  return f"{name} [{isa}]" if isa else name


# tcmalloc's shared library (Debian / Ubuntu package libtcmalloc-minimal4). Preloaded, it
# keeps freed memory for reuse where glibc unmaps large blocks: an XLA:CPU call's buffers
# (the CNN round's [K, d] uploads, 333 MB at K = 50) then come back without ~88k page
# faults per call (docs/performance.md, "The allocator").
TCMALLOC = "tcmalloc_minimal"


def find_tcmalloc() -> Optional[str]:
  """tcmalloc's library name for ``LD_PRELOAD`` (e.g. ``libtcmalloc_minimal.so.4``), or
  None where it is not installed."""
  import ctypes.util  # pylint: disable=g-import-not-at-top
  return ctypes.util.find_library(TCMALLOC)


def allocator() -> str:
  """The malloc this process runs with: ``"tcmalloc"`` or ``"jemalloc"`` when one is
  loaded (``LD_PRELOAD``), else ``"system"`` (glibc's on Linux)."""
  try:
    with open("/proc/self/maps") as f:
      maps = f.read()
  except OSError:
    return "system"
  for name in ("tcmalloc", "jemalloc"):
    if f"lib{name}" in maps:
      return name
  return "system"


def git_commit() -> str:
  """This checkout's commit (``+dirty`` with uncommitted changes to tracked files), or
  ``""`` outside a git checkout."""
  def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                          timeout=30)
  try:
    head = git("rev-parse", "HEAD")
    if head.returncode:
      return ""
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""
  return head.stdout.strip() + ("+dirty" if dirty else "")


def host() -> Dict[str, Any]:
  """CPU (``cpu_model``), cores, 1-minute load when the run started, ``allocator``,
  ``command`` (the script and its flags), ``git`` (``git_commit``), Python and numpy
  versions and ``time`` (UTC; ``report.py`` keeps the newest row of a configuration)."""
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg_1m": round(load, 2),
          "allocator": allocator(),
          "command": shlex.join([os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)]
                                + paths.shown_argv(sys.argv[1:])),
          "git": git_commit(), "python": platform.python_version(),
          "numpy": np.__version__,
          "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def openfhe_host() -> Dict[str, Any]:
  """``host()`` and the OpenFHE wheel's version: the crypto benchmarks' provenance."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    version = importlib.metadata.version("openfhe")
  except importlib.metadata.PackageNotFoundError:
    version = ""
  return {**host(), "openfhe": version}
