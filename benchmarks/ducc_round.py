"""One full encrypted PAFed round (Alg. 3 lines 9-14: DUCC + Eq. 17 + Alg. 5) timed by stage.

Runs ``secure_pafed_step`` with --online online and --delayed delayed random unit uploads
of a --dim parameter model and prints the breakdown: client encryption, inner products,
Min (Alg. 1), weighting/accumulation, division (masked inverse with S1), projection
(Eq. 12), Eq. 17, key transformation (Alg. 5), decryption. It also checks the result
against a float64 plaintext DUCC with the same Cheon Min (max_abs_err).

Every stage except Min and the division exchange is linear in the number of ciphertext
chunks ceil(dim / (N/2)). With several --dims the script fits t = a + b * chunks per stage
and extrapolates to --target_dim (default: the Fashion-MNIST CNN, 1,663,370 parameters).

Default (about 5-10 min on 2 cores): 128-bit, d=10 (depth 28, N=2^16), 1 and 2 chunks,
extrapolated to 51 chunks:
  python benchmarks/ducc_round.py --dims=32768,65536 --out_csv=/tmp/ducc_round.csv
"""

from __future__ import annotations

import csv
import time


from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from benchmarks import flagcheck
from benchmarks import host

from fedjax_async.crypto import ckks  # sets OMP_NUM_THREADS=1 unless set
from fedjax_async.crypto import cheon
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import vectors

FLAGS = flags.FLAGS
flagcheck.int_list("dims", ["32768", "65536"], "Model sizes to measure.")
flags.DEFINE_integer("target_dim", 1663370, "Extrapolate to this size (0: no).", lower_bound=0)
flags.DEFINE_integer("online", 10, "Online uploads.", lower_bound=1)
flags.DEFINE_integer("delayed", 10, "Delayed uploads.", lower_bound=0)
flags.DEFINE_integer("num_clients", 20, "K: key pairs; key transformation recipients.",
                     lower_bound=1)
flags.DEFINE_integer("kt_recipients", 0, "Re-encrypt for this many clients, at most "
                     "--num_clients (0: all K).", lower_bound=0)
flags.register_multi_flags_validator(
    ["kt_recipients", "num_clients"],
    lambda v: v["kt_recipients"] is None or v["num_clients"] is None
    or v["kt_recipients"] <= v["num_clients"],
    message="--kt_recipients: must be <= --num_clients (the key transformation re-encrypts "
            "for clients 0..kt_recipients-1 of the K; 0: all K)")
flags.DEFINE_integer("min_depth", 10, "Cheon Min iterations d.", lower_bound=1)
flags.DEFINE_enum("security", "128", ["128", "insecure"], "128-bit classic or NotSet.")
flagcheck.power_of_two("ring_dim", 0, "Ring dimension, a power of two (0: OpenFHE's "
                        "choice).")
flags.DEFINE_string("out_csv", "", "CSV output path.")
flags.DEFINE_enum("clock", "cpu", ["cpu", "wall"],
                  "cpu: process CPU seconds (OpenFHE is single-threaded here, so this is "
                  "the uncontended wall time on a shared machine); wall: perf_counter.")

CONSTANT_STAGES = ("min",)
# "normalise": S0's ||m||^2 for S1 and S1's masked 1/||m|| (the Min's unit mean, Sec. V-A).
STAGES = ("client_encrypt", "normalise", "inner_products", "min", "weighting", "division",
          "projection", "eq17", "key_transform", "decrypt")


def reference(w, online, delayed, alphas, d):
  """Eq. 17 with DUCC (Alg. 4) in float64 numpy and the same Cheon Min (Alg. 1)."""
  m = online.mean(0)
  s = (delayed @ m + 1) / 2
  x = cheon.cheon_min(s, 0.5, d)
  w1, w2 = s - x, x - 0.5
  m1 = (w1 @ delayed) / w1.sum() if w1.sum() != 0 else 0 * m
  m2 = (w2 @ delayed) / w2.sum() if w2.sum() != 0 else 0 * m
  m2 = m2 - (m2 @ m) / (m @ m) * m
  return w + alphas[0] * m + alphas[1] * m1 + alphas[2] * m2


def measure(proto, dim, rng):
  """Online updates share a common direction (cos ~ 0.3 to it); the delayed ones sit at
  cosines +-0.2..0.9 to the online mean (half of them conflicting)."""
  common = vectors.unit(rng.normal(size=dim))
  online = vectors.with_cos(common, [0.3] * FLAGS.online, dim, rng)
  m_hat = vectors.unit(online.mean(0))
  cos = rng.uniform(0.2, 0.9, FLAGS.delayed) * np.where(np.arange(FLAGS.delayed) % 2, -1, 1)
  delayed = vectors.with_cos(m_hat, cos, dim, rng)
  w = rng.normal(size=dim) * 0.05
  alphas = (1.0, 0.5, 0.5)
  proto.dim = dim
  t0, c0 = time.perf_counter(), time.process_time()
  got, timings = secure_ducc.secure_pafed_step(proto, w, online, delayed, alphas)
  total = (time.process_time() - c0) if FLAGS.clock == "cpu" else time.perf_counter() - t0
  wall = time.perf_counter() - t0
  want = reference(w, online, delayed, alphas, FLAGS.min_depth)
  row = {s: proto.last_breakdown.get(s, 0.0) for s in STAGES}
  row.update(dim=dim, chunks=ckks.num_chunks(dim, proto.s0.ev.slots), total_s=total,
             wall_s=wall,
             max_abs_err=float(np.max(np.abs(got - want))),
             update_norm=float(np.linalg.norm(want - w)))
  return row


def main(argv):
  del argv
  preset = "secure" if FLAGS.security == "128" else "insecure_test"
  if FLAGS.clock == "cpu":
    secure_ducc.CLOCK = time.process_time
  dims = [int(d) for d in FLAGS.dims]
  t0, c0 = time.perf_counter(), time.process_time()
  rec = list(range(FLAGS.kt_recipients)) if FLAGS.kt_recipients else None
  try:
    proto = secure_ducc.make_protocol(FLAGS.num_clients, dims[0], preset, FLAGS.min_depth,
                                      ring_dim=FLAGS.ring_dim or None, recipients=rec)
  except ValueError as e:  # a ring too small for the security level
    raise app.UsageError(f"--ring_dim={FLAGS.ring_dim}: {e}") from None
  setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
  cc = proto.cc
  print(f"setup (KDC keygen) {setup:.1f}s wall, {setup_cpu:.1f}s cpu: N={cc.GetRingDimension()} "
        f"depth={cc.GetMultiplicativeDepth()} security={FLAGS.security} "
        f"online={FLAGS.online} delayed={FLAGS.delayed} K={FLAGS.num_clients} "
        f"kt_recipients={FLAGS.kt_recipients or FLAGS.num_clients}", flush=True)
  # Warm-up (OpenFHE's lazily built tables): one encryption, product, EvalSum.
  c = proto.clients[0].encrypt_update(np.ones(8))[0]
  proto.s0.ev.eval_sum(proto.s0.ev.mult(c, c))
  rng = np.random.default_rng(0)
  rows = []
  for dim in dims:
    row = measure(proto, dim, rng)
    rows.append(row)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()), flush=True)
  if FLAGS.target_dim and len(rows) >= 2:
    chunks = np.array([r["chunks"] for r in rows], float)
    target_chunks = ckks.num_chunks(FLAGS.target_dim, proto.s0.ev.slots)
    ext = {"dim": FLAGS.target_dim, "chunks": target_chunks, "extrapolated": True}
    for s in STAGES:
      ys = [r[s] for r in rows]
      if s in CONSTANT_STAGES:  # one packed ciphertext: no chunk term
        ext[s] = float(np.mean(ys))
      else:
        b, a = np.polyfit(chunks, ys, 1)
        ext[s] = float(a + b * target_chunks)
    ext["total_s"] = float(sum(ext[s] for s in STAGES))
    ext["wall_s"] = float("nan")  # wall time on a shared machine does not extrapolate
    rows.append(ext)
    print("extrapolated (linear in chunks): " +
          " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in ext.items()), flush=True)
  print(f"stage times are {FLAGS.clock} seconds")
  keys = ["dim", "chunks"] + list(STAGES) + ["total_s", "wall_s", "max_abs_err",
                                              "update_norm"]
  print("\n" + " | ".join(keys))
  for r in rows:
    print(" | ".join(f"{r.get(k, float('nan')):.4g}" if not isinstance(r.get(k), int)
                     else str(r[k]) for k in keys))
  if FLAGS.out_csv:  # each row with where and how it was measured (host.openfhe_host)
    prov = host.openfhe_host()
    with open(FLAGS.out_csv, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=keys + ["extrapolated"] + list(prov),
                              extrasaction="ignore")
      writer.writeheader()
      writer.writerows(dict(r, **prov) for r in rows)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
