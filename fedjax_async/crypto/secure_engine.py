"""PAFed's server under CKKS as a host server of the round engine
(``crypto.secure_aggregation=ckks``, ``rounds.host_server``): step 5 of the round replaced
by the encrypted protocol of ``secure_ducc`` (``crypto.ckks_design=one_context``) or
``streamed_ducc`` (``streamed``), with the round's size and memory estimated and checked
before any key is made.

Per round: clients encrypt their uploads under pk_s, S0 runs the encrypted DUCC (Alg. 4,
Cheon Min with d iterations) and Eq. 17 on Enc_pk_s(w), S1 and S0 run the masked key
transformation (Alg. 5) for the clients that train next round, and a client decrypts
w^{t+1} with its own key. Time per round is split into client encryption, DUCC, key
transformation and decryption.
"""

from __future__ import annotations

import sys
import time
from typing import Dict, Optional

import numpy as np

from fedjax_async import console
from fedjax_async.crypto import calibration
from fedjax_async.crypto import cheon
from fedjax_async.crypto import ckks
from fedjax_async.crypto import parallel
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import stages as stages_lib
from fedjax_async.crypto import streamed_ducc
from fedjax_async.crypto import wire as wire_lib
# the host memory available now (a function of this module: tests replace it here)
from fedjax_async.data.federated import available_memory_bytes

STAGES = stages_lib.STAGES  # a step's timings: client_encrypt, ducc, key_transform, decrypt
# The metric of the round's conflicting delayed updates (m . u_j < 0): the simulator's
# diagnostic from the plaintext uploads, the bits the protocol hides from S0 and S1.
SIM_CONFLICTING = "sim_conflicting"
INSECURE_WARNING = ("WARNING: crypto.ckks_preset=insecure_test: CKKS with ring 2^11 and no "
                    "security level (HEStd_NotSet) is NOT secure; for tests only")


# The largest log2(Q) that 128-bit classic security allows per ring dimension N
# (HomomorphicEncryption.org standard, the table OpenFHE applies for HEStd_128_classic).
MAX_LOG_Q_128 = {2 ** 10: 27, 2 ** 11: 54, 2 ** 12: 109, 2 ** 13: 218, 2 ** 14: 438,
                 2 ** 15: 881, 2 ** 16: 1747, 2 ** 17: 3523}
# OpenFHE's ring for the streamed design's depth-2 vector context at 128 bits.
STREAMED_RING_128 = 2 ** 14
# The round's CPU-time and memory model (``round_estimate``): calibrations measured by
# benchmarks, each with its command and host, in ``calibration.json`` (``calibration``),
# read at each estimate. CPU: seconds of the one-context round at N = 2^16 (one chunk,
# further chunks, per upload) and of the streamed one (fixed, per upload x chunk). Memory:
# in units of one fresh ciphertext of the context concerned (2 N (L + 1) 8-byte limbs):
# the process and each context's tables (bytes), a key-switching key and a key pair, the
# live ciphertexts at each design's peak, a worker process of ``parallel`` (bytes).

# A worker's chunks in flight here (``parallel.key_transform``'s window).
WORKER_IN_FLIGHT_CHUNKS = parallel.IN_FLIGHT_PER_WORKER


def _ct_bytes(ring: int, depth: int) -> int:
  return 2 * ring * (depth + 1) * 8


def _key_bytes(cal: dict, ring: int, depth: int, slots: int, key_pairs: int) -> int:
  """The context's tables, the relinearisation key, log2(slots) rotation keys and
  ``key_pairs`` key pairs (``cal``: ``calibration.load()``)."""
  return int(cal["CONTEXT_BYTES"] + _ct_bytes(ring, depth) * (
      cal["SWITCH_KEY_CTS"] * (1 + max(1, slots).bit_length() - 1)
      + cal["KEY_PAIR_CTS"] * key_pairs))


def _workers_bytes(cal: dict, workers: int, ct_bytes: int, num_clients: int,
                   recipients: int) -> int:
  """Two pools of ``workers`` processes, and the chunks in flight held here."""
  if workers <= 1:
    return 0
  per_worker = (cal["WORKER_PROCESS_BYTES"]
                + (num_clients + 1 + 2 * (recipients + 1)) * ct_bytes)
  return 2 * workers * per_worker + WORKER_IN_FLIGHT_CHUNKS * workers * (
      recipients + 1) * ct_bytes


def round_estimate(dim: int, uploads: int, preset: str, min_depth: int,
                   design: str = "one_context", *, num_clients: Optional[int] = None,
                   recipients: Optional[int] = None, delayed: Optional[int] = None,
                   workers: int = 1) -> dict:
  """What one encrypted round needs, before any key is made: the ring dimension N (the
  preset's, or the smallest that holds the context's modulus at 128-bit), ceil(dim /
  (N/2)) chunks, a fresh ciphertext's bytes (2 N (depth + 1) 8-byte limbs), the bytes of
  the round's uploads, the peak memory of the process's keys and ciphertexts
  (``memory_bytes``, the model above; ``num_clients`` key pairs, default ``uploads``;
  Alg. 5 for ``recipients``, default ``uploads``; ``delayed`` of the uploads delayed,
  default all; ``workers`` per pool of ``parallel``, 1: none) and CPU seconds scaled from
  the measured round (a fixed part and a part per upload, the further chunks' linear in
  uploads; all linear in N), the model's constants from ``calibration.json``.

  Args:
    dim: the model's parameter count d.
    uploads: the round's uploads.
    preset: the CKKS preset (``ckks.get_preset``).
    min_depth: the Min's Cheon iterations d.
    design: ``one_context`` or ``streamed``.
    num_clients: the clients' key pairs (None: ``uploads``).
    recipients: the clients Alg. 5 re-encrypts for (None: ``uploads``).
    delayed: the uploads delayed (None: all).
    workers: the processes per pool of ``parallel`` (1: none).
  """
  num_clients = uploads if num_clients is None else int(num_clients)
  recipients = min(uploads, num_clients) if recipients is None else int(recipients)
  delayed = uploads if delayed is None else min(int(delayed), uploads)
  p, cal = ckks.get_preset(preset), calibration.load()
  streamed = _streamed_estimate(cal, dim, uploads, p, min_depth, num_clients, recipients,
                                delayed, workers)
  if design == "streamed":
    return streamed
  depth = ckks.ducc_depth(min_depth)
  log_q = p.first_mod_size + depth * p.scaling_mod_size
  ring = p.ring_dim or min(n for n, q in MAX_LOG_Q_128.items() if q >= log_q)
  chunks = -(-dim // (ring // 2))
  ct_bytes = _ct_bytes(ring, depth)
  per_upload, measured_uploads = cal["ROUND_CPU_S_PER_UPLOAD"], cal["ROUND_UPLOADS"]
  fixed = cal["ROUND_CPU_S_ONE_CHUNK"] - per_upload * measured_uploads
  cpu_s = ((fixed + per_upload * uploads
            + cal["ROUND_CPU_S_PER_CHUNK"] * (chunks - 1) * uploads / measured_uploads)
           * ring / 2 ** 16)
  held = (cal["ONE_CONTEXT_FIXED_CTS"]
          + chunks * (uploads + 2 * recipients + cal["ONE_CONTEXT_CHUNK_CTS"])) * ct_bytes
  memory = (cal["PROCESS_BYTES"] + _key_bytes(cal, ring, depth, ring // 2, num_clients + 1)
            + held + _workers_bytes(cal, workers, ct_bytes, num_clients, recipients))
  return {"design": "one_context", "ring": ring, "depth": depth, "chunks": chunks,
          "ciphertext_bytes": ct_bytes, "upload_bytes": uploads * chunks * ct_bytes,
          "memory_bytes": memory, "cpu_s": cpu_s,
          "streamed_memory_bytes": streamed["memory_bytes"]}


def _streamed_estimate(cal: dict, dim: int, uploads: int, p, min_depth: int,
                       num_clients: int, recipients: int, delayed: int, workers: int) -> dict:
  """``round_estimate`` of ``streamed_ducc``: S0 keeps the delayed uploads, Alg. 5 holds
  one recipient's copy at a time; the scalar context's keys and ciphertexts are fixed."""
  ring = p.ring_dim or STREAMED_RING_128
  chunks = -(-dim // (ring // 2))
  ct_bytes = _ct_bytes(ring, streamed_ducc.VECTOR_DEPTH)
  s_depth = streamed_ducc.scalar_depth(min_depth)
  s_log_q = p.first_mod_size + s_depth * p.scaling_mod_size
  s_ring = p.ring_dim or min(n for n, q in MAX_LOG_Q_128.items() if q >= s_log_q)
  s_slots = min(2 ** max(1, (max(delayed, 2) - 1).bit_length()), ring // 2)
  keys = (_key_bytes(cal, ring, streamed_ducc.VECTOR_DEPTH, ring // 2, num_clients + 1)
          + _key_bytes(cal, s_ring, s_depth, s_slots, 1))
  held = (chunks * (delayed + cal["STREAMED_CHUNK_CTS"]) * ct_bytes
          + cal["STREAMED_SCALAR_CTS"] * _ct_bytes(s_ring, s_depth))
  return {"design": "streamed", "ring": ring, "depth": streamed_ducc.VECTOR_DEPTH,
          "chunks": chunks,
          "ciphertext_bytes": ct_bytes, "upload_bytes": uploads * chunks * ct_bytes,
          "memory_bytes": (cal["PROCESS_BYTES"] + keys + held
                           + _workers_bytes(cal, workers, ct_bytes, num_clients, recipients)),
          "cpu_s": cal["STREAMED_CPU_S_FIXED"] + cal["STREAMED_CPU_S_PER_UPLOAD_CHUNK"]
          * uploads * chunks * ring / STREAMED_RING_128}


def _proc_kib_field(path: str, key: str) -> Optional[int]:
  """``key``'s value (kB) in a /proc file such as /proc/meminfo, in bytes; None where the
  file or the key is missing."""
  try:
    with open(path) as f:
      for line in f:
        if line.startswith(key + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _rss_bytes() -> int:
  """This process's resident memory now (0 where /proc is missing)."""
  return _proc_kib_field("/proc/self/status", "VmRSS") or 0


def check_round_fits(est: dict, uploads: int, dim: int, available: int):
  """ValueError naming the flags that change it when the round's estimated peak memory
  (``round_estimate``'s ``memory_bytes``) exceeds the memory available; for the
  one-context design it names the streamed design, with its own estimate."""
  if est["memory_bytes"] <= available:
    return
  need, have = est["memory_bytes"] / 2 ** 30, available / 2 ** 30
  if est["design"] == "streamed":
    raise ValueError(
        f"crypto.secure_aggregation=ckks crypto.ckks_design=streamed: one round of {uploads} "
        f"uploads of {dim:,} parameters ({est['chunks']} ciphertexts of "
        f"{est['ciphertext_bytes'] / 1e6:.2f} MB each) needs ~{need:.1f} GiB, more than the "
        f"{have:.1f} GiB available: use a smaller model.name or fewer clients per round "
        "(run.participation, delay.fraction)")
  raise ValueError(
      f"crypto.secure_aggregation=ckks: one round's {uploads} uploads of {dim:,} parameters "
      f"are {est['chunks']} ciphertexts each of {est['ciphertext_bytes'] / 1e6:.1f} MB (ring "
      f"2^{est['ring'].bit_length() - 1}, depth {est['depth']}); the round needs "
      f"~{need:.1f} GiB, more than the {have:.1f} GiB available: use "
      f"crypto.ckks_design=streamed (--ckks_design=streamed, "
      f"~{est['streamed_memory_bytes'] / 2**30:.1f} GiB), or a smaller model.name, fewer "
      "clients per round (run.participation, delay.fraction) or a smaller "
      "crypto.ckks_min_depth")


def _setup_protocol(dim: int, uploads: int, num_clients: int, preset: str, min_depth: int,
                    min_scale: float, stream, design: str = "one_context",
                    recipients: Optional[int] = None, delayed: Optional[int] = None):
  """The KDC's set-up, after the round's estimate is printed and checked against the
  memory available (a ValueError naming the flag that changes it)."""
  def estimate(workers):
    return round_estimate(dim, uploads, preset, min_depth, design, num_clients=num_clients,
                          recipients=recipients, delayed=delayed, workers=workers)

  est = estimate(1)
  workers = parallel.resolve_workers(0, est["chunks"])  # the protocols' default
  est = estimate(workers) if workers > 1 else est
  check_round_fits(est, uploads, dim, available_memory_bytes())
  console.say(f"[pafed/ckks] estimate per round ({design}): {uploads} uploads x {est['chunks']} "
              f"ciphertexts of {est['ciphertext_bytes'] / 1e6:.1f} MB = "
              f"{est['upload_bytes'] / 2**30:.2f} GiB of uploads, peak ~"
              f"{est['memory_bytes'] / 2**30:.2f} GiB for keys and ciphertexts (besides the "
              f"{_rss_bytes() / 2**30:.2f} GiB this process holds), ~{est['cpu_s']:.0f} CPU s",
              stream=stream)
  console.say(f"[pafed/ckks] KDC: CKKS context ({preset} preset, Min d={min_depth}) and key "
              f"pairs for S1 and {num_clients} clients ...", stream=stream)
  t0 = time.perf_counter()
  if design == "streamed":
    protocol = streamed_ducc.make_streamed_protocol(
        num_clients, dim, preset=preset, min_depth=min_depth, min_scale=min_scale,
        max_delayed=uploads if delayed is None else max(int(delayed), 1))
    protocol.keep_client_models = False
  else:
    protocol = secure_ducc.make_protocol(num_clients, dim, preset=preset,
                                         min_depth=min_depth, min_scale=min_scale)
  console.say(f"[pafed/ckks] ring dimension {protocol.cc.GetRingDimension()}, "
              f"{time.perf_counter() - t0:.1f}s", stream=stream)
  return protocol


def _step_fn(protocol):
  """The protocol's round: the streamed or the one-context design."""
  return (streamed_ducc.streamed_pafed_step
          if isinstance(protocol, streamed_ducc.StreamedProtocol)
          else secure_ducc.secure_pafed_step)


def _sim_conflicting(uploads: np.ndarray, online: np.ndarray, delayed: np.ndarray) -> int:
  """A simulator diagnostic from the plaintext uploads, the hidden conflict bits summed
  (delayed u_j with m . u_j < 0): no party computes it or receives it
  (``SIM_CONFLICTING``, docs/crypto.md)."""
  m = (np.mean(uploads[online], axis=0) if online.any()
       else np.zeros(uploads.shape[1:], uploads.dtype))
  return int(np.sum(uploads[delayed] @ m < 0))


class EncryptedServer:
  """PAFed's server under CKKS as the round engine's host server
  (``rounds.host_server.HostServer``): clients encrypt their uploads under pk_s, S0 runs
  the encrypted DUCC (Alg. 4) and Eq. 17 on Enc_pk_s(w), S1 and S0 the masked key
  transformation (Alg. 5) for the clients dispatched next round, and a client decrypts
  w^{t+1} with its own key. The encrypted global model is carried from round to round
  (S0 never sees w in the clear); the w^{t+1} returned is the one a client obtains."""

  name = "pafed/ckks"
  stages = STAGES

  def __init__(self, protocol, alphas, empty_class_tol: Optional[float], owned: bool,
               stream=sys.stdout):
    self.protocol, self.alphas, self.owned, self.stream = protocol, alphas, owned, stream
    self.step_fn = _step_fn(protocol)
    # k * eps_d: the Min error of a class weight, per delayed upload (``make_server``)
    self.eps_d = cheon.max_min_error(protocol.min_iterations, scale=protocol.min_scale)
    self.empty_class_tol = empty_class_tol
    self.first = True
    self.wire = protocol.wire or wire_lib.Wire()  # every round's messages, measured

  def step(self, t, w, uploads, online, delayed, recipients):
    """Round t (``HostServer.step``). Round 0 starts from w^0, which S0 initialises
    (Alg. 3 line 2); a resumed run from Enc_pk_s(w^t) that client 0 sends S0
    (``secure_ducc.model_from_client``); afterwards S0 continues from the Enc_pk_s(w)
    the key transformation carried over.

    Args:
      t: the round.
      w: w^t, the state's model.
      uploads: the round's [K, d] uploads.
      online: [K] bool, the online uploads.
      delayed: [K] bool, the delayed uploads that arrived.
      recipients: the clients dispatched in round t + 1 (they receive w^{t+1}).
    """
    self.protocol.recipients = tuple(recipients)
    if self.first and t > 0:
      secure_ducc.model_from_client(self.protocol, np.asarray(w, np.float64))
      console.say(f"[{self.name}] resumed at round {t + 1}: "
                  + secure_ducc.RESUME_NOTE.format(t=t), stream=self.stream)
    start = np.asarray(w, np.float64) if self.first and t == 0 else None
    self.first = False
    tol = (int(delayed.sum()) * self.eps_d if self.empty_class_tol is None
           else self.empty_class_tol)
    given, self.protocol.wire = self.protocol.wire, self.wire
    try:
      result = self.step_fn(self.protocol, start, uploads[online], uploads[delayed],
                            self.alphas, tol)
    finally:
      self.protocol.wire = given
    return (result.w, {SIM_CONFLICTING: np.int32(_sim_conflicting(uploads, online, delayed))},
            result.timings)

  def traffic(self) -> Dict[str, int]:
    """The last round's bytes measured on the wire (``wire.Wire``): up (the uploads to S0),
    down (S0's Enc_pk_i(w^{t+1}) to the recipients) and between the servers."""
    b = self.wire.bytes
    return {"bytes_up": int(b[("clients", "S0")]), "bytes_down": int(b[("S0", "clients")]),
            "bytes_s0_to_s1": int(b[("S0", "S1")]), "bytes_s1_to_s0": int(b[("S1", "S0")])}

  def note(self, metrics) -> str:
    b = self.traffic()
    return (f", simulator diagnostic: {int(metrics[SIM_CONFLICTING])} conflicting; wire "
            f"{b['bytes_up'] / 1e6:.2f} MB up, {b['bytes_down'] / 1e6:.2f} MB down, "
            f"{(b['bytes_s0_to_s1'] + b['bytes_s1_to_s0']) / 1e6:.2f} MB between S0 and S1")

  def close(self):
    if self.owned:  # its worker pools, if any
      self.protocol.close()


def server_views(design: str) -> Dict[str, str]:
  """What each server sees per round (a CKKS run's summary): docs/crypto.md's "Leakage"
  rows for ``design``."""
  s1 = "rows S1" + (" and S1 (streamed)" if design == "streamed" else "")
  return {"S0": "uploads, Enc(w) and S1's answers, IND-CPA ciphertexts under pk_s; in the "
                "clear who, when, online or delayed, n, k, the recipients (docs/crypto.md, "
                "Leakage, row S0)",
          "S1": "w + r (r uniform on [-B, B], Alg. 5), the recipients, blinded and flooded "
                f"norms and class tests, the counts (docs/crypto.md, Leakage, {s1})"}


def make_server(algorithm: str, hp: Dict[str, float], dim: int, num_clients: int, *,
                uploads: int, delayed: int, recipients: int, protocol=None,
                preset: str = "secure", min_depth: int = 10, min_scale: float = 1.0,
                design: str = "one_context", empty_class_tol: Optional[float] = None,
                stream=sys.stdout) -> EncryptedServer:
  """The encrypted server for rounds of at most ``uploads`` uploads (``delayed`` of them
  delayed) of ``dim`` parameters, ``num_clients`` clients with ids below ``recipients``
  receiving models; around ``protocol`` if given (not closed by the server), else a new
  one (the KDC's set-up, after the round's estimate is printed and checked against the
  memory available).

  ``empty_class_tol`` (default: k * eps_d, with k the round's delayed uploads and eps_d
  the Min error of one class weight, ``cheon.max_min_error``): a DUCC class whose total
  weight is within what the Min approximation alone could produce counts as empty, as
  it is for the exact Min. 0 gives the protocol exactly as written (docs/crypto.md).

  Args:
    algorithm: the algorithm's name (only ``pafed`` has an encrypted server).
    hp: its hyper-parameters (``alpha0``, ``alpha1``, ``alpha2``).
    dim: the model's parameter count.
    num_clients: the clients (each with a key pair).
    uploads: the most uploads of a round.
    delayed: the most delayed uploads of a round.
    recipients: the clients with ids below it receive models.
    protocol: an existing protocol to run on (None: a new one).
    preset: the CKKS preset of a new protocol.
    min_depth: the Min's Cheon iterations.
    min_scale: the Min's input scale c (``cheon.cheon_min``).
    design: ``one_context`` or ``streamed``.
    empty_class_tol: a DUCC class of total weight at most this is empty (None: k * eps_d).
    stream: where the estimate and progress lines go.
  """
  if algorithm != "pafed":
    raise ValueError("crypto.secure_aggregation=ckks: the encrypted server is PAFed's; got "
                     f"algorithm.names={algorithm}")
  preset = protocol.preset if protocol is not None else preset
  if preset == "insecure_test":  # every run, whatever ``stream`` is
    console.warn(INSECURE_WARNING)
  owned = protocol is None
  if owned:
    protocol = _setup_protocol(dim, uploads, num_clients, preset, min_depth, min_scale,
                               stream, design, recipients=recipients, delayed=delayed)
  # Eq. 17's alphas as the engine traces them (float32), as the plaintext server has them
  alphas = tuple(float(np.float32(hp[k])) for k in ("alpha0", "alpha1", "alpha2"))
  return EncryptedServer(protocol, alphas, empty_class_tol, owned, stream)
