"""Where a logistic-regression round's time goes (the profile behind the 10x-the-loop target).

For each K (clients per round), FedAvg, 60 features, 10 classes, batch 10:

1. **XLA's optimized HLO of the engine**: the instructions of the local-step loop body
   (the while body holding the step's dots), each one kernel launch ("thunk") of
   XLA:CPU, listed by kind;
2. **round = fixed + per-step cost**: the engine's time per round with 1, 6 and 12 local
   steps, fitted by least squares; the per-step slope divided by K is the cost of one
   client-step;
3. **the step's pieces**, timed standalone on [K, ...] arrays, one jitted call each: the
   batched forward dot ([B x 60] x [60 x 10] per client), the weight-gradient dot, one
   elementwise pass over the [K, 610] parameters, the minibatch gather, and a call that
   does nothing (the dispatch cost included in the others; read the pieces at large K);
4. **the step without its GEMMs**: the engine's round (6 steps) with the dense layer
   replaced by a dot-free stand-in with the same parameters (logits = x[:, :10] *
   kernel[0] + bias), i.e. what the round would cost if both matrix products were free;
5. **the loops' cost per client**: the per-client jit loop (one call per client) and
   fedjax's pattern (one call per step), divided by the number of client trainings.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/logreg_profile.py
  ... --clients=10,1000

Rows go to ``benchmarks/results/logreg_profile.jsonl``. Nothing here asserts a timing.
"""

import collections
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import models  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.int_list("clients", ["10", "200", "1000"], "Clients per round K.")
flags.DEFINE_integer("rounds", 20, "Rounds fused per timed engine call.", lower_bound=1)
flags.DEFINE_integer("reps", 5, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")

BATCH, FEATURES, CLASSES = 10, 60, 10
_SKIP = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast")


def step_body_ops(hlo_text: str) -> collections.Counter:
  """Kinds of the instructions in the while body that holds the local step's dots."""
  bodies = re.findall(r"while\([^)]*\), condition=%[\w.\-]+, body=(%[\w.\-]+)", hlo_text)
  for name in bodies:
    m = re.search(re.escape(name) + r" \(.*?\n(.*?)\n}\n", hlo_text, re.S)
    if m and " dot(" in m.group(1):
      kinds = collections.Counter()
      for line in m.group(1).splitlines():
        op = re.search(r"%([\w\-.]+) = \S+ ([\w\-]+)\(", line)
        if not op or op.group(2) in _SKIP:
          continue
        kind = op.group(2)
        if kind == "fusion":  # named after its ops, e.g. "select_add_fusion"
          kind = re.sub(r"\.\d+$", "", op.group(1))
        elif kind == "call":  # a fusion split over threads: "parallel_<name>"
          callee = re.search(r"to_apply=%(?:parallel_)?([\w\-]+?)(?:\.\d+)?(?:,|$)", line)
          kind = callee.group(1) if callee else "call"
        kinds[kind] += 1
      return kinds
  return collections.Counter()


class DotFreeStandIn(nn.Module):
  """Logistic regression's parameters (Dense_0 kernel [60, 10], bias) without a matmul."""

  @nn.compact
  def __call__(self, x, train=False):
    del train
    x = x.reshape(x.shape[0], -1)
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], CLASSES))
    bias = self.param("bias", nn.initializers.zeros_init(), (CLASSES,))
    return x[:, :CLASSES] * kernel[0] + bias


def engine_round_s(k: int, steps: int, compiled_out=None, dot_free=False) -> float:
  wl = common.Workload("logreg", k, num_clients=k, examples=steps * BATCH, batch=BATCH,
                       rounds=FLAGS.rounds)
  if dot_free:
    wl.w0, wl.apply_flat = models.flat_model(DotFreeStandIn(), (FEATURES,),
                                             jax.random.key(0))
  prep, run, compiled = common.engine_runner(wl)
  if compiled_out is not None:
    compiled_out.append(compiled)
  return common.timed(prep, run, FLAGS.reps) / FLAGS.rounds


def pieces_us(k: int) -> dict:
  """Standalone times (µs) of one local step's pieces at K clients."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((k, BATCH, FEATURES), np.float32))
  w = jnp.asarray(rng.standard_normal((k, FEATURES, CLASSES), np.float32))
  g = jnp.asarray(rng.standard_normal((k, BATCH, CLASSES), np.float32))
  flat = jnp.asarray(rng.standard_normal((k, FEATURES * CLASSES + CLASSES), np.float32))
  data = jnp.asarray(rng.standard_normal((k, 6 * BATCH, FEATURES), np.float32))
  rows = jnp.asarray(rng.integers(0, 6 * BATCH, (k, BATCH)))
  fns = {
      "forward_dot": (lambda x, w: jnp.einsum("kbf,kfc->kbc", x, w), (x, w)),
      "weight_grad_dot": (lambda x, g: jnp.einsum("kbf,kbc->kfc", x, g), (x, g)),
      "elementwise_pass": (lambda p: p * 0.9 + 0.1, (flat,)),
      "gather": (lambda d, r: jax.vmap(lambda d, r: d[r])(d, r), (data, rows)),
      "dispatch": (lambda a: a + 1.0, (jnp.float32(1.0),)),  # a call that does nothing
  }
  out = {}
  for name, (fn, args) in fns.items():
    f = jax.jit(fn)
    out[name] = common.best_time(lambda: jax.block_until_ready(f(*args)),
                                 FLAGS.reps * 4) * 1e6
  return out


def main(_):
  mach = common.machine()
  print(f"[logreg_profile] {mach}")
  rows = []
  for k in map(int, FLAGS.clients):
    compiled = []
    per_round = {s: engine_round_s(k, s, compiled if s == 6 else None) for s in (1, 6, 12)}
    slope, fixed = np.polyfit(list(per_round), list(per_round.values()), 1)
    ops = step_body_ops(compiled[0].as_text())
    dot_free = engine_round_s(k, 6, dot_free=True)
    pieces = pieces_us(k)
    wl = common.Workload("logreg", k, num_clients=k, examples=6 * BATCH, batch=BATCH,
                         rounds=2)
    loops = {}
    for name, make in (("loop", common.loop_runner), ("fedjax_loop",
                                                       common.fedjax_loop_runner)):
      prep, run = make(wl)
      loops[name] = common.timed(prep, run, 2) / (2 * k) * 1e6
    row = dict(bench="logreg_profile", clients_per_round=k, rounds=FLAGS.rounds,
               round_s_1_6_12_steps=[per_round[s] for s in (1, 6, 12)],
               fixed_us_per_round=fixed * 1e6, us_per_client_step=slope / k * 1e6,
               step_body_kernels=sum(ops.values()), step_body_ops=dict(ops),
               dot_free_round_s=dot_free,
               **{f"{n}_us": v for n, v in pieces.items()},
               **{f"{n}_us_per_client": v for n, v in loops.items()}, tag=FLAGS.tag, **mach)
    rows.append(row)
    print(f"[logreg_profile] K={k}: round = {fixed * 1e6:.0f} µs + steps x "
          f"{slope * 1e6:.0f} µs  ->  {slope / k * 1e6:.2f} µs per client-step")
    print(f"  local-step loop body: {sum(ops.values())} kernels per step: "
          + ", ".join(f"{n} x{c}" for n, c in sorted(ops.items())))
    net = {n: v - pieces["dispatch"] for n, v in pieces.items() if n != "dispatch"}
    print(f"  pieces at K={k}, µs per jitted call less the {pieces['dispatch']:.1f} µs of an "
          "empty call: " + ", ".join(f"{n} {v:.1f}" for n, v in net.items())
          + f"  ->  per client: forward dot {net['forward_dot'] / k:.2f}, weight-gradient "
          f"dot {net['weight_grad_dot'] / k:.2f}")
    print(f"  engine round (6 steps) at K={k}: {per_round[6] * 1e6:.0f} µs; with a dot-free "
          f"stand-in model {dot_free * 1e6:.0f} µs (the GEMMs: "
          f"{100 * (1 - dot_free / per_round[6]):.0f} % of the round)")
    print(f"  loops, µs per client trained (6 steps): per-client jit "
          f"{loops['loop']:.0f}, fedjax per-step jit {loops['fedjax_loop']:.0f}; "
          f"engine {6 * slope / k * 1e6 + fixed / k * 1e6:.1f}", flush=True)
  common.write_rows("logreg_profile", rows)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
