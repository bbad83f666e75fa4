"""One convolution layer's SGD step inside ``lax.scan`` vs unrolled, per conv impl.

XLA:CPU runs a convolution inside a while loop far slower than the same convolution at
top level when its operands are not in the default layout (jax-ml/jax#12868). The
engine runs every local step inside ``lax.scan``, so this decides the conv impl. For each
impl (``lax``: autodiff backward; ``slices``: im2col + GEMM; ``vjp``: the hand-written
default-layout backward of ``layers.canonical_conv``) and each layer shape, it times 3 SGD
steps of ``sum(sin(conv(x, k)))`` on a batch of 10, with respect to the kernel and the
input (as a layer inside a network needs both), as a rolled ``lax.scan`` and unrolled.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/conv_in_scan.py
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import layers  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.choice_list("impls", ["lax", "slices", "vjp"], layers.CONV_IMPLS,
                      "Conv implementations.")
flags.DEFINE_integer("reps", 5, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")

STEPS = 3
# (name, H=W, cin, cout, kernel size, padding): the two models' conv2 layers.
LAYERS = [("simple_cnn conv2", 30, 32, 64, 3, "VALID"), ("cnn conv2", 14, 32, 64, 5, "SAME")]


def conv_fn(impl, padding):
  if impl == "lax":
    return lambda x, k: jax.lax.conv_general_dilated(
        x, k, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
  extract = {"slices": "slices", "vjp": "vjp", "patches": "xla"}[impl]
  return lambda x, k: layers.patch_conv(x, k, (1, 1), padding, extract)


def make_train(conv, unroll):
  def train(k, x):
    def step(c, _):
      k, x = c
      gk, gx = jax.grad(lambda k, x: jnp.sum(jnp.sin(conv(x, k))), argnums=(0, 1))(k, x)
      return (k - 1e-3 * gk, x - 1e-3 * gx), None
    return jax.lax.scan(step, (k, x), None, length=STEPS, unroll=unroll)[0]
  return jax.jit(train)


def main(_):
  mach = common.machine()
  print(f"[conv_in_scan] {mach}")
  rows = []
  for name, h, cin, cout, ks, pad in LAYERS:
    kx, kk = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (10, h, h, cin))
    k = 0.1 * jax.random.normal(kk, (ks, ks, cin, cout))
    for impl in FLAGS.impls:
      ms = {}
      for label, unroll in (("scan", 1), ("unrolled", True)):
        f = make_train(conv_fn(impl, pad), unroll)
        ms[label] = 1e3 * common.best_time(
            lambda: jax.block_until_ready(f(k, x)), FLAGS.reps) / STEPS
      row = dict(bench="conv_in_scan", layer=name, impl=impl, ms_per_step_scan=ms["scan"],
                 ms_per_step_unrolled=ms["unrolled"],
                 scan_over_unrolled=ms["scan"] / ms["unrolled"], tag=FLAGS.tag, **mach)
      rows.append(row)
      print("[conv_in_scan] " + common.fmt_row(row, (
          "layer", "impl", "ms_per_step_scan", "ms_per_step_unrolled", "scan_over_unrolled")),
            flush=True)
  common.write_rows("conv_in_scan", rows)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
