"""Alg. 5 on worker pools (fedjax_async.crypto.parallel) and a stop asked for in the middle
of a CKKS round (fedjax_async.crypto.stopping), on the INSECURE test preset.

The pooled key transformation must give the clients the model the in-process one gives
(each decrypting with its own key, within CKKS noise), carry the same model to the next
round, and count the bytes the in-process round sends; each party's pool is its own (no
object reachable from S0 holds S1's secret key); a first Ctrl-C within
``interrupts.graceful()`` (only recorded there) must stop the round at the next chunk."""

import gc
import importlib.util
import os
import signal
import sys
import types

import numpy as np
import pytest

from fedjax_async import interrupts
from fedjax_async.algorithms import pafed

pytestmark = pytest.mark.crypto
pytest.importorskip("openfhe", exc_type=ImportError)

import openfhe  # pylint: disable=g-import-not-at-top,wrong-import-order
from fedjax_async.crypto import ckks  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import parallel  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import secure_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import streamed_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import vectors  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import wire  # pylint: disable=g-import-not-at-top

PRESET = "insecure_test"  # ring 2^11: 1024 slots per ciphertext
ALPHAS = (0.7, 0.5, 0.3)
D = 2


def _uploads(rng, dim, n_online=2, cos=(0.6, -0.5)):
  online = vectors.unit(rng.normal(size=(n_online, dim)) + 2.0 * rng.normal(size=dim))
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), list(cos), dim, rng)
  return online, delayed, rng.normal(size=dim) * 0.1


def _expected(w, online, delayed):
  m, m1, m2 = (np.asarray(x, np.float64) for x in
               pafed.ducc(online, delayed, cheon.make_cheon_min(D)))
  return w + ALPHAS[0] * m + ALPHAS[1] * m1 + ALPHAS[2] * m2


def _make(design, dim, workers, clients=4, recipients=(0, 2, 3), backend="process"):
  if design == "streamed":
    proto = streamed_ducc.make_streamed_protocol(clients, dim, PRESET, D, workers=workers,
                                                 recipients=recipients, max_delayed=2,
                                                 backend=backend)
    return proto, streamed_ducc.streamed_pafed_step
  # the one-context DUCC needs depth 2d + 8 = 12: ring 2^11 holds it at NotSet
  proto = secure_ducc.make_protocol(clients, dim, PRESET, D, workers=workers,
                                    recipients=recipients, backend=backend)
  return proto, secure_ducc.secure_pafed_step


def _tol(proto):
  """The model's CKKS error bound: ``ckks.error_bound`` of values bounded by 1 (unit
  updates, alpha <= 1, |w| ~ 0.1), times the largest multiplicative blind's inverse
  (2^BLIND_LOG2_RANGE) that S0 unblinds by: every blind at 2^-8 gives the one-context
  design ~1e-5 on the test ring (3.05e-5 here)."""
  return 2.0 ** secure_ducc.BLIND_LOG2_RANGE * ckks.error_bound(proto.cc, 1.0)


def _decrypted(proto, result, dim):
  return {i: proto.clients[i].decrypt_model(cts, dim)
          for i, cts in result.client_models.items()}


@pytest.mark.parametrize("design", ["streamed", "one_context"])
def test_two_workers_give_every_recipient_the_in_process_model(design):
  dim = 3 * 1024 + 5  # four chunks
  rng = np.random.default_rng(7)
  online, delayed, w = _uploads(rng, dim)
  want = _expected(w, online, delayed)
  got = {}
  for workers in (1, 2):
    proto, step = _make(design, dim, workers)
    proto.wire = wire.Wire()
    tol = _tol(proto)
    try:
      result = step(proto, w, online, delayed, ALPHAS)
      first, models = result.w, _decrypted(proto, result, dim)
      # the carried Enc_pk_s(w) continues the next round (no w_global)
      result = step(proto, None, online, delayed, ALPHAS)
      got[workers] = (first, models, result.w, result.breakdown, result.wire_bytes)
    finally:
      proto.close()
  (first1, models1, second1, b1, l1), (first2, models2, second2, b2, l2) = got[1], got[2]
  assert sorted(models2) == sorted(models1) == [0, 2, 3]  # the recipients and client 0
  for i in models1:  # each recipient decrypts with its own key the same model
    assert np.max(np.abs(models2[i] - want)) < tol
    assert np.max(np.abs(models2[i] - models1[i])) < 2 * tol
  assert np.max(np.abs(first2 - first1)) < 2 * tol
  assert np.max(np.abs(second2 - second1)) < 4 * tol
  assert b2["workers_cpu_s"] > 0 and "workers_cpu_s" not in b1
  # every message as bytes, counted per link: the uploads are (n + k) x 4 chunks of
  # fresh ciphertexts; the same messages on the pools, sizes equal but for OpenFHE's
  # metadata (one-context: 784 B of a ciphertext's ~696 kB)
  assert set(l1) == {"clients->S0", "S0->S1", "S1->S0", "S0->clients"}
  fresh = len(wire.ciphertext_bytes(proto.clients[0].encrypt_update(w)[0]))
  assert l1["clients->S0"] == (len(online) + len(delayed)) * 4 * fresh
  for link in ("S1->S0", "S0->clients"):
    assert abs(l2[link] - l1[link]) <= 0.005 * l1[link]


def _reachable(root):
  """Every object reachable from ``root`` in this process, by ``gc.get_referents``:
  containers, instance dicts, closures' cells, bound methods' ``__self__``, a process
  pool's executor and its internals (``_initargs``, queued work items, its processes'
  arguments), threads. Not through modules, classes or a function's globals (the code
  every party shares)."""
  skip = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
  seen, todo, out = set(), [root], []
  while todo:
    obj = todo.pop()
    if id(obj) in seen or id(obj) in skip or isinstance(obj, (types.ModuleType, type)):
      continue
    seen.add(id(obj))
    out.append(obj)
    refs = gc.get_referents(obj)
    if isinstance(obj, types.FunctionType):
      refs = [r for r in refs if r is not obj.__globals__]
    todo.extend(refs)
  return out


def _holding(objects, needle):
  """The objects among ``objects`` that hold ``needle`` (bytes) or are a secret key."""
  found = []
  for obj in objects:
    if isinstance(obj, openfhe.PrivateKey):
      found.append(type(obj).__name__)
    elif isinstance(obj, (bytes, bytearray, memoryview)) and needle in bytes(obj):
      found.append(f"{type(obj).__name__} of {len(obj)} bytes")
    elif isinstance(obj, np.ndarray) and needle in obj.tobytes():
      found.append(f"array {obj.shape}")
  return found


@pytest.mark.parametrize("design", ["one_context", "streamed"])
def test_nothing_reachable_from_s0_holds_s1s_secret_key(design):
  """Each party makes and holds its own Alg. 5 pool. With 1 and 2 workers, after a round
  and while S1's pool works on it, no object reachable from S0 holds S1's serialised
  sk_s (a 256-byte slice of it searched in every bytes, bytearray and array) nor a
  PrivateKey; S0's pool serves S0 and S1's S1; S1's pool has sk_s in its initargs (the
  search finds what it looks for). Ray, where installed: S1's pool stays processes."""
  dim = 2 * 1024 + 3
  rng = np.random.default_rng(5)
  online, delayed, w = _uploads(rng, dim)
  for workers in (1, 2):
    proto, step = _make(design, dim, workers)
    s1 = proto.s1.vector if design == "streamed" else proto.s1
    key = openfhe.Serialize(s1._secret_key, openfhe.BINARY)  # pylint: disable=protected-access
    needle = key[len(key) // 2:len(key) // 2 + 256]
    walks = []
    if workers > 1:  # walk S0 when S1's pool receives its first chunk
      real = proto.s1.worker_pool

      def s1_pool(*args, real=real):
        pool = real(*args)
        submit = pool.submit

        def walking(name, *task):
          if name == "_s1_reencrypt" and not walks:
            walks.append(_holding(_reachable(proto.s0), needle))
          return submit(name, *task)

        pool.submit = walking
        return pool

      proto.s1.worker_pool = s1_pool
    try:
      step(proto, w, online, delayed, ALPHAS)
      walks.append(_holding(_reachable(proto.s0), needle))
      assert len(walks) == (2 if workers > 1 else 1)
      assert walks == [[]] * len(walks), (workers, walks)
      if workers > 1:
        s0_pool, s1_pool = proto.s0._pool, s1._pool  # pylint: disable=protected-access
        assert (s0_pool.party, s1_pool.party) == ("S0", "S1")
        assert s1_pool.backend == "process" and s1.worker_pool(2, "ray") is s1_pool
        assert _holding(_reachable(s1_pool), needle)  # the search finds it where it is
    finally:
      proto.close()


def test_workers_option_is_checked():
  for bad in (-1, 1.5, "2", True):
    with pytest.raises(ValueError, match=r"^workers: must be an integer >= 0"):
      streamed_ducc.make_streamed_protocol(2, 100, PRESET, D, workers=bad)
  with pytest.raises(ValueError, match=r"^backend: must be one of process, ray, got 'mpi'"):
    secure_ducc.make_protocol(2, 100, PRESET, D, backend="mpi")
  # auto: the machine's cores for a large model, in this process for a small one
  assert parallel.resolve_workers(0, parallel.AUTO_MIN_CHUNKS) == parallel.default_workers()
  assert parallel.resolve_workers(0, parallel.AUTO_MIN_CHUNKS - 1) == 1
  assert parallel.resolve_workers(3, 1) == 3


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (the optional extra fedjax_async[ray])")
def test_two_ray_workers_give_the_in_process_model():
  import ray  # pylint: disable=g-import-not-at-top
  dim = 2 * 1024
  rng = np.random.default_rng(3)
  online, delayed, w = _uploads(rng, dim)
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  try:
    proto, step = _make("streamed", dim, 2, backend="ray")
    try:
      result = step(proto, w, online, delayed, ALPHAS)
      got, models = result.w, _decrypted(proto, result, dim)
    finally:
      proto.close()
  finally:
    ray.shutdown()
  want = _expected(w, online, delayed)
  assert np.max(np.abs(got - want)) < 1e-5
  assert np.max(np.abs(models[3] - want)) < 1e-5


class _CountingContext:
  """A CryptoContext whose encryptions are counted; the ``at``-th one sends this process
  a SIGINT (as a Ctrl-C would) before encrypting."""

  def __init__(self, cc, at):
    self._cc, self.at, self.encryptions = cc, at, 0

  def Encrypt(self, *args):  # pylint: disable=invalid-name
    self.encryptions += 1
    if self.encryptions == self.at:
      os.kill(os.getpid(), signal.SIGINT)
    return self._cc.Encrypt(*args)

  def __getattr__(self, name):
    return getattr(self._cc, name)


@pytest.mark.parametrize("design", ["streamed", "one_context"])
def test_a_first_ctrl_c_stops_the_round_at_the_next_chunk(design, capsys, sigint_default):
  """S1's re-encryptions in Alg. 5: 8 chunks x (3 recipients + pk_s) = 32. A Ctrl-C
  during the 11th (recipient 2's third chunk) must stop the round there, not after the
  other 21; within ``graceful()`` the signal itself only records a stop."""
  dim = 8 * 1024
  rng = np.random.default_rng(1)
  online, _, w = _uploads(rng, dim)
  proto, step = _make(design, dim, workers=1, recipients=(0, 2, 3))
  helper = proto.s1.vector if design == "streamed" else proto.s1
  counting = _CountingContext(helper._ev.cc, at=11)  # pylint: disable=protected-access
  helper._ev.cc = counting  # pylint: disable=protected-access
  with interrupts.handle_interrupts(), interrupts.graceful("stopping soon"):
    with pytest.raises(interrupts.Interrupted) as e:
      step(proto, w, online[:1], online[:0], ALPHAS)  # one online upload: Alg. 5 only
  assert e.value.signum == signal.SIGINT
  assert counting.encryptions == 11
  assert "stopping soon" in capsys.readouterr().err  # the signal was only recorded
  # without a signal the same round makes all 32
  counting.at = -1
  counting.encryptions = 0
  step(proto, w, online[:1], online[:0], ALPHAS)
  assert counting.encryptions == 32


def test_a_first_ctrl_c_stops_the_pooled_key_transformation_at_the_next_chunk(
    monkeypatch, capsys, sigint_default):
  """On the pools a chunk's three tasks (S0's mask, S1's re-encryptions, S0's unmasking)
  run in the workers; this process takes each finished one. A Ctrl-C while it takes the
  second chunk's result must stop the round before it takes another chunk's."""
  dim = 16 * 1024
  rng = np.random.default_rng(2)
  online, _, w = _uploads(rng, dim)
  proto, step = _make("streamed", dim, workers=2, recipients=(0,))
  finished = []  # chunks whose kept copies (client 0's and the pk_s copy) arrived here
  real = parallel.wire_lib.ciphertext_from_bytes

  def arrived(data):
    finished.append(1)
    if len(finished) == 2 * 2:  # the second chunk's pk_s copy
      os.kill(os.getpid(), signal.SIGINT)
    return real(data)

  monkeypatch.setattr(parallel.wire_lib, "ciphertext_from_bytes", arrived)
  try:
    with interrupts.handle_interrupts(), interrupts.graceful("stopping soon"):
      with pytest.raises(interrupts.Interrupted):
        step(proto, w, online[:1], online[:0], ALPHAS)
  finally:
    proto.close()
  assert len(finished) == 4  # two of the 16 chunks taken, no third
  assert "stopping soon" in capsys.readouterr().err
