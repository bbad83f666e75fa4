"""Encrypted Min(a, b): precision vs depth vs time (PAFed Alg. 1 and alternatives).

For each method, on the same N/2 random pairs (a, b) in [0, 1]^2 packed in one CKKS
ciphertext each, reports the multiplicative depth consumed, max/mean |Min - min(a, b)|
(over all pairs and over pairs with |a - b| >= 2^-k), wall and CPU time of the
homomorphic evaluation and amortised microseconds per comparison (CPU time by default:
OpenFHE runs single-threaded here, so it is the wall time on an unloaded core). Methods:

* cheon_d{d}: Cheon et al. (2019) Min, Alg. 1 of PAFed, d iterations (``crypto.cheon``;
  scaled recurrence, depth 2d + 1).
* seed_d{d}: Alg. 1 exactly as written (constant multiplications by 1/2, 1/4 cost a
  level each; n_i^2 and (n_i - 3)/4 computed in parallel): depth 2d + 2, the baseline.
* cheb_sign_{n}: OpenFHE ``EvalChebyshevFunction`` of sign(x) on [-1, 1], degree n, then
  min = (a+b)/2 - (a-b) sign(a-b)/2.
* comp_g{i}f{j}: Cheon-Kim-Kim (ASIACRYPT 2020) composite sign g_3^i then f_3^j with
  f_3(x) = (35x - 35x^3 + 21x^5 - 5x^7)/16, g_3(x) = (4589x - 16577x^3 + 25614x^5
  - 12860x^7)/2^10 (each degree-7 odd polynomial at depth 3), min as above.

Default (< 5 min on 2 cores): 128-bit security, ring chosen by OpenFHE (2^15/2^16).
Full run used for docs/crypto.md:
  python benchmarks/min_depth.py --security=128 --ring_dim=65536 \
    --depths=4,6,8,10,12 --cheb_degrees=59,119,247 --composite=0:3,1:2,2:2,2:3,3:2 \
    --out_csv=/tmp/min_depth.csv --png=/tmp/min_depth.png
"""

from __future__ import annotations

import csv
import math
import time


from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from benchmarks import flagcheck
from benchmarks import host

from fedjax_async.crypto import ckks  # sets OMP_NUM_THREADS=1 unless set
from fedjax_async.crypto import cheon
from fedjax_async.crypto import entities

FLAGS = flags.FLAGS
CHEB_MAX_DEGREE = 2031  # the last row of cheb_depth's table (OpenFHE's depth table)


def parse_composite(spec: str):
  """``--composite``'s ``g:f`` (g_3 applied g times, then f_3 f times) as (g, f); None
  unless both are integers >= 0, not both 0."""
  parts = spec.split(":")
  if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
    return None
  gi, fj = (int(p) for p in parts)
  return (gi, fj) if gi + fj >= 1 else None


def define_flags():
  """The script's flags (defined when it runs, so that its figure can be drawn from
  another program)."""
  flagcheck.power_of_two("ring_dim", 0, "Ring dimension N, a power of two (0: the smallest "
                          "secure for the depth).")
  flags.DEFINE_enum("security", "128", ["128", "insecure"], "128-bit classic or NotSet.")
  flagcheck.int_list("depths", ["4", "6", "8", "10"], "Cheon Min iterations d.")
  flagcheck.int_list("seed_depths", ["10"], "Alg. 1 as written (baseline), iterations d.")
  flagcheck.int_list("cheb_degrees", ["59", "119", "247"], "Chebyshev sign degrees.")
  flags.register_validator(
      "cheb_degrees", lambda v: all(not str(x).strip().lstrip("-").isdigit()
                                    or int(x) <= CHEB_MAX_DEGREE for x in v),
      message=f"--cheb_degrees: each degree must be at most {CHEB_MAX_DEGREE} (OpenFHE's "
              "Chebyshev depth table)")
  flagcheck.item_list("composite", ["1:2", "2:2", "2:3"],
                      "Composite sign methods, each g:f: g_3 applied g times then f_3 f "
                      "times (e.g. 0:3,1:2).",
                      "g:f iteration counts (g_3 then f_3 compositions, integers >= 0, not "
                      "both 0), e.g. 1:2,2:3", item_ok=lambda v: parse_composite(v) is not None)
  flagcheck.int_list("gaps_log2", ["2", "4", "6", "8"], "k: errors restricted to |a-b|>=2^-k.",
                     minimum=0)
  flags.DEFINE_integer("seed", 0, "Input seed.")
  flags.DEFINE_enum("clock", "cpu", ["cpu", "wall"],
                    "us_per_slot from process CPU time (OpenFHE single-threaded: the "
                    "uncontended wall time on a shared machine) or wall time.")
  flags.DEFINE_string("out_csv", "", "CSV output path.")
  flags.DEFINE_string("png", "", "PNG plot output path.")


F3 = (35 / 16, -35 / 16, 21 / 16, -5 / 16)
G3 = (4589 / 1024, -16577 / 1024, 25614 / 1024, -12860 / 1024)


def he_odd7(ev, x, coeffs):
  """c1 x + c3 x^3 + c5 x^5 + c7 x^7 at depth 3 (constants ride on x at level 1)."""
  c1, c3, c5, c7 = coeffs
  t = ev.square(x)  # x^2, level 1
  t2 = ev.square(t)  # x^4, level 2
  x3 = ev.mult(ev.mult_const(x, c7), t)  # c7 x^3, level 2
  terms = [ev.mult_const(x, c1),  # level 1
           ev.mult(ev.mult_const(x, c3), t),  # level 2
           ev.mult(ev.mult_const(x, c5), t2),  # level 3
           ev.mult(x3, t2)]  # level 3
  return ev.add_many(terms)


def he_min_seed(ev, a, b, iterations):
  """Alg. 1 verbatim: x=(a+b)/2, y=(a-b)/2, m0=y^2, n0=y^2-1, m+=m(1-n/2), n+=n^2(n-3)/4."""
  x = ev.mult_const(ev.add(a, b), 0.5)
  y = ev.mult_const(ev.sub(a, b), 0.5)
  m = ev.square(y)
  n = ev.add_const(m, -1.0)
  for _ in range(iterations):
    m_next = ev.mult(m, ev.const_sub(1.0, ev.mult_const(n, 0.5)))
    n = ev.mult(ev.square(n), ev.mult_const(ev.add_const(n, -3.0), 0.25))
    m = m_next
  return ev.sub(x, m)


def he_min_from_sign(ev, a, b, sign_fn):
  """min(a, b) = (a+b)/2 - ((a-b)/2) sign(a-b); one level after the sign."""
  diff = ev.sub(a, b)
  half_sum = ev.mult_const(ev.add(a, b), 0.5)
  half_diff = ev.mult_const(diff, 0.5)
  return ev.sub(half_sum, ev.mult(half_diff, sign_fn(diff)))


def methods():
  """(name, family, depth needed, fn(ev, cc, a, b))."""
  out = []
  for d in (int(x) for x in FLAGS.depths):
    out.append((f"cheon_d{d}", "cheon", ckks.cheon_min_depth(d),
                lambda ev, cc, a, b, d=d: cheon.he_min(ev, a, b, d)))
  for d in (int(x) for x in FLAGS.seed_depths):
    out.append((f"seed_d{d}", "seed", 2 * d + 2,
                lambda ev, cc, a, b, d=d: he_min_seed(ev, a, b, d)))
  for n in (int(x) for x in FLAGS.cheb_degrees):
    depth = cheb_depth(n) + 1

    def fn(ev, cc, a, b, n=n):
      sign = lambda x: cc.EvalChebyshevFunction(lambda v: float(np.sign(v)), x, -1.0, 1.0, n)
      return he_min_from_sign(ev, a, b, sign)

    out.append((f"cheb_sign_{n}", "chebyshev", depth, fn))
  for spec in FLAGS.composite:
    gi, fj = parse_composite(spec)

    def fn(ev, cc, a, b, gi=gi, fj=fj):
      def sign(x):
        for coeffs in [G3] * gi + [F3] * fj:
          x = he_odd7(ev, x, coeffs)
        return x
      return he_min_from_sign(ev, a, b, sign)

    out.append((f"comp_g{gi}f{fj}", "composite", 3 * (gi + fj) + 1, fn))
  return out


def cheb_depth(degree: int) -> int:
  """OpenFHE's Paterson-Stockmeyer Chebyshev depth table (FUNCTION_EVALUATION.md)."""
  for bound, depth in ((5, 3), (13, 4), (27, 5), (59, 6), (119, 7), (247, 8), (495, 9),
                       (1007, 10), (CHEB_MAX_DEGREE, 11)):
    if degree <= bound:
      return depth
  raise ValueError(degree)


def run_one(name, depth, fn, a_vals, b_vals, preset, ring_dim):
  cc = ckks.make_context(depth, preset, ring_dim or None)
  keys = cc.KeyGen()
  cc.EvalMultKeyGen(keys.secretKey)
  ev = ckks.Evaluator(cc)
  slots = ev.slots
  a, b = a_vals[:slots], b_vals[:slots]
  ca, cb = ev.encrypt(keys.publicKey, a), ev.encrypt(keys.publicKey, b)
  t0, c0 = time.perf_counter(), time.process_time()
  out = fn(ev, cc, ca, cb)
  wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  got = entities.decrypt_vector(cc, keys.secretKey, out)
  err = np.abs(got - np.minimum(a, b))
  gap = np.abs(a - b)
  row = {"method": name, "depth": ckks.depth_used(out), "context_depth": depth,
         "ring_dim": cc.GetRingDimension(), "security": FLAGS.security, "slots": slots,
         "max_err": float(err.max()), "mean_err": float(err.mean()), "wall_s": wall,
         "cpu_s": cpu, "us_per_slot": (cpu if FLAGS.clock == "cpu" else wall) / slots * 1e6}
  for k in FLAGS.gaps_log2:
    sel = gap >= 2.0 ** -int(k)
    row[f"max_err_gap2^-{k}"] = float(err[sel].max()) if sel.any() else math.nan
  return row


def plot(rows, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for family, marker in (("seed", "x"), ("cheon", "o"), ("chebyshev", "s"),
                         ("composite", "^")):
    fam = [r for r in rows if r["family"] == family]
    if not fam:
      continue
    axes[0].semilogy([r["depth"] for r in fam], [r["max_err"] for r in fam], marker,
                     label=family, linestyle="-")
    axes[1].loglog([r["us_per_slot"] for r in fam], [r["max_err"] for r in fam], marker,
                   label=family, linestyle="-")
    for r in fam:
      axes[1].annotate(r["method"], (r["us_per_slot"], r["max_err"]), fontsize=6)
  axes[0].set_xlabel("multiplicative depth")
  axes[1].set_xlabel("amortised us / comparison")
  for ax in axes:
    ax.set_ylabel("max |Min - min| on [0,1]^2")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  rings = sorted({r["ring_dim"] for r in rows})
  fig.suptitle(f"encrypted Min on [0,1]^2, N in {rings}, security={rows[0]['security']}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  preset = "secure" if FLAGS.security == "128" else "insecure_test"
  if preset == "insecure_test" and not FLAGS.ring_dim:
    raise app.UsageError("--security=insecure needs --ring_dim")
  rng = np.random.default_rng(FLAGS.seed)
  max_slots = (FLAGS.ring_dim or 2 ** 17) // 2
  a_vals, b_vals = rng.uniform(0, 1, max_slots), rng.uniform(0, 1, max_slots)
  rows = []
  for name, family, depth, fn in methods():
    try:
      row = run_one(name, depth, fn, a_vals, b_vals, preset, FLAGS.ring_dim)
    except ValueError as e:  # a ring too small for the security level at this depth
      raise app.UsageError(f"--ring_dim={FLAGS.ring_dim}: {e}") from None
    row["family"] = family
    rows.append(row)
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()), flush=True)
  keys = list(rows[0].keys())
  print("\n" + " | ".join(keys))
  for r in rows:
    print(" | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys))
  if FLAGS.out_csv:  # each row with where and how it was measured (host.openfhe_host)
    prov = host.openfhe_host()
    with open(FLAGS.out_csv, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=keys + list(prov))
      writer.writeheader()
      writer.writerows(dict(r, **prov) for r in rows)
  if FLAGS.png:
    plot(rows, FLAGS.png)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=flagcheck.parse_flags)
