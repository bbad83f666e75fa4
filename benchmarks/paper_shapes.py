"""The CNN round at the PAFed paper's shapes, many runs vmapped as one computation, per
local-training precision: examples/s and the fraction of the matmul peak measured in the
same precision.

  PYTHONPATH=. python benchmarks/paper_shapes.py                      # an accelerator
  PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/paper_shapes.py --model=logreg \\
      --runs=2 --clients=2 --num_clients=4 --examples=20 --batch=10 --epochs=1 --reps=1

Table V's runs (``experiments/pafed_table.py``, the paper's setting): N = 100 clients of
600 examples, K = 10 a round, E = 10 epochs of B = 50, so 120 local steps per client and
round; a sweep stacks R runs (deltas x seeds of one algorithm) on a leading axis and runs
them as one ``jit(vmap(run_chunk))`` (``sweep.make_sweep_runner``), each run's K clients
in one vmap. This times that computation on random data with every client at 600
examples, for R in ``--runs``, each ``--precisions`` entry (the local training's
``--precision``) and each ``--impls`` formulation of the convolutions; the matmul peak it is set against is timed in the same process in the
precision the round's products run in (``peaks.workload_peak_precision``: float32 code at
the process's default matmul precision, TF32 on recent NVIDIA GPUs), taking turns with the
round. FLOPs are counted from the model (``models.train_step_flops(count="analytic")``,
forward and backward, every client-step). ``projected_run_s``: one paper run (T = 100
rounds) at this R, the time per run-round times 100.
"""

from __future__ import annotations

import time

from absl import app, flags

from benchmarks import common
from benchmarks import flagcheck
from benchmarks import peaks
from fedjax_async import algorithms
from fedjax_async.core import client as client_lib
from fedjax_async import layers
from fedjax_async import models
from fedjax_async.rounds import engine
from fedjax_async.sweeps import sweep

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PAPER_ROUNDS = 100  # T of Table V

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "cnn", sorted(common.MODELS), "Model.")
flagcheck.int_list("runs", ["1", "8"], "Runs vmapped as one computation (R).")
flags.DEFINE_integer("clients", 10, "Clients per round K of each run.", lower_bound=1)
flags.DEFINE_integer("num_clients", 100, "Clients N of each run (the data held).",
                     lower_bound=1)
flags.DEFINE_integer("examples", 600, "Examples per client.", lower_bound=1)
flags.DEFINE_integer("batch", 50, "Local minibatch size B.", lower_bound=1)
flags.DEFINE_integer("epochs", 10, "Local epochs E.", lower_bound=1)
flags.DEFINE_integer("rounds", 1, "Rounds per timed call.", lower_bound=1)
flags.DEFINE_integer("reps", 2, "Timed repetitions (best is reported).", lower_bound=1)
flagcheck.choice_list("precisions", list(client_lib.PRECISIONS), client_lib.PRECISIONS,
                      "Local-training precisions (--precision of the experiments).")
flagcheck.choice_list("impls", ["vjp"], layers.CONV_IMPLS,
                      "Convolutions (models.get_model's impl): vjp (lax convolutions, the "
                      "default) | patches (im2col and one GEMM: per-client kernels as batched "
                      "GEMMs under vmap) | slices | lax.")
flags.DEFINE_enum("algorithm", "fedavg", list(algorithms.names("rounds")), "Algorithm.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")
flags.register_multi_flags_validator(
    ["clients", "num_clients"], lambda v: v["clients"] <= v["num_clients"],
    message="--clients: must be <= --num_clients")
flags.register_multi_flags_validator(
    ["examples", "batch"], lambda v: v["examples"] % v["batch"] == 0,
    message="--examples: must be a multiple of --batch (the FLOP count is of full batches)")


def sweep_runner(wl: common.Workload, runs: int):
  """``(prepare, run, compile_s)`` of ``runs`` copies of ``wl``'s rounds (each its own
  initial model) as one vmapped sweep computation."""
  runner = sweep.make_sweep_runner(wl.apply_flat, wl.alg, wl.engine_config())
  slots = {k: np.stack([v] * runs) for k, v in wl.timeline.slice(0, wl.rounds).items()}
  hp = {k: jnp.full((runs,), v, jnp.float32) for k, v in wl.hp.items()}
  evals = jnp.zeros((wl.rounds,), bool)

  def states():
    return sweep.stack_trees([engine.init_state(wl.alg, wl.w0, wl.num_clients, 2, seed)
                              for seed in range(runs)])

  t0 = time.perf_counter()
  compiled = runner.lower(states(), slots, evals, hp, wl.data).compile()
  compile_s = time.perf_counter() - t0
  holder = {}

  def prepare():
    holder["s"] = jax.block_until_ready(states())

  def run():
    s, m = compiled(holder.pop("s"), slots, evals, hp, wl.data)
    jax.block_until_ready((s.w, m["train_loss"]))
    return s, m

  return prepare, run, compile_s


def main(_):
  mach = common.machine()
  name, shape, classes = common.MODELS[FLAGS.model]
  net = models.get_model(name, classes, shape, impl="lax")
  step_flops = models.train_step_flops(net, shape, FLAGS.batch, count="analytic")
  sizes = peaks.default_sizes()
  print(f"[paper_shapes] {mach['devices']} x {mach['device_kind']}; {FLAGS.model} "
        f"{step_flops / 1e6:.1f} MFLOP per step of {FLAGS.batch} (counted from the model)",
        flush=True)
  for precision in FLAGS.precisions:
    peak_precision = peaks.workload_peak_precision(precision)
    peak_start, peak_n = peaks.measure(peak_precision, sizes, reps=2)
    mm_run, mm_flops = peaks.matmul_runner(peak_precision, peak_n)
    for impl, r in [(i, r) for i in FLAGS.impls for r in map(int, FLAGS.runs)]:
      wl = common.Workload(FLAGS.model, FLAGS.clients, num_clients=FLAGS.num_clients,
                           examples=FLAGS.examples, batch=FLAGS.batch, epochs=FLAGS.epochs,
                           rounds=FLAGS.rounds, algorithm=FLAGS.algorithm, impl=impl,
                           precision=precision)
      prepare, run, compile_s = sweep_runner(wl, r)
      times = common.timed_interleaved({"round": (prepare, run),
                                        "matmul_peak": (lambda: None, mm_run)}, FLAGS.reps)
      t = times["round"]
      peak = max(peak_start, mm_flops / times["matmul_peak"] / 1e9)
      client_steps = r * wl.client_steps_per_round * FLAGS.rounds
      gflops = step_flops * client_steps / t / 1e9
      sheet = peaks.datasheet_tflops(mach["device_kind"], peak_precision)
      row = dict(bench="paper_shapes", model=FLAGS.model, impl=impl, algorithm=FLAGS.algorithm,
                 precision=precision, peak_precision=peak_precision, runs=r,
                 clients_per_round=FLAGS.clients, num_clients=FLAGS.num_clients,
                 local_steps=wl.steps, batch=FLAGS.batch, rounds=FLAGS.rounds,
                 seconds=t, compile_s=compile_s,
                 examples_per_s=client_steps * FLAGS.batch / t,
                 client_steps_per_s=client_steps / t,
                 step_mflop_analytic=step_flops / 1e6, gflops_analytic=gflops,
                 peak_gflops=peak, peak_n=peak_n, fraction_of_peak_analytic=gflops / peak,
                 datasheet_tflops=sheet,
                 fraction_of_datasheet=gflops / 1e3 / sheet if sheet else None,
                 projected_run_s=t / FLAGS.rounds / r * PAPER_ROUNDS,
                 peak_device_bytes=common.device_peak_bytes(), tag=FLAGS.tag, **mach)
      common.write_rows("paper_shapes", [row])
      print("[paper_shapes] " + common.fmt_row(row, (
          "precision", "impl", "runs", "local_steps", "seconds", "compile_s", "examples_per_s",
          "gflops_analytic", "peak_precision", "peak_gflops", "fraction_of_peak_analytic",
          "projected_run_s")), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
