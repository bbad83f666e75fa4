"""Alg. 5 on worker pools (fedjax_async.crypto.parallel) and a stop asked for in the middle
of a CKKS round (fedjax_async.crypto.stopping), on the INSECURE test preset.

The pooled key transformation must give the clients the model the in-process one gives
(each decrypting with its own key, within CKKS noise), carry the same model to the next
round, and count the bytes the in-process round sends; a first Ctrl-C within
``interrupts.graceful()`` (only recorded there) must stop the round at the next chunk."""

import importlib.util
import os
import signal

import numpy as np
import pytest

from fedjax_async import interrupts
from fedjax_async.algorithms import pafed

pytestmark = pytest.mark.crypto
pytest.importorskip("openfhe", exc_type=ImportError)

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


def _decrypted(proto, dim):
  return {i: proto.clients[i].decrypt_model(cts, dim)
          for i, cts in proto.last_client_models.items()}


@pytest.mark.parametrize("design", ["streamed", "one_context"])
def test_two_workers_give_every_recipient_the_in_process_model(design):
  dim = 3 * 1024 + 5  # four chunks
  rng = np.random.default_rng(7)
  online, delayed, w = _uploads(rng, dim)
  want = _expected(w, online, delayed)
  got = {}
  for workers in (1, 2):
    proto, step = _make(design, dim, workers)
    if design == "streamed":
      proto.wire = wire.Wire()
    try:
      first, _ = step(proto, w, online, delayed, ALPHAS)
      models = _decrypted(proto, dim)
      # the carried Enc_pk_s(w) continues the next round (no w_global)
      second, _ = step(proto, None, online, delayed, ALPHAS)
      got[workers] = (first, models, second, proto.last_breakdown)
    finally:
      proto.close()
  (first1, models1, second1, b1), (first2, models2, second2, b2) = got[1], got[2]
  assert sorted(models2) == sorted(models1) == [0, 2, 3]  # the recipients and client 0
  for i in models1:  # each recipient decrypts with its own key the same model
    assert np.max(np.abs(models2[i] - want)) < 1e-5
    assert np.max(np.abs(models2[i] - models1[i])) < 1e-5
  assert np.max(np.abs(first2 - first1)) < 1e-5
  assert np.max(np.abs(second2 - second1)) < 1e-4
  assert b2["workers_cpu_s"] > 0 and "workers_cpu_s" not in b1
  if design == "streamed":  # the same messages, as bytes: sizes equal but for headers
    for link in ("S1->S0", "S0->clients"):
      assert abs(b2["bytes"][link] - b1["bytes"][link]) <= 0.001 * b1["bytes"][link]


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
      got, _ = step(proto, w, online, delayed, ALPHAS)
      models = _decrypted(proto, dim)
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
def test_a_first_ctrl_c_stops_the_round_at_the_next_chunk(design, capsys):
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


def test_a_first_ctrl_c_stops_the_pooled_key_transformation_at_the_next_chunk(monkeypatch,
                                                                               capsys):
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
