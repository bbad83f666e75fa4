"""Tests for the CKKS layer of PAFed (fedjax_async.crypto), on the INSECURE test preset.

Expectations are independent of the code under test: hand-computed Cheon Min values,
the plaintext DUCC of ``fedjax_async.algorithms.pafed`` (Alg. 4) evaluated with the same
Min function, exact minima, and properties of the keys/masks.
"""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async.algorithms import pafed

pytestmark = pytest.mark.crypto
# where OpenFHE does not load (its 3.12 wheel on Debian 12), skipped with the reason
pytest.importorskip("openfhe", exc_type=ImportError)

from fedjax_async.crypto import ckks
from fedjax_async.crypto import cheon
from fedjax_async.crypto import csprng
from fedjax_async.crypto import entities
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import streamed_ducc
from fedjax_async.crypto import vectors

PRESET = "insecure_test"
DIM = 1500  # two ciphertexts of 1024 slots: exercises chunking
D_SMALL = 5  # Cheon iterations for the fast protocol (DUCC depth 2*5 + 8 = 18)
D_EXACT = 10  # enough iterations for |cos| >= 0.4 to match the exact min (depth 28)
ALPHAS = (0.7, 0.5, 0.3)


def _expected(w, online, delayed, min_fn, alphas=ALPHAS, tol=0.0):
  """Eq. 17 with the plaintext DUCC (Alg. 4) of pafed.ducc."""
  m, m1, m2 = (np.asarray(x, np.float64)
               for x in pafed.ducc(online, delayed, min_fn, empty_class_tol=tol))
  return w + alphas[0] * m + alphas[1] * m1 + alphas[2] * m2


@pytest.fixture(scope="module")
def protocol():
  return secure_ducc.make_protocol(3, DIM, PRESET, min_depth=D_SMALL, log_size=64)


@pytest.fixture(scope="module")
def round_data():
  rng = np.random.default_rng(1)
  online = vectors.unit(rng.normal(size=(3, DIM)) + 2.0 * rng.normal(size=DIM))
  m_hat = vectors.unit(online.mean(0))
  return rng, online, m_hat


# ---------------------------------------------------------------- Cheon Min (Alg. 1)


def test_plain_cheon_min_hand_values():
  # a=0.2, b=0.7: x=0.45, y=-0.25, m0=0.0625, n0=-0.9375.
  assert cheon.cheon_min(0.2, 0.7, 0) == pytest.approx(0.45 - 0.0625)
  # m1 = 0.0625 * (1 + 0.9375/2) = 0.091796875.
  assert cheon.cheon_min(0.2, 0.7, 1) == pytest.approx(0.45 - 0.091796875)
  # n1 = 0.9375^2 * (-3.9375)/4 = -0.865173..., m2 = m1 * (1 + 0.865173/2).
  n1 = 0.9375 ** 2 * (-0.9375 - 3) / 4
  assert cheon.cheon_min(0.2, 0.7, 2) == pytest.approx(0.45 - 0.091796875 * (1 - n1 / 2))
  # Equal inputs are exact for every d; the error shrinks towards the exact min.
  assert cheon.cheon_min(0.3, 0.3, 7) == pytest.approx(0.3)
  errs = [abs(cheon.cheon_min(0.2, 0.7, d) - 0.2) for d in (1, 3, 5, 8)]
  assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-4
  assert abs(cheon.cheon_min(0.55, 0.5, 14) - 0.5) < 1e-4  # small gap needs more d
  assert abs(cheon.cheon_min(0.55, 0.5, 5) - 0.5) > 1e-2


def test_cheon_min_input_scale_hand_values_and_error():
  """The input scale c runs Alg. 1's iteration on (c y)^2 and divides m_d by c."""
  # a=0.2, b=0.7, c=2: c y = -0.5, m0 = 0.25, n0 = -0.75, m1 = 0.25 (1 + 0.375) = 0.34375,
  # Min = 0.45 - 0.34375 / 2 = 0.278125 (c = 1: 0.45 - 0.091796875 = 0.358203125).
  assert cheon.cheon_min(0.2, 0.7, 1, scale=2.0) == pytest.approx(0.278125)
  assert cheon.cheon_min(0.2, 0.7, 1) == pytest.approx(0.358203125)
  # DUCC's Min(s, 1/2): |y| <= 1/4, so c = 4 uses Wilkes' whole range: a quarter of the
  # error at every d (measured 4.712e-3 -> 1.178e-3 at d = 10)
  for d in (4, 10):
    e1, e4 = cheon.max_min_error(d), cheon.max_min_error(d, scale=4.0)
    assert e4 == pytest.approx(e1 / 4, rel=0.02)
  assert cheon.max_min_error(10, scale=4.0) < cheon.max_min_error(13)
  for bad in (0.0, -1.0, 4.5):
    with pytest.raises(ValueError, match="^crypto.ckks_min_scale: must be in"):
      pafed.check_ducc_scale(bad)


def test_homomorphic_cheon_min_matches_plaintext():
  d = 4
  cc = ckks.make_context(ckks.cheon_min_depth(d), PRESET)
  keys = cc.KeyGen()
  cc.EvalMultKeyGen(keys.secretKey)
  ev = ckks.Evaluator(cc)
  rng = np.random.default_rng(0)
  a, b = rng.uniform(0, 1, ev.slots), rng.uniform(0, 1, ev.slots)
  out = cheon.he_min(ev, ev.encrypt(keys.publicKey, a), ev.encrypt(keys.publicKey, b), d)
  assert ckks.depth_used(out) == ckks.cheon_min_depth(d) == 9
  got = entities.decrypt_vector(cc, keys.secretKey, out)
  want = cheon.cheon_min(a, b, d)
  assert np.max(np.abs(got - want)) < 1e-3
  assert np.max(np.abs(got - np.minimum(a, b))) > 1e-2  # d=4 is far from exact


# ----------------------------------------------------------- encrypted DUCC (Alg. 4)


@pytest.mark.parametrize("case", ["mixed", "all_conflicting", "none_conflicting",
                                  "near_orthogonal"])
@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_secure_ducc_matches_plaintext_cheon(protocol, round_data, case):
  rng, online, m_hat = round_data
  cos = {"mixed": [0.6, -0.5, 0.3, -0.8], "all_conflicting": [-0.6, -0.3, -0.9],
         "none_conflicting": [0.5, 0.2, 0.9],
         "near_orthogonal": [0.03, -0.02, 0.05, 0.04]}[case]
  delayed = vectors.with_cos(m_hat, cos, DIM, rng)
  w = rng.normal(size=DIM) * 0.1
  got, timings = secure_ducc.secure_pafed_step(protocol, w, online, delayed, ALPHAS)[:2]
  want = _expected(w, online, delayed, cheon.make_cheon_min(D_SMALL))
  assert set(timings) == {"client_encrypt", "ducc", "key_transform", "decrypt"}
  assert np.max(np.abs(got - want)) < 1e-4
  assert np.max(np.abs(want - w)) > 1e-2  # the update is not negligible


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_secure_ducc_with_the_min_input_scale_matches_its_plaintext(protocol, round_data):
  """min_scale = 4 folds c into the packing mask and 1/c into the weight masks: the
  encrypted round equals the plaintext DUCC with cheon_min(..., scale=4) at the same
  depth (the context has exactly ducc_depth(d) levels), and is nearer the exact Min."""
  rng, online, m_hat = round_data
  delayed = vectors.with_cos(m_hat, [0.6, -0.5, 0.3, -0.8, 0.15, -0.2], DIM, rng)
  w = rng.normal(size=DIM) * 0.1
  protocol.s0.min_scale = 4.0
  try:
    got = secure_ducc.secure_pafed_step(protocol, w, online, delayed, ALPHAS).w
  finally:
    protocol.s0.min_scale = 1.0
  want = _expected(w, online, delayed, cheon.make_cheon_min(D_SMALL, 4.0))
  assert np.max(np.abs(got - want)) < 1e-4
  exact = _expected(w, online, delayed, jnp.minimum)
  unscaled = _expected(w, online, delayed, cheon.make_cheon_min(D_SMALL))
  assert np.max(np.abs(want - exact)) < 0.5 * np.max(np.abs(unscaled - exact))


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_secure_ducc_components_and_depth(protocol, round_data):
  """m, m1, m2 separately (alpha one-hot) and the levels consumed = ducc_depth(d)."""
  rng, online, m_hat = round_data
  delayed = vectors.with_cos(m_hat, [0.7, -0.4, -0.6], DIM, rng)
  w = np.zeros(DIM)
  ducc = [np.asarray(x, np.float64)
          for x in pafed.ducc(online, delayed, cheon.make_cheon_min(D_SMALL))]
  for i in range(3):
    alphas = tuple(float(i == j) for j in range(3))
    got = secure_ducc.secure_pafed_step(protocol, w, online, delayed, alphas).w
    assert np.max(np.abs(got - ducc[i])) < 1e-4, i
  # Eq. 12 actually removed the m component of m2.
  assert abs(ducc[2] @ ducc[0]) < 1e-5
  s0 = protocol.s0
  cts = [c.encrypt_update(u) for c, u in zip(protocol.clients, online)]
  dcts = [protocol.clients[0].encrypt_update(u) for u in delayed]
  inv_norm = protocol.s1.masked_inverse_sqrt(s0.ducc_norm(cts, len(dcts)))
  inv = protocol.s1.masked_inverse(s0.ducc_begin(cts, dcts, ALPHAS, 0.0, inv_norm),
                                   s0.empty_tests)
  new = s0.ducc_finish(inv, s0.encrypt_global(w))
  assert max(ckks.depth_used(c) for c in new) == ckks.ducc_depth(D_SMALL) == 18


def test_secure_ducc_matches_exact_min():
  rng = np.random.default_rng(5)
  dim = 700
  proto = secure_ducc.make_protocol(2, dim, PRESET, min_depth=D_EXACT)
  online = vectors.unit(rng.normal(size=(4, dim)) + 1.5 * rng.normal(size=dim))
  m_hat = vectors.unit(online.mean(0))
  delayed = vectors.with_cos(m_hat, [0.8, -0.45, 0.5, -0.9, 0.45], dim, rng)
  w = rng.normal(size=dim)
  got = secure_ducc.secure_pafed_step(proto, w, online, delayed, ALPHAS).w
  # The plaintext inner products m . u_j: |m . u_j| >= 0.4 * ||m|| here.
  assert np.min(np.abs(delayed @ online.mean(0))) > 0.2
  exact = _expected(w, online, delayed, jnp.minimum)
  assert np.max(np.abs(got - exact)) < 1e-3
  assert len(proto.s1.decryption_log) == 0  # S1 keeps no log unless asked (log_size)


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_empty_classes_and_no_delayed(protocol, round_data):
  rng, online, _ = round_data
  w = rng.normal(size=DIM)
  got = secure_ducc.secure_pafed_step(protocol, w, online, np.zeros((0, DIM)), ALPHAS).w
  assert np.max(np.abs(got - (w + ALPHAS[0] * online.mean(0)))) < 1e-5
  got = secure_ducc.secure_pafed_step(protocol, w, np.zeros((0, DIM)), online, ALPHAS).w
  assert np.max(np.abs(got - w)) < 1e-5  # m = 0: s = 1/2, both classes empty


@pytest.mark.parametrize("case", ["all_conflicting", "none_conflicting", "mixed"])
@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_encrypted_empty_class_tolerance_matches_plaintext(protocol, round_data, case):
  """With the tolerance k eps_d in play, the encrypted step equals pafed.ducc with the
  same tolerance. All (none) conflicting: class 1 (2) holds only the Min's residue and is
  empty under the tolerance; the step without it differs by > 0.01 (100 times the CKKS
  tolerance asserted), so an encrypted test that ignored the tolerance fails here.
  Mixed: no class is empty, the tolerance changes nothing."""
  rng, online, m_hat = round_data
  cos = {"all_conflicting": [-0.6, -0.3, -0.9], "none_conflicting": [0.5, 0.2, 0.9],
         "mixed": [0.6, -0.5, 0.3]}[case]
  delayed = vectors.with_cos(m_hat, cos, DIM, rng)
  w = rng.normal(size=DIM) * 0.1
  tol = len(cos) * cheon.max_min_error(D_SMALL)
  got = secure_ducc.secure_pafed_step(protocol, w, online, delayed, ALPHAS, tol).w
  cheon_min = cheon.make_cheon_min(D_SMALL)
  want = _expected(w, online, delayed, cheon_min, tol=tol)
  assert np.max(np.abs(got - want)) < 1e-4
  without = _expected(w, online, delayed, cheon_min)
  gap = np.max(np.abs(without - want))
  assert (gap < 1e-12) if case == "mixed" else (gap > 0.01), gap


@pytest.mark.parametrize("end", [-1.0, 1.0])
def test_near_empty_classes_with_every_blind_at_an_end_of_its_range(end, monkeypatch):
  """d = 12 (eps_d = 2.1e-3, so tol = k eps_d is small) and delayed updates nearly
  orthogonal to m, so a class total is within tol of 0: with every blind at 2^-8 (2^8)
  the empty-class test must stay above CKKS noise (within the last level's range) and
  the step must match pafed.ducc with the same tolerance. Measured: <= 2.2e-6; a squared
  test s^2 (n^2 - tol^2) is 1e-10 at s = 2^-8, below the noise, and misreads the class
  (errors 0.1-0.27), as does multiplying an Enc(0) indicator into a huge 1 / (r n)."""
  end *= secure_ducc.BLIND_LOG2_RANGE
  monkeypatch.setattr(secure_ducc.csprng, "blind", lambda r, signed=True: 2.0 ** end)
  d, dim = 12, 64
  proto = secure_ducc.make_protocol(2, dim, PRESET, min_depth=d)
  rng = np.random.default_rng(0)
  online = vectors.unit(rng.normal(size=(3, dim)) + 2.0 * rng.normal(size=dim))
  m_hat = vectors.unit(online.mean(0))
  for cos in ([0.002], [-0.002], [0.3, 0.001]):
    delayed = vectors.with_cos(m_hat, cos, dim, rng)
    tol = len(cos) * cheon.max_min_error(d)
    w = rng.normal(size=dim) * 0.1
    got = secure_ducc.secure_pafed_step(proto, w, online, delayed, ALPHAS, tol).w
    want = _expected(w, online, delayed, cheon.make_cheon_min(d), tol=tol)
    assert np.max(np.abs(got - want)) < 1e-4, cos


# --------------------------------------------------------- key transformation (Alg. 5)


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_key_transformation_keys_and_masks(protocol, round_data):
  rng, online, m_hat = round_data
  delayed = vectors.with_cos(m_hat, [0.5, -0.5], DIM, rng)
  w = rng.normal(size=DIM) * 0.1
  s1 = protocol.s1
  s1.decryption_log.clear()
  result = secure_ducc.secure_pafed_step(protocol, w, online, delayed, ALPHAS)
  models = result.client_models
  want = _expected(w, online, delayed, cheon.make_cheon_min(D_SMALL))
  assert sorted(models) == [0, 1, 2]
  for i, client in enumerate(protocol.clients):
    assert np.max(np.abs(client.decrypt_model(models[i], DIM) - want)) < 1e-4
  # Client 1's key on client 0's model: OpenFHE refuses to decode, or yields garbage.
  try:
    wrong = protocol.clients[1].decrypt_model(models[0], DIM)
    assert np.linalg.norm(wrong - want) > 100 * np.linalg.norm(want)
  except entities.DecryptionError:
    pass
  # What S1 decrypted: 8 blinded scalars (r0^2 ||n m||^2 for the normalisation, r1 n1,
  # r2 n2, r3 ||m||^2, then the empty-class tests +-s (n - tol), +-s' (-n - tol) of
  # both classes),
  # then the w + r chunks.
  log = list(s1.decryption_log)
  n_chunks = ckks.num_chunks(DIM, protocol.s0.ev.slots)
  assert len(log) == 8 + n_chunks
  m = online.mean(0)
  s = (delayed @ (m / np.linalg.norm(m)) + 1) / 2
  x = cheon.cheon_min(s, 0.5, D_SMALL)
  n1, n2 = np.sum(s - x), np.sum(x - 0.5)
  tol = secure_ducc.EMPTY_EPS
  r = secure_ducc.BLIND_LOG2_RANGE

  uploads = np.concatenate([online, delayed])

  def blinded(v, t, blind=r):
    # a replicated scalar plus S0's zero-sum Gaussian flood, nothing else: the slots
    # around their mean are Gaussian (kurtosis 3, 5 sigma) and follow no upload
    value, noise = entities.replicated_value(v), v - entities.replicated_value(v)
    assert abs(np.mean(noise ** 4) / np.mean(noise ** 2) ** 2 - 3.0) < 5 * np.sqrt(24 / v.size)
    assert max(abs(np.corrcoef(noise, u[:v.size])[0, 1]) for u in uploads) < 6 / np.sqrt(v.size)
    ratio = abs(value / t)
    return 2 ** -blind - 1e-6 <= ratio <= 2 ** blind + 1e-6 and abs(ratio - 1) > 1e-3

  assert blinded(log[0], len(online) ** 2 * (m @ m), 2 * r)  # a squared blind for r0^2
  assert blinded(log[3], m @ m)
  # The classes (totals and tests) go out in a random order, the two tests of a class
  # too: some order of each matches the blinded values.
  assert any(blinded(log[1], a) and blinded(log[2], b)
             and any(blinded(log[4], ta) and blinded(log[5], tb) for ta, tb in (
                 (a - tol, -a - tol), (-a - tol, a - tol)))
             and any(blinded(log[6], ta) and blinded(log[7], tb) for ta, tb in (
                 (b - tol, -b - tol), (-b - tol, b - tol)))
             for a, b in ((n1, n2), (n2, n1)))
  masked = ckks.unchunk(log[8:], DIM)
  assert np.linalg.norm(masked - want) > 100 * np.linalg.norm(want)
  # A fresh uniform mask's correlation with a fixed vector has sd 1 / sqrt(DIM) (0.026):
  # 6 of them (a fixed 0.1 was 3.9: about one run in a thousand failed by chance).
  bound = 6 / np.sqrt(DIM)
  assert abs(np.corrcoef(masked, want)[0, 1]) < bound
  # S1 never saw an upload: no logged vector correlates with any client's update.
  for u in np.concatenate([online, delayed]):
    assert abs(np.corrcoef(masked, u)[0, 1]) < bound
  # The Enc_pk_s(w) carried to the next round decrypts to w^{tau+1} as well.
  carried = secure_ducc.secure_pafed_step(protocol, None, online, np.zeros((0, DIM)),
                                          (0.0, 0.0, 0.0)).w
  assert np.max(np.abs(carried - want)) < 1e-4


# ----------------------------------------------------------------- entity separation


def _walk(obj, seen, found, path="s0"):
  if id(obj) in seen:
    return
  seen.add(id(obj))
  found.append((path, obj))
  if isinstance(obj, dict):
    for k, v in obj.items():
      _walk(k, seen, found, f"{path}[{k!r}]")
      _walk(v, seen, found, f"{path}[{k!r}]")
  elif isinstance(obj, (list, tuple, set, frozenset)):
    for i, v in enumerate(obj):
      _walk(v, seen, found, f"{path}[{i}]")
  elif hasattr(obj, "__dict__") and not isinstance(obj, type):
    for k, v in vars(obj).items():
      _walk(v, seen, found, f"{path}.{k}")


def _assert_s0_public_only(s0, classes, path="s0"):
  """S0's object graph holds no secret key, S1, client, KDC, bound method or seedable
  generator, but its public material; the source of ``classes`` never decrypts."""
  found = []
  _walk(s0, set(), found, path)
  forbidden = (entities.secret_key_type(), entities.HelperServer, entities.Client,
               entities.KDC, streamed_ducc.StreamedHelper)
  bad = [p for p, o in found if isinstance(o, forbidden)]
  assert not bad, bad
  # No seedable generator: S0's randomness is os.urandom's (fedjax_async.crypto.csprng).
  assert not [p for p, o in found
              if isinstance(o, (np.random.Generator, np.random.RandomState))]
  assert not any(callable(o) and hasattr(o, "__self__") for _, o in found)
  assert any(isinstance(o, entities.PublicMaterial) for _, o in found)
  # S0's code (and its evaluator's) never decrypts nor touches a secret key.
  for cls in classes:
    src = inspect.getsource(cls)
    for token in (".Decrypt(", "decrypt_vector", "secretKey", "_secret_key", "KeyGen"):
      assert token not in src, (cls, token)


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_s0_holds_no_secret_key(protocol, round_data):
  rng, online, m_hat = round_data
  # Run a round first so any state S0 keeps is populated.
  secure_ducc.secure_pafed_step(protocol, np.zeros(DIM), online,
                                vectors.with_cos(m_hat, [0.4, -0.4], DIM, rng), ALPHAS)
  _assert_s0_public_only(protocol.s0, (secure_ducc.AggregationServer, ckks.Evaluator))
  # The other entities do hold their own secret keys.
  assert isinstance(protocol.s1._secret_key, entities.secret_key_type())


def test_streamed_s0_holds_no_secret_key():
  """The streamed design's S0, walked at every message it sends S1 (mid-round, with the
  round's state populated) and after the round, holds public material only."""
  proto = streamed_ducc.make_streamed_protocol(3, 300, PRESET, min_depth=3)
  s1, walks = proto.s1, []
  classes = (streamed_ducc.StreamedAggregationServer, secure_ducc.AggregationServer, ckks.Evaluator)

  def walking(name, method):
    def call(*args):
      _assert_s0_public_only(proto.s0, classes, f"s0 at {name}")
      walks.append(name)
      return method(*args)
    return call

  for name in ("refresh_inner_products", "masked_inverse_sqrt", "masked_inverse",
               "refresh_coefficients", "key_transform_each"):
    setattr(s1, name, walking(name, getattr(s1, name)))
  rng = np.random.default_rng(2)
  online = vectors.unit(rng.normal(size=(3, 300)) + 2.0 * rng.normal(size=300))
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), [0.4, -0.4], 300, rng)
  streamed_ducc.streamed_pafed_step(proto, np.zeros(300), online, delayed, ALPHAS)
  assert len(walks) == 5, walks
  _assert_s0_public_only(proto.s0, classes)
  assert isinstance(proto.s1.vector._secret_key, entities.secret_key_type())


def test_csprng_draws_are_fresh_uniform_and_ignore_numpy_seeds():
  """S0's randomness: 2^16 uniforms on [-B, B] (mean, spread, range as a uniform's), two
  draws after the same np.random.seed differ everywhere, blinds +-2^U(-R, R) take both
  signs and span the range."""
  np.random.seed(0)
  a = csprng.uniform(-1024.0, 1024.0, 2 ** 16)
  np.random.seed(0)
  b = csprng.uniform(-1024.0, 1024.0, 2 ** 16)
  assert a.min() >= -1024.0 and a.max() < 1024.0
  assert abs(a.mean()) < 20.0 and abs(a.std() - 2048.0 / np.sqrt(12)) < 10.0
  assert np.count_nonzero(a == b) == 0
  blinds = np.array([csprng.blind(8.0) for _ in range(200)])
  logs = np.log2(np.abs(blinds))
  assert logs.min() >= -8.0 and logs.max() <= 8.0 and np.ptp(logs) > 12.0
  assert 40 < np.count_nonzero(blinds > 0) < 160
  assert all(csprng.blind(8.0, signed=False) > 0 for _ in range(50))


# ----------------------------------------------------------------------- depth errors


@pytest.mark.xdist_group("crypto_protocol")  # its module fixture computed once
def test_ducc_depth_error_names_needed_depth(round_data):
  rng, online, m_hat = round_data
  proto = secure_ducc.make_protocol(1, 64, PRESET, min_depth=4, depth=10)
  with pytest.raises(ckks.DepthError, match=r"needs multiplicative depth 16"):
    secure_ducc.secure_pafed_step(proto, np.zeros(64), online[:, :64],
                                  vectors.unit(rng.normal(size=(2, 64))), ALPHAS)


def test_min_depth_error_names_needed_depth():
  cc = ckks.make_context(9, PRESET)
  keys = cc.KeyGen()
  cc.EvalMultKeyGen(keys.secretKey)
  ev = ckks.Evaluator(cc)
  a = ev.encrypt(keys.publicKey, np.full(ev.slots, 0.3))
  with pytest.raises(ckks.DepthError, match=r"needs multiplicative depth 13"):
    cheon.he_min(ev, a, a, 6)
  # The per-multiplication guard: a chain of squarings stops at the context's depth.
  x = a
  with pytest.raises(ckks.DepthError, match=r"needs multiplicative depth 10"):
    for _ in range(12):
      x = ev.square(x)


@pytest.mark.slow
def test_secure_preset_128_bit_round_matches_plaintext():
  """The default 128-bit preset (HEStd_128_classic, ring 2^16 at depth 28) end to end:
  one full round equals the plaintext DUCC with the same Min (slow: ~45 s)."""
  rng = np.random.default_rng(11)
  dim = 256
  proto = secure_ducc.make_protocol(4, dim, "secure", min_depth=D_EXACT)
  assert proto.cc.GetRingDimension() >= 2 ** 15
  online = vectors.unit(rng.normal(size=(2, dim)) + 1.5 * rng.normal(size=dim))
  m_hat = vectors.unit(online.mean(0))
  delayed = vectors.with_cos(m_hat, [0.6, -0.5], dim, rng)
  w = rng.normal(size=dim)
  got = secure_ducc.secure_pafed_step(proto, w, online, delayed, ALPHAS).w
  want = _expected(w, online, delayed, cheon.make_cheon_min(D_EXACT))
  assert np.max(np.abs(got - want)) < 1e-4


def test_a_ring_too_small_for_the_security_level_is_named():
  # OpenFHE's RuntimeError (a source path and line) becomes a ValueError that says which
  # ring, preset and depth, and the ring OpenFHE needs.
  with pytest.raises(ValueError, match=r"ring dimension 4096 is too small for the 'secure' "
                                       r"preset .* at depth 28: OpenFHE needs 65536"):
    ckks.make_context(28, "secure", 4096)
