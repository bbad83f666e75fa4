"""Weak and strong scaling of the client-sharded round on 1, 2, 4 forced CPU devices.

Each device count runs in its own subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=D``; the round's client-slot axis K is
split over a 1-D ``"clients"`` mesh (``fedjax_async.sharding``), the model, ring buffer,
client state and data replicated.

* strong scaling: K fixed (``--k_strong``), D = 1, 2, 4: time per round;
* weak scaling: K = ``--k_per_device`` x D: time per round (ideal: flat).

What this does and does not measure: forced host devices are D XLA CPU devices in one
process that share the SAME cores (2 here). The figures show that the sharded program
partitions, runs and agrees with the unsharded one, and what the partitioning costs
(per-device programs, the cross-device reduction of the uploads, replicated gathers); they
cannot show a speed-up from more hardware. On D real accelerators each device trains K / D
clients, so strong scaling would approach D x while K / D keeps each device busy.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/multidevice.py
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import flagcheck  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.int_list("devices", ["1", "2", "4"], "Device counts.")
flags.DEFINE_enum("model", "logreg", ["cnn", "logreg", "simple_cnn"], "Model.")
flags.DEFINE_integer("k_strong", 64, "K for strong scaling.")
flags.DEFINE_integer("k_per_device", 16, "K per device for weak scaling.")
flags.DEFINE_integer("examples", 60, "Examples per client.")
flags.DEFINE_integer("batch", 10, "Batch size.")
flags.DEFINE_integer("rounds", 10, "Rounds fused per call.")
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).")
flags.DEFINE_string("child", "", "Internal: K to run in this process.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")


def child(k):
  """Times the sharded (and, as a check, unsharded) round for K clients on all devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  wl = common.Workload(FLAGS.model, k, num_clients=k, examples=FLAGS.examples,
                       batch=FLAGS.batch, rounds=FLAGS.rounds)
  prep, run, _ = common.sharded_engine_runner(wl, jax.devices())
  t = common.timed(prep, run, FLAGS.reps)
  prep()
  w_sharded = np.asarray(run()[0].w)
  prep0, run0, _ = common.engine_runner(wl)
  prep0()
  w_ref = np.asarray(run0()[0].w)
  print("RESULT " + json.dumps(dict(
      devices=len(jax.devices()), clients_per_round=k, s_per_round=t / FLAGS.rounds,
      max_abs_diff_vs_unsharded=float(np.max(np.abs(w_sharded - w_ref))))), flush=True)


def main(_):
  if FLAGS.child:
    child(int(FLAGS.child))
    return
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  mach = common.machine()
  rows = []
  for kind in ("strong", "weak"):
    base = None
    for d in map(int, FLAGS.devices):
      k = FLAGS.k_strong if kind == "strong" else FLAGS.k_per_device * d
      env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                 XLA_FLAGS=f"--xla_force_host_platform_device_count={d}")
      cmd = [sys.executable, os.path.abspath(__file__), f"--child={k}",
             f"--model={FLAGS.model}", f"--examples={FLAGS.examples}",
             f"--batch={FLAGS.batch}", f"--rounds={FLAGS.rounds}", f"--reps={FLAGS.reps}"]
      proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
      lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
      if proc.returncode or not lines:
        print(f"[multidevice] {kind} D={d}: FAILED: {proc.stderr[-2000:]}", flush=True)
        continue
      r = json.loads(lines[-1][len("RESULT "):])
      base = base or r["s_per_round"]
      ideal = base / d if kind == "strong" else base
      row = dict(bench="multidevice", scaling=kind, model=FLAGS.model,
                 efficiency=ideal / r["s_per_round"], tag=FLAGS.tag,
                 forced_host_devices=True, **{**mach, **r})
      rows.append(row)
      print(f"[multidevice] {kind:6s} D={d} K={r['clients_per_round']:4d}: "
            f"{r['s_per_round'] * 1e3:.3f} ms/round, efficiency {row['efficiency']:.2f}, "
            f"max |w_sharded - w_unsharded| = {r['max_abs_diff_vs_unsharded']:.2e}",
            flush=True)
  common.write_rows("multidevice", rows)


if __name__ == "__main__":
  app.run(main)
