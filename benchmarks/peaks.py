"""This device's dense matmul peak in each precision, measured, beside the datasheet's.

  PYTHONPATH=. python benchmarks/peaks.py                       # n = 8192, 16384 on a GPU
  PYTHONPATH=. JAX_PLATFORMS=cpu python benchmarks/peaks.py --sizes=128 --min_time=0.01

One jitted n x n x n product per precision, on random normal data, called back to back
until ``--min_time`` seconds have passed (so that neither the launch nor the host's
dispatch is timed: a lone 2048^3 product takes ~35 us on an H200, its launch and
synchronisation as long); the best of ``--reps`` such timings and of ``--sizes``:

* ``float32``: float32 operands under ``jax.default_matmul_precision("float32")``
  (HIGHEST: full float32 arithmetic);
* ``tf32``: float32 operands under ``jax.default_matmul_precision("tensorfloat32")``;
* ``bf16``: bfloat16 operands;
* ``default``: float32 operands at this process's default precision, what un-annotated
  float32 code (the ``--precision=float32`` local training) gets: TF32 on recent NVIDIA
  GPUs unless ``JAX_DEFAULT_MATMUL_PRECISION`` says otherwise.

Each row carries the datasheet's dense figure for the device where ``DATASHEET`` knows it
("datasheet: unknown" otherwise). Other benchmarks take their peaks from ``measure`` in
their own process, in the precision their workload runs in (``workload_peak_precision``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Optional, Sequence, Tuple

from absl import app, flags

from benchmarks import common
from benchmarks import flagcheck

import jax  # noqa: E402  (after common: quiet TPU probe)
import jax.numpy as jnp  # noqa: E402

PRECISIONS = ("float32", "tf32", "bf16", "default")

# Dense peaks in TFLOP/s by precision ("default" = what float32 dots get by default on the
# card: TF32). Sources: NVIDIA's datasheets, "NVIDIA H100 Tensor Core GPU" (SXM, PCIe,
# NVL), "NVIDIA H200 Tensor Core GPU" (SXM, NVL) and "NVIDIA A100 Tensor Core GPU"; their
# TF32 and BF16 Tensor Core figures for Hopper are printed "with sparsity", halved here
# for dense products; FP32 is the CUDA cores' figure.
DATASHEET: Dict[str, Dict[str, float]] = {
    "H100 SXM": {"float32": 67.0, "tf32": 494.5, "bf16": 989.5},
    "H100 PCIe": {"float32": 51.0, "tf32": 378.0, "bf16": 756.5},
    "H100 NVL": {"float32": 60.0, "tf32": 417.5, "bf16": 835.5},
    "H200 SXM": {"float32": 67.0, "tf32": 494.5, "bf16": 989.5},
    "H200 NVL": {"float32": 60.0, "tf32": 417.5, "bf16": 835.5},
    "A100": {"float32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


def datasheet_model(device_kind: str) -> Optional[str]:
  """The ``DATASHEET`` entry of a JAX ``device_kind`` ("NVIDIA H100 80GB HBM3" -> "H100
  SXM", "NVIDIA H200" -> "H200 SXM", "NVIDIA A100-SXM4-40GB" -> "A100"), or None."""
  kind = device_kind.lower()
  for chip in ("h100", "h200"):
    if chip in kind:
      if "nvl" in kind:
        return f"{chip.upper()} NVL"
      if "pcie" in kind:
        return f"{chip.upper()} PCIe" if chip == "h100" else None
      if chip == "h200" or "hbm3" in kind or "sxm" in kind:
        return f"{chip.upper()} SXM"
      return None
  return "A100" if "a100" in kind else None


def datasheet_tflops(device_kind: str, precision: str) -> Optional[float]:
  """The datasheet's dense TFLOP/s for ``precision`` ("default": TF32's) or None."""
  model = datasheet_model(device_kind)
  if model is None:
    return None
  return DATASHEET[model]["tf32" if precision == "default" else precision]


def datasheet_text(device_kind: str, precision: str) -> str:
  tflops = datasheet_tflops(device_kind, precision)
  if tflops is None:
    return "datasheet: unknown"
  return f"datasheet ({datasheet_model(device_kind)}): {tflops:g} TFLOP/s dense"


def workload_peak_precision(precision: str) -> str:
  """The ``PRECISIONS`` entry whose peak a local training of ``precision`` (float32, tf32,
  bf16) is measured against: float32 code runs at the process's default precision."""
  return "default" if precision == "float32" else precision


def _context(precision: str):
  if precision == "float32":
    return jax.default_matmul_precision("float32")
  if precision == "tf32":
    return jax.default_matmul_precision("tensorfloat32")
  return contextlib.nullcontext()


def lower(precision: str, n: int):
  """``(lowered, a, b)``: the n^3 product of ``precision`` lowered for random normal
  ``a``, ``b`` (bfloat16 for "bf16")."""
  if precision not in PRECISIONS:
    raise ValueError(f"unknown precision {precision!r}; choices: {', '.join(PRECISIONS)}")
  ka, kb = jax.random.split(jax.random.key(n))
  dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
  a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
  with _context(precision):
    return jax.jit(jnp.matmul).lower(a, b), a, b


def matmul_runner(precision: str, n: int, min_time: float = 0.2):
  """``(run, flops)``: ``run()`` calls one compiled n^3 product of ``precision`` back to
  back (as many calls as took ``min_time`` s on a first pass) and blocks; ``flops`` is
  the FLOPs of one ``run()``."""
  lowered, a, b = lower(precision, n)
  mm = lowered.compile()
  mm(a, b).block_until_ready()  # warm-up
  t0, calls = time.perf_counter(), 0
  while calls < 2 or time.perf_counter() - t0 < min_time:
    mm(a, b).block_until_ready()
    calls += 1
  iters = max(1, int(calls * min_time / (time.perf_counter() - t0)))

  def run():
    out = None
    for _ in range(iters):
      out = mm(a, b)  # queued: the device runs them back to back
    out.block_until_ready()

  return run, 2.0 * n**3 * iters


def measure(precision: str, sizes: Sequence[int], reps: int = 3,
            min_time: float = 0.2) -> Tuple[float, int]:
  """(best GFLOP/s, the n it came at) of ``precision``'s product over ``sizes``."""
  best = (0.0, 0)
  for n in sizes:
    run, flops = matmul_runner(precision, n, min_time)
    gflops = flops / common.best_time(run, reps, warmup=1) / 1e9
    best = max(best, (gflops, n))
  return best


def bandwidth_runner(nbytes: int, min_time: float = 0.2):
  """``(run, bytes)``: ``run()`` calls one compiled ``2 * x + 1`` over ``nbytes`` of float32
  back to back (as many calls as took ``min_time`` s on a first pass) and blocks; ``bytes``
  is what one ``run()`` reads and writes (each element read once, written once)."""
  n = max(1, nbytes // 4)
  x = jnp.ones((n,), jnp.float32)
  f = jax.jit(lambda a: 2.0 * a + 1.0).lower(x).compile()
  f(x).block_until_ready()
  t0, calls = time.perf_counter(), 0
  while calls < 2 or time.perf_counter() - t0 < min_time:
    f(x).block_until_ready()
    calls += 1
  iters = max(1, int(calls * min_time / (time.perf_counter() - t0)))

  def run():
    out = None
    for _ in range(iters):
      out = f(x)
    out.block_until_ready()

  return run, 2.0 * 4 * n * iters


def measure_bandwidth(nbytes: int, reps: int = 3, min_time: float = 0.2) -> float:
  """GB/s of device memory (bytes read + written) streamed by an elementwise op, the
  roofline's memory slope."""
  run, nb = bandwidth_runner(nbytes, min_time)
  return nb / common.best_time(run, reps, warmup=1) / 1e9


def default_bandwidth_bytes() -> int:
  """2 GiB on an accelerator (well past its L2), 256 MiB on CPU."""
  return 2**28 if jax.default_backend() == "cpu" else 2**31


def rate(gflops: float) -> str:
  return f"{gflops / 1e3:.1f} TFLOP/s" if gflops >= 1e3 else f"{gflops:.1f} GFLOP/s"


def default_sizes() -> Tuple[int, ...]:
  """Large enough to fill an accelerator; on CPU the 2048^3 product the CPU figures use."""
  return (2048,) if jax.default_backend() == "cpu" else (8192, 16384)


def main(_):
  mach = common.machine()
  sizes = [int(s) for s in FLAGS.sizes] or list(default_sizes())
  kind = mach["device_kind"]
  print(f"[peaks] {mach['devices']} x {kind} ({mach['backend']}), JAX default matmul "
        f"precision: {mach['matmul_precision']}; sizes {sizes}", flush=True)
  for precision in FLAGS.precisions:
    gflops, n = measure(precision, sizes, FLAGS.reps, FLAGS.min_time)
    sheet = datasheet_tflops(kind, precision)
    row = dict(bench="peaks", precision=precision, peak_gflops=gflops, n=n, sizes=sizes,
               datasheet_model=datasheet_model(kind), datasheet_tflops=sheet,
               fraction_of_datasheet=(gflops / 1e3 / sheet) if sheet else None,
               tag=FLAGS.tag, **mach)
    common.write_rows("peaks", [row])
    frac = f" ({row['fraction_of_datasheet']:.0%} of it)" if sheet else ""
    print(f"[peaks] {precision:>8}: measured {rate(gflops)} at n = {n}; "
          f"{datasheet_text(kind, precision)}{frac}", flush=True)
  nbytes = FLAGS.bandwidth_mib * 2**20 if FLAGS.bandwidth_mib else default_bandwidth_bytes()
  gbs = measure_bandwidth(nbytes, FLAGS.reps, FLAGS.min_time)
  row = dict(bench="bandwidth", gbytes_per_s=gbs, nbytes=nbytes, tag=FLAGS.tag, **mach)
  common.write_rows("bandwidth", [row])
  print(f"[peaks] memory bandwidth: {gbs:.0f} GB/s (2 * x + 1 over {nbytes / 2**20:.0f} MiB "
        "of float32, bytes read + written)", flush=True)


FLAGS = flags.FLAGS

if __name__ == "__main__":
  flagcheck.choice_list("precisions", list(PRECISIONS), PRECISIONS, "Precisions to measure.")
  flags.DEFINE_list("sizes", [], "Square sizes n to try, the best reported (default "
                    "8192,16384 on an accelerator, 2048 on CPU).")
  flags.register_validator("sizes", lambda v: all(s.isdigit() and int(s) >= 8 for s in v),
                           message="--sizes: expected comma-separated integers >= 8")
  flags.DEFINE_integer("reps", 3, "Timed repetitions per size (best is kept).", lower_bound=1)
  flags.DEFINE_float("min_time", 0.2, "Seconds of back-to-back products per timing.",
                     lower_bound=0.0)
  flags.DEFINE_integer("bandwidth_mib", 0, "MiB streamed by the bandwidth probe (default "
                       "2048 on an accelerator, 256 on CPU).", lower_bound=0)
  flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")
  app.run(main, flags_parser=flagcheck.parse_flags)
