"""The noise-ratio attack: S1 reads a delayed update's |cos| to the online mean from the
spread of its own decryptions (docs/crypto.md, "Noise flooding").

A blinded value S1 decrypts is b (x + e): e, the CKKS error of the class weight, is shared
by a class's total n and its two empty-class tests, and OpenFHE's decoder adds noise of
the size of |b e| to every slot (it estimates the error from the imaginary parts). So a
value divided by its slot-to-slot spread cancels its blind: n / e, (n - tol) / e and
(n + tol) / e for a class's total and tests, which with the public tolerance tol give n.
With one delayed update (k = 1) the two class totals are public functions of the
update's cosine to the online mean (``class_totals``). S0's flood
(``secure_ducc.AggregationServer.flood``) makes every spread S1 sees the flood's,
whatever the blind.

S1 plays with exactly what it receives: its decryption log (``decryption_log``), in the
order the protocol decrypts (``TOTALS``, ``TESTS``), and the public parameters (the
decoder's noise floor, ``decoder_floor``). Its estimate is the posterior median of |cos| under the prior
U(0.2, 0.9), the likelihood of each class's log ratios (the tests' minus the total's,
``class_likelihood``) taken over both class orders and both signs: with no information
it answers the prior's median 0.55, whose median error is 0.175. The script prints the
attack's and the prior's median errors on the same rounds (one JSON row per design and
Min depth; ``--no_flood``: S0 as it was without the flood):

  python benchmarks/noise_ratio_attack.py --preset=secure --depths=4,6 --rounds=30 \
      --designs=one_context,streamed --out_jsonl=benchmarks/results/noise_ratio_attack.jsonl
"""

from __future__ import annotations

import functools
import json
import math
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async.algorithms import pafed
from fedjax_async.crypto import cheon
from fedjax_async.crypto import ckks
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import streamed_ducc
from fedjax_async.crypto import vectors

PRIOR = (0.2, 0.9)  # |cos| ~ U(PRIOR)
OUTLIER = 0.01  # the likelihood's share for a value off the model
SPAN = 32.0  # bits that a ratio of two blinds 2^U(-8, 8) spans
NULL = 0.5  # S1's prior that its spreads carry nothing (S0 floods)
# Positions in S1's log of one round with one delayed update: the two class totals (in the
# order S1 receives them) and their tests (2 c, 2 c + 1 of TESTS for total c).
TOTALS = {"one_context": (1, 2), "streamed": (3, 4)}
TESTS = {"one_context": (4, 5, 6, 7), "streamed": (5, 6, 7, 8)}


def make(design: str, d: int, preset: str, dim: int, num_clients: int, ring_dim=None):
  if design == "streamed":
    proto = streamed_ducc.make_streamed_protocol(num_clients, dim, preset, min_depth=d,
                                                 log_size=10_000, max_delayed=16,
                                                 ring_dim=ring_dim)
    return proto, streamed_ducc.streamed_pafed_step
  proto = secure_ducc.make_protocol(num_clients, dim, preset, min_depth=d, log_size=10_000,
                                    ring_dim=ring_dim)
  return proto, secure_ducc.secure_pafed_step


def play_rounds(design: str, d: int, rounds: int, preset: str = "secure", seed: int = 0,
                dim: int = 64, n_online: int = 3,
                ring_dim: Optional[int] = None) -> List[Dict[str, object]]:
  """``rounds`` encrypted rounds, each with ``n_online`` online uploads and one delayed
  one at |cos| ~ U(0.2, 0.9) (random sign); per round the true |cos|, the public
  tolerance, S1's decryption log and the round's max |error| against the plaintext
  DUCC with the same Min and tolerance (``ducc_error``)."""
  proto, step = make(design, d, preset, dim, n_online + 1, ring_dim)
  log_errors = _record_log_errors(proto)
  ring = int(proto.s0.ev.cc.GetRingDimension())  # the class totals' context
  rng = np.random.default_rng(seed)
  tol = cheon.max_min_error(d)
  out = []
  for _ in range(rounds):
    cos = float(rng.uniform(*PRIOR)) * float(rng.choice([-1.0, 1.0]))
    online = vectors.unit(rng.normal(size=(n_online, dim)) + 1.5 * rng.normal(size=dim))
    delayed = vectors.with_cos(vectors.unit(online.mean(0)), [cos], dim, rng)
    proto.s1.decryption_log.clear()
    log_errors.clear()
    w = rng.normal(size=dim) * 0.1
    new_w, _ = step(proto, w, online, delayed, empty_class_tol=tol)
    out.append({"cos": abs(cos), "tol": tol, "log": list(proto.s1.decryption_log),
                "log_error": list(log_errors), "ring_dim": ring,
                "ducc_error": ducc_error(new_w, w, online, delayed, d, tol)})
  proto.close()
  return out


def ducc_error(new_w, w, online, delayed, d: int, tol: float) -> float:
  """max |encrypted w' - plaintext w'|: Eq. 17 (alphas 1) with ``pafed.ducc``, the same
  Cheon Min and empty-class tolerance."""
  m, m1, m2 = (np.asarray(x, np.float64) for x in pafed.ducc(
      online, delayed, cheon.make_cheon_min(d), empty_class_tol=tol))
  return float(np.max(np.abs(np.asarray(new_w) - (w + m + m1 + m2))))


def _record_log_errors(proto) -> List[float]:
  """A second view S1 has of each decryption: the error its imaginary parts carry, as the
  decoder's ``GetLogError`` (log2 of its estimate, on real-data contexts) or, on complex
  ones, log2 of their slot-to-slot spread read by S1 itself. Recorded per S1
  decryption, in the order of ``decryption_log``."""
  errors = []
  helpers = ([proto.s1.vector, proto.s1.scalar] if hasattr(proto.s1, "scalar")
             else [proto.s1])
  for h in helpers:
    def decrypt_masked(ct, h=h, decrypt=h.decrypt_masked):
      pt = h._cc.Decrypt(h._secret_key, ct)  # pylint: disable=protected-access
      pt.SetLength(ckks.num_slots(h._cc))  # pylint: disable=protected-access
      imag = np.imag(np.asarray(pt.GetCKKSPackedValue(), np.complex128))
      logged = pt.GetLogError()  # 0 on complex contexts, which estimate nothing
      errors.append(float(logged) if logged else math.log2(float(np.std(imag)) + 1e-300))
      return decrypt(ct)
    h.decrypt_masked = decrypt_masked
  return errors


def decoder_floor(ring_dim: int, slots: int, scale: float = 2.0 ** 40) -> float:
  """The least slot-to-slot spread OpenFHE's decoder gives a decryption of ``slots``
  slots: it adds Gaussian noise of sqrt(2) x max(its error estimate, sqrt(N) / 8) per
  coefficient read."""
  return math.sqrt(2.0 * ring_dim * slots) / (8.0 * scale)


def log_ratio(v: np.ndarray, floor: float) -> Optional[float]:
  """log2(|value| / spread) of one decryption, the spread's part above the decoder's
  floor only (OpenFHE never adds less noise than its floor, whatever the error); None
  when the spread is within twice the floor (it carries nothing)."""
  spread = float(np.std(v, ddof=1))
  if spread < 2.0 * floor:
    return None
  return math.log2(abs(float(np.mean(v))) + 1e-300) - 0.5 * math.log2(spread ** 2 - floor ** 2)


def _kernel(z: np.ndarray, width: float) -> np.ndarray:
  """The density of a log-ratio difference off its prediction: Gaussian of ``width``,
  with an ``OUTLIER`` share spread over the blinds' ``SPAN`` (a value off the model)."""
  gauss = np.exp(-0.5 * (z / width) ** 2) / (width * math.sqrt(2.0 * math.pi))
  return (1.0 - OUTLIER) * gauss + OUTLIER / SPAN


def class_likelihood(d: Sequence[Optional[float]], n: np.ndarray, tol: float,
                     width: float) -> np.ndarray:
  """P(one class's log ratios d = (total, test, test) | its total n), on a grid of n. The
  total and its two tests share the class weight's error e, so each test's log ratio
  minus the total's is log2(||n| - tol| / |n|) or log2((|n| + tol) / |n|) (the tests come
  in a random order); flat (the null's density) when a value carried no signal."""
  if any(x is None for x in d):
    return np.full_like(n, SPAN ** -2.0)
  an = np.maximum(np.abs(n), 1e-12)
  lo, hi = np.log2(np.abs(an - tol) / an + 1e-300), np.log2((an + tol) / an)
  a, b = d[1] - d[0], d[2] - d[0]
  return 0.5 * (_kernel(a - lo, width) * _kernel(b - hi, width)
                + _kernel(a - hi, width) * _kernel(b - lo, width))


@functools.lru_cache(maxsize=None)
def class_totals(d: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(|cos| grid over the prior, n1, n2 for +|cos|): n1 = s - Min(s, 1/2), n2 = Min(s, 1/2)
  - 1/2, s = (cos + 1) / 2 (for -|cos| the classes swap: n1(-c) = -n2(c))."""
  grid = np.linspace(PRIOR[0], PRIOR[1], 701)
  s = (grid + 1.0) / 2.0
  m = cheon.cheon_min(s, 0.5, d)
  return grid, s - m, m - 0.5


def observations(log: Sequence[np.ndarray], design: str, floor: float,
                 log_error: Optional[Sequence[int]] = None):
  """Per class, the log ratios of its total and its two tests: log2 |value| minus log2
  of the spread above the floor (``log_ratio``), or with ``log_error`` minus the
  decoder's rounded log2 error estimate (None at the floor ``floor``, then a log2)."""
  idx = [[i] + list(TESTS[design][2 * c:2 * c + 2]) for c, i in enumerate(TOTALS[design])]
  if log_error is None:
    return [[log_ratio(log[i], floor) for i in c] for c in idx]
  return [[math.log2(abs(float(np.mean(log[i]))) + 1e-300) - log_error[i]
           if log_error[i] > floor else None for i in c] for c in idx]


def estimate(obs, tol: float, d: int, width: float) -> float:
  """S1's posterior median of |cos| from one round's ``observations``: the prior
  U(PRIOR) times the likelihood of its two classes' log ratios (in either order: S0
  swaps the classes at random; both signs of the cosine), mixed with the null that the
  ratios carry nothing (the differences spread over the blinds' ``SPAN``: the prior
  again), in proportion to how well each explains them."""
  grid, n1, n2 = class_totals(d)
  like = sum(class_likelihood(obs[0], a, tol, width) * class_likelihood(obs[1], b, tol, width)
             for a, b in ((n1, n2), (n2, n1), (-n2, -n1), (-n1, -n2))) / 4.0
  post = (1.0 - NULL) * like + NULL * SPAN ** -4.0
  cdf = np.cumsum(post) / np.sum(post)
  return float(grid[np.searchsorted(cdf, 0.5)])


def width_for(slots: int) -> float:
  """The spread of a test's log ratio minus its total's: two spreads estimated from
  ``slots`` Gaussian slots each (relative error 1 / sqrt(2 (slots - 1)))."""
  return max(0.01, 1.0 / (math.log(2.0) * math.sqrt(slots - 1)))


def spread_correlation(played, design: str, log_error: bool = False) -> float:
  """Pearson's r of log2 |value| and log2 spread (``log_error``: the decoder's log2 error
  estimate, ``GetLogError``) over S1's blinded class values (two totals, four tests per
  round): near 1 while the spread follows the blind, near 0 when the flood sets it."""
  values = list(TOTALS[design]) + list(TESTS[design])
  x = [math.log2(abs(float(np.mean(p["log"][i]))) + 1e-300) for p in played for i in values]
  y = [float(p["log_error"][i]) if log_error else math.log2(float(np.std(p["log"][i], ddof=1)))
       for p in played for i in values]
  return float(np.corrcoef(x, y)[0, 1]) if np.std(y) > 0 else 0.0


def score(played, design: str, d: int) -> Dict[str, object]:
  """The attack on played rounds: median |cos| errors of the attack and of the prior's
  median alone (same rounds), the rounds where it beats the prior by more than 0.02, the
  share within 0.01, ``spread_correlation``, and the same attack on the decoder's log2
  error estimates (``log_error_*``; their rounding to a bit: a width of 0.41); with the
  rounds' DUCC errors, their max (``ducc_max_abs_err``)."""
  truth = np.array([p["cos"] for p in played])
  values = list(TOTALS[design]) + list(TESTS[design])
  floor = decoder_floor(played[0]["ring_dim"], played[0]["log"][values[0]].size)
  width = width_for(played[0]["log"][values[0]].size)
  prior_err = np.abs(np.mean(PRIOR) - truth)
  row = {"prior_median_error": round(float(np.median(prior_err)), 4)}
  views = {"": lambda p: observations(p["log"], design, floor)}
  if all(p.get("log_error") for p in played):
    floor_e = min(p["log_error"][i] for p in played for i in values)
    views["log_error_"] = lambda p: observations(p["log"], design, floor_e, p["log_error"])
  for name, view in views.items():
    est = np.array([estimate(view(p), p["tol"], d, 0.41 if name else width)
                    for p in played])
    err = np.abs(est - truth)
    row.update({name + "median_error": round(float(np.median(err)), 4),
                name + "beats_prior_by_0.02": int(np.sum(err < prior_err - 0.02)),
                name + "within_0.01": round(float(np.mean(err < 0.01)), 3)})
  row["spread_correlation"] = round(spread_correlation(played, design), 3)
  if "log_error_" in views:
    row["log_error_correlation"] = round(spread_correlation(played, design, True), 3)
  if all("ducc_error" in p for p in played):
    row["ducc_max_abs_err"] = float(f"{max(p['ducc_error'] for p in played):.2e}")
  return row


def attack(design: str, d: int, rounds: int, preset: str = "secure", seed: int = 0,
           dim: int = 64) -> Dict[str, object]:
  """``rounds`` rounds played and scored (``score``), with the flood's ratio and the CPU
  and wall seconds they took."""
  t, cpu = time.time(), time.process_time()
  played = play_rounds(design, d, rounds, preset, seed, dim)
  return {"design": design, "min_depth": d, "preset": preset, "rounds": rounds,
          "contexts": "complex",  # ckks.make_context's slots
          **score(played, design, d), "flood_ratio": secure_ducc.FLOOD_RATIO,
          "cpu_s": round(time.process_time() - cpu, 1), "wall_s": round(time.time() - t, 1)}


def main(argv=None):
  import argparse  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", default="secure")
  p.add_argument("--designs", default="one_context,streamed")
  p.add_argument("--depths", default="4,6")
  p.add_argument("--rounds", type=int, default=30)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--dim", type=int, default=64)
  p.add_argument("--no_flood", action="store_true",
                 help="FLOOD_RATIO = 0 (S0 adds no flood): the attack as it was")
  p.add_argument("--out_jsonl", default="")
  args = p.parse_args(argv)
  if args.no_flood:
    secure_ducc.FLOOD_RATIO = 0.0
  for design in args.designs.split(","):
    for d in [int(x) for x in args.depths.split(",")]:
      row = attack(design, d, args.rounds, args.preset, args.seed, args.dim)
      print(json.dumps(row), flush=True)
      if args.out_jsonl:
        with open(args.out_jsonl, "a") as f:
          f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
