"""Achieved FLOP/s of the vmapped CNN round as a fraction of this machine's matmul peak.

Model FLOPs per round = K clients x local steps x (forward + backward FLOPs of one
minibatch step of the impl="lax" model, ``models.train_step_flops``), so the patches
formulation is not credited for its patch extraction. Both of the issue's counts are
reported: ``fraction_of_peak`` by XLA's cost analysis (taps on SAME padding left out,
element-wise ops in: 630 MFLOP for the CNN at batch 10) and ``fraction_of_peak_analytic``
counted from the model (every product, every tap: 724 MFLOP, what PyTorch's
``torch.utils.flop_counter`` gives for the same CNN; ``models.analytic_flops``).
Peak = a square matmul in the precision the round's products run in (``peaks.py``:
float32 local training at the process's default matmul precision, TF32 on recent NVIDIA
GPUs; ``--precision=tf32`` / ``bf16`` in those), 2048^3 on CPU and the best of 8192^3 and
16384^3 on an accelerator, measured in the same process: best of 3 at start, and again as
one more runner taking turns with the engine and the loop in every repetition; the larger
of the two is the peak (a VM that slows down mid-run then lowers the engine's figure,
never the peak's). The default 60 examples per client at batch 10
are the 6 local steps of the issue's starting point.
Also times the sequential per-client jit loop on the same workload (``--loop``) so that
"never slower than the loop" is checked in the same run. The round runs as the engine
runs it by default (``--client_chunk=-1``, as ``throughput.py`` and ``scaling.py``: the
CNN one client at a time on CPU, logistic regression in one vmap of K);
``--client_chunk=0`` forces one vmap of all K. ``--examples`` must be at least ``--batch``
(the FLOP count is of full batches).

Runs on JAX's default platform: the GPU where there is one (``JAX_PLATFORMS=cpu`` pins the
CPU). On recent NVIDIA GPUs JAX computes float32 dots and convolutions in TF32 by default,
the peak matmul and the workload alike (``JAX_DEFAULT_MATMUL_PRECISION=highest`` for full
float32); each row records ``matmul_precision`` and ``device_kind``.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/fraction_of_peak.py
  ... --clients=1000 --examples=20   # 2 local steps at 1000 clients (says so in the row)
"""

import copy
import os


from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from benchmarks import peaks  # noqa: E402
from fedjax_async.core import client as client_lib  # noqa: E402
from fedjax_async import layers  # noqa: E402
from fedjax_async import models  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "cnn", sorted(common.MODELS), "Model.")
flagcheck.int_list("clients", ["10", "50", "200"], "Clients per round K.")
flags.DEFINE_integer("examples", 60, "Examples per client (examples/batch local steps).",
                     lower_bound=1)
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Rounds fused per timed call.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_enum("impl", "vjp", list(layers.CONV_IMPLS), "Conv implementation.")
flags.DEFINE_enum("dense", "fast", list(layers.DENSE_IMPLS),
                  "Dense layers: layers.Dense (fast input gradient) or flax's nn.Dense.")
flags.DEFINE_bool("compare_dense", False,
                  "Also time the engine with the other --dense choice, taking turns.")
flags.DEFINE_bool("compare_flat_carry", False,
                  "Also time the engine whose local steps carry the flat [d] vector instead "
                  "of per-leaf pieces (models.FlatApply.split), taking turns.")
flags.DEFINE_bool("loop", True, "Also time the sequential per-client loop.")
flags.DEFINE_integer("client_chunk", -1, "Engine: clients per vmapped chunk (-1: the "
                     "engine's automatic choice, 1 for models of >= 100k parameters on CPU; "
                     "0: all K in one vmap).", lower_bound=-1)
flags.DEFINE_enum("precision", "float32", list(client_lib.PRECISIONS),
                  "The local training's arithmetic (--precision of the experiments); the "
                  "peak is measured in the same precision.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")
# A client with fewer examples than a batch trains on a partial batch, which the FLOP count
# (a full batch per local step) would over-count.
flags.register_multi_flags_validator(
    ["examples", "batch"],
    lambda v: None in (v["examples"], v["batch"]) or v["examples"] >= v["batch"],
    message="--examples: must be >= --batch (the FLOP count is of full batches of --batch "
            "examples per local step)")


def main(_):
  mach = common.machine()
  peak_precision = peaks.workload_peak_precision(FLAGS.precision)
  peak_start, peak_n = peaks.measure(peak_precision, peaks.default_sizes())
  name, shape, classes = common.MODELS[FLAGS.model]
  net = models.get_model(name, classes, shape, impl="lax")
  step_flops = models.train_step_flops(net, shape, FLAGS.batch)
  step_flops_analytic = models.train_step_flops(net, shape, FLAGS.batch, count="analytic")
  print(f"[fraction_of_peak] {mach} matmul peak ({peak_precision}, n = {peak_n}) "
        f"{peak_start:.1f} GFLOP/s at start; "
        f"{FLAGS.model} fwd+bwd {step_flops / 1e6:.1f} MFLOP per step of {FLAGS.batch} by "
        f"XLA's count, {step_flops_analytic / 1e6:.1f} counted from the model")
  rows = []
  other = [d for d in layers.DENSE_IMPLS if d != FLAGS.dense][0]
  mm_run, mm_flops = peaks.matmul_runner(peak_precision, peak_n)
  mm_prepare = lambda: None
  for k in map(int, FLAGS.clients):
    runners = {"matmul_peak": (mm_prepare, mm_run)}
    for dense in [FLAGS.dense] + ([other] if FLAGS.compare_dense else []):
      wl = common.Workload(FLAGS.model, k, num_clients=k, examples=FLAGS.examples,
                           batch=FLAGS.batch, rounds=FLAGS.rounds, impl=FLAGS.impl,
                           dense=dense, precision=FLAGS.precision)
      chunk = common.client_chunk(FLAGS.client_chunk, wl.dim)
      prep, run, _ = common.engine_runner(wl, wl.engine_config(client_chunk=chunk))
      runners["engine" if dense == FLAGS.dense else "engine_other_dense"] = (prep, run)
      if FLAGS.compare_flat_carry and dense == FLAGS.dense:
        flat_wl = copy.copy(wl)
        flat_wl.apply_flat = common.without_split(wl.apply_flat)
        prep, run, _ = common.engine_runner(
            flat_wl, flat_wl.engine_config(client_chunk=chunk))
        runners["engine_flat_carry"] = (prep, run)
      if FLAGS.loop and dense == FLAGS.dense:
        runners["loop"] = common.loop_runner(wl)
    times = common.timed_interleaved(runners, FLAGS.reps)  # taking turns: same load
    t, t_loop = times["engine"], times.get("loop", float("nan"))
    t_other = times.get("engine_other_dense", float("nan"))
    t_flat = times.get("engine_flat_carry", float("nan"))
    peak_turns = mm_flops / times["matmul_peak"] / 1e9
    peak = max(peak_start, peak_turns)
    flops = step_flops * wl.client_steps_per_round * FLAGS.rounds
    flops_analytic = step_flops_analytic * wl.client_steps_per_round * FLAGS.rounds
    row = dict(bench="fraction_of_peak", model=FLAGS.model, impl=FLAGS.impl, dense=FLAGS.dense,
               clients_per_round=k, local_steps=wl.steps, batch=FLAGS.batch,
               precision=FLAGS.precision, peak_precision=peak_precision, peak_n=peak_n,
               examples_per_s=wl.examples_per_round * FLAGS.rounds / t,
               rounds=FLAGS.rounds, client_chunk=chunk or 0, engine_s=t,
               loop_s=t_loop,
               gflops=flops / t / 1e9, loop_gflops=flops / t_loop / 1e9,
               peak_gflops=peak, peak_start_gflops=peak_start,
               peak_interleaved_gflops=peak_turns, fraction_of_peak=flops / t / 1e9 / peak,
               step_mflop=step_flops / 1e6, step_mflop_analytic=step_flops_analytic / 1e6,
               gflops_analytic=flops_analytic / t / 1e9,
               fraction_of_peak_analytic=flops_analytic / t / 1e9 / peak,
               speedup_vs_loop=t_loop / t,
               other_dense=other if FLAGS.compare_dense else "",
               other_dense_fraction_of_peak=flops / t_other / 1e9 / peak,
               speedup_vs_other_dense=t_other / t,
               flat_carry_fraction_of_peak=flops / t_flat / 1e9 / peak,
               speedup_vs_flat_carry=t_flat / t,
               xla_flags=os.environ.get("XLA_FLAGS", ""), tag=FLAGS.tag, **mach)
    rows.append(row)
    common.write_rows("fraction_of_peak", [row])  # each row as soon as it is measured
    print("[fraction_of_peak] " + common.fmt_row(row, (
        "clients_per_round", "local_steps", "engine_s", "loop_s", "gflops", "loop_gflops",
        "peak_gflops", "peak_interleaved_gflops", "fraction_of_peak",
        "fraction_of_peak_analytic", "speedup_vs_loop",
        "other_dense_fraction_of_peak", "speedup_vs_other_dense",
        "flat_carry_fraction_of_peak", "speedup_vs_flat_carry")), flush=True)
  del rows


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
