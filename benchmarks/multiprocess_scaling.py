"""Strong and weak scaling of the round engine over processes (JAX's multi-controller runtime).

Each configuration P x D launches P processes (``jax.distributed.initialize`` on
localhost, CPU collectives through gloo), each with D devices, so the round's client axis K
is split over P x D global devices (``fedjax_async.distributed``); every process places
only its own clients' data and state (``--client_data=sharded``, the default across
processes) or every device holds all of them (``--client_data=replicated``). The first
configuration (default: one process, one device) is the baseline.

* strong scaling: K fixed (``--k_strong``): time per round;
* weak scaling: K = ``--k_per_device`` x P x D (ideal: flat).

Efficiency against the first configuration: strong ``t0 G0 / (t G)``, weak ``t0 / t``
(G: global devices). On one machine the processes share its cores (2 here), so the figures
show what splitting a round across processes costs (the per-step all-reduce of the gathered
minibatch rows, the upload reduction, process start), not a speed-up from more hardware.
``bytes_per_round`` is the model-sized all-reduce volume a round needs across processes
(docs/distributed.md).

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/multiprocess_scaling.py
  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/multiprocess_scaling.py --model=cnn \
      --k_strong=4 --k_per_device=1 --rounds=2 --reps=2
"""

import json
import os
import socket
import subprocess
import sys
import time

from absl import app, flags

from benchmarks import flagcheck

FLAGS = flags.FLAGS
flagcheck.item_list("configs", ["1x1", "2x1", "1x2", "4x1"], "Configurations PxD: P processes "
                    "of D devices each; the first is the baseline.", "configs 'PxD'",
                    item_ok=lambda s: len(s.split("x")) == 2 and all(
                        p.isdigit() and int(p) >= 1 for p in s.split("x")))
flags.DEFINE_enum("model", "logreg", ["cnn", "logreg"], "Model.")
flags.DEFINE_string("algorithm", "fedavg", "Algorithm of the rounds.")
flags.DEFINE_enum("client_data", "sharded", ["sharded", "replicated"], "Across processes: "
                  "each process holds only its clients (sharded) or every device holds all.")
flags.DEFINE_integer("k_strong", 64, "K for strong scaling.", lower_bound=1)
flags.DEFINE_integer("k_per_device", 16, "K per global device for weak scaling.",
                     lower_bound=1)
flags.DEFINE_integer("examples", 60, "Examples per client.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Batch size.", lower_bound=1)
flags.DEFINE_integer("rounds", 10, "Rounds fused per call.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_integer("timeout_s", 900, "Give up on a configuration after this long.",
                     lower_bound=1)
flags.DEFINE_string("child", "", "Internal: K:P:D:process_id:port of this process.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")


def child(spec):
  """One process of a P x D configuration: times ``--rounds`` rounds of K clients."""
  k, p, d, pid, port = map(int, spec.split(":"))
  from fedjax_async import distributed  # pylint: disable=g-import-not-at-top
  if p > 1:
    distributed.initialize(f"localhost:{port}", p, pid)
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  from fedjax_async import sharding  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  wl = common.Workload(FLAGS.model, k, num_clients=k, examples=FLAGS.examples,
                       batch=FLAGS.batch, rounds=FLAGS.rounds, algorithm=FLAGS.algorithm)
  cfg = wl.engine_config(client_chunk=common.client_chunk(-1, wl.dim))
  placement = FLAGS.client_data if p > 1 else "replicated"
  cfg, wl.timeline, _, data = sharding.shard_clients(cfg, wl.timeline, wl.init_state(),
                                                     wl.data, devices, placement)
  state_fn = lambda: sharding.shard_clients(cfg, wl.timeline, wl.init_state(), data,
                                            devices, placement)[2]
  wl.data = data
  t0 = time.perf_counter()
  prep, run, _ = common.engine_runner(wl, cfg, state_fn=state_fn)
  compile_s = time.perf_counter() - t0
  t = common.timed(prep, run, FLAGS.reps)
  if distributed.is_main():
    print("RESULT " + json.dumps(dict(
        processes=p, devices_per_process=d, global_devices=len(devices), num_params=wl.dim,
        clients_per_round=k, s_per_round=t / FLAGS.rounds, compile_s=compile_s,
        client_data=placement, bytes_per_round=4 * wl.dim)), flush=True)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(k, p, d):
  """Runs one configuration; its result dict, or None with the reason printed."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  env = common.child_env(JAX_PLATFORMS="cpu",
                         XLA_FLAGS=f"--xla_force_host_platform_device_count={d}")
  port = free_port()
  cmd = [sys.executable, os.path.abspath(__file__), f"--model={FLAGS.model}",
         f"--algorithm={FLAGS.algorithm}", f"--client_data={FLAGS.client_data}",
         f"--examples={FLAGS.examples}",
         f"--batch={FLAGS.batch}", f"--rounds={FLAGS.rounds}", f"--reps={FLAGS.reps}"]
  t0 = time.perf_counter()
  procs = [subprocess.Popen(cmd + [f"--child={k}:{p}:{d}:{i}:{port}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(p)]
  outs = []
  for proc in procs:
    try:
      outs.append(proc.communicate(timeout=FLAGS.timeout_s))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      print(f"[multiprocess] {p}x{d} K={k}: NOT RUN (over --timeout_s={FLAGS.timeout_s})",
            flush=True)
      return None
  lines = [l for l in outs[0][0].splitlines() if l.startswith("RESULT ")]
  if any(q.returncode for q in procs) or not lines:
    why = next((o[1].strip().splitlines()[-1] for o in outs if o[1].strip()), "?")
    print(f"[multiprocess] {p}x{d} K={k}: NOT RUN: {why}", flush=True)
    return None
  return dict(json.loads(lines[-1][len("RESULT "):]), launch_s=time.perf_counter() - t0)


def main(_):
  if FLAGS.child:
    child(FLAGS.child)
    return
  os.environ["JAX_PLATFORMS"] = "cpu"
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  mach = common.machine()
  configs = [tuple(map(int, c.split("x"))) for c in FLAGS.configs]
  for kind in ("strong", "weak"):
    base = None  # (global devices, seconds per round) of the first configuration that ran
    for p, d in configs:
      k = FLAGS.k_strong if kind == "strong" else FLAGS.k_per_device * p * d
      r = launch(k, p, d)
      if r is None:
        continue
      g = r["global_devices"]
      base = base or (g, r["s_per_round"])
      row = dict(bench="multiprocess", scaling=kind, model=FLAGS.model,
                 client_data_across_processes=FLAGS.client_data,
                 algorithm=FLAGS.algorithm, tag=FLAGS.tag, baseline_global_devices=base[0],
                 efficiency=common.scaling_efficiency(kind, *base, g, r["s_per_round"]),
                 **{**mach, **r})
      common.write_rows("multiprocess", [row])
      print(f"[multiprocess] {kind:6s} {p}x{d} K={k:4d} {r['client_data']:10s}: "
            f"{r['s_per_round'] * 1e3:9.3f} "
            f"ms/round, efficiency {row['efficiency']:.2f} (compile {r['compile_s']:.1f} s, "
            f"launch {r['launch_s']:.1f} s)", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
