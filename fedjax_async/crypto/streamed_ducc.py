"""Encrypted DUCC at the paper's model size: the vectors in a shallow CKKS context, read
chunk by chunk; the few scalars in a deep one (PAFed Alg. 4, Eq. 12, Eq. 17, Alg. 5).

``secure_ducc`` runs every product at the Min's depth 2d + 8, so a 1.66M-parameter model
is 51 ciphertexts of 30 MB per upload (N = 2^16). Here the model-size work is linear in
the uploads, which needs depth 2 only:

    w' = w + gamma * msum + sum_j beta_j u_j                                  (Eq. 17)
    beta_j = a1 w1_j / n1 + a2 w2_j / n2                           (Alg. 4 lines 5-11)
    gamma  = a0 / n - a2 (sum_j w2_j ip_j) / (n2 ||msum||^2)            (Eq. 12 on m2)

with msum = sum of the n online uploads, ip_j = msum . u_j for the k delayed ones, w1, w2
DUCC's class weights from the Min (Eq. 13). The round, with S0's computations:

1. vectors (context V, depth 2, N = 2^14 at 128 bits): msum as the online uploads arrive
   (each dropped once added); ip_j and ||msum||^2 as sums over chunks of unrelinearised
   products, relinearised and slot-summed once each;
2. S1 refreshes the inner products and the mean's squared norm into the scalar context
   S: S0 sends ip_j + a_j and ||m||^2 + a (m = msum / n; additive masks uniform on
   [-B, B], as Alg. 5 masks w), S1 returns them under the scalar key (the ip_j packed in
   slots), S0 subtracts the masks in plaintext; then S0 blinds r0^2 ||m||^2 there and S1
   returns Enc_S(1 / (r0 ||m||)) (``secure_ducc``'s normalisation exchange, in the deep
   context, where a blind of 2^-8 keeps its precision);
3. scalars (context S, depth 2d + 5): the Min, class totals, empty-class tests and masked
   inverses exactly as ``secure_ducc``; then beta (packed) and gamma;
4. S1 refreshes beta_j + b_j and gamma + b (additive masks again) into V, one replicated
   ciphertext each; S0 forms w' chunk by chunk: sum_j Enc(beta_j + b_j) * u_j (products
   added before one relinearisation per chunk) minus sum_j b_j u_j (plaintext
   constants);
5. the key transformation (Alg. 5) in V, for the next round's recipients: S0 subtracts a
   fresh Enc_pk_i(r) from S1's Enc_pk_i(w + r) (Alg. 5 line 14), so what client i receives
   shares no randomness with what S1 produced.

What S1 decrypts, beyond ``secure_ducc``'s blinded scalars and w + r: the additively
masked ip_j, ||m||^2 and coefficients (2k + 3 scalars per round, each masked once). The
trust is the one S1 already has for the masked divisions (docs/crypto.md, "Streamed
design"). Randomness from ``csprng`` as everywhere in S0.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async.algorithms import pafed
from fedjax_async.crypto import cheon
from fedjax_async.crypto import ckks
from fedjax_async.crypto import csprng
from fedjax_async.crypto import entities
from fedjax_async.crypto import parallel
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import stages as stages_lib
from fedjax_async.crypto import stopping

# Levels of the vector context: ip_j = msum . u_j (1), ||m||^2 = ||msum||^2 / n^2 (2);
# the update's sum_j Enc(beta_j) * u_j (1).
VECTOR_DEPTH = 2
# The additive masks of the two refreshes: uniform on [-B, B] (as Alg. 5's mask).
REFRESH_MASK_BOUND = secure_ducc.KT_MASK_BOUND


def scalar_depth_breakdown(min_iterations: int) -> Dict[str, int]:
  """Levels of the scalar context, from the refreshed inner products (fresh, level 0):
  normalise (the packing mask, then times 1 / ||msum||), the Min (2 per iteration),
  weight (w1, w2 times their masks), inverse (times S1's 1 / (r n)), projection
  (sum_j w2_j ip_j / n2 times 1 / ||msum||^2, Eq. 12)."""
  d = int(min_iterations)
  return {"normalise": 2, "min": 2 * d if d > 0 else 1, "weight": 1, "inverse": 1,
          "projection": 1}


def scalar_depth(min_iterations: int) -> int:
  """2d + 5 for d Min iterations."""
  return sum(scalar_depth_breakdown(min_iterations).values())


class StreamedHelper:
  """S1 with a key pair in each context (``entities.HelperServer`` per context, one log).

  Decrypts only S0-masked values: those of ``secure_ducc`` (blinded class totals and
  tests, w + r) plus the additively masked inner products and coefficients it moves
  between the contexts (``refresh_inner_products``, ``refresh_coefficients``)."""

  def __init__(self, vector: entities.HelperServer, scalar: entities.HelperServer,
               log_size: int = 0):
    self.vector, self.scalar = vector, scalar
    self.decryption_log = collections.deque(maxlen=int(log_size))
    vector.decryption_log = scalar.decryption_log = self.decryption_log

  def masked_inverse(self, cts, tests=()):
    return self.scalar.masked_inverse(cts, tests)

  def key_transform_each(self, masked_cts, recipients):
    """Alg. 5 lines 6-12 in the vector context, one recipient at a time
    (``entities.HelperServer.key_transform_each``)."""
    return self.vector.key_transform_each(masked_cts, recipients)

  def worker_material(self):
    """The vector context's S1 material for its Alg. 5 workers."""
    return self.vector.worker_material()

  def worker_pool(self, workers: int, backend: str = "process"):
    """S1's Alg. 5 pool (the vector context's), held by S1 (``parallel.PoolHolder``)."""
    return self.vector.worker_pool(workers, backend)

  def close_pool(self, cancel: bool = False):
    self.vector.close_pool(cancel)

  def masked_inverse_sqrt(self, cts):
    return self.scalar.masked_inverse_sqrt(cts)

  def refresh_inner_products(self, masked_ips: Sequence[object], masked_norm) -> Tuple:
    """[Enc_V(ip_j + a_j)] and Enc_V(||m||^2 + a) (replicated) -> Enc_S of the masked ip_j
    packed in slots 0..k-1, and Enc_S(||m||^2 + a) replicated."""
    ips = [entities.replicated_value(self.vector.decrypt_masked(c)) for c in masked_ips]
    norm = entities.replicated_value(self.vector.decrypt_masked(masked_norm))
    return self.scalar.encrypt_packed(ips), self.scalar.encrypt_replicated(norm)

  def refresh_coefficients(self, masked_betas, masked_gamma, k: int) -> List[object]:
    """Enc_S(beta_j + b_j) packed and Enc_S(gamma + b) -> k + 1 replicated Enc_V values."""
    betas = self.scalar.decrypt_masked(masked_betas)[:k]
    gamma = entities.replicated_value(self.scalar.decrypt_masked(masked_gamma))
    return [self.vector.encrypt_replicated(float(v)) for v in list(betas) + [gamma]]


class StreamedAggregationServer(secure_ducc.AggregationServer):
  """S0 of the streamed design. ``self.ev`` is the scalar context's evaluator (the Min,
  the class totals and tests, shared with ``secure_ducc``); ``self.vev`` the vector
  context's. Public material only."""

  def __init__(self, vector_public: entities.PublicMaterial,
               scalar_public: entities.PublicMaterial):
    super().__init__(scalar_public)
    self.vector_public = vector_public
    self.vev = ckks.Evaluator(vector_public.cc)
    self.start_round()

  def check_depth(self):
    need = scalar_depth(self.min_iterations)
    if self.ev.depth < need:
      parts = ", ".join(f"{k}={v}" for k, v in
                        scalar_depth_breakdown(self.min_iterations).items())
      raise ckks.DepthError(
          f"streamed DUCC with Min d={self.min_iterations} needs scalar depth {need} "
          f"({parts}) but the scalar CKKS context has depth {self.ev.depth}")
    if self.vev.depth < VECTOR_DEPTH:
      raise ckks.DepthError(f"streamed DUCC needs vector depth {VECTOR_DEPTH} but the "
                            f"vector CKKS context has depth {self.vev.depth}")

  def encrypt_global(self, w: np.ndarray) -> List[object]:
    return [self.vev.encrypt(self.vector_public.pk_s, b)
            for b in ckks.chunk(w, self.vev.slots)]

  def worker_material(self) -> Dict[str, object]:
    """The vector context's public material (Alg. 5 runs there) for S0's workers."""
    pub = self.vector_public
    return parallel.party_material(pub.cc, pub.pk_s, pub.client_pks)

  # ------------------------------------------------------------------ 1. vectors

  def start_round(self):
    self.timings = {}
    self._msum: Optional[List[object]] = None
    self._n = 0
    self._delayed: List[List[object]] = []
    self._state = {}

  def receive(self, cts: List[object], online: bool):
    """One client's Enc_pk_s(u) chunks: an online one is added to msum and not kept."""
    t = secure_ducc.now()
    if online:
      self._n += 1
      self._msum = (list(cts) if self._msum is None else
                    [self.vev.add(a, b) for a, b in zip(self._msum, cts)])
    else:
      self._delayed.append(list(cts))
    self._tick("receive", t)

  def _dot(self, xs, ys):
    """Enc(x . y) replicated: products of all chunks added unrelinearised, then one
    relinearisation and one slot sum."""
    cc = self.vev.cc
    self.vev.check_levels(xs[0], ys[0], what="inner product over chunks")
    acc = None
    for x, y in zip(xs, ys):
      stopping.between_chunks()
      p = cc.EvalMultNoRelin(x, y)
      acc = p if acc is None else cc.EvalAdd(acc, p)
    return self.vev.eval_sum(cc.Relinearize(acc))

  def inner_products(self) -> Tuple[List[object], object]:
    """Alg. 4 line 5 over chunks: ([Enc_V(ip_j + a_j)], Enc_V(||m||^2 + a)) for S1's
    ``refresh_inner_products``; ([], None) when no Min is needed (n = 0 or k = 0)."""
    if self._n == 0 or not self._delayed:
      return [], None
    t = secure_ducc.now()
    k = len(self._delayed)
    if k > self.ev.slots:
      raise ValueError(f"{k} delayed uploads exceed the scalar context's {self.ev.slots} "
                       f"slots: make the protocol with max_delayed >= {k}")
    a = csprng.uniform(-REFRESH_MASK_BOUND, REFRESH_MASK_BOUND, k + 1)
    vpk = self.vector_public.pk_s
    # flooded (``flood``; no blind yet): |ip_j| <= n, ||m||^2 <= 1
    masked = [self.flood(self.vev.add_const(self._dot(self._msum, u), a[j]), 0.0, self._n,
                         self.vev, vpk) for j, u in enumerate(self._delayed)]
    # ||m||^2 = ||msum||^2 / n^2 <= 1: its blind r0^2 (2^-16..2^16) is applied in the
    # scalar context, where small values keep their precision (``normalise``).
    norm = self.vev.add_const(self.vev.mult_const(self._dot(self._msum, self._msum),
                                                  1.0 / self._n ** 2, what="||m||^2"), a[k])
    norm = self.flood(norm, 0.0, 1.0, self.vev, vpk)
    self._state.update(ip_mask=a)
    self._tick("inner_products", t)
    return masked, norm

  # ------------------------------------------------------------------ 3. scalars

  def normalise(self, refreshed) -> List[object]:
    """The masks off the refreshed values (plaintext subtractions), then the blinded
    [Enc_S(r0^2 ||m||^2)] for S1's ``masked_inverse_sqrt`` (the paper normalises the
    online mean before the Min, Sec. V-A)."""
    self.check_depth()
    packed, norm = refreshed
    st, k = self._state, len(self._delayed)
    t = secure_ducc.now()
    a_mask = np.zeros(self.ev.slots)
    a_mask[:k] = st["ip_mask"][:k]
    st["ip"] = self.ev.cc.EvalSub(packed, self.ev.encode(a_mask))  # ip_j in slot j
    st["r0"] = r0 = self._blind(signed=False)
    norm = self.ev.add_const(norm, -st["ip_mask"][k])
    out = [self.flood(self.ev.mult_const(norm, r0 * r0, what="r0^2 ||m||^2"),
                      2 * secure_ducc.BLIND_LOG2_RANGE, 1.0)]
    self._tick("normalise", t)
    return out

  def scalars_begin(self, inverse_norm, alphas, empty_class_tol: float = 0.0) -> List[object]:
    """Alg. 4 lines 5-10 on the packed inner products, given S1's [Enc(1 / (r0 ||m||))]:
    the Min, the blinded class totals [Enc(r1 n1), Enc(r2 n2)] for S1's
    ``masked_inverse`` (with ``empty_tests``)."""
    inv_norm = inverse_norm[0]
    st, k, slots, c = self._state, len(self._delayed), self.ev.slots, self.min_scale
    t = secure_ducc.now()
    ip = st["ip"]
    valid = np.zeros(slots)
    valid[:k] = 1.0
    # S1 returned 1 / (r0 ||m||) = n / (r0 ||msum||); r0 / n off it at once, so that no
    # later constant or value carries a blind's range (2^-8 .. 2^8) twice.
    inv_msum = self.ev.mult_const(inv_norm, st["r0"] / self._n, what="1 / ||msum||")
    # z_j = c ip_j / (4 sqrt 2 ||msum||) = c y_j / sqrt 2 (as secure_ducc.ducc_begin).
    z = self.ev.mult_plain(ip, valid * (c / (4.0 * secure_ducc.SQRT2)),
                           what="packing inner products")
    z = self.ev.mult(z, inv_msum, what="normalise: times 1 / ||msum||")
    y = self.ev.mult_const(z, secure_ducc.SQRT2, what="Alg. 1: y")
    half_m = cheon.he_half_abs_from_z(self.ev, z, self.min_iterations)
    m_d = self.ev.add(half_m, half_m)
    st.update(inv_msum=inv_msum, valid=valid, alphas=tuple(map(float, alphas)),
              w1=self.ev.add(y, m_d), w2=self.ev.sub(y, m_d))
    t = self._tick("min", t)
    self.empty_tests, requests, tol = [], [], max(float(empty_class_tol),
                                                  secure_ducc.EMPTY_EPS)
    for name in ("1", "2"):
      r = st["r" + name] = self._blind()
      w = st["w" + name]
      requests.append(self.flood(
          self.ev.eval_sum(self.ev.mult_plain(w, (r / c) * valid, what="class total")),
          secure_ducc.BLIND_LOG2_RANGE, k * max(1.0, 1.0 / c)))  # |n| <= k / 2
      tests, st["sigma" + name] = self.empty_class_test(w, valid / c, tol)
      self.empty_tests += tests
    self._tick("class_totals", t)
    return self._swap_classes(requests)

  def scalars_finish(self, inverses) -> Tuple[object, object]:
    """beta (packed) and gamma, each plus a fresh additive mask, for S1's
    ``refresh_coefficients``."""
    st, slots, c = self._state, self.ev.slots, self.min_scale
    a0, a1, a2 = st["alphas"]
    t = secure_ducc.now()
    inverses = self._unswap_classes(inverses)
    inv1 = self._class_factor(inverses[0], st["sigma1"])  # 1 / (r1 n1), or 0 if empty
    inv2 = self._class_factor(inverses[1], st["sigma2"])
    valid = st["valid"]
    beta = self.ev.add(
        self.ev.mult(self.ev.mult_plain(st["w1"], valid * (st["r1"] * a1 / c),
                                        what="weight: a1 w1"), inv1,
                     what="Alg. 4 line 11: / n1"),
        self.ev.mult(self.ev.mult_plain(st["w2"], valid * (st["r2"] * a2 / c),
                                        what="weight: a2 w2"), inv2,
                     what="Alg. 4 line 11: / n2"))
    # Eq. 12: a2 (sum_j w2_j ip_j) / (n2 ||msum||^2), r2 folded into the mask.
    ipm = self.ev.mult_plain(st["ip"], valid * (a2 * st["r2"] / c),
                             what="Eq. 12: masked inner products")
    p = self.ev.eval_sum(self.ev.mult(st["w2"], ipm, what="Eq. 12: w2_j ip_j"))
    inv_nn = self.ev.square(st["inv_msum"], what="Eq. 12: 1 / ||msum||^2")
    proj = self.ev.mult(self.ev.mult(p, inv2, what="Eq. 12: / n2"), inv_nn,
                        what="Eq. 12: / ||msum||^2")
    b = csprng.uniform(-REFRESH_MASK_BOUND, REFRESH_MASK_BOUND, len(self._delayed) + 1)
    st["coef_mask"] = b
    # The slots past the k coefficients (beta = 0 there, but for S0's CKKS noise) get
    # masks of their own, so S1 reads no unmasked slot; the imaginary parts, where S1
    # would read beta's own CKKS error (that of w1 / n1 and w2 / n2), get a mask too.
    b_packed = csprng.uniform(-REFRESH_MASK_BOUND, REFRESH_MASK_BOUND, slots)
    b_packed[:len(self._delayed)] = b[:-1]
    b_imag = csprng.uniform(-REFRESH_MASK_BOUND, REFRESH_MASK_BOUND, slots)
    masked_beta = self.ev.cc.EvalAdd(
        beta, self.ev.cc.MakeCKKSPackedPlaintext(b_packed + 1j * b_imag))
    masked_gamma = self.ev.add_const(self.ev.cc.EvalNegate(proj), a0 / self._n + b[-1])
    # gamma's error carries r2's (S1's 1 / (r2 n2) is a fresh encryption): flooded as if
    # |gamma| were the mask's bound B (a larger one the mask would not hide anyway)
    masked_gamma = self.flood(masked_gamma, secure_ducc.BLIND_LOG2_RANGE, REFRESH_MASK_BOUND)
    self._tick("coefficients", t)
    return masked_beta, masked_gamma

  # ------------------------------------------------------------------ 4. the update

  def combine(self, coefficients: Sequence[object], w_ct: List[object]) -> List[object]:
    """Eq. 17 chunk by chunk: w + sum_j Enc(beta_j + b_j) u_j + Enc(gamma + b) msum
    - (sum_j b_j u_j + b msum), one relinearisation per chunk."""
    t = secure_ducc.now()
    cc, vectors = self.vev.cc, self._delayed + [self._msum]
    b = self._state["coef_mask"]
    self.vev.check_levels(coefficients[0], vectors[0][0], what="sum_j beta_j u_j")
    out = []
    for ci, w_c in enumerate(w_ct):
      stopping.between_chunks()
      acc = None
      for coef, vec in zip(coefficients, vectors):
        p = cc.EvalMultNoRelin(coef, vec[ci])
        acc = p if acc is None else cc.EvalAdd(acc, p)
      unmask = cc.EvalLinearWSum([vec[ci] for vec in vectors], [float(x) for x in b])
      out.append(self.vev.add(w_c, self.vev.sub(cc.Relinearize(acc), unmask)))
    self._release()
    self._tick("combine", t)
    return out

  def _release(self):
    """The round's uploads are read for the last time: S0 drops them (memory)."""
    self._delayed, self._msum = [], None

  def online_only(self, alphas, w_ct: List[object]) -> List[object]:
    """No delayed upload: w + a0 msum / n (Eq. 17 with m1 = m2 = 0); no exchange."""
    t = secure_ducc.now()
    scale = float(alphas[0]) / self._n
    out = [self.vev.add(w, self.vev.mult_const(m, scale, what="Eq. 17: a0 m"))
           for w, m in zip(w_ct, self._msum)]
    self._release()
    self._tick("combine", t)
    return out

  # ------------------------------------------------------------------ 5. Alg. 5

  def kt_mask(self, w_ct: List[object]) -> List[object]:
    """Alg. 5 lines 2-5 in the vector context: Enc(w) + Enc_pk_s(r), r fresh (CSPRNG)."""
    slots = self.vev.slots
    r = csprng.uniform(-secure_ducc.KT_MASK_BOUND, secure_ducc.KT_MASK_BOUND,
                       len(w_ct) * slots).reshape(len(w_ct), slots)
    self._state = {"kt_r": r}
    cc, out = self.vev.cc, []
    for c, rb in zip(w_ct, r):
      stopping.between_chunks()
      # imaginary parts masked too (``secure_ducc.AggregationServer.kt_mask``)
      masked = cc.MakeCKKSPackedPlaintext(
          parallel.imaginary_mask(rb, secure_ducc.KT_MASK_BOUND))
      out.append(self.vev.add(c, cc.Encrypt(self.vector_public.pk_s, masked)))
    return out

  def kt_unmask(self, cts: List[object], recipient: Optional[int]) -> List[object]:
    """Alg. 5 lines 13-17 for one recipient: Enc_pk_i(w + r) - Enc_pk_i(r), a fresh
    encryption of r under the recipient's key for every chunk (each chunk's r encoded
    once, for every recipient), so that what client i receives shares no randomness with
    the ciphertext S1 produced (with r subtracted as a plaintext, S1 would read r off
    the difference of the two and so w: ``test_crypto_attacks``, the stripping test).
    ``recipient`` None: the next round's Enc_pk_s(w), which S0 keeps and S1 could
    decrypt anyway (it holds sk_s): r is subtracted as a plaintext there."""
    if "kt_r_encoded" not in self._state:
      self._state["kt_r_encoded"] = [self.vev.encode(rb) for rb in self._state.pop("kt_r")]
    cc, encoded = self.vev.cc, self._state["kt_r_encoded"]
    if recipient is None:
      return [cc.EvalSub(c, p) for c, p in zip(cts, encoded)]
    pk = self.vector_public.client_pks[recipient]
    out = []
    for c, p in zip(cts, encoded):
      stopping.between_chunks()
      out.append(cc.EvalSub(c, cc.Encrypt(pk, p)))
    return out


@dataclasses.dataclass
class StreamedProtocol(secure_ducc.SecureProtocol):
  """All entities of one deployment of the streamed design (``make_streamed_protocol``);
  a step's ``client_models`` hold only client 0's model (the one decrypted) unless
  ``keep_client_models`` (a deployment sends each away at once)."""

  keep_client_models: bool = True

  @property
  def cc(self):
    return self.s0.vector_public.cc


def make_streamed_protocol(num_clients: int, dim: int, preset: str = "secure",
                           min_depth: int = 10, recipients: Optional[Sequence[int]] = None,
                           min_scale: float = 1.0, log_size: int = 0,
                           ring_dim: Optional[int] = None,
                           max_delayed: int = 16, workers: int = 0,
                           backend: str = "process") -> StreamedProtocol:
  """The KDC's set-up (Alg. 3 line 1) for the streamed design: a vector context of depth
  ``VECTOR_DEPTH`` (clients' and S1's key pairs, S1's evaluation keys) and a scalar
  context of depth ``scalar_depth(min_depth)`` (S1's key pair and evaluation keys) whose
  ciphertexts hold ``max_delayed`` slots rounded up to a power of two (sparse packing:
  its slot sums need log2 of that many rotation keys, 145 MB each at N = 2^16).
  ``ring_dim`` overrides both contexts' ring (``preset`` must allow it). ``workers``,
  ``backend``: Alg. 5's worker pools (``parallel``; 1: in this process).

  Args:
    num_clients: K; each gets its own key pair.
    dim: the model size d.
    preset: the CKKS preset.
    min_depth: d, the Min's Cheon iterations.
    recipients: the clients the key transformation re-encrypts for (None: all).
    min_scale: c in (0, 4], the Min's input scale (``cheon.cheon_min``).
    log_size: S1 keeps its last ``log_size`` decryptions (tests).
    ring_dim: overrides both contexts' ring dimension.
    max_delayed: the most delayed uploads of a round (the scalar context's slots).
    workers: Alg. 5's pool size (0: auto, 1: in this process).
    backend: the pools' backend (``parallel.BACKENDS``).
  """
  pafed.check_ducc_scale(min_scale)
  workers, backend = parallel.check_workers(workers), parallel.check_backend(backend)
  d = int(min_depth)
  vcc = ckks.make_context(VECTOR_DEPTH, preset, ring_dim)
  slots = 2 ** max(1, math.ceil(math.log2(max(int(max_delayed), 2))))
  scc = ckks.make_context(scalar_depth(d), preset, ring_dim,
                          batch_size=min(slots, ckks.num_slots(vcc)))
  keys = []
  for cc in (vcc, scc):
    kp = cc.KeyGen()
    cc.EvalMultKeyGen(kp.secretKey)
    cc.EvalSumKeyGen(kp.secretKey)
    keys.append(kp)
  client_keys = [vcc.KeyGen() for _ in range(num_clients)]
  pks = tuple(k.publicKey for k in client_keys)
  s0 = StreamedAggregationServer(entities.PublicMaterial(vcc, keys[0].publicKey, pks, d),
                                 entities.PublicMaterial(scc, keys[1].publicKey, (), d))
  s0.min_scale = float(min_scale)
  s1 = StreamedHelper(entities.HelperServer(vcc, keys[0], pks),
                      entities.HelperServer(scc, keys[1], ()), log_size)
  clients = [entities.Client(i, vcc, keys[0].publicKey, k) for i, k in enumerate(client_keys)]
  rec = None if recipients is None else tuple(int(i) for i in recipients)
  return StreamedProtocol(s0, s1, clients, int(dim), d, ckks.get_preset(preset).name,
                          float(min_scale), rec, workers=workers, backend=backend)


def _ducc_exchanges(s0, s1, rec: stages_lib.Stages, w_ct, alphas, empty_class_tol: float,
                    k: int):
  """The streamed DUCC's round trips between S0 and S1 once every upload is in (inner
  products refreshed, the norm and the class totals inverted, the coefficients
  refreshed): S0's new Enc(w). S1's seconds go to ``rec``'s s1_refresh and division."""
  send = rec.send
  masked, norm = send("S0", "S1", s0.inner_products())
  with rec.timed("s1_refresh"):
    refreshed = send("S1", "S0", s1.refresh_inner_products(masked, norm))
  request = send("S0", "S1", s0.normalise(refreshed))
  with rec.timed("division"):
    inverse_norm = send("S1", "S0", s1.masked_inverse_sqrt(request))
  requests = s0.scalars_begin(inverse_norm, alphas, empty_class_tol)
  requests, tests = send("S0", "S1", (requests, s0.empty_tests))
  with rec.timed("division"):
    inverses = send("S1", "S0", s1.masked_inverse(requests, tests))
  masked_beta, masked_gamma, k = send("S0", "S1", s0.scalars_finish(inverses) + (k,))
  with rec.timed("s1_refresh"):
    coefficients = send("S1", "S0", s1.refresh_coefficients(masked_beta, masked_gamma, k))
  return s0.combine(coefficients, w_ct)


def _streamed_ducc(protocol: StreamedProtocol, rec: stages_lib.Stages, w_global, online,
                   delayed, alphas, empty_class_tol: float):
  """The uploads, one client at a time, then DUCC and Eq. 17: S0's Enc(w^{tau+1})."""
  s0, clients = protocol.s0, protocol.clients
  s0.start_round()
  rec.add("client_encrypt", 0.0)
  for stage in ("s1_refresh", "division"):  # S1's part of the breakdown, 0 without it
    rec.add(stage, 0.0)
  for i, (u, is_online) in enumerate([(u, True) for u in online] +
                                     [(u, False) for u in delayed]):
    with rec.timed("client_encrypt"):
      cts = clients[i % len(clients)].encrypt_update(u)
    with rec.timed("ducc"):
      s0.receive(rec.send("clients", "S0", cts), is_online)
  with rec.timed("ducc"):
    w_ct = s0.start_model(w_global)
    if len(online) == 0:  # m = 0: s = 1/2, both classes empty (plaintext reference)
      return list(w_ct)
    if len(delayed) == 0:
      return s0.online_only(alphas, w_ct)
    return _ducc_exchanges(s0, protocol.s1, rec, w_ct, alphas, empty_class_tol,
                           len(delayed))


def streamed_pafed_step(protocol: StreamedProtocol, w_global: Optional[np.ndarray],
                        online_uploads, delayed_uploads, alphas=(1.0, 1.0, 1.0),
                        empty_class_tol: float = 0.0) -> stages_lib.StepResult:
  """One PAFed server round in the streamed design, as ``secure_ducc.secure_pafed_step``
  (same arguments, a ``stages.StepResult`` with the same timings keys; its breakdown has
  ``server_wall_s``, the round's wall time but the clients'): each client's upload is
  encrypted and handed to S0 one at a time, so S0 never holds the online ones together.

  Args:
    protocol: the ``StreamedProtocol``.
    w_global: w^tau in the clear (None: S0's Enc_pk_s(w) from the previous round).
    online_uploads: [n, d] the online clients' unit updates.
    delayed_uploads: [k, d] the delayed ones' that arrived this round.
    alphas: Eq. 17's (alpha0, alpha1, alpha2).
    empty_class_tol: a class of total weight at most this is empty (``pafed.ducc``).
  """
  s0, s1, dim = protocol.s0, protocol.s1, protocol.dim
  online = np.asarray(online_uploads, np.float64).reshape(-1, dim)
  delayed = np.asarray(delayed_uploads, np.float64).reshape(-1, dim)
  rec = stages_lib.Stages(protocol.wire, secure_ducc.now, server_wall=True)
  send = rec.send
  new_ct = _streamed_ducc(protocol, rec, w_global, online, delayed, alphas, empty_class_tol)
  with rec.timed("key_transform"):
    out = secure_ducc.pooled_key_transform(protocol, rec, new_ct, s0.vev.slots,
                                           plain_for_s=True,
                                           keep_all=protocol.keep_client_models)
    if out is None:
      out = {}
      masked = send("S0", "S1", s0.kt_mask(new_ct))
      for i, cts in s1.key_transform_each(masked, secure_ducc.recipients_of(protocol)):
        cts = s0.kt_unmask(send("S1", "S0", cts), i)
        if i is None:  # kept by S0 for the next round
          s0.global_ct = cts
          continue
        keep = protocol.keep_client_models or i == 0
        cts = send("S0", "clients", cts, deliver=keep)  # sent to client i
        if keep:
          out[i] = cts
  with rec.timed("decrypt"):
    new_w = protocol.clients[0].decrypt_model(out[0], dim)
  return rec.result(new_w, s0.timings, out)
