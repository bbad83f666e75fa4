"""The entities of PAFed (Alg. 3 line 1, Fig. 4): KDC, clients, S0 and S1.

Key separation (Sec. V-B "System initialization"):
* ``KDC`` builds one CKKS context, a key pair (pk_s, sk_s) for S1 and (pk_i, sk_i) per
  client, and the evaluation keys (relinearisation + EvalSum rotations) for sk_s. It hands
  each entity only its share and keeps nothing for S0.
* ``Client`` i holds (pk_i, sk_i) and pk_s: it encrypts its unit-length update under pk_s
  (Alg. 3 line 9) and decrypts the global model with sk_i after the key transformation.
* ``HelperServer`` (S1) holds sk_s. It only ever decrypts values masked by S0: w + r in
  the key transformation (Alg. 5 line 7), r * n in the masked-inverse exchange used for
  the divisions of Alg. 4 line 11 / Eq. 12, and the sign-flipped, blinded empty-class test
  +-s_a (n - tol), +-s_b (-n - tol). ``decryption_log`` keeps the last ``log_size`` decryptions (none
  by default) so that tests can check the masking.
* ``AggregationServer`` (S0) lives in ``secure_ducc``; it receives only ``PublicMaterial``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import List, Sequence

import numpy as np
import openfhe

from fedjax_async.crypto import ckks
from fedjax_async.crypto import parallel
from fedjax_async.crypto import stopping


@dataclasses.dataclass(frozen=True)
class PublicMaterial:
  """What S0 may see: the context (with sk_s's evaluation keys loaded) and public keys."""

  cc: object
  pk_s: object
  client_pks: tuple
  min_iterations: int


# S1 answers Enc(0) for a blinded value this close to 0 (no finite inverse); S0's
# empty-class test, not this, decides which classes count as empty.
ZERO_EPS = 1e-12


def replicated_value(slots: np.ndarray) -> float:
  """The number a decryption holds in every slot (an EvalSum, S0's masked scalars): the
  real parts' mean. The real parts of S0's noise flood
  (``secure_ducc.AggregationServer.flood``) sum to zero over the slots, so the mean
  carries none of it, and averages OpenFHE's decoding noise (the flood's imaginary
  parts have a fresh mean of their own: ``decrypt_vector`` reads the real parts)."""
  return float(np.mean(slots))


class Client:
  """Client C_i (Alg. 3 lines 5-10): encrypts under pk_s, decrypts with its own sk_i."""

  def __init__(self, index: int, cc, pk_s, keypair):
    self.index = index
    self._cc = cc
    self._pk_s = pk_s
    self.public_key = keypair.publicKey
    self._secret_key = keypair.secretKey
    self._ev = ckks.Evaluator(cc)

  def encrypt_update(self, update: np.ndarray) -> List[object]:
    """Enc_pk_s(u) in ceil(d / (N/2)) ciphertexts (Alg. 3 line 9); u is unit length."""
    out = []
    for blk in ckks.chunk(update, self._ev.slots):
      stopping.between_chunks()
      out.append(self._ev.encrypt(self._pk_s, blk))
    return out

  def decrypt_model(self, cts: Sequence[object], dim: int) -> np.ndarray:
    """Dec_sk_i of the key-transformed global model (after Alg. 5)."""
    return ckks.unchunk([decrypt_vector(self._cc, self._secret_key, c) for c in cts], dim)


class HelperServer(parallel.PoolHolder):
  """S1: holds sk_s; decrypts only S0-masked values (Alg. 5 lines 6-12, masked inverse).
  Its Alg. 5 pool (``worker_pool``) is its own, always processes (never Ray's shared
  object store)."""

  PARTY = "S1"
  RAY_ALLOWED = False

  def __init__(self, cc, keypair, client_pks: Sequence[object], log_size: int = 0):
    self._cc = cc
    self.pk_s = keypair.publicKey
    self._secret_key = keypair.secretKey
    self._client_pks = tuple(client_pks)
    self._ev = ckks.Evaluator(cc)
    self.decryption_log = collections.deque(maxlen=int(log_size))

  def decrypt_masked(self, ct) -> np.ndarray:
    """Dec_sk_s of one value S0 masked or blinded (Alg. 5 line 7's w + r, the divisors
    of Alg. 4 line 11, the streamed refreshes); every decryption S1 makes, logged."""
    v = decrypt_vector(self._cc, self._secret_key, ct)
    self.decryption_log.append(v.copy())
    return v

  def encrypt_replicated(self, value: float):
    """Enc_pk_s(value) in every slot: S1's answer for one scalar."""
    return self._ev.encrypt(self.pk_s, np.full(self._ev.slots, value))

  def encrypt_packed(self, values: Sequence[float]):
    """Enc_pk_s of ``values`` in slots 0.. (0 after): the streamed refresh of the inner
    products (``streamed_ducc``, step 2)."""
    packed = np.zeros(self._ev.slots)
    packed[:len(values)] = values
    return self._ev.encrypt(self.pk_s, packed)

  def worker_material(self):
    """S1's context and keys, sk_s included, serialised for its own Alg. 5 workers
    (``parallel.party_material``)."""
    return parallel.party_material(self._cc, self.pk_s, self._client_pks, self._secret_key)

  def masked_inverse(self, cts: Sequence[object], tests: Sequence[object] = ()):
    """Alg. 4 line 11's divisions, blinded: one answer per denominator.

    ``cts``: Enc(r n) per denominator (r = +-2^u, random sign and magnitude, chosen by
    S0); the inverse is 1 / (r n) (0 when |r n| <= ``ZERO_EPS``). ``tests[2 i]``,
    ``tests[2 i + 1]`` go with ``cts[i]``: S0's empty-class tests, two blinded linear
    values with hidden signs. For a tested denominator S1 returns four members,
    Enc_pk_s(1 / (r n)) at index 2 pa + pb (pa, pb: test a, b positive) and Enc_pk_s(0)
    at the other three; for an untested one, Enc_pk_s(1 / (r n)). S0 alone knows the
    signs, so S1 cannot tell which members mean "empty". Each value is replicated in
    every slot and flooded by S0; their mean is used (``replicated_value``).
    """
    values = [replicated_value(self.decrypt_masked(ct)) for ct in cts]
    positive = [replicated_value(self.decrypt_masked(ct)) > 0.0 for ct in tests]
    out = []
    for i, v in enumerate(values):
      inv = 1.0 / v if abs(v) > ZERO_EPS else 0.0
      if 2 * i + 1 < len(positive):
        hit = 2 * positive[2 * i] + positive[2 * i + 1]
        out.append(tuple(self.encrypt_replicated(inv if j == hit else 0.0) for j in range(4)))
      else:
        out.append(self.encrypt_replicated(inv))
    return out

  def masked_inverse_sqrt(self, cts: Sequence[object]) -> List[object]:
    """For each Enc(r^2 v) (v >= 0) return Enc_pk_s(1 / (r sqrt(v))), or Enc(0) when
    r^2 v <= ``ZERO_EPS``: S0's normalisation of the online mean (PAFed Sec. V-A), S1
    seeing the blinded r^2 ||m||^2 only. The replicated value's mean is used."""
    out = []
    for ct in cts:
      v = replicated_value(self.decrypt_masked(ct))
      out.append(self.encrypt_replicated(1.0 / math.sqrt(v) if v > ZERO_EPS else 0.0))
    return out

  def key_transform(self, masked_cts: Sequence[object], recipients: Sequence[int]):
    """Alg. 5 lines 6-12: Dec_sk_s(w + r), then Enc_pk_i(w + r) for each recipient i
    and Enc_pk_s(w + r) for the next round. Returns ({i: [cts]}, [cts under pk_s])."""
    plain = [self.decrypt_masked(ct) for ct in masked_cts]

    def encrypt(pk):
      out = []
      for p in plain:
        stopping.between_chunks()
        out.append(self._ev.encrypt(pk, p))
      return out

    per_client = {i: encrypt(self._client_pks[i]) for i in recipients}
    return per_client, encrypt(self.pk_s)

  def key_transform_each(self, masked_cts: Sequence[object], recipients: Sequence[int]):
    """Alg. 5 lines 6-12, one recipient at a time: Dec_sk_s(w + r) once, then yields
    (i, Enc_pk_i(w + r)) for each recipient and last (None, Enc_pk_s(w + r)), so that a
    round holds one recipient's copy of the model, not all of them. Each chunk of w + r
    is encoded once and encrypted afresh for every key."""
    ev = self._ev
    plain = [ev.encode(self.decrypt_masked(ct)) for ct in masked_cts]
    for i, pk in [(i, self._client_pks[i]) for i in recipients] + [(None, self.pk_s)]:
      out = []
      for p in plain:
        stopping.between_chunks()
        out.append(ev.cc.Encrypt(pk, p))
      yield i, out


class KDC:
  """Key distribution centre (Alg. 3 line 1): context, all key pairs, sk_s eval keys."""

  def __init__(self, num_clients: int, depth: int, min_iterations: int, preset="secure",
               ring_dim=None, log_size: int = 0, batch_size=None):
    self.cc = ckks.make_context(depth, preset, ring_dim, batch_size)
    server_keys = self.cc.KeyGen()
    # Evaluation keys for S0's computations over ciphertexts under pk_s.
    self.cc.EvalMultKeyGen(server_keys.secretKey)
    self.cc.EvalSumKeyGen(server_keys.secretKey)
    client_keys = [self.cc.KeyGen() for _ in range(num_clients)]
    pks = tuple(k.publicKey for k in client_keys)
    self.public = PublicMaterial(self.cc, server_keys.publicKey, pks, int(min_iterations))
    self.helper = HelperServer(self.cc, server_keys, pks, log_size)
    self.clients = [Client(i, self.cc, server_keys.publicKey, k)
                    for i, k in enumerate(client_keys)]


def decrypt_vector(cc, secret_key, ct) -> np.ndarray:
  """Decrypt one ciphertext to its N/2 real slot values.

  A wrong key makes OpenFHE's CKKS decoder raise (approximation error too high) or
  return noise; callers get a ``DecryptionError`` in the first case.
  """
  try:
    pt = cc.Decrypt(secret_key, ct)
  except RuntimeError as e:
    raise DecryptionError(str(e)) from e
  pt.SetLength(ckks.num_slots(cc))
  return np.asarray(pt.GetRealPackedValue(), np.float64)


class DecryptionError(RuntimeError):
  """OpenFHE could not decode the plaintext (typically: wrong secret key)."""


def secret_key_type():
  return openfhe.PrivateKey
