"""Tests of fedjax_async.privacy: flag validation, noise formulas, RDP accounting."""

import math

import numpy as np
import pytest
from scipy import special
from scipy import stats

from fedjax_async import privacy


@pytest.mark.parametrize("eps,delta,clip,field", [
    (0.0, 1e-5, 1.0, "dp_epsilon"), (-1.0, 1e-5, 1.0, "dp_epsilon"),
    (float("nan"), 1e-5, 1.0, "dp_epsilon"), (1.0, 0.0, 1.0, "dp_delta"),
    (1.0, 1.0, 1.0, "dp_delta"), (1.0, 1e-5, 0.0, "dp_clip"),
    (1.0, 1e-5, -2.0, "dp_clip")])
def test_invalid_privacy_values_name_the_field(eps, delta, clip, field):
  with pytest.raises(ValueError, match=rf"^privacy\.{field}: must be"):
    privacy.validate(eps, delta, clip)


def test_valid_privacy_values_pass():
  privacy.validate(1.0, 1e-5, 2.0)
  privacy.validate(math.inf, 1e-5, 2.0)  # epsilon = inf: the non-private run


def test_noise_formulas():
  # Alg. 1: Delta f = lr 2C / |D_k| = 0.01 * 4 / 100 = 4e-4; sigma = Delta f / eps
  assert np.isclose(privacy.alg1_sensitivity(0.01, 2.0, 100), 4e-4)
  assert np.isclose(privacy.alg1_sigma(0.01, 2.0, 100, 5.0), 8e-5)
  assert float(privacy.alg1_sigma(0.01, 2.0, 100, math.inf)) == 0.0
  assert np.isclose(privacy.eq25_sigma(0.01, 2.0, 100, 5.0, 1e-5),
                    8e-5 * math.sqrt(2 * math.log(1.25e5)), rtol=1e-5)
  # true step sensitivity: per-example clipping over b rows, or the whole batch clipped
  assert np.isclose(privacy.step_sensitivity(0.1, 1.0, 20, "example"), 0.01)
  assert np.isclose(privacy.step_sensitivity(0.1, 1.0, 20, "batch"), 0.2)
  np.testing.assert_array_equal(privacy.smallest_batch(np.array([100, 95, 7, 50]), 50),
                                [50, 45, 7, 50])


def _gaussian_epsilon_by_hand(z, steps, delta):
  """Three epsilons of s Gaussian mechanisms (noise multiplier z), by hand, on a dense
  grid of Renyi orders a > 1 with the Gaussian's RDP s a / (2 z^2) (Mironov 2017, Prop. 7):
  the exact one (s compositions are mu-GDP with mu = sqrt(s) / z, Dong et al. 2019,
  Cor. 2.13: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)), a lower bound
  on any accountant's; the RDP conversion of Canonne et al. 2020 (Prop. 12), which
  dp_accounting's RdpAccountant applies on its own grid of orders; and Mironov's classic
  conversion rdp + log(1/delta) / (a - 1), looser."""
  mu = math.sqrt(steps) / z
  gap = lambda e: (stats.norm.cdf(-e / mu + mu / 2)
                   - math.exp(e + stats.norm.logcdf(-e / mu - mu / 2)) - delta)
  lo, hi = 0.0, 1e4
  for _ in range(200):
    lo, hi = ((lo + hi) / 2, hi) if gap((lo + hi) / 2) > 0 else (lo, (lo + hi) / 2)
  a = np.concatenate([np.linspace(1.001, 20, 20000), np.linspace(20, 5000, 20000)])
  rdp_curve = steps * a / (2 * z * z)
  canonne = np.min(rdp_curve + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1))
  classic = np.min(rdp_curve + math.log(1 / delta) / (a - 1))
  return lo, float(canonne), float(classic)


@pytest.mark.parametrize("z,steps", [(1.3, 1), (1.3, 10), (1.3, 1000), (0.5, 100), (5.0, 10)])
def test_epsilon_lies_between_the_exact_gaussian_curve_and_the_classic_rdp_bound(z, steps):
  delta = 1e-5
  exact, canonne, classic = _gaussian_epsilon_by_hand(z, steps, delta)
  eps = privacy.spent_epsilon(z, steps, delta)
  assert exact <= eps <= classic
  # The same conversion as by hand, up to the accountant's coarser grid of orders.
  assert canonne - 1e-6 <= eps <= canonne * 1.01


def test_epsilon_edge_cases_and_monotonicity():
  z, delta = 1.3, 1e-5
  eps = [privacy.spent_epsilon(z, s, delta) for s in (1, 10, 100, 1000)]
  assert all(a < b for a, b in zip(eps, eps[1:]))
  assert privacy.spent_epsilon(z, 0, delta) == 0.0
  assert privacy.spent_epsilon(0.0, 5, delta) == math.inf
  # more noise, less epsilon
  assert privacy.spent_epsilon(2.0, 100, delta) < privacy.spent_epsilon(1.0, 100, delta)


def test_calibrate_sigma_hits_the_target():
  target, delta, steps = 3.0, 1e-5, 200
  z = privacy.calibrate_noise_multiplier(target, delta, steps)
  assert privacy.spent_epsilon(z, steps, delta) <= target
  assert privacy.spent_epsilon(z * 0.99, steps, delta) > target  # (nearly) the smallest
  sigma = privacy.calibrate_sigma(target, delta, steps, sensitivity=0.04)
  assert sigma == pytest.approx(0.04 * z, rel=1e-3)
  assert privacy.calibrate_noise_multiplier(math.inf, delta, steps) == 0.0
  with pytest.raises(ValueError, match=r"^privacy\.dp_delta: must be in \(0, 1\)"):
    privacy.calibrate_sigma(1.0, 2.0, 10)


def test_seed_calibration_spends_far_more_than_its_per_step_epsilon():
  """The seed's sigma = lr 2C / (|D_k| eps) against the true per-example-clipping
  sensitivity lr 2C / B gives z = B / (|D_k| eps) per step; composed over all steps the
  spent epsilon exceeds the per-step epsilon by orders of magnitude."""
  rep = privacy.report([60, 120], [600, 600], lr=0.01, clip=2.0, epsilon=5.0, delta=1e-5,
                       batch_size=50, clip_mode="example")
  np.testing.assert_allclose(rep["noise_multiplier"], [50 / (600 * 5.0)] * 2)
  assert rep["epsilon_spent_per_client"][1] > rep["epsilon_spent_per_client"][0] > 5.0
  direct = privacy.spent_epsilon(50 / 3000, 120, 1e-5)
  assert rep["epsilon_spent_max"] == pytest.approx(direct)
  cal = privacy.report([60, 120], [600, 600], lr=0.01, clip=2.0, epsilon=5.0, delta=1e-5,
                       batch_size=50, clip_mode="example",
                       noise_multiplier=privacy.calibrate_noise_multiplier(5.0, 1e-5, 120))
  assert cal["epsilon_spent_max"] <= 5.0


@pytest.mark.parametrize("q,z,steps", [(0.1, 1.0, 100), (0.3, 1.43, 4), (0.01, 0.8, 1000)])
def test_poisson_sampled_epsilon_is_the_sampled_gaussians_rdp_by_hand(q, z, steps):
  """DP-FedAvg's accountant (``sampling_rate`` q < 1): ``steps`` compositions of the
  Poisson-subsampled Gaussian, whose RDP at an integer order a is
  log(sum_k C(a, k) (1 - q)^(a - k) q^k exp((k^2 - k) / (2 z^2))) / (a - 1) (Mironov et
  al. 2019, Sec. 3.3), converted as Canonne et al. 2020 (Prop. 12) at the orders 2..64 and
  80..512, here in log space; q = 1 is the Gaussian alone, and sampling spends less."""
  orders = list(range(2, 65)) + [80, 96, 128, 192, 256, 512]
  best = math.inf
  for a in orders:
    k = np.arange(a + 1)
    log_terms = (special.gammaln(a + 1) - special.gammaln(k + 1) - special.gammaln(a - k + 1)
                 + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z * z))
    rdp = steps * special.logsumexp(log_terms) / (a - 1)
    best = min(best, rdp + math.log((a - 1) / a) - (math.log(1e-5) + math.log(a)) / (a - 1))
  got = privacy.spent_epsilon(z, steps, 1e-5, sampling_rate=q)
  assert got == pytest.approx(max(best, 0.0), rel=1e-6)
  assert got < privacy.spent_epsilon(z, steps, 1e-5)
  assert privacy.spent_epsilon(z, steps, 1e-5, sampling_rate=1.0) == privacy.spent_epsilon(
      z, steps, 1e-5)
  target = privacy.calibrate_noise_multiplier(2.0, 1e-5, steps, sampling_rate=q)
  assert 2.0 * (1 - 1e-3) <= privacy.spent_epsilon(target, steps, 1e-5, q) <= 2.0
