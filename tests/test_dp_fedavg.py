"""DP-FedAvg (McMahan et al. 2018, Alg. 1) and adaptive clipping (Andrew et al. 2021) on
the round engine, against a numpy FedAvg with clipping, the noise it adds, dp-accounting
called here, and hand-computed clip-norm steps.

The engine runs a softmax regression on 12 clients (6 sampled a round, 30% of them delayed
1-2 rounds, so a round's arrivals differ from the expected m = 6) with full-batch local
steps (batch size >= every client's examples: the minibatch order cannot matter), 12
rounds, 3 per call; two compiled programs (one vmap, chunks of 4), shared by the runs.
"""

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_async as fa
from fedjax_async import config
from fedjax_async.algorithms import base
from fedjax_async.algorithms import dp_fedavg
from fedjax_async.algorithms import fedprox
from fedjax_async.algorithms import server_optimizers as so
from fedjax_async.core import client as client_lib
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.rounds import engine

N, M, D, C, ROUNDS, EPOCHS = 12, 16, 100, 3, 12, 2
PARAMS = D * C + C
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, M, D)).astype(np.float32)
Y = RNG.integers(0, C, (N, M)).astype(np.int32)
COUNTS = RNG.integers(4, M + 1, N).astype(np.int32)
W0 = RNG.normal(scale=0.1, size=PARAMS).astype(np.float32)
TL = timeline_lib.build(N, ROUNDS, 0.5, timeline_lib.DelayConfig(0.3, "uniform", 2), seed=3)
MEAN_CLIENTS = 6  # m = 0.5 * 12
CLIP_NORM = 1.1  # C: the deltas' norms are 0.7-1.6


def apply_flat(w, xb, train=False, rng=None):
  del train, rng
  return xb @ w[:D * C].reshape(D, C) + w[D * C:]


def run(chunk=None, lr=0.5, alg=None, **dp):
  """The final model and rows of a 12-round run of dp_fedavg (``alg``: another private
  rule; ``dp``: its flags)."""
  cfg = config.RunConfig().replace(algorithm="dp_fedavg", participation=0.5,
                                   rounds=ROUNDS, seed=7, **dp)
  alg = alg or fa.algorithms.get("dp_fedavg")
  hp = dict(cfg.hparams(alg, N), lr=lr, momentum=0.0)
  ecfg = engine.EngineConfig(client_lib.LocalConfig(M, EPOCHS, M, momentum=False),
                             ring_size=3, eval_batch=8, client_chunk=chunk)
  data = engine.DeviceData(*map(jnp.asarray, (X, Y, COUNTS, X[0, :8], Y[0, :8])))
  state = engine.init_state(alg, W0, N, 3, 7)
  state, rows = engine.run_rounds(engine.make_runner(apply_flat, alg, ecfg), state, TL, hp,
                                  data, rounds_per_call=3)
  return np.asarray(state.w), rows


def numpy_clipped_fedavg(clip, lr=0.5, mu=0.0):
  """FedAvg with each delta clipped to ``clip``, summed over a round's arrivals (each from
  the model of its dispatch round) and divided by m, in float64: (models, norms)."""
  history = [W0.astype(np.float64)]
  norms = []
  for t in range(ROUNDS):
    total = np.zeros(PARAMS)
    for k in np.flatnonzero(TL.valid[t]):
      c, start = TL.client[t, k], history[TL.dispatch[t, k]]
      n = COUNTS[c]
      x, onehot = X[c, :n].astype(np.float64), np.eye(C)[Y[c, :n]]
      w = start.copy()
      for _ in range(EPOCHS):  # one full-batch step an epoch
        W, b = w[:D * C].reshape(D, C), w[D * C:]
        logits = x @ W + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = np.concatenate([(x.T @ (p - onehot) / n).ravel(), (p - onehot).mean(0)])
        w = w - lr * (g + mu * (w - start))
      delta = w - start
      norms.append(np.linalg.norm(delta))
      total += delta * min(1.0, clip / np.linalg.norm(delta))
    history.append(history[-1] + total / MEAN_CLIENTS)
  return history[-1], np.array(norms)


@pytest.fixture(scope="module")
def runs():
  """The engine's runs, by name: noise-free and noisy, one vmap and chunks of 4."""
  out = {}
  for chunk in (None, 4):
    out["free", chunk] = run(chunk, dp_update_clip=CLIP_NORM)
    out["noisy", chunk] = run(chunk, dp_update_clip=CLIP_NORM, dp_noise_multiplier=0.7)
    out["zero", chunk] = run(chunk, lr=0.0, dp_update_clip=CLIP_NORM, dp_noise_multiplier=0.7)
  out["prox"] = run(None, alg=dp_fedavg.private(fedprox.ALGORITHM, name="dp_fedprox"),
                    dp_update_clip=CLIP_NORM, mu=0.5)
  return out


def test_noise_free_dp_fedavg_is_numpy_clipped_fedavg(runs):
  """z = 0: FedAvg with each delta clipped to C and the fixed denominator m, to float32
  accuracy (rtol 2e-5 over 12 rounds), FedAvg's clients and FedProx's (mu = 0.5)."""
  want, norms = numpy_clipped_fedavg(CLIP_NORM)
  assert (norms > CLIP_NORM).any() and (norms < CLIP_NORM).any()  # some clipped, some not
  assert any(TL.valid[t].sum() != MEAN_CLIENTS for t in range(ROUNDS))  # m is no count
  np.testing.assert_allclose(runs["free", None][0], want, rtol=2e-5, atol=2e-6)
  prox, _ = numpy_clipped_fedavg(CLIP_NORM, mu=0.5)
  np.testing.assert_allclose(runs["prox"][0], prox, rtol=2e-5, atol=2e-6)
  assert not np.allclose(prox, want, atol=1e-4)
  assert [r["dp_update_clip"] for r in runs["free", None][1]] == [pytest.approx(CLIP_NORM)] * ROUNDS


def test_chunks_give_the_same_model_and_the_same_noise(runs):
  """Chunks of 4 of a round's clients: the sums in another order, the noise drawn once a
  round from the same key."""
  for kind in ("free", "noisy", "zero"):
    np.testing.assert_allclose(runs[kind, 4][0], runs[kind, None][0], rtol=1e-5, atol=1e-6)
  assert not np.allclose(runs["noisy", None][0], runs["free", None][0], atol=1e-3)


def test_the_noise_added_has_std_z_c_over_m(runs):
  """Zero updates (local lr 0): each round's step w_{t+1} - w_t is the noise
  N(0, (z C)^2 I) / m alone. Its std, from the 12 steps' norms (12 x 303 = 3636 draws: a
  1.2% standard error), is z C / m = 0.7 * 1.1 / 6 within 4%, with one vmap and in
  chunks (where the noise is still drawn once a round); its mean is 0."""
  want = 0.7 * CLIP_NORM / MEAN_CLIENTS
  for chunk in (None, 4):
    w, rows = runs["zero", chunk]
    steps = np.array([r["server_step_norm"] for r in rows])
    std = math.sqrt(np.mean(steps ** 2) / PARAMS)
    assert abs(std / want - 1) < 0.04, (chunk, std, want)
    drift = (w - W0) / math.sqrt(ROUNDS)  # the sum of 12 draws a coordinate
    assert abs(drift.mean()) < 4 * want / math.sqrt(PARAMS), chunk


def _server_round(alg, w, state, uploads, round_index, **hp):
  """One round of ``alg``'s server on the given uploads (all valid)."""
  k = len(uploads)
  one = jnp.ones(k, bool)
  arrivals = base.Arrivals(one, one, ~one, jnp.zeros(k, jnp.int32), jnp.ones(k), jnp.ones(k),
                           None)
  full = dict(server_lr=1.0, dp_update_clip=1.0, dp_noise_multiplier=0.0, dp_quantile=0.0,
              dp_clip_lr=0.2, dp_count_noise=0.05, dp_clients_per_round=float(k), dp_seed=0.0)
  full.update(hp)
  return alg.server_update(w, state, jnp.asarray(uploads, jnp.float32), arrivals,
                           jnp.int32(round_index), base.with_defaults(alg, full))


def test_adaptive_clip_moves_to_the_quantile_of_hand_built_norms():
  """Ten updates along e_1 of norms 1..10, C_0 = 4, eta_C = 0.2, the count's noise ~0:
  gamma = 0.5 sees b~ = 0.4 (1-4 <= C), so C_t = 4 e^{0.02 t} until 5 of 10 are <= C
  (t = 12: C = 4 e^{0.24} = 5.085), then stays; the step of round 1 is
  (1 + 2 + 3 + 4 + 6 * 4) / 10 = 3.4. gamma = 0.2 falls to below 3 by the paper's
  C <- C exp(-eta_C (b~ - gamma)), counted here in numpy."""
  alg = dp_fedavg.ALGORITHM
  uploads = np.outer(np.arange(1.0, 11.0), [1.0, 0.0])
  for gamma in (0.5, 0.2):
    w, state = jnp.zeros(2), alg.init_server_state(jnp.zeros(2))
    clips, want, c = [], [], 4.0
    for t in range(30):
      new_w, state, metrics = _server_round(alg, w, state, uploads, t, dp_update_clip=4.0,
                                            dp_quantile=gamma, dp_count_noise=1e-9)
      if t == 0 and gamma == 0.5:
        np.testing.assert_allclose(np.asarray(new_w), [3.4, 0.0], rtol=1e-6)
      w = new_w
      clips.append(float(metrics["dp_update_clip"]))
      want.append(c)
      c *= math.exp(-0.2 * (np.mean(np.arange(1, 11) <= c) - gamma))
    np.testing.assert_allclose(clips, want, rtol=1e-5)
    if gamma == 0.5:
      assert clips[11] < 5 < clips[12] == pytest.approx(4 * math.exp(0.24), rel=1e-5)
      assert clips[-1] == pytest.approx(clips[12], rel=1e-5)
    else:
      assert 2 < clips[-1] < 3


def test_adaptive_noise_multiplier_is_andrew_et_al_z_delta():
  """z_D = (z^-2 - (2 sigma_b)^-2)^-1/2: z = 1, sigma_b = 0.05 * 20 = 1 -> 1 / sqrt(0.75);
  a fixed clip keeps z."""
  hp = dict(dp_noise_multiplier=1.0, dp_count_noise=0.05, dp_clients_per_round=20.0,
            dp_quantile=0.5)
  assert float(dp_fedavg.update_noise_multiplier(hp)) == pytest.approx(1 / math.sqrt(0.75))
  assert float(dp_fedavg.update_noise_multiplier(dict(hp, dp_quantile=0.0))) == 1.0


def test_a_server_optimizer_steps_on_the_clipped_mean():
  """FedAvgM (beta 0.5, eta 0.1) on DP-FedAvg's step: uploads (3, 4) and (0.3, 0.4)
  clipped to C = 1 are (0.6, 0.8) and (0.3, 0.4), their sum over m = 2 is s = (0.45, 0.6);
  v_1 = s, v_2 = 1.5 s, so w_2 = w_0 + 0.1 (1 + 1.5) s."""
  alg = so.with_server_optimizer(dp_fedavg.ALGORITHM, optax.trace(0.5))
  w = jnp.zeros(2)
  state = alg.init_server_state(w)
  for t in range(2):
    w, state, _ = _server_round(alg, w, state, [[3.0, 4.0], [0.3, 0.4]], t, server_lr=0.1)
  np.testing.assert_allclose(np.asarray(w), 0.25 * np.array([0.45, 0.6]), rtol=1e-6)


# dp-accounting's RDP accountant at the integer orders 2..64 and 80..512, called here.
ORDERS = list(range(2, 65)) + [80, 96, 128, 192, 256, 512]


def test_a_run_at_a_target_epsilon_spends_it(capsys):
  """simulate(dp_epsilon=2): z calibrated over 4 rounds at q = 3 / 10; summary.json's
  privacy block spends 2 within the bisection's rounding (<= 2, 0.1% under at most), the
  same epsilon dp-accounting gives for that z, and the console says so."""
  out = fa.simulate(algorithm="dp_fedavg", num_clients=10, participation=0.3, rounds=4,
                    local_epochs=1, delay_fraction=0.0, dp_epsilon=2.0, dp_delta=1e-5,
                    output_dir=None)
  block = out.runs["dp_fedavg"].summary["privacy"]
  assert block["sampling_rate"] == 0.3 and block["rounds"] == 4
  assert 2.0 * (1 - 1e-3) <= block["epsilon_spent"] <= 2.0
  import dp_accounting  # pylint: disable=g-import-not-at-top
  acc = dp_accounting.rdp.RdpAccountant(ORDERS)
  acc.compose(dp_accounting.PoissonSampledDpEvent(
      0.3, dp_accounting.GaussianDpEvent(block["noise_multiplier"])), 4)
  assert block["epsilon_spent"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  assert f"epsilon {block['epsilon_spent']:.4g}" in capsys.readouterr().err


def test_a_sweep_over_epsilon_reports_each_run_s_epsilon_spent():
  """simulate(sweep={"dp_epsilon": [1, 4]}, seeds=[0, 1]): one vmapped computation whose
  four summaries each carry the privacy block a single run's summary has, each spending
  its own target (within the bisection's 0.1%) at the noise dp-accounting gives it."""
  out = fa.simulate(algorithm="dp_fedavg", num_clients=10, participation=0.3, rounds=4,
                    local_epochs=1, delay_fraction=0.0, dp_delta=1e-5, seeds=[0, 1],
                    sweep={"dp_epsilon": [1.0, 4.0]}, quiet=True)
  assert len(out.runs) == 4
  import dp_accounting  # pylint: disable=g-import-not-at-top
  for run_ in out.runs.values():
    block = run_.summary["privacy"]
    target = block["epsilon_target"]
    assert target in (1.0, 4.0) and block["rounds"] == 4
    assert target * (1 - 1e-3) <= block["epsilon_spent"] <= target
    acc = dp_accounting.rdp.RdpAccountant(ORDERS)
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        0.3, dp_accounting.GaussianDpEvent(block["noise_multiplier"])), 4)
    assert block["epsilon_spent"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_wrong_dp_settings_are_one_line_errors_naming_the_flag():
  cfg = config.RunConfig().replace(algorithm="dp_fedavg")
  with pytest.raises(config.ConfigError, match=r"^algorithm\.dp_noise_multiplier: give it "
                     r"or a finite algorithm\.dp_epsilon, not both"):
    config.validate(cfg.replace(dp_noise_multiplier=1.0, dp_epsilon=1.0))
  with pytest.raises(config.ConfigError, match=r"^algorithm\.dp_epsilon: must be in "):
    config.validate(cfg.replace(dp_epsilon=0.0))
  config.validate(cfg.replace(dp_epsilon=math.inf))
  adaptive = cfg.replace(dp_quantile=0.5, dp_noise_multiplier=2.0)  # 2 sigma_b = 1 here
  with pytest.raises(ValueError, match=r"^algorithm\.dp_count_noise: an adaptive clip needs "
                     r"2 sigma_b = 1 > z = 2 .* set it above 0\.1$"):
    adaptive.hparams(fa.algorithms.get("dp_fedavg"))
  with pytest.raises(ValueError, match="upload w_end - w_start"):
    dp_fedavg.private(fa.algorithms.get("fednova"))
