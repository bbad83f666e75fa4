"""Tests of fedjax_async.privacy: flag validation, noise formulas, RDP accounting."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from fedjax_async import privacy


@pytest.mark.parametrize("eps,delta,clip,flag", [
    (0.0, 1e-5, 1.0, "--dp_epsilon"), (-1.0, 1e-5, 1.0, "--dp_epsilon"),
    (float("nan"), 1e-5, 1.0, "--dp_epsilon"), (1.0, 0.0, 1.0, "--dp_delta"),
    (1.0, 1.0, 1.0, "--dp_delta"), (1.0, 1e-5, 0.0, "--dp_clip"),
    (1.0, 1e-5, -2.0, "--dp_clip")])
def test_invalid_privacy_values_name_the_flag(eps, delta, clip, flag):
  with pytest.raises(ValueError, match=flag):
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


def test_epsilon_grows_with_steps_and_matches_dp_accounting():
  z, delta = 1.3, 1e-5
  eps = [privacy.spent_epsilon(z, s, delta) for s in (1, 10, 100, 1000)]
  assert all(a < b for a, b in zip(eps, eps[1:]))
  for s, e in zip((1, 10, 100, 1000), eps):
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), s)
    assert e == pytest.approx(acc.get_epsilon(delta), rel=1e-12)
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
  with pytest.raises(ValueError, match="--dp_delta"):
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
