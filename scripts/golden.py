#!/usr/bin/env python
"""Golden outputs: runs the four reference jobs and compares two recordings.

  python scripts/golden.py record DIR [COMMIT]  # main job, reduced Table V, a virtual-
                                   # clock flag file, FedEDS --quick (~19 min on 2 shared cores),
                                   # from this checkout or from a worktree of COMMIT
  python scripts/golden.py compare A B          # every metric equal, wall times aside
  FEDJAX_ASYNC_GOLDEN_JOBS=main,virtual_clock python scripts/golden.py record ...  # some

A refactoring that must not change results records before and after and compares; the
comparison lists each differing file, row and key (exit status 1 when any differs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

JOBS = {
    "main": ["experiments/run.py", "--quiet"],
    "table_v": ["experiments/pafed_table.py", "--quiet",
                "--flagfile=experiments/flags/pafed_table_reduced.flags"],
    "virtual_clock": ["experiments/async_family.py",
                      "--flagfile=experiments/flags/dc_vs_fedasync_hinge_synthetic_noniid_M4.flags"],
    "fededs_quick": ["experiments/fededs_table.py", "--quick"],
}
# Keys that hold wall-clock measurements, not results.
TIME_WORDS = ("time", "wall", "seconds", "elapsed", "compile")
ROWS = (".jsonl", ".json", ".csv")


def record(out: str, commit: str = ""):
  only = [j for j in os.environ.get("FEDJAX_ASYNC_GOLDEN_JOBS", "").split(",") if j]
  unknown = sorted(set(only) - set(JOBS))
  if unknown:
    sys.exit(f"error: FEDJAX_ASYNC_GOLDEN_JOBS: unknown job(s) {', '.join(unknown)}; "
             f"choices: {', '.join(JOBS)}")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with tempfile.TemporaryDirectory() as tmp:
    if commit:  # that commit's code, imported before the installed package
      root_of_commit = os.path.join(tmp, "src")
      subprocess.run(["git", "worktree", "add", "--detach", root_of_commit, commit],
                     cwd=root, check=True)
    src = root_of_commit if commit else root
    env = dict(os.environ, PYTHONPATH=src)
    try:
      for name, cmd in JOBS.items():
        if only and name not in only:
          continue
        target = os.path.join(os.path.abspath(out), name)
        print(f"[golden] {name}: {' '.join(cmd)} --output_dir={target}", flush=True)
        subprocess.run([sys.executable, *cmd, f"--output_dir={target}", "--overwrite"],
                       cwd=src, env=env, check=True)
    finally:
      if commit:
        subprocess.run(["git", "worktree", "remove", "--force", root_of_commit], cwd=root,
                       check=False)


def is_time(key: str) -> bool:
  """A wall-clock key: ``*_s``, ``eta`` or one naming time."""
  k = key.lower()
  return k.endswith("_s") or k == "eta" or any(w in k for w in TIME_WORDS)


def strip(value, root: str):
  """``value`` without wall-clock keys, with the recording's folder written ``<root>``."""
  if isinstance(value, dict):
    return {k: strip(v, root) for k, v in value.items() if not is_time(k)}
  if isinstance(value, list):
    return [strip(v, root) for v in value]
  if isinstance(value, str):
    return value.replace(root, "<root>")
  return value


def load(path: str, root: str):
  with open(path) as f:
    if path.endswith(".jsonl"):
      return [strip(json.loads(line), root) for line in f if line.strip()]
    return strip(json.load(f), root)


def files(root: str):
  for d, _, names in os.walk(root):
    if "checkpoints" in d.split(os.sep) or "tb" in d.split(os.sep):
      continue
    for n in names:
      if n.endswith(ROWS):
        yield os.path.relpath(os.path.join(d, n), root)


def diff(a, b, where: str, out: list):
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      diff(a.get(k), b.get(k), f"{where}.{k}", out)
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    for i, (x, y) in enumerate(zip(a, b)):
      diff(x, y, f"{where}[{i}]", out)
  elif a != b:
    out.append(f"{where}: {a!r} != {b!r}")


def compare(a: str, b: str) -> int:
  fa, fb = set(files(a)), set(files(b))
  problems = [f"only in {a}: {p}" for p in sorted(fa - fb)]
  problems += [f"only in {b}: {p}" for p in sorted(fb - fa)]
  for p in sorted(fa & fb):
    if p.endswith(".csv"):  # tables carry wall-time columns: compared through their json
      continue
    diff(load(os.path.join(a, p), os.path.abspath(a)), load(os.path.join(b, p),
                                                           os.path.abspath(b)), p, problems)
  for line in problems:
    print(line)
  print(f"[golden] {len(fa & fb)} files compared, {len(problems)} differences")
  return 1 if problems else 0


if __name__ == "__main__":
  if len(sys.argv) in (3, 4) and sys.argv[1] == "record":
    record(*sys.argv[2:])
  elif len(sys.argv) == 4 and sys.argv[1] == "compare":
    sys.exit(compare(sys.argv[2], sys.argv[3]))
  else:
    sys.exit(__doc__)
