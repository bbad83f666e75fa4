"""Alg. 5's per-chunk work in worker processes: each party's in its own pool.

The key transformation is independent per chunk: for chunk c, S0 masks Enc(w_c) with a
fresh Enc_pk_s(r_c); S1 decrypts w_c + r_c once and encrypts it for each of the R
recipients and pk_s; S0 subtracts a fresh Enc_pk_i(r_c) from each (for pk_s, r_c as a
plaintext in the streamed design, a fresh Enc_pk_s(r_c) in the one-context one) and
serialises what goes to the clients. ``key_transform`` ferries these three steps per
chunk between S0's pool and S1's, pipelined (chunk c's S1 step starts when its mask is
done), every ciphertext as bytes (``wire``), each S1 task labelled with its chunk.

* Each party creates and holds its own pool (``PoolHolder``: ``AggregationServer`` S0's,
  ``HelperServer`` S1's) from its own ``worker_material()``, serialised (OpenFHE's binary
  format) once, when the pool starts: S0's workers get the context and the public keys,
  S1's also sk_s. Nothing reachable from S0 holds S1's material
  (``tests/test_crypto_parallel.py`` walks S0's objects for sk_s's bytes).
* ``workers`` per pool: 0 picks the machine's cores (``default_workers``) when the model
  has at least ``AUTO_MIN_CHUNKS`` chunks, else 1; 1 runs the round in this process as
  before (no pool). ``backend="ray"`` puts S0's workers on Ray actors (``ray.init()``
  first, or a local one is started; ``pip install fedjax_async[ray]``); S1's stay a
  process pool of its own: a Ray cluster has one object store for all its actors, where
  sk_s would sit beside S0's objects.
* A signal recorded by ``interrupts`` (the first Ctrl-C within ``graceful()``) is raised
  between two finished chunks; the tasks not started are cancelled.

The mask r stays S0's: it is drawn in this process (``csprng``) and sent with each chunk's
task to S0's workers only.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import os
import signal
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import openfhe

from fedjax_async.crypto import ckks
from fedjax_async.crypto import csprng
from fedjax_async.crypto import stopping
from fedjax_async.crypto import wire as wire_lib

# ``workers=0`` (auto) uses a pool only for a model of at least this many chunks: below
# it, starting the workers (~1 s each) costs more than they save.
AUTO_MIN_CHUNKS = 16
# ``key_transform`` keeps up to this many chunks per worker in flight (the bytes held).
IN_FLIGHT_PER_WORKER = 4
BACKENDS = ("process", "ray")
BINARY = openfhe.BINARY


def default_workers() -> int:
  """The cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def check_workers(workers, flag: str = "workers") -> int:
  """``workers`` as an int >= 0, else a one-line ValueError naming ``flag``."""
  if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
    raise ValueError(f"{flag}: must be an integer >= 0 (0: the machine's cores, 1: in this "
                     f"process), got {workers!r}")
  return int(workers)


def check_backend(backend, flag: str = "backend") -> str:
  if backend not in BACKENDS:
    raise ValueError(f"{flag}: must be one of {', '.join(BACKENDS)}, got {backend!r}")
  if backend == "ray":
    try:
      import ray  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise ValueError(f"{flag}=ray: ray is not installed (pip install "
                       "'fedjax_async[ray]')") from None
  return backend


def resolve_workers(workers: int, chunks: int) -> int:
  """The pool size for a model of ``chunks`` chunks (``workers`` 0: auto)."""
  workers = check_workers(workers)
  if workers == 0:
    return default_workers() if chunks >= AUTO_MIN_CHUNKS else 1
  return workers


# ---------------------------------------------------------------------- in a worker

_MATERIAL: Dict[str, object] = {}


def _setup_worker(material: Dict[str, object]):
  """A worker's party material from bytes; SIGINT is left to the main process (Ctrl-C
  reaches every process of the terminal's foreground group)."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  cc = openfhe.DeserializeCryptoContextString(material["cc"], BINARY)
  _MATERIAL.clear()
  _MATERIAL.update(
      cc=cc, slots=int(material["slots"]),
      pk_s=openfhe.DeserializePublicKeyString(material["pk_s"], BINARY),
      pks=[openfhe.DeserializePublicKeyString(b, BINARY) for b in material["pks"]],
      sk=(openfhe.DeserializePrivateKeyString(material["sk"], BINARY)
          if material.get("sk") is not None else None))


def _encode(values):
  cc = _MATERIAL["cc"]
  return cc.MakeCKKSPackedPlaintext(np.asarray(values, np.float64).reshape(-1).tolist())


def _timed(fn):
  def run(*args):
    t = time.process_time()
    out = fn(*args)
    return out, time.process_time() - t
  run.__name__ = fn.__name__
  return run


@_timed
def _s0_mask(w_bytes: bytes, r: np.ndarray, bound: float) -> bytes:
  """Alg. 5 lines 2-5 for one chunk: Enc(w_c) + Enc_pk_s(r_c + i r'_c), serialised for
  S1; r' (uniform on [-bound, bound], fresh: ``imaginary_mask``) masks the imaginary
  parts, where S1 would read the CKKS error of w_c."""
  cc = _MATERIAL["cc"]
  w = wire_lib.ciphertext_from_bytes(w_bytes)
  masked = cc.MakeCKKSPackedPlaintext(imaginary_mask(r, bound))
  return wire_lib.ciphertext_bytes(cc.EvalAdd(w, cc.Encrypt(_MATERIAL["pk_s"], masked)))


def imaginary_mask(r: np.ndarray, bound: float) -> np.ndarray:
  """r + i r', r' uniform on [-bound, bound] per slot from ``csprng`` (fresh): Alg. 5's
  mask with imaginary parts of its own. S1 decrypts w + r + i (Im e + r') and
  re-encrypts the real parts only, so S0 subtracts r alone (``_s0_unmask``)."""
  r = np.asarray(r, np.float64).reshape(-1)
  return r + 1j * csprng.uniform(-bound, bound, r.size)


@_timed
def _s1_reencrypt(chunk: int, masked: bytes, recipients: Sequence[int]) -> List[bytes]:
  """Alg. 5 lines 6-12 for chunk ``chunk`` (the message's label): Dec_sk_s(w_c + r_c)
  once, encoded once, then a fresh encryption under each recipient's key and last under
  pk_s."""
  del chunk
  cc, sk = _MATERIAL["cc"], _MATERIAL["sk"]
  pt = cc.Decrypt(sk, wire_lib.ciphertext_from_bytes(masked))
  pt.SetLength(_MATERIAL["slots"])
  p = _encode(pt.GetRealPackedValue())
  keys = [_MATERIAL["pks"][i] for i in recipients] + [_MATERIAL["pk_s"]]
  return [wire_lib.ciphertext_bytes(cc.Encrypt(k, p)) for k in keys]


@_timed
def _s0_unmask(per_key: List[bytes], r: np.ndarray, recipients: Sequence[int],
               keep: Sequence[bool], plain_for_s: bool) -> Tuple[List, int]:
  """Alg. 5 lines 13-17 for one chunk: Enc_pk_i(w_c + r_c) - Enc_pk_i(r_c) (fresh) per
  recipient, serialised for client i (returned only where ``keep``, else only counted);
  under pk_s r_c is subtracted as a plaintext (``plain_for_s``) or a fresh Enc_pk_s(r_c).
  Returns ([bytes or None per recipient] + [the pk_s copy's bytes], bytes to clients)."""
  cc, p = _MATERIAL["cc"], _encode(r)
  out, to_clients = [], 0
  for i, k, data in zip(list(recipients) + [None], list(keep) + [True], per_key):
    ct = wire_lib.ciphertext_from_bytes(data)
    if i is None:
      ct = cc.EvalSub(ct, p) if plain_for_s else cc.EvalSub(ct, cc.Encrypt(_MATERIAL["pk_s"], p))
      out.append(wire_lib.ciphertext_bytes(ct))
      continue
    data = wire_lib.ciphertext_bytes(cc.EvalSub(ct, cc.Encrypt(_MATERIAL["pks"][i], p)))
    to_clients += len(data)
    out.append(data if k else None)
  return out, to_clients


_TASKS = {f.__name__: f for f in (_s0_mask, _s1_reencrypt, _s0_unmask)}


def _run(name: str, *args):
  return _TASKS[name](*args)


class _RayWorker:  # a Ray actor: one worker's party material
  def __init__(self, material):
    _setup_worker(material)

  def run(self, name, *args):
    return _run(name, *args)


# ---------------------------------------------------------------------- the pools


def party_material(cc, pk_s, client_pks, secret_key=None) -> Dict[str, object]:
  """What one party's workers receive, serialised: the context, the public keys (and
  S1's sk_s for S1's workers)."""
  return {"cc": openfhe.Serialize(cc, BINARY), "slots": ckks.num_slots(cc),
          "pk_s": openfhe.Serialize(pk_s, BINARY),
          "pks": [openfhe.Serialize(k, BINARY) for k in client_pks],
          "sk": None if secret_key is None else openfhe.Serialize(secret_key, BINARY)}


class PartyPool:
  """``workers`` processes (or Ray actors) holding one party's material (``party``: "S0"
  or "S1", for the messages' counts and the tests)."""

  def __init__(self, material: Dict[str, object], workers: int, backend: str = "process",
               party: str = ""):
    self.workers, self.backend = int(workers), check_backend(backend)
    self.party = party
    if backend == "ray":
      import ray  # pylint: disable=g-import-not-at-top
      if not ray.is_initialized():
        ray.init(num_cpus=max(self.workers, default_workers()), include_dashboard=False,
                 log_to_driver=False)
      # half a CPU each: the cluster may be this machine, where S1's pool runs too
      actor = ray.remote(num_cpus=0.5)(_RayWorker)
      self._actors = [actor.remote(material) for _ in range(self.workers)]
      self._next = 0
      self._executor = None
    else:
      self._executor = cf.ProcessPoolExecutor(
          self.workers, mp_context=multiprocessing.get_context("spawn"),
          initializer=_setup_worker, initargs=(material,))

  def submit(self, name: str, *args) -> cf.Future:
    if self._executor is not None:
      return self._executor.submit(_run, name, *args)
    actor = self._actors[self._next % len(self._actors)]
    self._next += 1
    return actor.run.remote(name, *args).future()

  def close(self, cancel: bool = False):
    if self._executor is not None:
      self._executor.shutdown(wait=not cancel, cancel_futures=cancel)
      self._executor = None
    else:
      import ray  # pylint: disable=g-import-not-at-top
      for a in self._actors:
        ray.kill(a)
      self._actors = []


class PoolHolder:
  """A party's own Alg. 5 pool: made from the party's ``worker_material()`` on first use
  and held by the party alone (``PARTY``: its name). ``RAY_ALLOWED`` False keeps the
  party's workers off Ray (S1: its secret key would enter the cluster's shared object
  store)."""

  PARTY = ""
  RAY_ALLOWED = True
  _pool: Optional[PartyPool] = None

  def worker_pool(self, workers: int, backend: str = "process") -> PartyPool:
    backend = backend if self.RAY_ALLOWED else "process"
    pool = self._pool
    if pool is not None and (pool.workers != int(workers) or pool.backend != backend):
      self.close_pool()
    if self._pool is None:
      self._pool = PartyPool(self.worker_material(), workers, backend, self.PARTY)
    return self._pool

  def close_pool(self, cancel: bool = False):
    if self._pool is not None:
      self._pool.close(cancel)
      self._pool = None

  def worker_material(self) -> Dict[str, object]:
    raise NotImplementedError


def key_transform(s0_pool: PartyPool, s1_pool: PartyPool, w_ct: Sequence[object],
                  recipients: Sequence[int], keep: Sequence[bool], slots: int,
                  mask_bound: float, plain_for_s: bool,
                  wire: Optional[wire_lib.Wire] = None):
  """Alg. 5 for every chunk on S0's pool and S1's (each held by its party). Returns
  ({i: [ciphertexts]} for the recipients whose ``keep`` is true, the pk_s copy
  [ciphertexts], {party: worker CPU seconds}).
  ``wire``: the bytes per direction are added to it as ``Wire.send`` would.

  Args:
    s0_pool: S0's worker pool.
    s1_pool: S1's worker pool.
    w_ct: the model's ciphertexts under pk_s, one per chunk.
    recipients: the clients to re-encrypt the model for.
    keep: per recipient, whether its ciphertexts are kept (else only counted).
    slots: the slots per ciphertext.
    mask_bound: B, the mask r's range [-B, B].
    plain_for_s: subtract r from the pk_s copy as a plaintext (else a fresh Enc_pk_s(r)).
    wire: the message counter (None: nothing counted).
  """
  chunks = len(w_ct)
  r = csprng.uniform(-mask_bound, mask_bound, chunks * slots).reshape(chunks, slots)
  recipients, keep = tuple(recipients), tuple(bool(k) for k in keep)
  sizes = collections.Counter()
  cpu = collections.Counter()
  pk_s_copy: List[object] = [None] * chunks
  kept = {i: [None] * chunks for i, k in zip(recipients, keep) if k}
  running: Dict[cf.Future, Tuple[str, int]] = {}
  todo = list(range(chunks))
  limit = IN_FLIGHT_PER_WORKER * s0_pool.workers  # chunks in flight: bounds the bytes held

  def start_mask():
    while todo and len(running) < limit:
      c = todo.pop(0)
      data = wire_lib.ciphertext_bytes(w_ct[c])
      running[s0_pool.submit("_s0_mask", data, r[c], mask_bound)] = ("mask", c)

  try:
    start_mask()
    while running:
      done, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
      for fut in done:
        step, c = running.pop(fut)
        out, seconds = fut.result()
        stopping.between_chunks()
        if step == "mask":
          cpu["S0"] += seconds
          sizes[("S0", "S1")] += len(out)
          running[s1_pool.submit("_s1_reencrypt", c, out, recipients)] = ("s1", c)
        elif step == "s1":
          cpu["S1"] += seconds
          sizes[("S1", "S0")] += sum(len(b) for b in out)
          running[s0_pool.submit("_s0_unmask", out, r[c], recipients, keep,
                                  plain_for_s)] = ("unmask", c)
        else:
          cpu["S0"] += seconds
          per_key, to_clients = out
          sizes[("S0", "clients")] += to_clients
          for i, data in zip(recipients, per_key):
            if data is not None:
              kept[i][c] = wire_lib.ciphertext_from_bytes(data)
          pk_s_copy[c] = wire_lib.ciphertext_from_bytes(per_key[-1])
      start_mask()
  except BaseException:
    for fut in running:
      fut.cancel()
    raise
  if wire is not None:
    for link, n in sizes.items():
      wire.bytes[link] += n
    wire.messages[("S0", "S1")] += 1
    wire.messages[("S1", "S0")] += len(recipients) + 1
    wire.messages[("S0", "clients")] += len(recipients)
  return kept, pk_s_copy, dict(cpu)
