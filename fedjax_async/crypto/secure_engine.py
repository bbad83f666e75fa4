"""The round loop with PAFed's server under CKKS (``crypto.secure_aggregation=ckks``).

The same round as ``fedjax_async.rounds.engine.round_step``, with step 5 (the server) replaced by
the encrypted protocol of ``secure_ducc`` (``crypto.ckks_design=one_context``) or
``streamed_ducc`` (``streamed``):

1-4. ``engine.client_phase`` (jitted): gather from the ring buffer, vmapped ADMM local
     training, unit-normalised uploads (Alg. 3 line 8), dual variables scattered back.
5.   on the host: clients encrypt their uploads under pk_s, S0 runs the encrypted DUCC
     (Alg. 4, Cheon Min with d iterations) and Eq. 17 on Enc_pk_s(w), S1 and S0 run the
     masked key transformation (Alg. 5) for the clients that train next round, and a
     client decrypts w^{t+1} with its own key.
6.   ``engine.finish_round`` (jitted): ring-buffer write and the round's metrics.

The encrypted global model is carried from round to round (S0 never sees w in the
clear); the decrypted copy that the simulation continues with is the one a client
obtains. Rounds run one at a time (the host work per round is seconds to minutes, so
fusing rounds in a scan would buy nothing). Time per round is split into client
encryption, DUCC, key transformation and decryption, and printed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async.rounds import engine
from fedjax_async.rounds import ops
from fedjax_async.rounds import timeline as timeline_lib
from fedjax_async.algorithms import base
from fedjax_async.crypto import cheon
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import streamed_ducc

STAGES = ("client_encrypt", "ducc", "key_transform", "decrypt")
INSECURE_WARNING = ("WARNING: crypto.ckks_preset=insecure_test: CKKS with ring 2^11 and no "
                    "security level (HEStd_NotSet) is NOT secure; for tests only")


# The largest log2(Q) that 128-bit classic security allows per ring dimension N
# (HomomorphicEncryption.org standard, the table OpenFHE applies for HEStd_128_classic).
MAX_LOG_Q_128 = {2 ** 10: 27, 2 ** 11: 54, 2 ** 12: 109, 2 ** 13: 218, 2 ** 14: 438,
                 2 ** 15: 881, 2 ** 16: 1747, 2 ** 17: 3523}
# CPU seconds of one round at N = 2^16, 10 online + 10 delayed uploads: 57 with one chunk
# of N/2 parameters, 16 more per further chunk (benchmarks/ducc_round.py, depth 28,
# docs/crypto.md).
ROUND_CPU_S_ONE_CHUNK, ROUND_CPU_S_PER_CHUNK, ROUND_UPLOADS = 57.0, 16.0, 20
# The streamed design (benchmarks/results/ducc_round.jsonl, the CNN row): OpenFHE's ring
# for the depth-2 vector context at 128 bits, the scalar context's keys (relinearisation
# and 4 rotation keys at N = 2^16, measured RSS), and CPU seconds of the round's scalar
# work plus its model-size work per (upload x ciphertext), the key transformation for as
# many recipients as uploads (21 s + 0.016 s x 20 x 204 = 86 s; measured 86.7).
STREAMED_RING_128 = 2 ** 14
STREAMED_KEY_BYTES = int(0.9 * 2 ** 30)
STREAMED_CPU_S_FIXED, STREAMED_CPU_S_PER_UPLOAD_CHUNK = 21.0, 0.016


def round_estimate(dim: int, uploads: int, preset: str, min_depth: int,
                   design: str = "one_context") -> dict:
  """What one encrypted round needs, before any key is made: the ring dimension N (the
  preset's, or the smallest that holds the context's modulus at 128-bit), ceil(dim /
  (N/2)) chunks, a fresh ciphertext's bytes (2 N (depth + 1) 8-byte limbs), the bytes of
  the round's uploads alone (a lower bound on its memory), and CPU seconds scaled from
  the measured round (rough: linear in uploads, chunks and N)."""
  from fedjax_async.crypto import ckks  # pylint: disable=g-import-not-at-top
  if design == "streamed":
    return _streamed_estimate(dim, uploads, ckks.get_preset(preset))
  depth = ckks.ducc_depth(min_depth)
  p = ckks.get_preset(preset)
  log_q = p.first_mod_size + depth * p.scaling_mod_size
  ring = p.ring_dim or min(n for n, q in MAX_LOG_Q_128.items() if q >= log_q)
  chunks = -(-dim // (ring // 2))
  ct_bytes = 2 * ring * (depth + 1) * 8
  cpu_s = ((ROUND_CPU_S_ONE_CHUNK + ROUND_CPU_S_PER_CHUNK * (chunks - 1)) * uploads
           / ROUND_UPLOADS * ring / 2 ** 16)
  return {"design": "one_context", "ring": ring, "depth": depth, "chunks": chunks,
          "ciphertext_bytes": ct_bytes, "upload_bytes": uploads * chunks * ct_bytes,
          "memory_bytes": uploads * chunks * ct_bytes, "cpu_s": cpu_s,
          "streamed_memory_bytes": _streamed_estimate(dim, uploads, p)["memory_bytes"]}


def _streamed_estimate(dim: int, uploads: int, p) -> dict:
  """``round_estimate`` of ``streamed_ducc``: S0 keeps the delayed uploads (at most all
  of them), then the key transformation holds one copy per recipient (at most all)."""
  ring = p.ring_dim or STREAMED_RING_128
  chunks = -(-dim // (ring // 2))
  ct_bytes = 2 * ring * (streamed_ducc.VECTOR_DEPTH + 1) * 8
  held = (uploads + 4) * chunks * ct_bytes  # delayed (or recipients) + msum, w, w', mask
  keys = STREAMED_KEY_BYTES if p.ring_dim is None else 0
  return {"design": "streamed", "ring": ring, "depth": streamed_ducc.VECTOR_DEPTH,
          "chunks": chunks,
          "ciphertext_bytes": ct_bytes, "upload_bytes": uploads * chunks * ct_bytes,
          "memory_bytes": held + keys,
          "cpu_s": STREAMED_CPU_S_FIXED + STREAMED_CPU_S_PER_UPLOAD_CHUNK * uploads * chunks
          * ring / STREAMED_RING_128}


def available_memory_bytes() -> int:
  """MemAvailable of /proc/meminfo (else all physical memory)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_round_fits(est: dict, uploads: int, dim: int, available: int):
  """ValueError naming the flags that change it when the round's estimated memory
  (``round_estimate``'s ``memory_bytes``) exceeds the memory available."""
  if est["memory_bytes"] <= available:
    return
  if est["design"] == "streamed":
    raise ValueError(
        f"crypto.secure_aggregation=ckks crypto.ckks_design=streamed: one round of {uploads} "
        f"uploads of {dim:,} parameters holds ~{est['memory_bytes'] / 2**30:.1f} GiB "
        f"({est['chunks']} "
        f"ciphertexts of {est['ciphertext_bytes'] / 1e6:.2f} MB per upload), more than the "
        f"{available / 2**30:.1f} GiB available: use a smaller model.name or fewer clients per "
        "round (run.participation, delay.fraction)")
  raise ValueError(
      f"crypto.secure_aggregation=ckks: one round's {uploads} uploads of {dim:,} parameters "
      f"are {est['chunks']} ciphertexts each of {est['ciphertext_bytes'] / 1e6:.1f} MB (ring "
      f"2^{est['ring'].bit_length() - 1}, depth {est['depth']}), "
      f"{est['upload_bytes'] / 2**30:.1f} GiB before any computation, more than the "
      f"{available / 2**30:.1f} GiB available: use a smaller model.name, fewer clients per "
      "round (run.participation, delay.fraction), a smaller crypto.ckks_min_depth, or "
      f"crypto.ckks_design=streamed (~{est['streamed_memory_bytes'] / 2**30:.1f} GiB)")


def next_round_recipients(tl: timeline_lib.Timeline, t: int) -> tuple:
  """Clients dispatched in round t + 1: they need Enc_pk_i(w^{t+1}) (Alg. 5 line 8).

  Those online in round t + 1 and the delayed ones dispatched then, whose updates arrive
  in later rounds. A client dispatched in t + 1 whose update is dropped (older than the
  ring buffer) or still in flight after the last round has no slot in the timeline and
  is not counted (its update never reaches the server)."""
  if t + 1 >= tl.num_rounds:
    return ()
  later = np.s_[t + 1:]
  sel = tl.valid[later] & (tl.dispatch[later] == t + 1)
  return tuple(int(i) for i in np.unique(tl.client[later][sel]))


def _setup_protocol(dim: int, uploads: int, num_clients: int, preset: str, min_depth: int,
                    min_scale: float, stream, design: str = "one_context"):
  """The KDC's set-up, after the round's estimate is printed and checked against the
  memory available (a ValueError naming the flag that changes it)."""
  est = round_estimate(dim, uploads, preset, min_depth, design)
  check_round_fits(est, uploads, dim, available_memory_bytes())
  print(f"[pafed/ckks] estimate per round ({design}): {uploads} uploads x {est['chunks']} "
        f"ciphertexts of {est['ciphertext_bytes'] / 1e6:.1f} MB = "
        f"{est['upload_bytes'] / 2**30:.2f} GiB of uploads, ~"
        f"{est['memory_bytes'] / 2**30:.2f} GiB held, ~{est['cpu_s']:.0f} CPU s",
        file=stream, flush=True)
  print(f"[pafed/ckks] KDC: CKKS context ({preset} preset, Min d={min_depth}) and key "
        f"pairs for S1 and {num_clients} clients ...", file=stream, flush=True)
  t0 = time.perf_counter()
  if design == "streamed":
    protocol = streamed_ducc.make_streamed_protocol(
        num_clients, dim, preset=preset, min_depth=min_depth, min_scale=min_scale,
        max_delayed=uploads)
    protocol.keep_client_models = False
  else:
    protocol = secure_ducc.make_protocol(num_clients, dim, preset=preset,
                                         min_depth=min_depth, min_scale=min_scale)
  print(f"[pafed/ckks] ring dimension {protocol.cc.GetRingDimension()}, "
        f"{time.perf_counter() - t0:.1f}s", file=stream, flush=True)
  return protocol


def _round_rows(metrics: dict, evaluated, t_round: float) -> List[dict]:
  """The round's metrics row (with the test accuracy and loss when ``evaluated``)."""
  acc, loss = evaluated if evaluated is not None else (jnp.float32(jnp.nan),
                                                       jnp.float32(jnp.nan))
  metrics["test_accuracy"], metrics["test_loss"] = acc, loss
  rows = engine.metrics_to_rows(jax.tree.map(lambda v: jnp.asarray(v)[None], metrics))
  rows[0]["wall_time"] = time.perf_counter() - t_round
  return rows


def _plaintext_pieces(apply_flat: Callable, algorithm: base.Algorithm,
                      ecfg: engine.EngineConfig, data: engine.DeviceData):
  """The jitted client phase, round end and evaluation of the round engine. The clients
  encrypt their own uploads, so the round's [K, d] uploads are kept (not folded into the
  plaintext server's running sums chunk by chunk)."""
  ecfg = dataclasses.replace(ecfg, stream_uploads=False)
  phase_fn = jax.jit(functools.partial(engine.client_phase, apply_flat=apply_flat,
                                       algorithm=algorithm, cfg=ecfg))
  eval_fn = jax.jit(lambda w: ops.evaluate(apply_flat, w, data.test_x, data.test_y,
                                           ecfg.eval_batch))
  return phase_fn, jax.jit(engine.finish_round), eval_fn


def simulate(apply_flat: Callable, algorithm: base.Algorithm, ecfg: engine.EngineConfig,
             state: engine.SimState, tl: timeline_lib.Timeline, hp: Dict[str, float],
             data: engine.DeviceData, *, protocol=None,
             preset: str = "secure", min_depth: int = 10, min_scale: float = 1.0,
             design: str = "one_context", on_chunk: Optional[Callable] = None,
             eval_every: int = 1,
             stop_round: Optional[int] = None, stream=sys.stdout,
             empty_class_tol: Optional[float] = None):
  """Runs rounds ``state.round ..`` with the encrypted PAFed server.

  ``empty_class_tol`` (default: k * eps_d, with k the round's delayed uploads and eps_d
  the Min error of one class weight, ``cheon.max_min_error``): a DUCC class whose total
  weight is within what the Min approximation alone could produce counts as empty, as
  it is for the exact Min. 0 gives the protocol exactly as written (see docs/crypto.md).

  Returns ``(state, rows, totals)``: the final state, one metrics row per round (the
  engine's keys plus ``he_<stage>_s`` seconds) and the total seconds per stage.
  """
  if algorithm.name != "pafed":
    raise ValueError("crypto.secure_aggregation=ckks: the encrypted server is PAFed's; got "
                     f"algorithm.names={algorithm.name}")
  dim = int(state.w.shape[0])
  preset = protocol.preset if protocol is not None else preset
  if preset == "insecure_test":  # every run, whatever ``stream`` is
    print(INSECURE_WARNING, file=sys.stderr, flush=True)
  if protocol is None:
    protocol = _setup_protocol(dim, int(tl.valid.sum(1).max()), int(data.counts.shape[0]),
                               preset, min_depth, min_scale, stream, design)
  step = (streamed_ducc.streamed_pafed_step
          if isinstance(protocol, streamed_ducc.StreamedProtocol)
          else secure_ducc.secure_pafed_step)
  eps_d = cheon.max_min_error(protocol.min_iterations, scale=protocol.min_scale)
  hp = {k: jnp.asarray(v, jnp.float32) for k, v in hp.items()}
  alphas = tuple(float(hp[k]) for k in ("alpha0", "alpha1", "alpha2"))
  phase_fn, finish_fn, eval_fn = _plaintext_pieces(apply_flat, algorithm, ecfg, data)
  total = tl.num_rounds
  stop = total if stop_round is None else min(stop_round, total)
  schedule = engine.eval_schedule(total, eval_every)
  totals = {s: 0.0 for s in STAGES}
  all_rows: List[dict] = []
  first = True
  for t in range(int(state.round), stop):
    t_round = time.perf_counter()
    slots = jax.tree.map(lambda a: jnp.asarray(a[0]), tl.slice(t, t + 1))
    phase = phase_fn(state, slots, hp, data)
    uploads = np.asarray(phase.uploads, np.float64)
    online = np.asarray(phase.arrivals.online)
    delayed = np.asarray(phase.arrivals.delayed)
    protocol.recipients = next_round_recipients(tl, t)
    # Round 0 (or a resumed run) starts from w in the clear (Alg. 3 line 2); afterwards
    # S0 continues from Enc_pk_s(w) carried over by the key transformation.
    new_w, timings = step(
        protocol, np.asarray(state.w, np.float64) if first else None,
        uploads[online], uploads[delayed], alphas,
        int(delayed.sum()) * eps_d if empty_class_tol is None else empty_class_tol)
    first = False
    new_w = jnp.asarray(new_w, jnp.float32)
    # Simulator diagnostics from the plaintext uploads (no protocol party computes this).
    m = np.mean(uploads[online], axis=0) if online.any() else np.zeros(dim)
    alg_metrics = {"conflicting": jnp.int32(int(np.sum(uploads[delayed] @ m < 0)))}
    alg_metrics.update({f"he_{s}_s": jnp.float32(timings[s]) for s in STAGES})
    state, metrics = finish_fn(state, phase, new_w, state.server_state, slots, alg_metrics)
    rows = _round_rows(metrics, eval_fn(state.w) if schedule[t] else None, t_round)
    if (not engine.host_stops_on_divergence(on_chunk)
        and engine.first_nonfinite(rows) is not None):
      raise engine.diverged(rows, 0)
    for s in STAGES:
      totals[s] += timings[s]
    print(f"[pafed/ckks] round {t + 1}/{total}: " + ", ".join(
        f"{s} {timings[s]:.2f}s" for s in STAGES) + f" ({rows[0]['delayed']} delayed, "
          f"{alg_metrics['conflicting']} conflicting)", file=stream, flush=True)
    all_rows.extend(rows)
    if on_chunk is not None:
      on_chunk(state, rows)
  n = max(len(all_rows), 1)
  print("[pafed/ckks] mean time per round: " + ", ".join(
      f"{s} {totals[s] / n:.2f}s" for s in STAGES), file=stream, flush=True)
  return state, all_rows, totals
