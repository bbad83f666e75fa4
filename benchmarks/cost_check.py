"""The cost estimates against the measured time, on the README's commands: each command
runs as written (in a folder of its own), and this prints, per run, the estimate its
``cost:`` line gave (the CKKS server's ``estimate per round`` line for a CKKS round), the
time measured (``summary.json``'s ``wall_time_s``; for CKKS the slowest round's
``wall_time`` in metrics.jsonl, the estimate being the largest round's) and their ratio,
which should lie within 2x.

  python benchmarks/cost_check.py                    # main,cnn,clock,ckks
  python benchmarks/cost_check.py --cases=main,clock

A timing check, printed (and written as JSON lines with ``--out_jsonl``, each row with its
host, load and commit: ``host.host``), never asserted. The CKKS estimate's constants are
data, ``fedjax_async/crypto/calibration.json`` (``CALIBRATION_NOTE``, printed with the
ckks case).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import flagcheck
from benchmarks import host
from benchmarks import paths

RUN = os.path.join("experiments", "run.py")
# name -> the command's flags (README.md: the main job, "More"'s CNN, virtual-clock and CKKS
# commands)
CASES = {
    "main": [],
    "cnn": ["--algorithm=pafed", "--dataset=fashion_mnist", "--partition=shards",
            "--num_clients=100", "--participation=0.1", "--local_epochs=1", "--rounds=5",
            "--delay_fraction=0.5"],
    "clock": ["--algorithm=fedasync,fedbuff", "--num_updates=300"],
    "ckks": ["--algorithm=pafed", "--secure_aggregation=ckks", "--rounds=3"],
}
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}
COST = re.compile(r"^\[([^\]]+)\] cost: .*?~([0-9.]+) (s|min|h|days) on ", re.M)
CKKS = re.compile(r"estimate per round .*?~([0-9.]+) CPU s", re.M)
CALIBRATION_NOTE = (
    "ckks: the estimate's constants are fedjax_async/crypto/calibration.json, each with the "
    "command that measured it; refresh the CPU ones with benchmarks/ducc_round.py "
    "--write_calibration (--dims=32768,65536; --design=streamed --dims=7850,199210,1663370 "
    "--target_dim=0 --kt_recipients=20) and record this check's ratio in the source note "
    "of ROUND_CPU_S_PER_UPLOAD")

FLAGS = flags.FLAGS
flagcheck.item_list("cases", list(CASES), "The commands to run: " + ", ".join(CASES) + ".",
                    "names among " + ", ".join(CASES), item_ok=lambda v: v in CASES)
flags.DEFINE_string("out_jsonl", "", "Also write the rows as JSON lines here.")


def estimates(stderr: str) -> dict:
  """{run: estimated seconds} from the ``cost:`` lines (a CKKS round: ``ckks round``, from
  the server's estimate on stdout)."""
  out = {name: float(v) * UNITS[unit] for name, v, unit in COST.findall(stderr)}
  ckks = CKKS.findall(stderr)
  if ckks:
    out = {"ckks round": float(ckks[0])}
  return out


def measured(out_dir: str, ckks: bool) -> dict:
  """{run: seconds} from the runs' summaries (CKKS: the slowest round's ``wall_time``)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(out_dir, "**", "summary.json"), recursive=True)):
    run = os.path.basename(os.path.dirname(path))
    if ckks:
      with open(os.path.join(os.path.dirname(path), "metrics.jsonl")) as f:
        out["ckks round"] = max(json.loads(line)["wall_time"] for line in f)
    else:
      with open(path) as f:
        out[run] = json.load(f)["wall_time_s"]
  return out


def check(name: str) -> list:
  """Runs case ``name``; its rows (run, estimate, measured, ratio)."""
  with tempfile.TemporaryDirectory() as tmp:
    # (not --quiet: the cost lines it reads are progress lines, which --quiet drops)
    cmd = [sys.executable, RUN, *CASES[name], f"--output_dir={tmp}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=paths.ROOT, capture_output=True, text=True, check=False)
    total = time.perf_counter() - t0
    if proc.returncode:
      sys.stderr.write(proc.stderr[-3000:])
      raise SystemExit(f"error: {name}: the command failed (exit {proc.returncode})")
    est, got = estimates(proc.stderr + proc.stdout), measured(tmp, name == "ckks")
  if name != "ckks" and len(est) == 1 and len(got) == 1:  # one run: its folder is the root
    got = {next(iter(est)): next(iter(got.values()))}
  if not any(run in got for run in est):
    raise SystemExit(f"error: {name}: no run with both an estimate ({sorted(est)}) and a "
                     f"measured time ({sorted(got)}) in the command's output")
  return [{"case": name, "run": run, "estimate_s": est[run], "measured_s": got[run],
           "ratio": est[run] / max(got[run], 1e-9), "command_s": total}
          for run in est if run in got]


def main(argv):
  del argv
  rows = []
  print(f"{'case':6} {'run':12} {'estimate s':>10} {'measured s':>10} {'ratio':>6}")
  for name in FLAGS.cases:
    where = host.openfhe_host() if name == "ckks" else host.host()  # at the case's start
    for r in check(name):
      r.update(where)
      rows.append(r)
      within = "" if 0.5 <= r["ratio"] <= 2.0 else "  (outside 2x)"
      print(f"{r['case']:6} {r['run']:12} {r['estimate_s']:10.1f} {r['measured_s']:10.1f} "
            f"{r['ratio']:6.2f}{within}", flush=True)
  if "ckks" in FLAGS.cases:
    print(CALIBRATION_NOTE)
  if FLAGS.out_jsonl:
    with open(FLAGS.out_jsonl, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
