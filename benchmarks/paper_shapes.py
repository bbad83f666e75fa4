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

The roofline of each shape: one local step of all R x K clients (their own weights, the
round's loss, gradient and SGD update, in the same precision and formulation) is compiled
alone and XLA's cost analysis gives its bytes accessed (the sum over its HLO
instructions of operands read and results written: an upper estimate of the memory
traffic, as caches are not modelled) and FLOPs (reported, not used: on a GPU it
undercounts the convolutions, which become library calls). The step's bound is
``max(FLOPs / peak, bytes / bandwidth)`` with the model's FLOPs, the peak above and the
memory bandwidth measured in the same process (``peaks.measure_bandwidth``);
``fraction_of_roofline`` is the round's FLOP rate over the bound's. ``--profile`` traces
one call of each shape with ``jax.profiler`` (in a temporary folder, deleted after) and
prints where the device time went by op (``profile_summary``), the summaries also appended
to ``paper_shapes_profile.md`` beside the rows.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import app, flags

from benchmarks import common
from benchmarks import flagcheck
from benchmarks import peaks
from benchmarks import profile_summary
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
flags.DEFINE_bool("profile", False, "Trace one call of each shape with jax.profiler and "
                  "print a summary of its device time by op (also appended to "
                  "paper_shapes_profile.md beside the rows).")
flags.DEFINE_integer("bandwidth_mib", 0, "MiB streamed by the bandwidth probe (default: "
                     "peaks.default_bandwidth_bytes).", lower_bound=0)
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


def step_cost(wl: common.Workload, clients: int):
  """``(flops, bytes_accessed)`` by XLA's cost analysis of one local step (loss, gradient,
  plain SGD update; ``wl``'s model, formulation and precision) of ``clients`` clients,
  each with its own weights, vmapped."""
  precision = wl.local.precision

  def loss(w, x, y):
    logits, _ = client_lib.forward(wl.apply_flat, w, x, None, precision)
    return client_lib.masked_cross_entropy(logits, y, jnp.ones(y.shape, bool))

  def step(w, x, y):
    return w - 0.05 * jax.grad(loss)(w, x, y)

  spec = jax.ShapeDtypeStruct
  args = (spec((clients, wl.dim), jnp.float32),
          spec((clients, wl.batch) + tuple(wl.input_shape), jnp.float32),
          spec((clients, wl.batch), jnp.int32))
  fn = client_lib.with_precision(jax.vmap(step), precision)
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def profile(run, prepare, title: str) -> str:
  """One ``run()`` traced; the summary's text, also appended to paper_shapes_profile.md
  in the results folder, and its row to paper_shapes_profile.jsonl (the Markdown is
  ``profile_summary.format_file`` of those rows)."""
  prepare()
  with tempfile.TemporaryDirectory() as where:
    with jax.profiler.trace(where):
      run()
    row = profile_summary.stored(profile_summary.summarize(where), 20, title)
  text = profile_summary.format_summary(row, row["top"], title)
  os.makedirs(common.RESULTS_DIR, exist_ok=True)
  with open(os.path.join(common.RESULTS_DIR, "paper_shapes_profile.md"), "a") as f:
    f.write(text + "\n")
  with open(os.path.join(common.RESULTS_DIR, "paper_shapes_profile.jsonl"), "a") as f:
    f.write(json.dumps(row) + "\n")
  return text


def main(_):
  mach = common.machine()
  name, shape, classes = common.MODELS[FLAGS.model]
  net = models.get_model(name, classes, shape, impl="lax")
  step_flops = models.train_step_flops(net, shape, FLAGS.batch, count="analytic")
  sizes = peaks.default_sizes()
  print(f"[paper_shapes] {mach['devices']} x {mach['device_kind']}; {FLAGS.model} "
        f"{step_flops / 1e6:.1f} MFLOP per step of {FLAGS.batch} (counted from the model)",
        flush=True)
  if FLAGS.profile and not profile_summary.available():
    FLAGS.profile = False
    print(f"[paper_shapes] --profile: jax {jax.__version__} cannot read a profile "
          "(jax.profiler.ProfileData is None); the shapes run without one (jax 0.11 reads "
          "them)", flush=True)
  nbytes = FLAGS.bandwidth_mib * 2**20 or peaks.default_bandwidth_bytes()
  bandwidth = peaks.measure_bandwidth(nbytes, reps=2)
  print(f"[paper_shapes] memory bandwidth {bandwidth:.0f} GB/s (read + written)", flush=True)
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
      # the roofline of one step of all r x K clients (module docstring)
      xla_flops, step_bytes = step_cost(wl, r * FLAGS.clients)
      flops_all = step_flops * r * FLAGS.clients
      bound_s = max(flops_all / (peak * 1e9), step_bytes / (bandwidth * 1e9))
      roofline_gflops = flops_all / bound_s / 1e9
      bound = "compute" if flops_all / (peak * 1e9) >= step_bytes / (bandwidth * 1e9) \
          else "memory"
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
                 step_bytes_xla=step_bytes, step_gflop_xla=xla_flops / 1e9,
                 arithmetic_intensity=flops_all / step_bytes if step_bytes else None,
                 bandwidth_gbs=bandwidth, roofline_gflops=roofline_gflops,
                 roofline_bound=bound, fraction_of_roofline=gflops / roofline_gflops,
                 peak_device_bytes=common.device_peak_bytes(), tag=FLAGS.tag, **mach)
      common.write_rows("paper_shapes", [row])
      print("[paper_shapes] " + common.fmt_row(row, (
          "precision", "impl", "runs", "local_steps", "seconds", "compile_s", "examples_per_s",
          "gflops_analytic", "peak_precision", "peak_gflops", "fraction_of_peak_analytic",
          "arithmetic_intensity", "roofline_bound", "roofline_gflops",
          "fraction_of_roofline", "projected_run_s")), flush=True)
      if FLAGS.profile:
        print(profile(run, prepare, f"{mach['device_kind']}, {FLAGS.model}, {precision}, "
                      f"{impl}, R = {r}, K = {FLAGS.clients}, B = {FLAGS.batch}, "
                      f"{wl.steps} steps"), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
