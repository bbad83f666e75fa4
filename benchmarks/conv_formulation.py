"""Conv as nn.Conv (lax) vs patches + GEMM, vmapped over clients vs a per-client loop.

Prints, for this machine:

1. a 2048^3 float32 matmul's GFLOP/s (best of --reps after warm-up), taken as peak;
2. for the Fashion-MNIST CNN, one local SGD step on a batch of --batch examples for C
   clients (each with its own flat parameters), as one ``jit(vmap(step))`` and as a
   sequential loop of ``jit(step)`` calls, for impl=lax and impl=patches: time, GFLOP/s,
   fraction of peak, and vmap time / loop time. impl=slices is PatchConv with im2col
   by shifted slices instead of ``lax.conv_general_dilated_patches``.

GFLOP/s uses the *model* FLOPs (XLA cost analysis of the impl=lax per-client step, x C)
for both impls, so rows are comparable; ``xla_gflop`` is each impl's own XLA count,
which for patches also counts the patch extraction. One JSON line per row goes to
stdout and, with --out, to that file.

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/conv_formulation.py --clients=10,50
"""

import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import layers  # noqa: E402
from fedjax_async import models  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.int_list("clients", ["10", "50"], "Client counts C.")
flagcheck.choice_list("impls", ["lax", "patches", "slices", "vjp"], layers.CONV_IMPLS,
                      "Conv implementations (fedjax_async.layers.CONV_IMPLS).")
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_integer("matmul_n", 2048, "Size of the peak matmul.", lower_bound=1)
flags.DEFINE_string("out", None, "Append JSON lines here too.")

INPUT_SHAPE = (28, 28, 1)


def make_step(impl):
  """(w0, step) for one client's SGD step on the CNN with conv ``impl``."""
  model = models.get_model("cnn", 10, INPUT_SHAPE, impl=impl)
  w0, apply_flat = models.flat_model(model, INPUT_SHAPE, jax.random.key(0))

  def loss(w, x, y):
    logits = apply_flat(w, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(w, x, y):
    value, g = jax.value_and_grad(loss)(w, x, y)
    return w - 0.01 * g, value

  return w0, step


def step_flops(step, w, x, y):
  """XLA cost-analysis FLOPs of one per-client step."""
  cost = jax.jit(step).lower(w, x, y).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    return float(sum(c.get("flops", 0.0) for c in cost if c))
  return float(cost.get("flops", 0.0))


def client_data(num_clients, batch, w0):
  """Per-client parameters (perturbed copies of w0), inputs and labels."""
  kw, kx, ky = jax.random.split(jax.random.key(1), 3)
  ws = w0 + 0.01 * jax.random.normal(kw, (num_clients, w0.size), w0.dtype)
  xs = jax.random.normal(kx, (num_clients, batch, *INPUT_SHAPE), jnp.float32)
  ys = jax.random.randint(ky, (num_clients, batch), 0, 10)
  return ws, xs, ys


def time_vmap(step, ws, xs, ys, reps):
  """Seconds for one jit(vmap(step)) over all clients."""
  f = jax.jit(jax.vmap(step))
  return common.best_time(lambda: jax.block_until_ready(f(ws, xs, ys)), reps)


def time_loop(step, ws, xs, ys, reps):
  """Seconds for a Python loop of jit(step), one call per client."""
  f = jax.jit(step)
  args = [(ws[c], xs[c], ys[c]) for c in range(ws.shape[0])]
  jax.block_until_ready(args)
  return common.best_time(lambda: jax.block_until_ready([f(*a) for a in args]), reps)


def emit(row, out):
  """Prints a JSON row and appends it to ``out`` when given."""
  line = json.dumps(row)
  print(line, flush=True)
  if out:
    with open(out, "a") as fh:
      fh.write(line + "\n")


def main(argv):
  del argv
  peak = common.matmul_peak(FLAGS.matmul_n, max(FLAGS.reps, 3))
  t_mm = 2 * FLAGS.matmul_n**3 / peak / 1e9
  emit({"row": "peak", "matmul_n": FLAGS.matmul_n, "time_s": round(t_mm, 5),
        "gflops": round(peak, 2), "device": str(jax.devices()[0]),
        "cpu_count": os.cpu_count()}, FLAGS.out)

  steps = {impl: make_step(impl) for impl in FLAGS.impls}
  w0 = steps[FLAGS.impls[0]][0]
  x1 = jnp.zeros((FLAGS.batch, *INPUT_SHAPE))
  y1 = jnp.zeros((FLAGS.batch,), jnp.int32)
  xla_flops = {impl: step_flops(s, w0, x1, y1) for impl, (_, s) in steps.items()}
  model_flops = step_flops(make_step("lax")[1], w0, x1, y1)

  table = []
  for num_clients in map(int, FLAGS.clients):
    ws, xs, ys = client_data(num_clients, FLAGS.batch, w0)
    for impl, (_, step) in steps.items():
      times = {"vmap": time_vmap(step, ws, xs, ys, FLAGS.reps),
               "loop": time_loop(step, ws, xs, ys, FLAGS.reps)}
      for mode, t in times.items():
        gflops = model_flops * num_clients / t / 1e9
        row = {"row": "cnn_step", "impl": impl, "mode": mode, "clients": num_clients,
               "batch": FLAGS.batch, "time_s": round(t, 4),
               "model_gflop": round(model_flops * num_clients / 1e9, 3),
               "xla_gflop": round(xla_flops[impl] * num_clients / 1e9, 3),
               "gflops": round(gflops, 2), "frac_peak": round(gflops / peak, 4),
               "vmap_over_loop": round(times["vmap"] / times["loop"], 3)}
        emit(row, FLAGS.out)
        table.append(row)

  print(f"\npeak (matmul {FLAGS.matmul_n}^3 f32): {peak:.1f} GFLOP/s")
  print(f"{'C':>4} {'impl':>8} {'mode':>5} {'time_s':>8} {'GFLOP/s':>8} "
        f"{'%peak':>6} {'vmap/loop':>9}")
  for r in table:
    print(f"{r['clients']:>4} {r['impl']:>8} {r['mode']:>5} {r['time_s']:>8.4f} "
          f"{r['gflops']:>8.2f} {100 * r['frac_peak']:>6.1f} {r['vmap_over_loop']:>9.3f}")


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
