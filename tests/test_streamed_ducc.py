"""The streamed encrypted DUCC (fedjax_async.crypto.streamed_ducc), on the INSECURE test
preset: the same numbers as the plaintext DUCC of ``pafed.ducc`` with the same Min, the
levels each context spends, the key transformation, and S1's view of the two refreshes
played as an attack (what it decrypts, with its own keys, and nothing else)."""

import ast
import pathlib

import numpy as np
import pytest

from fedjax_async.algorithms import pafed

pytestmark = pytest.mark.crypto
pytest.importorskip("openfhe", exc_type=ImportError)

from fedjax_async.crypto import ckks  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import entities  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import streamed_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import vectors  # pylint: disable=g-import-not-at-top

PRESET = "insecure_test"
DIM = 2500  # three vector ciphertexts of 1024 slots
D = 5
ALPHAS = (0.7, 0.5, 0.3)


def _expected(w, online, delayed, d=D, tol=0.0):
  """Eq. 17 with pafed.ducc (Alg. 4, Eq. 12) and Cheon's Min with d iterations."""
  m, m1, m2 = (np.asarray(x, np.float64) for x in
               pafed.ducc(online, delayed, cheon.make_cheon_min(d), empty_class_tol=tol))
  return w + ALPHAS[0] * m + ALPHAS[1] * m1 + ALPHAS[2] * m2


@pytest.fixture(scope="module")
def protocol():
  return streamed_ducc.make_streamed_protocol(3, DIM, PRESET, min_depth=D, log_size=256)


def _round(rng, cos, dim=DIM, n_online=3):
  online = vectors.unit(rng.normal(size=(n_online, dim)) + 2.0 * rng.normal(size=dim))
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), cos, dim, rng)
  return online, delayed, rng.normal(size=dim) * 0.1


@pytest.mark.parametrize("cos,tol", [([0.7, -0.4, -0.6], 0.0), ([0.5, 0.2, 0.9], None),
                                     ([-0.6, -0.3, -0.9], None)])
@pytest.mark.xdist_group("streamed_protocol")
def test_streamed_round_equals_plaintext_ducc_with_the_same_min(protocol, cos, tol):
  """Mixed classes; none / all conflicting with the tolerance k eps_d, where one class
  holds only the Min's residue and is empty (the step without the tolerance differs by
  more than 0.01 there, so a streamed round that lost it fails)."""
  rng = np.random.default_rng(int(100 * abs(cos[0]) + 10 * abs(cos[1])))
  online, delayed, w = _round(rng, cos)
  tol = len(cos) * cheon.max_min_error(D) if tol is None else tol
  got, timings = streamed_ducc.streamed_pafed_step(protocol, w, online, delayed, ALPHAS,
                                                   tol)[:2]
  want = _expected(w, online, delayed, tol=tol)
  assert np.max(np.abs(got - want)) < 1e-5
  if tol:
    assert np.max(np.abs(_expected(w, online, delayed) - want)) > 0.01
  assert set(timings) == {"client_encrypt", "ducc", "key_transform", "decrypt"}


@pytest.mark.parametrize("end", [-1.0, 1.0])
def test_every_blind_at_an_end_of_its_range_with_many_aligned_online_updates(end,
                                                                         monkeypatch):
  """Every blind at 2^-8 (2^8) and 10 online uploads at cos 0.9 to one direction, so
  ||msum||^2 ~ 80: the values S0 and S1 exchange stay within CKKS's range at the level
  where they are decrypted (2^19 at the last level), and the step equals pafed.ducc."""
  monkeypatch.setattr(streamed_ducc.csprng, "blind",
                      lambda r, signed=True: 2.0 ** (end * r))
  dim = 600
  proto = streamed_ducc.make_streamed_protocol(2, dim, PRESET, min_depth=D)
  rng = np.random.default_rng(5)
  common = vectors.unit(rng.normal(size=dim))
  online = vectors.with_cos(common, [0.9] * 10, dim, rng)
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), [0.6, -0.4, 0.3], dim, rng)
  w = rng.normal(size=dim) * 0.1
  assert online.sum(0) @ online.sum(0) > 60
  got = streamed_ducc.streamed_pafed_step(proto, w, online, delayed, ALPHAS).w
  assert np.max(np.abs(got - _expected(w, online, delayed))) < 1e-5


@pytest.mark.xdist_group("streamed_protocol")
def test_no_delayed_or_no_online_update_and_the_carried_model(protocol):
  rng = np.random.default_rng(3)
  online, delayed, w = _round(rng, [0.5, -0.5])
  got = streamed_ducc.streamed_pafed_step(protocol, w, online, np.zeros((0, DIM)), ALPHAS).w
  assert np.max(np.abs(got - (w + ALPHAS[0] * online.mean(0)))) < 1e-6
  got = streamed_ducc.streamed_pafed_step(protocol, w, np.zeros((0, DIM)), delayed, ALPHAS).w
  assert np.max(np.abs(got - w)) < 1e-6  # m = 0: s = 1/2, both classes empty
  # Round 2 starts from the Enc_pk_s(w) the key transformation carried over.
  first = streamed_ducc.streamed_pafed_step(protocol, w, online, delayed, ALPHAS).w
  second = streamed_ducc.streamed_pafed_step(protocol, None, online, delayed, ALPHAS).w
  assert np.max(np.abs(second - _expected(first, online, delayed))) < 1e-5


def test_the_design_flag_is_checked():
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="^crypto.ckks_design: must be 'one_context' or 'streamed', "
                     "got 'two'"):
    config.validate(config.RunConfig().replace(ckks_design="two"))


def test_each_context_spends_the_levels_its_depth_names():
  """The vector context's products stop at VECTOR_DEPTH = 2; the scalar context's last
  ciphertexts (the masked coefficients) sit at scalar_depth(d) = 2d + 5, and a scalar
  context one level short is refused naming the depth."""
  d, dim = 3, 300
  proto = streamed_ducc.make_streamed_protocol(2, dim, PRESET, min_depth=d)
  s0, s1 = proto.s0, proto.s1
  rng = np.random.default_rng(0)
  online, delayed, w = _round(rng, [0.6, -0.4], dim=dim)
  s0.start_round()
  for u in online:
    s0.receive(proto.clients[0].encrypt_update(u), True)
  for u in delayed:
    s0.receive(proto.clients[1].encrypt_update(u), False)
  masked, norm = s0.inner_products()
  assert ckks.depth_used(norm) == streamed_ducc.VECTOR_DEPTH == 2
  inverse_norm = s1.masked_inverse_sqrt(s0.normalise(s1.refresh_inner_products(masked, norm)))
  requests = s0.scalars_begin(inverse_norm, ALPHAS)
  beta, gamma = s0.scalars_finish(s1.masked_inverse(requests, s0.empty_tests))
  assert ckks.depth_used(gamma) == streamed_ducc.scalar_depth(d) == 2 * d + 5
  assert ckks.depth_used(beta) == 2 * d + 4
  new = s0.combine(s1.refresh_coefficients(beta, gamma, len(delayed)), s0.encrypt_global(w))
  assert max(ckks.depth_used(c) for c in new) <= streamed_ducc.VECTOR_DEPTH
  short = streamed_ducc.make_streamed_protocol(2, dim, PRESET, min_depth=d + 1)
  short.s0.min_iterations = d + 2
  with pytest.raises(ckks.DepthError, match="needs scalar depth 15 "):
    short.s0.check_depth()


@pytest.mark.xdist_group("streamed_protocol")
def test_key_transformation_only_for_the_recipients_each_with_its_own_key(protocol):
  rng = np.random.default_rng(4)
  online, delayed, w = _round(rng, [0.6, -0.5])
  protocol.recipients = (2,)
  try:
    result = streamed_ducc.streamed_pafed_step(protocol, w, online, delayed, ALPHAS)
  finally:
    protocol.recipients = None
  got, models = result.w, result.client_models
  assert sorted(models) == [0, 2]  # client 0 decrypts the returned model
  want = _expected(w, online, delayed)
  assert np.max(np.abs(protocol.clients[2].decrypt_model(models[2], DIM) - want)) < 1e-5
  assert np.max(np.abs(got - want)) < 1e-5
  try:
    wrong = protocol.clients[1].decrypt_model(models[2], DIM)
    assert np.linalg.norm(wrong - want) > 100 * np.linalg.norm(want)
  except entities.DecryptionError:
    pass


# ------------------------------------------------------- S1's view, as an attack


class S1Log:
  """What S1 receives in each call of its methods, decrypted with its own keys."""

  def __init__(self, s1):
    self.calls = []
    for name in ("refresh_inner_products", "refresh_coefficients", "masked_inverse",
                 "key_transform_each"):
      setattr(s1, name, self._wrap(s1, name, getattr(s1, name)))

  def _wrap(self, s1, name, fn):
    def plain(ct):
      for h in (s1.vector, s1.scalar):
        try:
          return entities.decrypt_vector(h._cc, h._secret_key, ct)  # pylint: disable=protected-access
        except (entities.DecryptionError, RuntimeError, TypeError):
          continue
      raise AssertionError("S1 cannot decrypt what it was sent")

    def wrapped(*args):
      if name == "refresh_inner_products":
        self.calls.append((name, [plain(c)[0] for c in args[0]], plain(args[1])[0]))
      return fn(*args)
    return wrapped

  def inner_products(self):
    return [(ips, norm) for name, ips, norm in self.calls if name == "refresh_inner_products"]


def test_s1_cannot_read_the_inner_products_it_refreshes():
  """One delayed update per round, 8 rounds with fresh uploads. S1 holds ip + a (a uniform
  on [-1024, 1024]) for ip = msum . u (|ip| <= 3 here: n = 3 unit uploads); read with the
  mask taken as 0 it is within 0.05 of ip in at most 2 of the 8 rounds (unmasked: all 8).
  The same uploads sent twice are masked 1 apart at least (a mask reused across rounds:
  equal, and S1 would read ip differences)."""
  proto = streamed_ducc.make_streamed_protocol(2, 64, PRESET, min_depth=3)
  log = S1Log(proto.s1)
  rng = np.random.default_rng(9)
  hits = 0
  for _ in range(8):
    online, delayed, w = _round(rng, [0.37], dim=64)
    streamed_ducc.streamed_pafed_step(proto, w, online, delayed, ALPHAS)
    (ips, _), = log.inner_products()[-1:]
    hits += abs(ips[0] - online.sum(0) @ delayed[0]) < 0.05
  assert hits <= 2, hits
  streamed_ducc.streamed_pafed_step(proto, w, online, delayed, ALPHAS)
  (again, _), = log.inner_products()[-1:]
  assert abs(again[0] - log.inner_products()[-2][0][0]) > 1.0


def test_messages_as_bytes_give_the_same_round_and_their_sizes():
  """With a ``wire.Wire`` every message is serialised (OpenFHE binary) and what the
  receiver deserialises is used: the round equals pafed.ducc as before. The uploads
  weigh (n + k) C fresh ciphertexts of 2 N (depth + 1) 8-byte words (plus a header of
  under 4 KiB each); S1 sends S0 the recipients' and pk_s's copies of the model: (R + 1) C
  ciphertexts at least, and S0 the clients R C."""
  from fedjax_async.crypto import wire as wire_lib  # pylint: disable=g-import-not-at-top
  dim = 1500
  proto = streamed_ducc.make_streamed_protocol(3, dim, PRESET, min_depth=3)
  proto.wire = wire_lib.Wire()
  rng = np.random.default_rng(12)
  online, delayed, w = _round(rng, [0.6, -0.4], dim=dim)
  result = streamed_ducc.streamed_pafed_step(proto, w, online, delayed, ALPHAS)
  assert np.max(np.abs(result.w - _expected(w, online, delayed, d=3))) < 1e-5
  links = result.wire_bytes
  n_ct = 2 * 2048 * (streamed_ducc.VECTOR_DEPTH + 1) * 8
  chunks, uploads, recipients = 2, 5, 3
  assert n_ct * chunks * uploads <= links["clients->S0"] <= (n_ct + 4096) * chunks * uploads
  assert links["S1->S0"] >= n_ct * chunks * (recipients + 1)
  assert n_ct * chunks * recipients <= links["S0->clients"] <= (n_ct + 4096) * chunks * recipients
  assert set(links) == {"clients->S0", "S0->S1", "S1->S0", "S0->clients"}


# ------------------------------------------------------ one object, one interface


def _foreign_protected(source):
  """``obj._x`` reads of another object's protected member in ``source`` (``self._x``,
  ``cls._x``, ``super()._x`` and dunders are the object's own)."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
      continue
    v = node.value
    own = (isinstance(v, ast.Name) and v.id in ("self", "cls")) or (
        isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super")
    if not own and not node.attr.startswith("__"):
      out.append((node.lineno, ast.unparse(node)))
  return out


def test_crypto_modules_reach_each_other_through_public_methods_only():
  """S0, S1 and their helpers call each other's public methods: no ``obj._x`` across
  objects or modules and no silenced pylint protected-access in the crypto package."""
  assert _foreign_protected("h._ev.cc\nsecure_ducc._now()\nx = s1.vector._decrypt(c)") == [
      (1, "h._ev"), (2, "secure_ducc._now"), (3, "s1.vector._decrypt")]
  assert not _foreign_protected("self._x\ncls._y()\nsuper()._z\nv.__class__\n_f()")
  files = sorted(pathlib.Path(streamed_ducc.__file__).parent.glob("*.py"))
  assert len(files) > 5
  found = {}
  for path in files:
    source = path.read_text()
    bad = _foreign_protected(source)
    if "protected-access" in source:
      bad.append("pylint: disable=protected-access")
    if bad:
      found[path.name] = bad
  assert not found, found
