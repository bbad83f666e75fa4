"""Attacks on every message of the encrypted round, in both designs (one-context
``secure_ducc`` and ``streamed_ducc``), on the INSECURE test preset.

Each test plays the curious party with exactly what it receives: S1 gets the ciphertexts
S0 sends it (decrypted with its own secret keys), the plaintext numbers beside them, the
ciphertexts it produces itself (it keeps copies), and what is public (the code, the
alphas, the empty-class tolerance, the counts n and k). The delivered key-transformation
ciphertext is given to S1 as well (the channel to a client is not assumed private). Each
attack is aimed at one mask or blind and recovers the secret when that mask is weak
(seeded, reused, constant or zero: the docstrings name the weak variant and what the
attack then recovers); each test asserts the attack fails against the code as it is.
"""

import math

import numpy as np
import pytest

pytestmark = pytest.mark.crypto
pytest.importorskip("openfhe", exc_type=ImportError)

from fedjax_async.crypto import ckks  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import entities  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import secure_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import streamed_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import vectors  # pylint: disable=g-import-not-at-top

PRESET = "insecure_test"
DIM = 1500  # two vector ciphertexts of 1024 slots, 548 padded slots
D = 3  # Cheon iterations (eps_3 = 8.2e-2)
ALPHAS = (0.7, 0.5, 0.3)
DESIGNS = ("one_context", "streamed")
BOUND = secure_ducc.KT_MASK_BOUND  # B, the additive masks' published bound


def _make(design, num_clients=3, dim=DIM):
  if design == "streamed":
    return streamed_ducc.make_streamed_protocol(num_clients, dim, PRESET, min_depth=D)
  return secure_ducc.make_protocol(num_clients, dim, PRESET, min_depth=D)


def _step(design):
  return (streamed_ducc.streamed_pafed_step if design == "streamed"
          else secure_ducc.secure_pafed_step)


def _uploads(rng, cos, n_online=3, dim=DIM):
  """n_online unit uploads around a common direction and delayed ones at the given
  cosines to their normalised mean; a small random model w."""
  online = vectors.unit(rng.normal(size=(n_online, dim)) + 1.5 * rng.normal(size=dim))
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), cos, dim, rng)
  return online, delayed, rng.normal(size=dim) * 0.1


# ------------------------------------------------------------------ S1's view


class S1Record:
  """Every call S1 receives, with its ciphertext arguments decrypted by S1's own key of
  the context they belong to, and copies (``Clone``) of the ciphertexts S1 produces in
  the key transformation: ``calls`` is [(method, [argument values])], a ciphertext
  argument an array of its slots, a list of them a list of arrays."""

  # (method, the context of its ciphertext arguments) per design
  ONE_CONTEXT = {"masked_inverse_sqrt": "main", "masked_inverse": "main",
                 "key_transform": "main"}
  STREAMED = {"refresh_inner_products": "vector", "masked_inverse_sqrt": "scalar",
              "masked_inverse": "scalar", "refresh_coefficients": "scalar",
              "key_transform_each": "vector"}

  def __init__(self, s1, streamed):
    self.calls, self.produced = [], []  # produced: per round {recipient: [ct copies]}
    if streamed:
      self.keys = {"vector": s1.vector, "scalar": s1.scalar}
      methods = self.STREAMED
    else:
      self.keys = {"main": s1}
      methods = self.ONE_CONTEXT
    for name, ctx in methods.items():
      setattr(s1, name, self._wrap(name, ctx, getattr(s1, name)))

  def _plain(self, arg, ctx):
    h = self.keys[ctx]
    if hasattr(arg, "GetLevel"):
      return entities.decrypt_vector(h._cc, h._secret_key, arg)  # pylint: disable=protected-access
    if isinstance(arg, (list, tuple)) and arg and hasattr(arg[0], "GetLevel"):
      return [self._plain(a, ctx) for a in arg]
    return arg

  def _wrap(self, name, ctx, method):
    def call(*args):
      self.calls.append((name, [self._plain(a, ctx) for a in args]))
      if name == "key_transform":
        per_client, under_s = method(*args)
        self.produced.append({i: [c.Clone() for c in cts] for i, cts in per_client.items()})
        return per_client, under_s
      if name == "key_transform_each":
        return self._each(method(*args))
      return method(*args)
    return call

  def _each(self, gen):
    self.produced.append({})
    for i, cts in gen:
      self.produced[-1][i] = [c.Clone() for c in cts]
      yield i, cts

  def last(self, name):
    """The arguments of the last call of ``name``."""
    return next(args for n, args in reversed(self.calls) if n == name)

  def all(self, name):
    return [args for n, args in self.calls if n == name]


@pytest.fixture(scope="module")
def streamed():
  proto = _make("streamed")
  return proto, S1Record(proto.s1, streamed=True)


# ------------------------------------------------- key transformation (Alg. 5)


def _strip(cc, secret_key, delivered, produced, received):
  """S1's stripping attack on one delivered model: delivered - produced is S0's
  unmasking term alone. If S0 subtracted r as a plaintext that term is (-r, 0), which
  any key decrypts, and w = (w + r) - r; returns S1's w (None if it does not decode)."""
  out = []
  for d, p, wr in zip(delivered, produced, received):
    try:
      minus_r = entities.decrypt_vector(cc, secret_key, cc.EvalSub(d, p))
    except entities.DecryptionError:
      return None
    out.append(wr + minus_r)
  return out


@pytest.mark.parametrize("design", DESIGNS)
def test_attack_key_transformation_stripping(design):
  """S1 keeps the Enc_pk_i(w + r) it produced for client i and the w + r it decrypted,
  and reads the ciphertext delivered to client i: delivered - produced decrypted with its
  own key, added to w + r. Against Alg. 5's fresh Enc_pk_i(r) that difference is an
  encryption under pk_i and S1 recovers nothing (OpenFHE refuses to decode it, or its w
  is off by more than 100); against r subtracted as a plaintext it recovers w to 1e-6.
  The control: the same attack on Enc_pk_i(w + r) - r (the true r, as a plaintext)
  recovers w, so the attack is not vacuous."""
  proto = _make(design)
  record = S1Record(proto.s1, streamed=design == "streamed")
  rng = np.random.default_rng(11)
  online, delayed, w = _uploads(rng, [0.5, -0.4])
  new_w, _ = _step(design)(proto, w, online, delayed, ALPHAS)
  h = proto.s1.vector if design == "streamed" else proto.s1
  sk, cc = h._secret_key, proto.cc  # pylint: disable=protected-access
  received = record.last("key_transform_each" if design == "streamed" else "key_transform")[0]
  produced = record.produced[-1]
  delivered = proto.last_client_models
  assert sorted(delivered) == [0, 1, 2]
  for i, cts in delivered.items():
    got = _strip(cc, sk, cts, produced[i], received)
    if got is not None:
      err = np.max(np.abs(ckks.unchunk(got, DIM) - new_w))
      assert err > 100.0, (i, err)
  # Control: with the plaintext unmasking the same attack succeeds.
  ev = ckks.Evaluator(cc)
  r = [wr - x for wr, x in zip(received, ckks.chunk(new_w, ev.slots))]
  weak = [cc.EvalSub(p, ev.encode(rb)) for p, rb in zip(produced[1], r)]
  got = _strip(cc, sk, weak, produced[1], received)
  assert np.max(np.abs(ckks.unchunk(got, DIM) - new_w)) < 1e-5
