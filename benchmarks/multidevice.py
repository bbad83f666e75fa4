"""Weak and strong scaling of the client-sharded round on 1, 2, 4 devices.

Each device count runs in its own subprocess; the round's client-slot axis K is split over
a 1-D ``"clients"`` mesh (``fedjax_async.sharding``) of the first D devices, the model,
ring buffer, client state and data replicated. ``--platform=cpu`` (the default) makes D
forced host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=D``);
``--platform=default`` uses the machine's own devices (JAX's default platform: GPUs or TPU
cores), and a D larger than their number is reported as not run.

* strong scaling: K fixed (``--k_strong``), D in ``--devices``: time per round;
* weak scaling: K = ``--k_per_device`` x D: time per round (ideal: flat).

Efficiencies are against the first D of ``--devices``: strong ``t(D0) D0 / (t(D) D)``,
weak ``t(D0) / t(D)``.

What this does and does not measure: forced host devices are D XLA CPU devices in one
process that share the SAME cores (2 here). The figures show that the sharded program
partitions, runs and agrees with the unsharded one, and what the partitioning costs
(per-device programs, the cross-device reduction of the uploads, replicated gathers); they
cannot show a speed-up from more hardware. On D real accelerators each device trains K / D
clients, so strong scaling would approach D x while K / D keeps each device busy.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/multidevice.py
  PYTHONPATH=. .venv/bin/python benchmarks/multidevice.py --platform=default --devices=1,2,4,8
"""

import json
import os
import subprocess
import sys


from absl import app, flags  # noqa: E402

from benchmarks import flagcheck  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.int_list("devices", ["1", "2", "4"], "Device counts.")
flags.DEFINE_enum("platform", "cpu", ["cpu", "default"],
                  "cpu: D forced host devices on this CPU; default: the machine's own "
                  "devices (JAX's default platform).")
flags.DEFINE_enum("model", "logreg", ["cnn", "logreg", "simple_cnn"], "Model.")
flags.DEFINE_integer("k_strong", 64, "K for strong scaling.", lower_bound=1)
flags.DEFINE_integer("k_per_device", 16, "K per device for weak scaling.", lower_bound=1)
flags.DEFINE_integer("examples", 60, "Examples per client.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Batch size.", lower_bound=1)
flags.DEFINE_integer("rounds", 10, "Rounds fused per call.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_string("child", "", "Internal: K:D to run in this process.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")


def child(spec):
  """Times the sharded (and, as a check, unsharded) round for K clients on D devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  from fedjax_async import sharding  # pylint: disable=g-import-not-at-top
  k, d = map(int, spec.split(":"))
  available = jax.devices()
  if d > len(available):
    sys.exit(f"error: --devices: D = {d}, but JAX sees {len(available)} "
             f"{available[0].platform} device(s) here; --platform=cpu runs D forced host "
             "devices instead")
  devices = sharding.select_devices(d, "devices")
  wl = common.Workload(FLAGS.model, k, num_clients=k, examples=FLAGS.examples,
                       batch=FLAGS.batch, rounds=FLAGS.rounds)
  prep, run, _ = common.sharded_engine_runner(wl, devices)
  t = common.timed(prep, run, FLAGS.reps)
  prep()
  w_sharded = np.asarray(run()[0].w)
  prep0, run0, _ = common.engine_runner(wl)
  prep0()
  w_ref = np.asarray(run0()[0].w)
  print("RESULT " + json.dumps(dict(
      devices=len(devices), device_kind=devices[0].device_kind, clients_per_round=k,
      s_per_round=t / FLAGS.rounds,
      max_abs_diff_vs_unsharded=float(np.max(np.abs(w_sharded - w_ref))))), flush=True)


def main(_):
  if FLAGS.child:
    child(FLAGS.child)
    return
  forced = FLAGS.platform == "cpu"
  if forced:  # this process reports the machine the children run on: the CPU
    os.environ["JAX_PLATFORMS"] = "cpu"
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  mach = common.machine()
  for kind in ("strong", "weak"):
    base = None  # (D0, seconds per round at D0): the first device count that ran
    for d in map(int, FLAGS.devices):
      k = FLAGS.k_strong if kind == "strong" else FLAGS.k_per_device * d
      env = (common.child_env(JAX_PLATFORMS="cpu",
                              XLA_FLAGS=f"--xla_force_host_platform_device_count={d}")
             if forced else common.child_env())
      cmd = [sys.executable, os.path.abspath(__file__), f"--child={k}:{d}",
             f"--model={FLAGS.model}", f"--examples={FLAGS.examples}",
             f"--batch={FLAGS.batch}", f"--rounds={FLAGS.rounds}", f"--reps={FLAGS.reps}"]
      proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
      lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
      if proc.returncode or not lines:
        why = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"[multidevice] {kind} D={d}: NOT RUN (rc {proc.returncode}): {why}", flush=True)
        continue
      r = json.loads(lines[-1][len("RESULT "):])
      base = base or (d, r["s_per_round"])
      row = dict(bench="multidevice", scaling=kind, model=FLAGS.model,
                 efficiency=common.scaling_efficiency(kind, *base, d, r["s_per_round"]),
                 baseline_devices=base[0], tag=FLAGS.tag, forced_host_devices=forced,
                 **{**mach, **r})
      common.write_rows("multidevice", [row])  # each row as soon as it is measured
      print(f"[multidevice] {kind:6s} D={d} K={r['clients_per_round']:4d}: "
            f"{r['s_per_round'] * 1e3:.3f} ms/round, efficiency {row['efficiency']:.2f}, "
            f"max |w_sharded - w_unsharded| = {r['max_abs_diff_vs_unsharded']:.2e}",
            flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
