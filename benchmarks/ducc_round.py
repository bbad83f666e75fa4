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

``--design=streamed`` runs ``streamed_ducc`` (vectors at depth 2, N=2^14; scalars at
depth 2d + 5), which fits the CNN itself (measured, not extrapolated):
  python benchmarks/ducc_round.py --design=streamed --dims=1663370 --target_dim=0 \
      --kt_recipients=10 --out_jsonl=benchmarks/results/ducc_round.jsonl
``--out_jsonl`` appends one row per size: dim, online, delayed, preset, measured (false
for an extrapolated row), peak_rss_gib, server_s (S0 + S1, with S0's receiving and the
messages' deserialisation), client_encrypt_s and client_decrypt_s (per client),
key_transform_s, the stages, where it ran and ``bytes``: the round's messages
serialised, in bytes per direction (clients->S0, S0->S1, S1->S0, S0->clients), with
``wire_s`` the CPU seconds of their (de)serialisation.

``--workers=N`` runs Alg. 5 per chunk on S0's and S1's pools of N processes each
(``crypto.parallel``; 0: the machine's cores for 16 chunks or more, 1: in this process);
rows then add workers, workers_cpu_s (the pools' CPU seconds), server_cpu_s (S0 + S1 here
and in the pools, with --clock=cpu), server_wall_s (streamed: the round's wall time but
the clients'), workers_peak_rss_gib (the workers' peaks, summed) and the load average
before the round. 1 vs 2 workers for the CNN:
  python benchmarks/ducc_round.py --design=streamed --dims=1663370 --target_dim=0 \
      --kt_recipients=20 --workers=2

Each run prints the CPU-time calibrations of ``secure_engine.round_estimate`` it measures
(a ``calibration:`` line: one_context at N = 2^16 from a 1-chunk and a larger size,
streamed from two sizes or more); ``--write_calibration`` writes them, with this command
and host as their source, to fedjax_async/crypto/calibration.json (128-bit, --clock=cpu):
  python benchmarks/ducc_round.py --dims=32768,65536 --target_dim=0 --write_calibration
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import resource
import time


from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

from benchmarks import flagcheck
from benchmarks import host

from fedjax_async.crypto import ckks  # sets OMP_NUM_THREADS=1 unless set
from fedjax_async.crypto import calibration
from fedjax_async.crypto import cheon
from fedjax_async.crypto import parallel
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import secure_engine
from fedjax_async.crypto import streamed_ducc
from fedjax_async.crypto import vectors
from fedjax_async.crypto import wire as wire_lib

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
flags.DEFINE_string("out_jsonl", "", "Append one JSON row per size to this file.")
flags.DEFINE_enum("design", "one_context", ["one_context", "streamed"],
                  "one_context: secure_ducc (every product at the Min's depth); streamed: "
                  "streamed_ducc (vectors in a depth-2 context, scalars in a deep one).")
flags.DEFINE_integer("workers", 0, "Alg. 5's per-chunk work in S0's and S1's pools of this "
                     "many worker processes each (0: the machine's cores for a model of "
                     f"{parallel.AUTO_MIN_CHUNKS} chunks or more, else 1; 1: in this "
                     "process).", lower_bound=0)
flags.DEFINE_enum("parallel_backend", "process", list(parallel.BACKENDS),
                  "process: concurrent.futures process pools; ray: Ray actors (a local "
                  "ray.init(); pip install fedjax_async[ray]).")
flags.register_validator(
    "parallel_backend",
    lambda v: v != "ray" or importlib.util.find_spec("ray") is not None,
    message="ray is not installed (pip install 'fedjax_async[ray]')")
flags.DEFINE_enum("clock", "cpu", ["cpu", "wall"],
                  "cpu: process CPU seconds (OpenFHE is single-threaded here, so this is "
                  "the uncontended wall time on a shared machine); wall: perf_counter.")
flags.DEFINE_bool("write_calibration", False,
                  "Write the CPU-time calibrations of the round's estimate that this run "
                  "measures (its 'calibration:' line) into "
                  "fedjax_async/crypto/calibration.json, this command and host as their "
                  "source: 128-bit, --clock=cpu, two sizes or more (one_context: one of "
                  "them one chunk).")
flags.register_multi_flags_validator(
    ["write_calibration", "security", "clock"],
    lambda v: not v["write_calibration"] or (v["security"] == "128" and v["clock"] == "cpu"),
    message="--write_calibration: the estimate's calibrations are 128-bit CPU seconds "
            "(--security=128 --clock=cpu)")

CONSTANT_STAGES = ("min",)
# "normalise": S0's ||m||^2 for S1 and S1's masked 1/||m|| (the Min's unit mean, Sec. V-A).
STAGES = ("client_encrypt", "normalise", "inner_products", "min", "weighting", "division",
          "projection", "eq17", "key_transform", "decrypt")
# streamed_ducc's stages: S0 receive (msum), inner products, S1's refreshes, the scalar
# work (Min, class totals, division, coefficients), the chunked update, Alg. 5.
STREAMED_STAGES = ("client_encrypt", "receive", "inner_products", "s1_refresh", "min",
                   "class_totals", "division", "coefficients", "combine", "key_transform",
                   "decrypt")


def stages():
  return STREAMED_STAGES if FLAGS.design == "streamed" else STAGES


def peak_rss_gib() -> float:
  """This process's peak resident memory so far (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def children_peak_rss_gib() -> float:
  """The sum of the peak resident memory (VmHWM) of this process's live children: the
  worker pools (and multiprocessing's resource tracker); 0 without /proc."""
  total = 0
  try:
    for tid in os.listdir("/proc/self/task"):
      with open(f"/proc/self/task/{tid}/children") as f:
        for pid in f.read().split():
          with open(f"/proc/{pid}/status") as g:
            total += sum(int(line.split()[1]) for line in g if line.startswith("VmHWM:"))
  except OSError:
    return 0.0
  return total / 2 ** 20


def reference(w, online, delayed, alphas, d):
  """Eq. 17 with DUCC (Alg. 4) in float64 numpy and the same Cheon Min (Alg. 1)."""
  m = online.mean(0)
  s = (delayed @ (m / np.linalg.norm(m)) + 1) / 2  # the mean normalised (Sec. V-A)
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
  step = (streamed_ducc.streamed_pafed_step if FLAGS.design == "streamed" else
          secure_ducc.secure_pafed_step)
  load = os.getloadavg()[0]
  t0, c0 = time.perf_counter(), time.process_time()
  result = step(proto, w, online, delayed, alphas)
  total = (time.process_time() - c0) if FLAGS.clock == "cpu" else time.perf_counter() - t0
  wall = time.perf_counter() - t0
  got, timings, breakdown = result.w, result.timings, result.breakdown
  want = reference(w, online, delayed, alphas, FLAGS.min_depth)
  row = {s: breakdown.get(s, 0.0) for s in stages()}
  slots = proto.s0.vev.slots if FLAGS.design == "streamed" else proto.s0.ev.slots
  uploads = len(online) + len(delayed)
  row.update(dim=dim, chunks=ckks.num_chunks(dim, slots), total_s=total,
             wall_s=wall,
             max_abs_err=float(np.max(np.abs(got - want))),
             update_norm=float(np.linalg.norm(want - w)),
             server_s=timings["ducc"] + timings["key_transform"],
             client_encrypt_s=timings["client_encrypt"] / uploads,
             **({"bytes": result.wire_bytes, "wire_s": breakdown["wire_s"]}
                if result.wire_bytes is not None else {}),
             client_decrypt_s=timings["decrypt"], key_transform_s=timings["key_transform"],
             peak_rss_gib=peak_rss_gib(), measured=True, load_avg_1m_before=load,
             workers=parallel.resolve_workers(FLAGS.workers, ckks.num_chunks(dim, slots)),
             workers_cpu_s=breakdown.get("workers_cpu_s", 0.0))
  if "server_wall_s" in breakdown:
    row["server_wall_s"] = breakdown["server_wall_s"]
  if FLAGS.clock == "cpu":  # S0 + S1 in this process, and their workers
    row["server_cpu_s"] = row["server_s"] + row["workers_cpu_s"]
  return row


def primitive_costs(proto, repeats: int = 5) -> dict:
  """CPU seconds of one vector-context primitive each (streamed design): encryption,
  decryption with decoding, unrelinearised product, relinearisation, slot sum."""
  ev, s1 = proto.s0.vev, proto.s1.vector
  x = np.random.default_rng(0).normal(size=ev.slots) * 1e-3
  cts = [ev.encrypt(proto.s0.vector_public.pk_s, x) for _ in range(2)]

  def timed(fn):
    c0 = time.process_time()
    for _ in range(repeats):
      out = fn()
    return (time.process_time() - c0) / repeats, out

  costs = {}
  costs["encrypt"], _ = timed(lambda: ev.encrypt(proto.s0.vector_public.pk_s, x))
  costs["decrypt"], _ = timed(lambda: s1.decrypt_masked(cts[0]))
  costs["product"], prod = timed(lambda: ev.cc.EvalMultNoRelin(cts[0], cts[1]))
  costs["relinearise"], _ = timed(lambda: ev.cc.Relinearize(prod))
  costs["slot_sum"], _ = timed(lambda: ev.eval_sum(cts[0]))
  return costs


def predict(costs: dict, chunks: int, online: int, delayed: int, recipients: int) -> dict:
  """The streamed round's model-size work from the primitives (docs/crypto.md, "Cost
  model"): per client C encryptions and C decryptions; S0 2 (k + 1) C products, C + k + 1
  relinearisations, k + 1 slot sums; Alg. 5 (R + 1) C encryptions by S0 (its mask and a
  fresh Enc_pk_i(r) per recipient), C decryptions and (R + 1) C encryptions by S1 (each
  chunk encoded once: an encryption of an encoded plaintext costs about 0.7 of one with
  its encoding, measured 3.5 / 5.0 ms at N = 2^14). The scalar steps (the Min...) and
  the messages' (de)serialisation are not in it."""
  k1 = delayed + 1
  return {
      "client_encrypt_s": chunks * costs["encrypt"],
      "client_decrypt_s": chunks * costs["decrypt"],
      "s0_vectors_s": (2 * k1 * chunks * costs["product"]
                       + (chunks + k1) * costs["relinearise"] + k1 * costs["slot_sum"]),
      "key_transform_s": chunks * (costs["encrypt"] + costs["decrypt"]
                                   + (2 * recipients + 1) * 0.7 * costs["encrypt"]),
  }


def extrapolate(rows, proto):
  """The row at --target_dim: each stage linear in the chunks (constant for the stages of
  one packed ciphertext), from the measured rows."""
  chunks = np.array([r["chunks"] for r in rows], float)
  target_chunks = ckks.num_chunks(
      FLAGS.target_dim, (proto.s0.vev if FLAGS.design == "streamed" else proto.s0.ev).slots)
  ext = {"dim": FLAGS.target_dim, "chunks": target_chunks, "extrapolated": True,
         "measured": False}
  for s in stages():
    ys = [r[s] for r in rows]
    if s in CONSTANT_STAGES:  # one packed ciphertext: no chunk term
      ext[s] = float(np.mean(ys))
    else:
      b, a = np.polyfit(chunks, ys, 1)
      ext[s] = float(a + b * target_chunks)
  ext["total_s"] = float(sum(ext[s] for s in stages()))
  ext["wall_s"] = float("nan")  # wall time on a shared machine does not extrapolate
  print("extrapolated (linear in chunks): " +
        " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                 for k, v in ext.items()), flush=True)
  return ext


def calibration_values(rows, ring: int) -> dict:
  """The CPU-time calibrations of ``secure_engine.round_estimate`` that the measured rows
  give ({} where they give none): one_context (at N = 2^16) the 1-chunk round's CPU
  seconds, the slope per further chunk and the round's uploads; streamed (at the vector
  ring of 128 bits) the fit t = fixed + per_upload_chunk x uploads x chunks."""
  rows = [r for r in rows if r.get("measured")]
  uploads = FLAGS.online + FLAGS.delayed
  chunks = [r["chunks"] for r in rows]
  totals = [r["total_s"] for r in rows]
  if len(set(chunks)) < 2:
    return {}
  if FLAGS.design == "streamed":
    if ring != secure_engine.STREAMED_RING_128:
      return {}
    b, a = np.polyfit([uploads * c for c in chunks], totals, 1)
    return {"STREAMED_CPU_S_FIXED": round(float(a), 1),
            "STREAMED_CPU_S_PER_UPLOAD_CHUNK": round(float(b), 4)}
  if ring != 2 ** 16 or 1 not in chunks:
    return {}
  b, _ = np.polyfit(chunks, totals, 1)
  return {"ROUND_CPU_S_ONE_CHUNK": round(totals[chunks.index(1)], 1),
          "ROUND_CPU_S_PER_CHUNK": round(float(b), 1), "ROUND_UPLOADS": uploads}


def report_calibration(rows, ring: int):
  """Prints the calibrations the rows give (``calibration_values``) and, with
  --write_calibration, writes them to ``calibration.PATH`` with this run as source."""
  values, where = calibration_values(rows, ring), os.path.relpath(calibration.PATH, host.ROOT)
  if not values:
    print(f"calibration: none from this run ({where} holds the estimate's "
          "constants, each with the command that measures it)")
    if FLAGS.write_calibration:
      raise SystemExit("error: --write_calibration: this run measures no calibration (a "
                       "128-bit ring, two sizes or more; one_context: one of one chunk)")
    return
  print("calibration: " + ", ".join(f"{k}={v}" for k, v in values.items())
        + f" (measured here; --write_calibration writes them to {where})")
  if FLAGS.write_calibration:
    prov = host.openfhe_host()
    calibration.write(values, {
        "command": "python " + prov["command"],
        "host": f"{prov['cpu']}, {prov['cores']} cores, load {prov['load_avg_1m']}, "
                f"OpenFHE {prov['openfhe']}, {prov['time']}",
        "rows": os.path.relpath(FLAGS.out_jsonl, host.ROOT) if FLAGS.out_jsonl else "stdout"})
    print(f"calibration: written to {where}")


def write_rows(rows, preset):
  """The table on stdout, and the rows to --out_csv / --out_jsonl."""
  print(f"stage times are {FLAGS.clock} seconds")
  keys = ["dim", "chunks"] + list(stages()) + ["total_s", "wall_s", "max_abs_err",
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
  if FLAGS.out_jsonl:
    prov = host.openfhe_host()
    with open(FLAGS.out_jsonl, "a") as f:
      for r in rows:
        f.write(json.dumps(dict(r, design=FLAGS.design, preset=preset, online=FLAGS.online,
                                delayed=FLAGS.delayed, min_depth=FLAGS.min_depth,
                                kt_recipients=FLAGS.kt_recipients or FLAGS.num_clients,
                                num_clients=FLAGS.num_clients,
                                clock=FLAGS.clock, **prov)) + "\n")


def main(argv):
  del argv
  preset = "secure" if FLAGS.security == "128" else "insecure_test"
  if FLAGS.clock == "cpu":
    secure_ducc.CLOCK = time.process_time
  dims = [int(d) for d in FLAGS.dims]
  t0, c0 = time.perf_counter(), time.process_time()
  rec = list(range(FLAGS.kt_recipients)) if FLAGS.kt_recipients else None
  try:
    if FLAGS.design == "streamed":
      proto = streamed_ducc.make_streamed_protocol(
          FLAGS.num_clients, dims[0], preset, FLAGS.min_depth, recipients=rec,
          ring_dim=FLAGS.ring_dim or None, max_delayed=FLAGS.delayed,
          workers=FLAGS.workers, backend=FLAGS.parallel_backend)
      proto.keep_client_models = False  # each recipient's model is sent away
    else:
      proto = secure_ducc.make_protocol(FLAGS.num_clients, dims[0], preset, FLAGS.min_depth,
                                        ring_dim=FLAGS.ring_dim or None, recipients=rec,
                                        workers=FLAGS.workers,
                                        backend=FLAGS.parallel_backend)
    proto.wire = wire_lib.Wire()  # messages as bytes, counted (both designs)
  except ValueError as e:  # a ring too small for the security level
    raise app.UsageError(f"--ring_dim={FLAGS.ring_dim}: {e}") from None
  setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
  cc = proto.cc
  deep = proto.s0.ev.cc
  print(f"setup (KDC keygen) {setup:.1f}s wall, {setup_cpu:.1f}s cpu: design={FLAGS.design} "
        f"N={cc.GetRingDimension()} depth={cc.GetMultiplicativeDepth()} "
        + (f"(scalars: N={deep.GetRingDimension()} depth={deep.GetMultiplicativeDepth()}) "
           if deep is not cc else "") + f"security={FLAGS.security} "
        f"online={FLAGS.online} delayed={FLAGS.delayed} K={FLAGS.num_clients} "
        f"kt_recipients={FLAGS.kt_recipients or FLAGS.num_clients}", flush=True)
  # Warm-up (OpenFHE's lazily built tables): one encryption, product, EvalSum.
  c = proto.clients[0].encrypt_update(np.ones(8))[0]
  ev = proto.s0.vev if FLAGS.design == "streamed" else proto.s0.ev
  ev.eval_sum(ev.mult(c, c))
  costs = primitive_costs(proto) if FLAGS.design == "streamed" else None
  if costs:
    print("vector-context primitives (CPU ms): " + ", ".join(
        f"{k} {v * 1e3:.2f}" for k, v in costs.items()), flush=True)
  rng = np.random.default_rng(0)
  rows = []
  for dim in dims:
    if costs:
      pred = predict(costs, ckks.num_chunks(dim, proto.s0.vev.slots), FLAGS.online,
                     FLAGS.delayed, FLAGS.kt_recipients or FLAGS.num_clients)
      print(f"predicted at {dim}: " + ", ".join(f"{k} {v:.2f}" for k, v in pred.items()),
            flush=True)
    row = measure(proto, dim, rng)
    if costs:
      row.update({"predicted_" + k: v for k, v in pred.items()},
                 primitives_ms={k: v * 1e3 for k, v in costs.items()})
    rows.append(row)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in row.items()), flush=True)
  if any(r.get("workers", 1) > 1 for r in rows):
    workers_peak = children_peak_rss_gib()
    for r in rows:
      r["workers_peak_rss_gib"] = workers_peak  # summed over the workers, whole run
  proto.close()
  if FLAGS.target_dim and len(rows) >= 2:
    rows.append(extrapolate(rows, proto))
  write_rows(rows, preset)
  report_calibration(rows, cc.GetRingDimension())

if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
