"""Where the vmapped Fashion-MNIST CNN step spends its time (the profile behind the
fraction-of-peak miss in docs/performance.md).

Each component below is jitted on its own, vmapped over K clients with *their own*
weights (as in the engine), timed (best of --reps after a warm-up), and set against XLA's
cost analysis of the same compiled program (FLOPs and bytes accessed). Two machine
references are measured in the same run: the 2048^3 matmul peak (GFLOP/s) and a
streaming bandwidth (GB/s of ``a + b`` over 64M floats). A component whose GB/s is near the
streaming bandwidth is memory bound; one whose GFLOP/s is near peak is compute bound.

  python benchmarks/cnn_profile.py --clients=50 --batch=10

Optional: ``--trace_dir=DIR`` also writes a ``jax.profiler`` trace of one full step
(open it in Perfetto / TensorBoard's profile plugin).
"""

from __future__ import annotations



import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import layers  # noqa: E402
from fedjax_async import models  # noqa: E402

flags.DEFINE_integer("clients", 50, "K, clients vmapped together.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best reported).", lower_bound=1)
flags.DEFINE_enum("impl", "vjp", list(layers.CONV_IMPLS), "Conv implementation.")
flags.DEFINE_enum("dense", "fast", list(layers.DENSE_IMPLS),
                  "Dense layers (the other choice is timed too, as a full step).")
flags.DEFINE_string("trace_dir", "", "Write a jax.profiler trace of one full step here.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")
FLAGS = flags.FLAGS


def cost(compiled):
  c = compiled.cost_analysis()
  c = c[0] if isinstance(c, (list, tuple)) else c
  return float(c.get("flops", 0.0)), float(c.get("bytes accessed", 0.0))


def measure(name, fn, args, peak, bw, rows):
  jitted = jax.jit(fn)
  compiled = jitted.lower(*args).compile()
  flops, nbytes = cost(compiled)
  t = common.best_time(lambda: jax.block_until_ready(compiled(*args)), FLAGS.reps)
  row = dict(bench="cnn_profile", component=name, clients=FLAGS.clients, batch=FLAGS.batch,
             impl=FLAGS.impl, dense=FLAGS.dense, time_ms=t * 1e3, gflop=flops / 1e9,
             gbytes=nbytes / 1e9,
             gflops_per_s=flops / t / 1e9, gbytes_per_s=nbytes / t / 1e9,
             fraction_of_peak=flops / t / 1e9 / peak, fraction_of_bandwidth=nbytes / t / 1e9 / bw,
             tag=FLAGS.tag)
  rows.append(row)
  print(f"| {name} | {t * 1e3:.1f} | {flops / 1e9:.2f} | {nbytes / 1e9:.2f} | "
        f"{flops / t / 1e9:.1f} | {100 * flops / t / 1e9 / peak:.1f} % | "
        f"{nbytes / t / 1e9:.1f} | {100 * nbytes / t / 1e9 / bw:.0f} % |", flush=True)
  return compiled


def stream_bandwidth(n=64 * 2**20):
  a = jnp.ones((n,), jnp.float32)
  b = jnp.ones((n,), jnp.float32)
  add = jax.jit(jnp.add)
  t = common.best_time(lambda: add(a, b).block_until_ready(), 5)
  return 3 * 4 * n / t / 1e9  # read a, read b, write the sum


def measure_layers(k, bsz, keys, peak, bw, rows):
  """The CNN's pieces one by one: its GEMMs, fc1's three products, patches and pooling."""
  # The layers' GEMMs as the patches formulation issues them (fwd + both bwd products).
  def gemm_fwd_bwd(a, b):
    return jax.grad(lambda a, b: jnp.sum(jnp.tanh(a @ b)), argnums=(0, 1))(a, b)

  shapes = {"conv1 GEMM [10*784, 25] x [25, 32]": (bsz * 784, 25, 32),
            "conv2 GEMM [10*196, 800] x [800, 64]": (bsz * 196, 800, 64),
            "fc1 GEMM [10, 3136] x [3136, 512]": (bsz, 3136, 512),
            "fc2 GEMM [10, 512] x [512, 10]": (bsz, 512, 10)}
  for name, (m, kk, n) in shapes.items():
    a = jax.random.normal(keys[0], (k, m, kk))
    b = jax.random.normal(keys[1], (k, kk, n))
    measure(name, jax.vmap(gemm_fwd_bwd), (a, b), peak, bw, rows)
  # fc1's three products one by one: XLA:CPU's (Eigen's) GEMM is fast when the big
  # [3136, 512] operand is contracted on its leading axis (forward, weight gradient) and
  # ~4x slower when it is contracted on its minor axis (the input gradient g @ W^T).
  x1 = jax.random.normal(keys[0], (k, bsz, 3136))
  g1 = jax.random.normal(keys[1], (k, bsz, 512))
  w1 = jax.random.normal(keys[2], (k, 3136, 512))
  # layers.Dense computes the input gradient as (W g^T)^T (layers.dense_matmul).
  dense_dx = lambda x, w, g: jax.vjp(lambda x: layers.dense_matmul(x, w), x)[1](g)[0]
  for name, fn, args in (("fc1 forward x @ W", lambda x, w: x @ w, (x1, w1)),
                         ("fc1 input gradient g @ W^T", lambda g, w: g @ w.T, (g1, w1)),
                         ("fc1 input gradient (W g^T)^T, layers.dense_matmul", dense_dx,
                          (x1, w1, g1)),
                         ("fc1 weight gradient x^T @ g", lambda x, g: x.T @ g, (x1, g1))):
    measure(name, jax.vmap(fn), args, peak, bw, rows)
  # The non-GEMM layers: patch extraction (both extractors) and 2x2 max pooling, each
  # forward + backward (gradient of a scalar function of the output w.r.t. the input).
  def fwd_bwd(f):
    return jax.vmap(jax.grad(lambda x: jnp.sum(jnp.tanh(f(x)))))

  for shape, ksize in (((bsz, 28, 28, 1), 5), ((bsz, 14, 14, 32), 5)):
    x = jax.random.normal(keys[2], (k,) + shape)
    for ext, fn in (("xla", layers._patches_xla), ("slices", layers._patches_slices)):  # pylint: disable=protected-access
      measure(f"patches ({ext}) of {list(shape)}, {ksize}x{ksize}",
              fwd_bwd(lambda x, fn=fn: fn(x, (ksize, ksize), (1, 1), "SAME")), (x,), peak, bw,
              rows)
  for shape in ((bsz, 28, 28, 32), (bsz, 14, 14, 64)):
    x = jax.random.normal(keys[2], (k,) + shape)
    measure(f"max pool (nn.max_pool, select-and-scatter bwd) of {list(shape)}",
            fwd_bwd(layers.max_pool2_window), (x,), peak, bw, rows)
    measure(f"max pool (reshape + max: layers.max_pool2) of {list(shape)}",
            fwd_bwd(layers.max_pool2), (x,), peak, bw, rows)


def main(argv):
  del argv
  k, bsz = FLAGS.clients, FLAGS.batch
  peak = common.matmul_peak(2048, 3)
  bw = stream_bandwidth()
  net = models.get_model("cnn", 10, (28, 28, 1), impl=FLAGS.impl, dense=FLAGS.dense)
  w0, apply_flat = models.flat_model(net, (28, 28, 1), jax.random.key(0))
  other_dense = [d for d in layers.DENSE_IMPLS if d != FLAGS.dense][0]
  _, apply_other = models.flat_model(
      models.get_model("cnn", 10, (28, 28, 1), impl=FLAGS.impl, dense=other_dense),
      (28, 28, 1), jax.random.key(0))
  d = int(w0.shape[0])
  keys = jax.random.split(jax.random.key(1), 3)
  ws = w0[None] + 0.01 * jax.random.normal(keys[0], (k, d))
  xs = jax.random.normal(keys[1], (k, bsz, 28, 28, 1))
  ys = jax.random.randint(keys[2], (k, bsz), 0, 10)
  print(f"[cnn_profile] {common.machine()}; K={k}, batch {bsz}, d={d}, impl {FLAGS.impl}, "
        f"dense {FLAGS.dense}; "
        f"matmul peak {peak:.1f} GFLOP/s, streaming bandwidth {bw:.1f} GB/s\n")
  print("| component (vmapped over K) | ms | GFLOP | GB accessed | GFLOP/s | of peak | "
        "GB/s | of bandwidth |")
  print("|---|---|---|---|---|---|---|---|")

  def loss(w, x, y, apply_flat=apply_flat):
    logits = apply_flat(w, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  opt = optax.sgd(0.1, momentum=0.5)
  mom = jax.vmap(opt.init)(ws)

  def full_step(w, m, x, y, apply_flat=apply_flat):
    g = jax.grad(loss)(w, x, y, apply_flat)
    upd, m = opt.update(g, m, w)
    return optax.apply_updates(w, upd), m

  def sgd_only(w, m, g):
    upd, m = opt.update(g, m, w)
    return optax.apply_updates(w, upd), m

  rows = []
  step = measure("full local step (fwd + bwd + SGD momentum)", jax.vmap(full_step),
                 (ws, mom, xs, ys), peak, bw, rows)
  measure(f"full local step, dense layers {other_dense!r}",
          jax.vmap(lambda w, m, x, y: full_step(w, m, x, y, apply_other)),
          (ws, mom, xs, ys), peak, bw, rows)
  measure("forward + backward", jax.vmap(jax.grad(loss)), (ws, xs, ys), peak, bw, rows)
  measure("forward", jax.vmap(loss), (ws, xs, ys), peak, bw, rows)
  measure("SGD momentum update alone", jax.vmap(sgd_only), (ws, mom, ws), peak, bw, rows)
  measure_layers(k, bsz, keys, peak, bw, rows)
  common.write_rows("cnn_profile", rows)
  if FLAGS.trace_dir:
    jax.block_until_ready(step(ws, mom, xs, ys))
    with jax.profiler.trace(FLAGS.trace_dir):
      jax.block_until_ready(step(ws, mom, xs, ys))
    print(f"\n[cnn_profile] trace written under {FLAGS.trace_dir}")


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
