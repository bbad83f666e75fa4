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

A third view, the imaginary-mean attack: S1's decryption holds b x in the real parts'
mean and b Im(e) in the imaginary parts' mean, so their ratio cancels b as well
(``imaginary_observations``); S0's flood gives its imaginary parts a fresh mean of its
own (``secure_ducc.FLOOD_IMAG_MEAN``; ``--zero_imag_mean``: the plant without it).

S1 plays with exactly what it receives: its decryption log (``decryption_log``, and its
complex slots: ``_record_log_errors``), in the order the protocol decrypts (``TOTALS``,
``TESTS``), and the public parameters (the decoder's noise floor, ``decoder_floor``). Its estimate is the posterior median of |cos| under the prior
U(0.2, 0.9), the likelihood of each class's log ratios (the tests' minus the total's,
``class_likelihood``) taken over both class orders and both signs: with no information
it answers the prior's median 0.55, whose median error is 0.175. The script prints the
attack's and the prior's median errors on the same rounds (one JSON row per design and
Min depth; ``--no_flood``: S0 without its flood, the spread attack's plant):

  python benchmarks/noise_ratio_attack.py --preset=secure --depths=4 --rounds=30 \
      --designs=one_context --out_jsonl=benchmarks/results/noise_ratio_attack.jsonl
  python benchmarks/noise_ratio_attack.py --preset=insecure_test --depths=4,6 \
      --rounds=30 --batch_size=64 --out_jsonl=benchmarks/results/noise_ratio_attack.jsonl
"""

from __future__ import annotations

import functools
import json
import math
import time
from typing import Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from fedjax_async.algorithms import pafed
from fedjax_async.crypto import cheon
from fedjax_async.crypto import ckks
from fedjax_async.crypto import secure_ducc
from fedjax_async.crypto import streamed_ducc
from fedjax_async.crypto import vectors

PRIOR = (0.2, 0.9)  # |cos| ~ U(PRIOR)
OUTLIER = 0.01  # the likelihood's share for a value off the model
# The imaginary-mean attack's kernel widths (a mixture: its log ratios are precise where
# the shared error dominates the value's own rescaling errors, loose where it does not)
IMAG_WIDTHS = (0.02, 1.0)
SPAN = 32.0  # bits that a ratio of two blinds 2^U(-8, 8) spans
# S1's prior that its ratios carry nothing (S0 floods): at 0.99 the estimate of a round
# whose ratios carry nothing stays at the prior's median (over 30 rounds of pure flood its
# median error is within 0.01 of the prior's in 99 % of simulated runs; at 0.5, 3 % of
# them beat it by 0.02), while a real signal still dominates (its likelihood ~1e5 times
# the null's)
NULL = 0.99
# Positions in S1's log of one round with one delayed update: the two class totals (in the
# order S1 receives them) and their tests (2 c, 2 c + 1 of TESTS for total c).
TOTALS = {"one_context": (1, 2), "streamed": (3, 4)}
TESTS = {"one_context": (4, 5, 6, 7), "streamed": (5, 6, 7, 8)}


def make(design: str, d: int, preset: str, dim: int, num_clients: int, ring_dim=None,
         batch_size=None):
  if design == "streamed":
    proto = streamed_ducc.make_streamed_protocol(num_clients, dim, preset, min_depth=d,
                                                 log_size=10_000, max_delayed=16,
                                                 ring_dim=ring_dim)
    return proto, streamed_ducc.streamed_pafed_step
  proto = secure_ducc.make_protocol(num_clients, dim, preset, min_depth=d, log_size=10_000,
                                    ring_dim=ring_dim, batch_size=batch_size)
  return proto, secure_ducc.secure_pafed_step


def play_rounds(design: str, d: int, rounds: int, preset: str = "secure", seed: int = 0,
                dim: int = 64, n_online: int = 3,
                ring_dim: Optional[int] = None,
                batch_size: Optional[int] = None) -> List[Dict[str, object]]:
  """``rounds`` encrypted rounds, each with ``n_online`` online uploads and one delayed
  one at |cos| ~ U(0.2, 0.9) (random sign); per round the true |cos|, the public
  tolerance, S1's decryption log (and the complex means: ``_record_log_errors``), the
  uploads (online, delayed) and the round's max |error| against the plaintext DUCC with
  the same Min and tolerance (``ducc_error``). ``batch_size``: the one-context design's
  slots per ciphertext (default N/2; the tests use fewer)."""
  proto, step = make(design, d, preset, dim, n_online + 1, ring_dim, batch_size)
  log_errors, means = _record_log_errors(proto)
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
    means.clear()
    w = rng.normal(size=dim) * 0.1
    new_w = step(proto, w, online, delayed, empty_class_tol=tol).w
    out.append({"cos": abs(cos), "tol": tol, "log": list(proto.s1.decryption_log),
                "uploads": (online, delayed),
                "log_error": list(log_errors), "mean": list(means), "ring_dim": ring,
                "ducc_error": ducc_error(new_w, w, online, delayed, d, tol)})
  proto.close()
  return out


@functools.lru_cache(maxsize=None)
def _plaintext_ducc(d: int, tol: float):
  """``pafed.ducc`` with Cheon's Min of d iterations and the tolerance, jitted once (an
  eager call compiles its branches again every round)."""
  return jax.jit(functools.partial(pafed.ducc, min_fn=cheon.make_cheon_min(d),
                                   empty_class_tol=tol))


def ducc_error(new_w, w, online, delayed, d: int, tol: float) -> float:
  """max |encrypted w' - plaintext w'|: Eq. 17 (alphas 1) with ``pafed.ducc``, the same
  Cheon Min and empty-class tolerance."""
  m, m1, m2 = (np.asarray(x, np.float64) for x in _plaintext_ducc(d, float(tol))(
      online, delayed))
  return float(np.max(np.abs(np.asarray(new_w) - (w + m + m1 + m2))))


def _record_log_errors(proto) -> Tuple[List[float], List[complex]]:
  """S1's other views of each decryption, from its complex slots: the error its
  imaginary parts carry, as the decoder's ``GetLogError`` (log2 of its estimate, on
  real-data contexts) or, on complex ones, log2 of their slot-to-slot spread read by S1
  itself; and the slots' complex mean (real: the value; imaginary: the blind times the
  value's CKKS error where S0 does not flood it). Recorded per S1 decryption, in the
  order of ``decryption_log``: (errors, means)."""
  errors, means = [], []
  helpers = ([proto.s1.vector, proto.s1.scalar] if hasattr(proto.s1, "scalar")
             else [proto.s1])
  for h in helpers:
    def decrypt_masked(ct, h=h, decrypt=h.decrypt_masked):
      pt = h._cc.Decrypt(h._secret_key, ct)  # pylint: disable=protected-access
      pt.SetLength(ckks.num_slots(h._cc))  # pylint: disable=protected-access
      slots = np.asarray(pt.GetCKKSPackedValue(), np.complex128)
      imag = np.imag(slots)
      means.append(complex(np.mean(slots)))
      logged = pt.GetLogError()  # 0 on complex contexts, which estimate nothing
      errors.append(float(logged) if logged else math.log2(float(np.std(imag)) + 1e-300))
      return decrypt(ct)
    h.decrypt_masked = decrypt_masked
  return errors, means


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


def _kernel(z: np.ndarray, width) -> np.ndarray:
  """The density of a log-ratio difference off its prediction: Gaussian of ``width`` (a
  tuple: an equal mixture of Gaussians of those widths), with an ``OUTLIER`` share
  spread over the blinds' ``SPAN`` (a value off the model)."""
  widths = width if isinstance(width, tuple) else (width,)
  gauss = sum(np.exp(-0.5 * (z / w) ** 2) / (w * math.sqrt(2.0 * math.pi))
              for w in widths) / len(widths)
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


def imaginary_observations(means: Sequence[complex], design: str):
  """Per class, the log ratios of its total and its two tests from the slots' complex
  means: log2 |real mean| - log2 |imaginary mean|. Unflooded, the real mean is b x and
  the imaginary one b Im(e), e the class weight's CKKS error, shared by the total and
  its tests: the ratio cancels the blind b and differs between a test and its total by
  log2 ||n| -+ tol| / |n| (the imaginary-mean attack). None where the imaginary mean is
  0."""
  idx = [[i] + list(TESTS[design][2 * c:2 * c + 2]) for c, i in enumerate(TOTALS[design])]
  return [[math.log2(abs(means[i].real) + 1e-300) - math.log2(abs(means[i].imag))
           if means[i].imag != 0.0 else None for i in c] for c in idx]


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
  y = [float(p["log_error"][i]) if log_error
       else math.log2(float(np.std(p["log"][i], ddof=1)) + 1e-300)
       for p in played for i in values]
  return float(np.corrcoef(x, y)[0, 1]) if np.std(y) > 0 else 0.0


def imaginary_correlation(played, design: str) -> float:
  """Pearson's r of log2 |real mean| and log2 |imaginary mean| over S1's blinded class
  values: near 1 while the imaginary mean is the blind times the value's error, near 0
  when it is the flood's."""
  values = list(TOTALS[design]) + list(TESTS[design])
  pairs = [(abs(p["mean"][i].real), abs(p["mean"][i].imag)) for p in played for i in values]
  x = [math.log2(a + 1e-300) for a, _ in pairs]
  y = [math.log2(b + 1e-300) for _, b in pairs]
  return float(np.corrcoef(x, y)[0, 1]) if np.std(y) > 0 else 0.0


def imaginary_mean_bound(played, design: str, d: int) -> float:
  """max |imaginary mean| of S1's blinded class values in units of N M / Delta (M: the
  bound S0 sizes the flood from, 1 for a total and 1 + tol for a test, k = 1): with
  ``--unit_blinds`` (every blind 1, no flood) the value's own error, which S0's flood of
  standard deviation FLOOD_RATIO x 2^u x 64 N M / Delta must cover."""
  ring = played[0]["ring_dim"]
  out = 0.0
  for p in played:
    tol = max(p["tol"], secure_ducc.EMPTY_EPS)
    for i in TOTALS[design]:
      out = max(out, abs(p["mean"][i].imag) * 2.0 ** 40 / ring)
    for i in TESTS[design]:
      out = max(out, abs(p["mean"][i].imag) * 2.0 ** 40 / (ring * (1.0 + tol)))
  return out


def spread_bound(played, design: str) -> float:
  """max slot-to-slot spread (real or imaginary parts) of S1's blinded class values in
  units of N M / Delta (as ``imaginary_mean_bound``)."""
  ring, out = played[0]["ring_dim"], 0.0
  for p in played:
    for i in list(TOTALS[design]) + list(TESTS[design]):
      m = 1.0 if i in TOTALS[design] else 1.0 + max(p["tol"], secure_ducc.EMPTY_EPS)
      spread = max(float(np.std(p["log"][i])), 2.0 ** p["log_error"][i])
      out = max(out, spread * 2.0 ** 40 / (ring * m))
  return out


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
  widths = {"": width, "log_error_": 0.41, "imag_mean_": IMAG_WIDTHS}
  if all(p.get("log_error") for p in played):
    floor_e = min(p["log_error"][i] for p in played for i in values)
    views["log_error_"] = lambda p: observations(p["log"], design, floor_e, p["log_error"])
  if all(p.get("mean") for p in played):
    views["imag_mean_"] = lambda p: imaginary_observations(p["mean"], design)
  for name, view in views.items():
    est = np.array([estimate(view(p), p["tol"], d, widths[name]) for p in played])
    err = np.abs(est - truth)
    row.update({name + "median_error": round(float(np.median(err)), 4),
                name + "beats_prior_by_0.02": int(np.sum(err < prior_err - 0.02)),
                name + "within_0.01": round(float(np.mean(err < 0.01)), 3)})
  row["spread_correlation"] = round(spread_correlation(played, design), 3)
  if "log_error_" in views:
    row["log_error_correlation"] = round(spread_correlation(played, design, True), 3)
  if "imag_mean_" in views:
    row["imag_mean_correlation"] = round(imaginary_correlation(played, design), 3)
  if all(p.get("mean") for p in played):
    row["max_imag_mean_over_NM_Delta"] = round(imaginary_mean_bound(played, design, d), 3)
    row["max_spread_over_NM_Delta"] = round(spread_bound(played, design), 3)
  if all("ducc_error" in p for p in played):
    row["ducc_max_abs_err"] = float(f"{max(p['ducc_error'] for p in played):.2e}")
  return row


def attack(design: str, d: int, rounds: int, preset: str = "secure", seed: int = 0,
           dim: int = 64, batch_size: Optional[int] = None) -> Dict[str, object]:
  """``rounds`` rounds played and scored (``score``), with the flood's ratio and the CPU
  and wall seconds they took."""
  t, cpu = time.time(), time.process_time()
  played = play_rounds(design, d, rounds, preset, seed, dim, batch_size=batch_size)
  return {"design": design, "min_depth": d, "preset": preset, "rounds": rounds,
          "contexts": "complex",  # ckks.make_context's slots
          **score(played, design, d), "flood_ratio": secure_ducc.FLOOD_RATIO,
          "flood_imag_mean": secure_ducc.FLOOD_IMAG_MEAN, "null": NULL,
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
  p.add_argument("--batch_size", type=int, default=0,
                 help="the one-context design's slots per ciphertext (0: N/2; the tests: 64)")
  p.add_argument("--no_flood", action="store_true",
                 help="FLOOD_RATIO = 0 (S0 adds no flood): the spread attack's plant")
  p.add_argument("--zero_imag_mean", action="store_true",
                 help="FLOOD_IMAG_MEAN = 0 (the flood's imaginary parts sum to zero): "
                      "the imaginary-mean attack's plant")
  p.add_argument("--unit_blinds", action="store_true",
                 help="every blind 1 and no flood: max_imag_mean_over_NM_Delta is then the "
                      "values' own error, which the flood must cover")
  p.add_argument("--null", type=float, default=NULL,
                 help="S1's prior that its ratios carry nothing (NULL)")
  p.add_argument("--out_jsonl", default="")
  args = p.parse_args(argv)
  globals()["NULL"] = args.null
  if args.no_flood:
    secure_ducc.FLOOD_RATIO = 0.0
  if args.zero_imag_mean:
    secure_ducc.FLOOD_IMAG_MEAN = 0.0
  if args.unit_blinds:
    secure_ducc.FLOOD_RATIO = 0.0
    secure_ducc.csprng.blind = lambda log2_range, signed=True: 1.0
  for design in args.designs.split(","):
    for d in [int(x) for x in args.depths.split(",")]:
      row = attack(design, d, args.rounds, args.preset, args.seed, args.dim,
                   args.batch_size or None)
      print(json.dumps(row), flush=True)
      if args.out_jsonl:
        with open(args.out_jsonl, "a") as f:
          f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
