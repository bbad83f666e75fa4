"""DUCC classification error of the encrypted Cheon Min against |cos(m, u_j)|, per d.

A delayed update u_j with s = (cos + 1)/2 gets the class weights (Eq. 13)
w1 = s - Min(s, 1/2) (non-conflicting) and w2 = Min(s, 1/2) - 1/2 (conflicting). With the
exact Min exactly one of them is non-zero; with Cheon's Min (d iterations) the wrong class
receives the approximation error. For each d and each |cos| bin this evaluates the Min
*under CKKS* (all N/2 slots of one ciphertext: a bin's cos values, half of each sign) and
reports

* error rate: the fraction of updates whose wrong-class |weight| >= right-class |weight|
  (the update counts more for the wrong class than for its own);
* leak > 10 %: the fraction of updates that put more than 10 % of their weight in the
  wrong class;
* leaked weight: mean of |wrong| / (|wrong| + |right|);
* the same error rate from the plaintext polynomial (``cheon.cheon_min``), and the largest
  difference between the encrypted and the plaintext Min (CKKS noise).

  python benchmarks/classification_error.py                     # 128-bit, ring 2^16
  python benchmarks/classification_error.py --preset=insecure_test --depths=4,8  # seconds
"""

from __future__ import annotations

import csv
import os
import sys
import time


from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from benchmarks import flagcheck
from benchmarks import host
from benchmarks import paths

from fedjax_async.crypto import ckks  # sets OMP_NUM_THREADS=1 unless set
from fedjax_async.crypto import cheon
from fedjax_async.crypto import entities

flags.DEFINE_enum("preset", "secure", ["secure", "insecure_test"],
                  "secure (128-bit) | insecure_test (ring 2^11).")
flagcheck.int_list("depths", ["4", "6", "8", "10", "12"], "Cheon Min iterations d.")
flags.DEFINE_string("bins", "0,0.001,0.01,0.05,0.1,0.2,0.5,1", "|cos| bin edges.")
flags.DEFINE_integer("seed", 0, "Seed of the sampled cosines.")
flags.DEFINE_string("out_csv", os.path.join(paths.RESULTS_DIR, "classification_error.csv"),
                    "CSV output, rewritten by each run (default: in "
                    "$FEDJAX_ASYNC_BENCH_RESULTS when set, else benchmarks/results of "
                    "this checkout; empty: none).")
FLAGS = flags.FLAGS


def sample_cos(rng, lo, hi, n):
  """n cosines with |cos| in [lo, hi) (log-uniform when lo > 0), alternating signs."""
  if lo > 0:
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
  else:
    mag = rng.uniform(lo, hi, n)
  sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
  return sign * mag


def class_weights(cos, min_values):
  s = (cos + 1.0) / 2.0
  w1 = s - min_values
  w2 = min_values - 0.5
  right = np.where(cos > 0, np.abs(w1), np.abs(w2))
  wrong = np.where(cos > 0, np.abs(w2), np.abs(w1))
  return right, wrong


def main(argv):
  del argv
  depths = [int(v) for v in FLAGS.depths]
  try:
    edges = [float(v) for v in FLAGS.bins.split(",")]
  except ValueError:
    sys.exit(f"error: --bins: expected comma-separated numbers, got {FLAGS.bins!r}")
  if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
    sys.exit(f"error: --bins: expected increasing edges, got {FLAGS.bins!r}")
  rows = []
  for d in depths:
    t0 = time.perf_counter()
    cc = ckks.make_context(ckks.cheon_min_depth(d), FLAGS.preset)
    keys = cc.KeyGen()
    cc.EvalMultKeyGen(keys.secretKey)
    ev = ckks.Evaluator(cc)
    slots = ev.slots
    per_bin = slots // (len(edges) - 1)
    rng = np.random.default_rng(FLAGS.seed)
    cos = np.concatenate([sample_cos(rng, lo, hi, per_bin)
                          for lo, hi in zip(edges, edges[1:])])
    s = np.zeros(slots)
    s[:cos.size] = (cos + 1.0) / 2.0
    t1 = time.perf_counter()
    ct = cheon.he_min(ev, ev.encrypt(keys.publicKey, s),
                      ev.encrypt(keys.publicKey, np.full(slots, 0.5)), d)
    he_s = time.perf_counter() - t1
    enc_min = entities.decrypt_vector(cc, keys.secretKey, ct)[:cos.size]
    plain_min = cheon.cheon_min((cos + 1.0) / 2.0, 0.5, d)
    right, wrong = class_weights(cos, enc_min)
    p_right, p_wrong = class_weights(cos, plain_min)
    for b, (lo, hi) in enumerate(zip(edges, edges[1:])):
      sl = slice(b * per_bin, (b + 1) * per_bin)
      rows.append({
          "d": d, "depth": ckks.cheon_min_depth(d), "ring_dim": cc.GetRingDimension(),
          "cos_lo": lo, "cos_hi": hi, "n": per_bin,
          "error_rate": float(np.mean(wrong[sl] >= right[sl])),
          "leak10_rate": float(np.mean(wrong[sl] > 0.1 * (wrong[sl] + right[sl]))),
          "leaked_weight": float(np.mean(wrong[sl] / (wrong[sl] + right[sl]))),
          "plain_error_rate": float(np.mean(p_wrong[sl] >= p_right[sl])),
          "max_abs_he_vs_plain": float(np.max(np.abs(enc_min[sl] - plain_min[sl]))),
          "he_seconds": he_s,
      })
    print(f"[classification_error] d={d}: {slots} slots, Min in {he_s:.1f}s "
          f"(set-up {t1 - t0:.1f}s)", flush=True)
  print(f"\npreset {FLAGS.preset}; cells: error rate / leak > "
        "10 % rate / mean leaked weight (encrypted); max |encrypted - plaintext Min| "
        f"{max(r['max_abs_he_vs_plain'] for r in rows):.1e}; plaintext-polynomial error "
        f"rate max {max(r['plain_error_rate'] for r in rows):.3f}\n")
  bins = [f"|cos| in [{lo:g}, {hi:g})" for lo, hi in zip(edges, edges[1:])]
  print("| d | depth | ring | " + " | ".join(bins) + " |")
  print("|---|---|---|" + "---|" * len(bins))
  for d in depths:
    cells = [r for r in rows if r["d"] == d]
    print(f"| {d} | {cells[0]['depth']} | 2^{int(np.log2(cells[0]['ring_dim']))} | " + " | ".join(
        f"{r['error_rate']:.3f} / {r['leak10_rate']:.3f} / {r['leaked_weight']:.1e}"
        for r in cells) + " |")
  if FLAGS.out_csv:
    os.makedirs(os.path.dirname(FLAGS.out_csv) or ".", exist_ok=True)
    prov = host.openfhe_host()  # where and how it was measured, on each row
    with open(FLAGS.out_csv, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]) + list(prov))
      w.writeheader()
      w.writerows(dict(r, **prov) for r in rows)
    print(f"\nwrote {FLAGS.out_csv}")


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
