"""Encrypted DUCC (PAFed Alg. 4), Eq. 17 and the key transformation (Alg. 5) over CKKS.

``AggregationServer`` (S0) holds only ``PublicMaterial`` (context + evaluation keys for
sk_s + public keys). It never holds a secret key nor a reference to S1: the two divisions
of Alg. 4 line 11 / Eq. 12 and the key transformation are message exchanges that the
orchestrator (``secure_pafed_step``) ferries between S0 and S1, so S0's work is split in
phases (``ducc_norm`` -> S1 ``masked_inverse_sqrt`` -> ``ducc_begin`` -> S1
``masked_inverse`` -> ``ducc_finish`` -> ``kt_mask`` -> S1 ``key_transform`` ->
``kt_unmask``). The first exchange gives S0 Enc(1 / ||m||): the paper normalises the
online mean m before the Min (Sec. V-A: "We first normalize ..."); the second also
carries the empty-class tests (``empty_class_test``).

Randomness: every mask and blind is fresh from ``csprng`` (os.urandom), never from the
experiment's seed; each cancels exactly, so results stay reproducible.

Data layout: a [d] vector is ceil(d / (N/2)) ciphertexts of N/2 slots. Scalars derived
from vectors (inner products, class totals) are *replicated* in every slot by EvalSum.
All k delayed inner products are packed into ONE ciphertext (slot j = client j) so that
Cheon's Min (Alg. 1) runs once for every delayed client at the same time.

Constants are folded into plaintext masks wherever a mask multiplication happens anyway
(1/n of the mean, 1/4 and 1/sqrt 2 of Alg. 1's y, the blinding factors r and the alphas
of Eq. 17), so the total depth is 2d + 8 (``ckks.ducc_depth``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async.algorithms import pafed
from fedjax_async.crypto import cheon
from fedjax_async.crypto import ckks
from fedjax_async.crypto import csprng
from fedjax_async.crypto import entities
from fedjax_async.crypto import parallel
from fedjax_async.crypto import stages as stages_lib
from fedjax_async.crypto import stopping

SQRT2 = math.sqrt(2.0)
# Multiplicative blinds r = +-2^u of the masked inverse and of the empty-class test, u
# uniform on [-R, R] (csprng.blind); R is bounded by CKKS precision (docs/crypto.md).
BLIND_LOG2_RANGE = 8.0
# Additive key-transformation mask r: uniform in [-B, B] per coordinate (Alg. 5 line 2).
KT_MASK_BOUND = 1024.0
# A class whose |total| is at most max(empty_class_tol, EMPTY_EPS) counts as empty.
EMPTY_EPS = 1e-6
# rho of S0's noise flood (``AggregationServer.flood``): its standard deviation per slot
# over the largest spread S1 could otherwise see (blind range x ckks.error_bound); 0: no
# flood (the tests' plant). docs/crypto.md, "Noise flooding".
FLOOD_RATIO = 64.0
# The standard deviation of the mean of the flood's imaginary parts, over sigma (the
# flood's per-slot one): a fresh Gaussian per message, so that S1's imaginary mean is the
# flood's and not the blind times the value's own CKKS error (its real mean, the value,
# stays exact); 0: an imaginary mean of zero (the tests' plant). docs/crypto.md, "Noise
# flooding".
FLOOD_IMAG_MEAN = 1.0
# Clock of the timings. OpenFHE runs single-threaded here (OMP_NUM_THREADS=1), so
# benchmarks on a shared machine may set ``time.process_time`` (CPU seconds of this
# process, i.e. the uncontended wall time) instead of wall-clock time.
CLOCK = time.perf_counter


def now():
  """The timings' clock (``CLOCK``, read at each call)."""
  return CLOCK()


class AggregationServer(parallel.PoolHolder):
  """S0: the encrypted DUCC (Alg. 4), Eq. 17 and its half of Alg. 5. No secret keys; its
  own Alg. 5 pool (``worker_pool``)."""

  PARTY = "S0"

  def __init__(self, public: entities.PublicMaterial):
    self.public = public
    self.ev = ckks.Evaluator(public.cc)
    self.min_iterations = public.min_iterations
    self.min_scale = 1.0  # c of ``cheon.cheon_min``: the Min's input y scaled by c
    self.timings: Dict[str, float] = {}
    self.global_ct: Optional[List[object]] = None  # Enc_pk_s(w) carried to the next round
    self._state: Dict[str, object] = {}

  # ------------------------------------------------------------------ helpers

  def _tick(self, key, t0):
    self.timings[key] = self.timings.get(key, 0.0) + now() - t0
    return now()

  @staticmethod
  def _blind(signed: bool = True) -> float:
    """A fresh blind +-2^u from the OS's CSPRNG (never from the experiment's seed)."""
    return csprng.blind(BLIND_LOG2_RANGE, signed)

  def flood(self, ct, blind_log2: float, magnitude: float, ev=None, pk=None):
    """``ct`` + Enc_pk(f) before S1 decrypts it: noise flooding of a value replicated in
    every slot (an EvalSum). S1's decryption of a blinded b (x + e) holds b e, the
    blinded value's own CKKS error, in every direction of its slots but the real parts'
    mean (the value): as the slot-to-slot spread of the real and the imaginary parts
    (OpenFHE's decoder estimates the error, ``GetLogError``, from the latter) and as the
    imaginary parts' mean b Im(e), where e is the same for a class's total and its two
    tests (each value's real mean over its imaginary mean cancels its blind). f is fresh
    Gaussian noise (``csprng.normal``), independent of the blind, with standard deviation
    sigma = FLOOD_RATIO x 2^blind_log2 x ``ckks.error_bound(magnitude)`` per slot in its
    real and its imaginary part, and an imaginary mean of its own, Gaussian of standard
    deviation FLOOD_IMAG_MEAN x sigma: every direction but the value's carries f's noise
    of at least sigma, whatever the blind. f's real parts sum to zero over the slots and
    S1 reads their mean (``entities.replicated_value``): the value it reads is unchanged.
    One encryption, no level. ``ev``, ``pk``: the context's evaluator and pk_s (default:
    this server's).

    Args:
      ct: the ciphertext S1 will decrypt, a value replicated in every slot.
      blind_log2: log2 of the largest blind on the value.
      magnitude: the bound on the values it is computed from (``ckks.error_bound``).
      ev: the context's evaluator (None: this server's).
      pk: the context's pk_s (None: this server's).
    """
    if FLOOD_RATIO <= 0.0:
      return ct
    ev, pk = ev or self.ev, pk or self.public.pk_s
    sigma = FLOOD_RATIO * 2.0 ** blind_log2 * ckks.error_bound(ev.cc, magnitude)
    re, im = sigma * csprng.normal(ev.slots), sigma * csprng.normal(ev.slots)
    mean = FLOOD_IMAG_MEAN * sigma * float(csprng.normal(1)[0])
    f = (re - re.mean()) + 1j * (im - im.mean() + mean)
    return ev.add(ct, ev.cc.Encrypt(pk, ev.cc.MakeCKKSPackedPlaintext(f)))

  def worker_material(self) -> Dict[str, object]:
    """S0's public material serialised for its own Alg. 5 workers
    (``parallel.party_material``)."""
    pub = self.public
    return parallel.party_material(pub.cc, pub.pk_s, pub.client_pks)

  def check_depth(self):
    """Raise ``DepthError`` unless the context can hold 2d + 8 levels (Alg. 4 + Eq. 17)."""
    need = ckks.ducc_depth(self.min_iterations)
    if self.ev.depth < need:
      parts = ", ".join(f"{k}={v}" for k, v in
                        ckks.ducc_depth_breakdown(self.min_iterations).items())
      raise ckks.DepthError(
          f"encrypted DUCC with Min d={self.min_iterations} needs multiplicative depth "
          f"{need} ({parts}) but the CKKS context has depth {self.ev.depth}")

  def encrypt_global(self, w: np.ndarray) -> List[object]:
    """Enc_pk_s(w) (S0 initialises w^0 in Alg. 3 line 2; public-key encryption)."""
    return [self.ev.encrypt(self.public.pk_s, b) for b in ckks.chunk(w, self.ev.slots)]

  def start_model(self, w_global: Optional[np.ndarray]) -> List[object]:
    """Enc_pk_s(w) for the round: ``w_global`` encrypted (the first round, or a resumed
    run), or with None the Enc_pk_s(w) the last key transformation carried over."""
    if w_global is not None:
      return self.encrypt_global(np.asarray(w_global, np.float64))
    if self.global_ct is None:
      raise ValueError("no encrypted global model carried over; pass w_global")
    return self.global_ct

  def _dot_replicated(self, xs, ys, what):
    """Enc(x . y) in every slot: chunk-wise products, added, then EvalSum."""
    prods = []
    for x, y in zip(xs, ys):
      stopping.between_chunks()
      prods.append(self.ev.mult(x, y, what=what))
    return self.ev.eval_sum(self.ev.add_many(prods))

  # ------------------------------------------------------------------ Alg. 4

  def ducc_norm(self, online: Sequence[List[object]], num_delayed: int) -> List[object]:
    """The blinded squared norm of the online sum for S1: [Enc(r0^2 ||sum_i u_i||^2)]
    (empty when no delayed update needs the Min). S1 returns Enc(1 / (r0 ||sum||)),
    which ``ducc_begin`` turns into the normalised inner products m . u_j / ||m||."""
    self.timings = {}
    self._norm_blind = None
    if not online or num_delayed == 0:
      return []
    t = now()
    msum = [self.ev.add_many([u[c] for u in online]) for c in range(len(online[0]))]
    r0 = self._blind(signed=False)  # S1 takes a square root of r0^2 ||msum||^2
    self._norm_blind = r0
    scaled = [self.ev.mult_const(x, r0 * r0, what="r0^2 m") for x in msum]
    # ||msum|| <= n; r0^2 spans 2^(2R)
    out = [self.flood(self._dot_replicated(msum, scaled, "||m||^2 for the normalisation"),
                      2 * BLIND_LOG2_RANGE, len(online) ** 2)]
    self._tick("normalise", t)
    return out

  def ducc_begin(self, online: Sequence[List[object]], delayed: Sequence[List[object]],
                 alphas: Tuple[float, float, float],
                 empty_class_tol: float = 0.0,
                 inverse_norm: Sequence[object] = ()) -> List[object]:
    """Alg. 4 lines 3-10 (+ the numerators of line 11 and Eq. 12).

    ``inverse_norm``: S1's answer to ``ducc_norm`` ([Enc(1 / (r0 ||sum||))]; needed when
    there are online and delayed updates). Returns the blinded denominators
    [Enc(r1 n1), Enc(r2 n2), Enc(r3 ||m||^2)] for S1 (empty when no division is needed);
    ``self.empty_tests`` holds the empty-class tests that go with them
    (``empty_class_test``; ``pafed.ducc``'s ``empty_class_tol``).

    Args:
      online: each online upload's ciphertexts (one per chunk).
      delayed: each delayed upload's ciphertexts.
      alphas: Eq. 17's (alpha0, alpha1, alpha2).
      empty_class_tol: a class of total weight at most this is empty.
      inverse_norm: S1's answer to ``ducc_norm``.
    """
    self.empty_tests = []
    self.check_depth()
    a0, a1, a2 = (float(a) for a in alphas)
    n, k = len(online), len(delayed)
    st = self._state = {"n": n, "k": k}
    t = now()
    if n == 0:  # m = 0: s_j = 1/2, both classes have zero weight (plaintext reference).
      return []
    if k > 0 and (not inverse_norm or self._norm_blind is None):
      raise ValueError("ducc_begin: the delayed updates' Min needs S1's answer to "
                       "ducc_norm (inverse_norm)")
    msum = [self.ev.add_many([u[c] for u in online]) for c in range(len(online[0]))]
    st["m_term"] = [self.ev.mult_const(c, a0 / n, what="Eq. 17: alpha0 * m") for c in msum]
    if k == 0:
      return []
    slots = self.ev.slots
    if k > slots:
      raise ValueError(f"{k} delayed uploads exceed the {slots} slots of one ciphertext")
    # Alg. 4 line 5: msum . u_j; normalised below (m / ||m|| = msum / ||msum||).
    ips = [self._dot_replicated(msum, u, "inner product m . u_j") for u in delayed]
    t = self._tick("inner_products", t)
    c = self.min_scale
    w1, w2 = self._class_weights(ips, inverse_norm[0])
    t = self._tick("min", t)
    r1, r2, r3 = self._blind(), self._blind(), self._blind()
    valid = np.zeros(slots)
    valid[:k] = 1.0
    acc, tol = {}, max(float(empty_class_tol), EMPTY_EPS)
    for name, w, r, a in (("1", w1, r1, a1), ("2", w2, r2, a2)):
      # Broadcast slot j of w to all slots (times r * alpha), then Alg. 4 lines 5 / 7.
      wj = [self.ev.eval_sum(self.ev.mult_plain(w, ckks.one_hot(slots, j, r * a / c),
                                                what="broadcast class weight"))
            for j in range(k)]
      acc[name] = []
      for ci in range(len(msum)):
        stopping.between_chunks()
        acc[name].append(self.ev.add_many([self.ev.mult(wj[j], delayed[j][ci],
                                                        what="class weight * u_j")
                                           for j in range(k)]))
      # Alg. 4 lines 6 / 8: the class totals n1, n2, blinded by r.
      st["v" + name] = self.ev.eval_sum(self.ev.mult_plain(w, (r / c) * valid,
                                                           what="class total"))
      tests, st["sigma" + name] = self.empty_class_test(w, valid / c, tol)
      self.empty_tests += tests
    st["A1"], st["A2"] = acc["1"], acc["2"]
    t = self._tick("weighting", t)
    # Eq. 12 numerator and the blinded ||m||^2: with c = (r3 / n^2) msum,
    # r3 ||m||^2 = msum . c, and (m2 . m / ||m||^2) m = (A2 . msum) / (n2 ||msum||^2) msum.
    st["c"] = [self.ev.mult_const(x, r3 / (n * n), what="Eq. 12: r3 m / n") for x in msum]
    st["v3"] = self._dot_replicated(msum, st["c"], "Eq. 12: ||m||^2")
    st["P"] = self._dot_replicated(st["A2"], msum, "Eq. 12: m2 . m")
    self._tick("projection", t)
    # |n1|, |n2| <= k / 2 from weights computed at scale c; ||m||^2 <= 1
    bound = k * max(1.0, 1.0 / c)
    return self._swap_classes([self.flood(v, BLIND_LOG2_RANGE, m) for v, m in
                               ((st["v1"], bound), (st["v2"], bound), (st["v3"], 1.0))])

  def _class_weights(self, ips: Sequence[object], inverse_norm) -> Tuple[object, object]:
    """(Enc(c w1), Enc(c w2)), the delayed updates' class weights packed in slots 0..k-1
    (Eq. 13 with Alg. 1's Min), from the inner products m . u_j and S1's
    Enc(1 / (r0 ||msum||))."""
    slots, c = self.ev.slots, self.min_scale
    # Pack all z_j = c (m . u_j)/(4 sqrt 2 ||m||) = c y_j / sqrt 2 into one ciphertext:
    # r0 and the input scale c folded into the packing mask, times S1's
    # Enc(1 / (r0 ||msum||)).
    z = self.ev.add_many([
        self.ev.mult_plain(ip, ckks.one_hot(slots, j, c * self._norm_blind / (4.0 * SQRT2)),
                           what="packing inner products") for j, ip in enumerate(ips)])
    z = self.ev.mult(z, inverse_norm, what="normalise: times 1 / ||m||")
    y = self.ev.mult_const(z, SQRT2, what="Alg. 1: y")
    # Eq. 13 with Alg. 1: Min(s, 1/2) = x - m_d, s = 2y + 1/2, x = y + 1/2, so
    # w1 = s - Min = y + m_d and w2 = Min - 1/2 = y - m_d, m_d = 2 M_d. With the scale c
    # these are c w1 and c w2 (m_d ~ |c y|); the 1/c rides on the masks below.
    half_m = cheon.he_half_abs_from_z(self.ev, z, self.min_iterations)
    m_d = self.ev.add(half_m, half_m)
    return self.ev.add(y, m_d), self.ev.sub(y, m_d)

  def empty_class_test(self, w, total_mask: np.ndarray, tol: float):
    """The class is empty when |n| <= tol, n = EvalSum(w * total_mask): two linear tests
    for S1, Enc(sigma_a s_a (n - tol)) and Enc(sigma_b s_b (-n - tol)), and (sigma_a,
    sigma_b). The class is not empty exactly when one of sigma_a, sigma_b times its value
    is > 0. s_a, s_b are blinds independent of each other and of the total's r (so S1
    cannot cancel one against another), sigma = +-1 hides which sign means what.
    1 level each, off the critical path. (A single squared test s^2 (n^2 - tol^2) falls
    below CKKS noise for small s and tol: s = 2^-8, tol = 2e-3 give 1e-10.)
    The two tests go out in a random order (a fresh coin; the sigmas are returned in
    the order sent), so that S1 cannot tell |n - tol| from |n + tol|, i.e. the sign of
    n, from their positions; "empty" is "neither test positive under its sigma", which
    does not depend on the order."""
    tests, sigmas = [], []
    # |n| + tol: k weights, each at most 1/2 of the mask's 1 / c
    bound = max(np.count_nonzero(total_mask), float(np.sum(np.abs(total_mask)))) + tol
    for side in (1.0, -1.0):
      s, sigma = self._blind(signed=False), float(csprng.signs(1)[0])
      sn = self.ev.eval_sum(self.ev.mult_plain(w, s * sigma * side * total_mask,
                                               what="empty-class test"))
      tests.append(self.flood(self.ev.add_const(sn, -sigma * s * tol), BLIND_LOG2_RANGE,
                              bound))
      sigmas.append(sigma)
    if csprng.signs(1)[0] < 0:
      tests, sigmas = tests[::-1], sigmas[::-1]
    return tests, tuple(sigmas)

  def _swap_classes(self, requests: List[object]) -> List[object]:
    """The two classes' blinded totals (and their tests, ``empty_tests``) in a random
    order (a fresh coin, kept in the round's state): with one delayed update one class
    total is large and the other is the Min's residue, and which class is which is the
    update's conflict bit. n1 for cosine c and -n2 for -c are equal (m_d depends on y^2
    only), so with the classes' order and the tests' order random S1's view is the same
    for c and -c (docs/crypto.md, "Leakage")."""
    swap = bool(csprng.signs(1)[0] < 0)
    self._state["swap"] = swap
    if swap:
      requests = [requests[1], requests[0]] + list(requests[2:])
      self.empty_tests = self.empty_tests[2:4] + self.empty_tests[0:2]
    return requests

  def _unswap_classes(self, inverses: Sequence[object]) -> List[object]:
    """S1's answers back in class order (1, 2, ...)."""
    inverses = list(inverses)
    if self._state.pop("swap"):
      inverses = [inverses[1], inverses[0]] + inverses[2:]
    return inverses

  def _class_factor(self, answer, sigmas):
    """Enc(1 / (r n)) if the class is not empty, else Enc(0), from S1's four members
    (``HelperServer.masked_inverse``; member 2 pa + pb holds 1 / (r n), pa / pb = test a /
    b was positive, the others Enc(0)): the sum of the members whose (pa, pb) means
    "n > tol or -n > tol" under S0's signs. Additions only: no level, and no ciphertext
    product (a huge 1 / (r n) times an Enc(0) indicator would amplify CKKS noise)."""
    sa, sb = sigmas
    keep = [answer[2 * pa + pb] for pa in (0, 1) for pb in (0, 1)
            if (pa if sa > 0 else 1 - pa) or (pb if sb > 0 else 1 - pb)]
    return self.ev.add_many(keep)

  def ducc_finish(self, inverses: Sequence[object], w_ct: List[object]) -> List[object]:
    """Alg. 4 lines 11-12 and Eq. 17 on Enc_pk_s(w): returns Enc_pk_s(w^{tau+1}).

    ``inverses``: S1's answers to ``ducc_begin``'s denominators and ``empty_tests``
    (``HelperServer.masked_inverse``: four members per tested class, then
    1 / (r3 ||m||^2))."""
    st = self._state
    t = now()
    if st["n"] == 0:
      return list(w_ct)
    terms = [st["m_term"]]
    if st["k"] > 0:
      inverses = self._unswap_classes(inverses)
      inv1 = self._class_factor(inverses[0], st["sigma1"])
      inv2 = self._class_factor(inverses[1], st["sigma2"])
      inv3 = inverses[2]
      # Alg. 4 line 11: m1 = A1 / n1, m2 = A2 / n2 (r and alpha cancel / stay).
      terms.append([self.ev.mult(a, inv1, what="Alg. 4 line 11: m1 / n1") for a in st["A1"]])
      terms.append([self.ev.mult(a, inv2, what="Alg. 4 line 11: m2 / n2") for a in st["A2"]])
      t = self._tick("division", t)
      inv23 = self.ev.mult(inv2, inv3, what="Eq. 12: 1 / (n2 ||m||^2)")
      coef = self.ev.mult(st["P"], inv23, what="Eq. 12: coefficient")
      proj = [self.ev.mult(coef, c, what="Eq. 12: coefficient * m") for c in st["c"]]
      terms.append([self.ev.cc.EvalNegate(p) for p in proj])
      t = self._tick("projection", t)
    # Eq. 17: w + alpha0 m + alpha1 m1 + alpha2 m2 (alphas already folded in).
    new_w = [self.ev.add_many([w_ct[c]] + [term[c] for term in terms])
             for c in range(len(w_ct))]
    self._tick("eq17", t)
    self._state = {}
    return new_w

  # ------------------------------------------------------------------ Alg. 5

  def kt_mask(self, w_ct: List[object]) -> List[object]:
    """Alg. 5 lines 2-5: Enc(w) + Enc_pk_s(r) with a fresh uniform mask r (CSPRNG).

    r covers every slot: the slots past the model (zero in w) get values of their own,
    independent of the model's, so S1 reads no known-plaintext slot; and the imaginary
    parts, where S1 would read w's CKKS error (that of the round's class weights times
    the delayed updates), get a fresh mask on the same range
    (``parallel.imaginary_mask``), which ``kt_unmask`` need not remove: S1 re-encrypts
    the real parts only."""
    r = csprng.uniform(-KT_MASK_BOUND, KT_MASK_BOUND, len(w_ct) * self.ev.slots)
    self._state = {"kt_r": list(r.reshape(len(w_ct), self.ev.slots))}
    cc, out = self.ev.cc, []
    for c, rb in zip(w_ct, self._state["kt_r"]):
      stopping.between_chunks()
      masked = cc.MakeCKKSPackedPlaintext(parallel.imaginary_mask(rb, KT_MASK_BOUND))
      out.append(self.ev.add(c, cc.Encrypt(self.public.pk_s, masked)))
    return out

  def kt_unmask(self, per_client: Dict[int, List[object]], under_s: List[object]):
    """Alg. 5 lines 13-17: Enc_pk_i(w + r) - Enc_pk_i(r) per client (and under pk_s)."""
    rs = self._state.pop("kt_r")
    pks = self.public.client_pks

    def unmask(cts, pk):
      out = []
      for c, rb in zip(cts, rs):
        stopping.between_chunks()
        out.append(self.ev.sub(c, self.ev.encrypt(pk, rb)))
      return out

    out = {i: unmask(cts, pks[i]) for i, cts in per_client.items()}
    self.global_ct = unmask(under_s, self.public.pk_s)
    return out


# ---------------------------------------------------------------------- protocol


@dataclasses.dataclass
class SecureProtocol:
  """All entities of one PAFed deployment (one process, separate key material)."""

  s0: AggregationServer
  s1: entities.HelperServer
  clients: List[entities.Client]
  dim: int
  min_iterations: int
  preset: str
  min_scale: float = 1.0  # the Min's input scale c (``make_protocol``)
  recipients: Optional[Tuple[int, ...]] = None  # None: every client (Alg. 5 line 8)
  # A ``wire.Wire``: the round's messages carried as bytes and counted per (sender,
  # receiver) (None: passed as objects).
  wire: Optional[object] = None
  # Alg. 5's per-chunk work in S0's and S1's worker pools (``parallel``): 0 the machine's
  # cores for a model of ``parallel.AUTO_MIN_CHUNKS`` chunks or more, 1 in this process.
  workers: int = 0
  backend: str = "process"  # or "ray" (S0's workers; S1's stay processes)

  @property
  def cc(self):
    return self.s0.public.cc

  def key_transform_pools(self, workers: int):
    """(S0's pool, S1's pool) of ``workers`` each: each party starts its own on first use
    and keeps it (``parallel.PoolHolder``); the protocol only ferries between them."""
    return (self.s0.worker_pool(workers, self.backend),
            self.s1.worker_pool(workers, self.backend))

  def close(self):
    """Stops each party's worker pool (if any)."""
    self.s0.close_pool()
    self.s1.close_pool()


def make_protocol(num_clients: int, dim: int, preset: str = "secure", min_depth: int = 10,
                  ring_dim: Optional[int] = None, depth: Optional[int] = None,
                  recipients: Optional[Sequence[int]] = None, min_scale: float = 1.0,
                  log_size: int = 0, batch_size: Optional[int] = None, workers: int = 0,
                  backend: str = "process") -> SecureProtocol:
  """KDC setup (Alg. 3 line 1) sized for DUCC with ``min_depth`` Cheon iterations.

  Args:
    num_clients: K; each gets its own key pair.
    dim: model size d (chunked into ceil(d / (N/2)) ciphertexts).
    preset: "secure" (128-bit, HEStd_128_classic) or "insecure_test" (tests only).
    min_depth: d, the number of iterations of Alg. 1.
    ring_dim: override the preset's ring dimension.
    depth: override the context depth (default ``ckks.ducc_depth(min_depth)`` = 2d + 8).
    recipients: clients the key transformation re-encrypts for (default: all).
    min_scale: c in (0, 4], the Min's input y = cos / 4 scaled by c (``cheon.cheon_min``):
      1 is Alg. 1 as printed; 4 feeds Wilkes' iteration its whole range [0, 1] at no
      extra depth (a quarter of the error).
    log_size: S1 keeps its last ``log_size`` decryptions in ``decryption_log`` (tests).
    batch_size: slots per ciphertext, a power of two <= N/2 (default N/2; fewer make
      each slot sum cheaper and the model more ciphertexts).
    workers, backend: Alg. 5's worker pools (``parallel``; 1: in this process).

  S0's masks and blinds come from the OS's CSPRNG (``csprng``), never from a seed.
  """
  pafed.check_ducc_scale(min_scale)
  workers, backend = parallel.check_workers(workers), parallel.check_backend(backend)
  depth = ckks.ducc_depth(min_depth) if depth is None else int(depth)
  kdc = entities.KDC(num_clients, depth, min_depth, preset, ring_dim, log_size, batch_size)
  s0 = AggregationServer(kdc.public)
  s0.min_scale = float(min_scale)
  rec = None if recipients is None else tuple(int(i) for i in recipients)
  return SecureProtocol(s0, kdc.helper, kdc.clients, int(dim), int(min_depth),
                        ckks.get_preset(preset).name, float(min_scale), rec,
                        workers=workers, backend=backend)


RESUME_NOTE = ("client 0, which decrypted w^{t} after round {t}'s key transformation, "
               "encrypts it under the new keys' pk_s and sends it to S0: S0 starts from "
               "Enc(w^{t}) and never holds it in the clear (the checkpoint is the "
               "simulator's: it stores w^{t} as the clients hold it)")


def model_from_client(protocol: SecureProtocol, w: np.ndarray, client: int = 0):
  """A resumed run's Enc_pk_s(w) for S0 (both designs): client ``client``, which holds w
  after decrypting the last key transformation's output, encrypts it under pk_s of the
  protocol's (new) keys and sends it to S0, which carries it as it carries Alg. 5's
  Enc_pk_s(w): the next step runs with ``w_global=None``. S0 never holds w in the clear
  (only at the first round, whose w^0 it initialises, Alg. 3 line 2)."""
  cts = protocol.clients[client].encrypt_update(np.asarray(w, np.float64))
  wire = protocol.wire
  protocol.s0.global_ct = cts if wire is None else wire.send("clients", "S0", cts)


def _encrypt_uploads(protocol: SecureProtocol, uploads: np.ndarray, offset: int):
  cl = protocol.clients
  return [cl[(offset + i) % len(cl)].encrypt_update(u) for i, u in enumerate(uploads)]


def recipients_of(protocol) -> Tuple[int, ...]:
  """The key transformation's recipients: ``protocol.recipients`` (None: every client),
  client 0 always among them (it decrypts the round's model)."""
  recipients = protocol.recipients
  if recipients is None:
    recipients = tuple(range(len(protocol.clients)))
  return recipients if 0 in recipients else (0,) + tuple(recipients)


def pooled_key_transform(protocol: SecureProtocol, stages: stages_lib.Stages,
                         new_ct: List[object], slots: int, plain_for_s: bool,
                         keep_all: bool = True) -> Optional[Dict[int, List[object]]]:
  """Alg. 5 per chunk on S0's and S1's pools (``parallel.key_transform``), the messages
  counted on ``stages``' wire: the recipients' models (client 0's always; the others'
  if ``keep_all``), S0 keeping the pk_s copy and ``workers_cpu_s`` noted. None where
  ``protocol.workers`` resolves to 1 for ``new_ct``'s chunks (the step's own Alg. 5).

  Args:
    protocol: the protocol (its parties, pools and recipients).
    stages: the round's ``stages.Stages``.
    new_ct: S0's Enc_pk_s(w^{tau+1}), one ciphertext per chunk.
    slots: the slots per ciphertext.
    plain_for_s: r subtracted from the pk_s copy as a plaintext (else a fresh Enc_pk_s(r)).
    keep_all: keep every recipient's model (else client 0's only).
  """
  workers = parallel.resolve_workers(protocol.workers, len(new_ct))
  if workers <= 1:
    return None
  recipients = recipients_of(protocol)
  out, protocol.s0.global_ct, cpu = parallel.key_transform(
      *protocol.key_transform_pools(workers), new_ct, recipients,
      [keep_all or i == 0 for i in recipients], slots, KT_MASK_BOUND,
      plain_for_s=plain_for_s, wire=stages.wire)
  stages.note("workers_cpu_s", sum(cpu.values()))
  return out


def _ducc(protocol: SecureProtocol, rec: stages_lib.Stages, w_global, online, delayed,
          alphas, empty_class_tol: float):
  """Alg. 4 and Eq. 17's messages: the uploads to S0, its exchanges with S1 (normalisation,
  masked inverses); S0's Enc(w^{tau+1})."""
  s0, s1, send = protocol.s0, protocol.s1, rec.send
  with rec.timed("client_encrypt"):
    on_cts = _encrypt_uploads(protocol, online, 0)
    de_cts = _encrypt_uploads(protocol, delayed, len(online))
  with rec.timed("ducc"):
    on_cts = [send("clients", "S0", c) for c in on_cts]  # one message per client
    de_cts = [send("clients", "S0", c) for c in de_cts]
    w_ct = s0.start_model(w_global)
    norm_request = send("S0", "S1", s0.ducc_norm(on_cts, len(de_cts)))
    with rec.timed(*(("normalise",) if norm_request else ())):
      inverse_norm = send("S1", "S0", s1.masked_inverse_sqrt(norm_request) if norm_request
                          else [])
    requests = s0.ducc_begin(on_cts, de_cts, alphas, empty_class_tol, inverse_norm)
    with rec.timed("division"):
      if requests:
        requests, tests = send("S0", "S1", (requests, s0.empty_tests))
        inverses = send("S1", "S0", s1.masked_inverse(requests, tests))
      else:
        inverses = []
    return s0.ducc_finish(inverses, w_ct)


def secure_pafed_step(protocol: SecureProtocol, w_global: Optional[np.ndarray],
                      online_uploads: np.ndarray, delayed_uploads: np.ndarray,
                      alphas=(1.0, 1.0, 1.0),
                      empty_class_tol: float = 0.0) -> stages_lib.StepResult:
  """One PAFed server round under CKKS (Alg. 3 lines 9-14): a ``stages.StepResult``.

  Its ``w`` is w^{tau+1} as client 0 decrypts it with its own sk_0 after the key
  transformation; ``timings`` has ``stages.STAGES`` (seconds), ``breakdown`` DUCC's
  stages too, ``client_models`` every recipient's Enc_pk_i(w^{tau+1}).
  ``w_global=None`` continues from the Enc_pk_s(w) carried over from the previous round.
  ``empty_class_tol``: as in ``pafed.ducc`` (0: only an exactly empty class is empty).

  Args:
    protocol: the ``SecureProtocol`` (its parties, keys and wire).
    w_global: w^tau in the clear (None: S0's Enc_pk_s(w) from the previous round).
    online_uploads: [n, d] the online clients' unit updates.
    delayed_uploads: [k, d] the delayed ones' that arrived this round.
    alphas: Eq. 17's (alpha0, alpha1, alpha2).
    empty_class_tol: a class of total weight at most this is empty (``pafed.ducc``).
  """
  s0, s1, dim = protocol.s0, protocol.s1, protocol.dim
  online = np.asarray(online_uploads, np.float64).reshape(-1, dim)
  delayed = np.asarray(delayed_uploads, np.float64).reshape(-1, dim)
  rec = stages_lib.Stages(protocol.wire, now)
  send = rec.send
  new_ct = _ducc(protocol, rec, w_global, online, delayed, alphas, empty_class_tol)
  with rec.timed("key_transform"):
    out = pooled_key_transform(protocol, rec, new_ct, s0.ev.slots, plain_for_s=False)
    if out is None:
      masked = send("S0", "S1", s0.kt_mask(new_ct))
      per_client, under_s = send("S1", "S0", s1.key_transform(masked, recipients_of(protocol)))
      out = s0.kt_unmask(per_client, under_s)
      out = {i: send("S0", "clients", cts) for i, cts in out.items()}
  with rec.timed("decrypt"):
    new_w = protocol.clients[0].decrypt_model(out[0], dim)
  return rec.result(new_w, s0.timings, out)
