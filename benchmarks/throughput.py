"""Vmapped round engine vs a sequential per-client jit loop: client-steps/s, examples/s.

For each model and each K (clients per round) it builds one random workload (K clients
per round, every client with ``--examples`` examples, batch ``--batch``, one local epoch:
``examples / batch`` local steps), then times, in this one process:

* ``engine``: ``engine.make_runner`` (all ``--rounds`` rounds fused in one ``lax.scan``,
  the K clients of a round as the engine trains them by default, ``--client_chunk=-1``:
  one ``jax.vmap`` of all K, or for models of >= 100k parameters on CPU (the CNN) one
  client per ``lax.map`` step; ``--client_chunk=0`` forces one vmap of all K);
* ``loop``: one jitted per-client ``train`` + ``client_final`` (all of a client's local
  steps in one call) in a Python loop over the arrivals of each round, then a jitted
  server step: the stronger of the two loop baselines, and the one the targets use;
* ``fedjax_loop``: fedjax's own ``ForEachClientJitBackend`` pattern, jitted
  ``client_init`` / ``client_step`` / ``client_final`` with one ``client_step`` call per
  local step (``common.fedjax_loop_runner``);

* ``engine_sharded`` (``--engine_devices=D``, D > 1): the engine with each round's
  clients split over D XLA CPU devices (``jax_num_cpu_devices``; ``sharding.shard_clients``),
  i.e. over the cores, each device's share on its own thread; the loops and ``engine`` stay
  on one device (a sequential loop trains one client at a time by construction; its calls
  may still use every core through XLA's intra-op threads);

each the best of ``--reps`` after a warm-up, the three taking turns in every repetition
(``common.timed_interleaved``), and prints client-steps/s, examples/s, and the ratios
engine/loop and engine/fedjax_loop.
One JSON line per row is appended to ``benchmarks/results/throughput.jsonl`` (and a CSV
rewritten).

Runs on JAX's default platform: the GPU where there is one (``JAX_PLATFORMS=cpu`` pins the
CPU). On recent NVIDIA GPUs JAX computes float32 dots and convolutions in TF32 by default
(``JAX_DEFAULT_MATMUL_PRECISION=highest`` for full float32); each row records
``matmul_precision`` and ``device_kind``.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/throughput.py
  ... --models=logreg --clients=10,50,200,1000 --rounds=20
  ... --models=logreg --clients=10,50,200,1000 --engine_devices=2
"""

import sys


from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import algorithms  # noqa: E402
from fedjax_async import sharding  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.choice_list("models", ["logreg", "cnn"], sorted(common.MODELS),
                       "Models (see benchmarks/common.py).")
flagcheck.int_list("clients", ["10", "50", "200"], "Clients per round K.")
flags.DEFINE_integer("rounds", 0, "Rounds per timed run (0: 20 for logreg, 2 for cnn).",
                     lower_bound=0)
flags.DEFINE_integer("examples", 60, "Examples per client.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_enum("algorithm", "fedavg", list(algorithms.names("rounds")), "Algorithm.")
flags.DEFINE_bool("loop", True, "Also time the sequential per-client jit loop.")
flags.DEFINE_bool("fedjax_loop", True, "Also time fedjax's per-step jit pattern.")
flags.DEFINE_integer("fedjax_loop_max_clients", 0, "Time fedjax's pattern only up to this "
                     "many clients per round (0: at every K); one Python dispatch per local "
                     "step, it took 31 s for 20 logreg rounds at K = 200 on an H200.",
                     lower_bound=0)
flags.DEFINE_integer("engine_devices", 1, "D > 1: also time the engine with each round's "
                     "clients split over D CPU devices (made here with jax_num_cpu_devices; "
                     "they share the machine's cores).", lower_bound=1)
flags.DEFINE_integer("client_chunk", -1, "Engine: clients per vmapped chunk (-1: the "
                     "engine's automatic choice, 1 for models of >= 100k parameters on CPU; "
                     "0: all K in one vmap).", lower_bound=-1)
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")


def main(_):
  if FLAGS.engine_devices > 1:
    try:
      sharding.set_cpu_devices(FLAGS.engine_devices, "engine_devices")
    except ValueError as e:
      sys.exit(f"error: {e}")
  mach = common.machine()
  print(f"[throughput] {mach}")
  for model in FLAGS.models:
    for k in map(int, FLAGS.clients):
      rounds = FLAGS.rounds or (20 if model == "logreg" else 2)
      wl = common.Workload(model, k, num_clients=k, examples=FLAGS.examples,
                           batch=FLAGS.batch, rounds=rounds, algorithm=FLAGS.algorithm)
      chunk = common.client_chunk(FLAGS.client_chunk, wl.dim)
      prep, run, _ = common.engine_runner(wl, wl.engine_config(client_chunk=chunk))
      runners = {"engine": (prep, run)}
      if FLAGS.engine_devices > 1:
        prep_s, run_s, _ = common.sharded_engine_runner(
            wl, sharding.select_devices(FLAGS.engine_devices, "engine_devices"), chunk)
        runners["engine_sharded"] = (prep_s, run_s)
      if FLAGS.loop:
        runners["loop"] = common.loop_runner(wl)
      if FLAGS.fedjax_loop and (not FLAGS.fedjax_loop_max_clients
                                or k <= FLAGS.fedjax_loop_max_clients):
        runners["fedjax_loop"] = common.fedjax_loop_runner(wl)
      t = common.timed_interleaved(runners, FLAGS.reps)
      t_engine = t["engine"]
      t_loop, t_fedjax = t.get("loop", float("nan")), t.get("fedjax_loop", float("nan"))
      t_sharded = t.get("engine_sharded", float("nan"))
      steps = wl.client_steps_per_round * rounds
      ex = wl.examples_per_round * rounds
      row = dict(bench="throughput", model=model, params=wl.dim, clients_per_round=k,
                 rounds=rounds, local_steps=wl.steps, batch=wl.batch,
                 algorithm=FLAGS.algorithm, client_chunk=chunk or 0, engine_s=t_engine,
                 loop_s=t_loop,
                 engine_steps_per_s=steps / t_engine, loop_steps_per_s=steps / t_loop,
                 engine_examples_per_s=ex / t_engine, loop_examples_per_s=ex / t_loop,
                 speedup_vs_loop=t_loop / t_engine, fedjax_loop_s=t_fedjax,
                 fedjax_loop_steps_per_s=steps / t_fedjax,
                 speedup_vs_fedjax_loop=t_fedjax / t_engine,
                 engine_devices=FLAGS.engine_devices, engine_sharded_s=t_sharded,
                 engine_sharded_steps_per_s=steps / t_sharded,
                 speedup_sharded_vs_loop=t_loop / t_sharded,
                 speedup_sharded_vs_fedjax_loop=t_fedjax / t_sharded, tag=FLAGS.tag, **mach)
      common.write_rows("throughput", [row])  # each row as soon as it is measured
      print("[throughput] " + common.fmt_row(row, (
          "model", "clients_per_round", "rounds", "engine_s", "loop_s",
          "engine_steps_per_s", "loop_steps_per_s", "engine_examples_per_s",
          "speedup_vs_loop", "fedjax_loop_s", "speedup_vs_fedjax_loop")
          + (("engine_devices", "engine_sharded_s", "engine_sharded_steps_per_s",
              "speedup_sharded_vs_loop", "speedup_sharded_vs_fedjax_loop")
             if FLAGS.engine_devices > 1 else ())), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
