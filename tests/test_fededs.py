"""FedEDS (fedjax_async.fededs): schedules, stochastic layer, encryptor, KL transfer."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async import checkpoint
from fedjax_async import fededs
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedavg
from fedjax_async.algorithms import fedprox
from fedjax_async.rounds.engine import DeviceData

N, M, B, C, F = 3, 24, 8, 3, 16
SHAPE = (8, 8, 1)
COUNTS = np.array([24, 15, 10], np.int32)


def _toy_data(seed=0):
  """Learnable toy images: class c brightens quadrant c of an 8x8 image (plus noise)."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, C, (N, M)).astype(np.int32)
  x = 0.2 * rng.uniform(size=(N, M) + SHAPE).astype(np.float32)
  for c, (r, q) in enumerate([(0, 0), (0, 4), (4, 0)]):
    x[..., r:r + 4, q:q + 4, :] += 0.7 * (y == c)[..., None, None, None]
  return jnp.asarray(x), jnp.asarray(y)


MODEL = fededs.SplitModel("mlp", C, SHAPE, hidden=F)
CFG = fededs.FedEDSConfig(pretrain_epochs=3, encryptor_epochs=8, batch_size=B,
                          unet_width=4, transfer_batch=8, e_max=3, e_min=1, t_alpha=1,
                          t_beta=3)
ENCRYPTOR = fededs.make_encryptor(SHAPE, width=4)


@pytest.fixture(scope="module")
def generation():
  x, y = _toy_data()
  w0, _, split = MODEL.flat(jax.random.PRNGKey(0))
  layers = fededs.client_stochastic_layers(7, N, F)
  gen = fededs.generate_encrypted(MODEL, ENCRYPTOR, split(w0), layers, x, y,
                                  jnp.asarray(COUNTS), jax.random.PRNGKey(1), CFG)
  return gen, layers, x, y


# ------------------------------------------------------------------- schedules


def test_annealed_epochs_paper_defaults():
  # Eq. 5 with E_max=5, E_min=1, T_alpha=1, T_beta=3:
  #   t=1 (<= T_alpha): 5
  #   t=2: 5 - floor(4 * (2-1) / (3-1)) = 5 - 2 = 3
  #   t=3 (= T_beta): 5 - floor(4 * 2 / 2) = 1
  #   t=4 (> T_beta): E_min = 1
  got = [fededs.annealed_epochs(t, 5, 1, 1, 3) for t in (1, 2, 3, 4, 30)]
  assert got == [5, 3, 1, 1, 1]
  traced = jax.jit(lambda t: fededs.annealed_epochs(t, 5, 1, 1, 3))
  assert [int(traced(t)) for t in (1, 2, 3, 4)] == [5, 3, 1, 1]


def test_annealed_epochs_uneven_floor():
  # E_max=5, E_min=1, T_alpha=2, T_beta=5: t=2 -> 5; t=3 -> 5 - floor(4/3) = 4;
  # t=4 -> 5 - floor(8/3) = 3; t=5 -> 5 - floor(12/3) = 1; t=6 -> 1.
  assert [fededs.annealed_epochs(t, 5, 1, 2, 5) for t in (2, 3, 4, 5, 6)] == [5, 4, 3, 1, 1]


def test_transfer_weights_eqs_9_10():
  # m=3, eps=0.01. t=1: sigmoid(0) = 0.5 each. t=2: lambda_dis = e^-3 / (1 + e^-3)
  # = 0.0497871 / 1.0497871 = 0.0474259. t=3: e^-6 / (1 + e^-6) = 0.0024726 < eps -> (1, 0).
  assert fededs.transfer_weights(1) == (0.5, 0.5)
  lc, ld = fededs.transfer_weights(2)
  assert ld == pytest.approx(0.0474259, abs=1e-6) and lc + ld == pytest.approx(1.0)
  assert fededs.transfer_weights(3) == (1.0, 0.0)


def test_round_hparams_scale_lr_and_schedule():
  base_hp = {"lr": 0.01, "momentum": 0.9, "server_lr": 1.0}
  hp1 = fededs.round_hparams(base_hp, 1, fededs.FedEDSConfig(), anneal=True, share=True)
  assert hp1["local_epochs"] == 5 and hp1["lr"] == pytest.approx(0.005)
  hp_s1 = fededs.round_hparams(base_hp, 1, fededs.FedEDSConfig(), anneal=True, share=False)
  assert hp_s1["fededs_lambda_dis"] == 0.0 and hp_s1["lr"] == 0.01
  hp, sched = fededs.hp_schedule(base_hp, 6, fededs.FedEDSConfig(), anneal=True,
                                 share=True)
  assert hp == hp1
  # engine rounds 0..5 = paper t=1..6: E 5, 5 - floor(4 * 1 / 2) = 3, then E_min = 1;
  # lambda_dis = 1 / (1 + e^{3(t-1)}): 0.5, 0.0474, then 0 (below eps = 0.01)
  np.testing.assert_array_equal(sched["local_epochs"], [5, 3, 1, 1, 1, 1])
  np.testing.assert_allclose(sched["fededs_lambda_dis"], [0.5, 0.0474259, 0, 0, 0, 0],
                             atol=1e-6)
  np.testing.assert_allclose(sched["fededs_lambda_c"] + sched["fededs_lambda_dis"], 1.0)
  np.testing.assert_allclose(sched["lr"], 0.01 * sched["fededs_lambda_c"], rtol=1e-6)
  _, s1 = fededs.hp_schedule(base_hp, 3, fededs.FedEDSConfig(), anneal=False, share=False,
                             fixed_epochs=2)
  np.testing.assert_array_equal(s1["local_epochs"], [2, 2, 2])
  np.testing.assert_array_equal(s1["fededs_lambda_dis"], [0, 0, 0])


def test_equal_work_epochs_total_fededs_epochs_spread_evenly():
  # Paper defaults, T = 10: FedEDS's E_t = 5, 3, 1 x 8 -> 16 epochs; the equal-work
  # baseline runs 16 // 10 = 1 each and one more in 16 % 10 = 6 rounds, where
  # floor(r 6 / 10) steps up (r = 2, 4, 5, 7, 9, 10): 1 2 1 2 2 1 2 1 2 2.
  assert fededs.equal_work_epochs(10, fededs.FedEDSConfig()) == [1, 2, 1, 2, 2, 1, 2, 1, 2, 2]
  # T = 3: 5 + 3 + 1 = 9 -> 3 each.
  assert fededs.equal_work_epochs(3, fededs.FedEDSConfig()) == [3, 3, 3]
  _, sched = fededs.hp_schedule({"lr": 0.01}, 4, fededs.FedEDSConfig(), anneal=False,
                                share=False, fixed_epochs=[2, 1, 2, 1])
  np.testing.assert_array_equal(sched["local_epochs"], [2, 1, 2, 1])


def test_config_validation_names_field():
  with pytest.raises(ValueError, match="t_beta"):
    fededs.FedEDSConfig(t_alpha=3, t_beta=3)


# ------------------------------------------------------------- stochastic layer


def test_stochastic_layer_client_specific_and_seeded():
  a = fededs.client_stochastic_layers(0, 4, F)
  b = fededs.client_stochastic_layers(0, 4, F)
  c = fededs.client_stochastic_layers(1, 4, F)
  np.testing.assert_array_equal(a["gain"], b["gain"])
  np.testing.assert_array_equal(a["bias"], b["bias"])
  for i in range(4):
    for j in range(i + 1, 4):
      assert not np.allclose(a["gain"][i], a["gain"][j])
  assert not np.allclose(a["gain"], c["gain"])


def test_stochastic_layer_forward_formula():
  theta_g, theta_c = MODEL.init(jax.random.PRNGKey(0))
  layer = {"gain": jnp.full((F,), 2.0), "bias": jnp.full((F,), 0.5)}
  x = _toy_data()[0][0, :4]
  h = MODEL.features(theta_g, x)
  expect = MODEL.classify(theta_c, 2.0 * h + 0.5)
  np.testing.assert_allclose(MODEL.forward(theta_g, theta_c, x, layer), expect, rtol=1e-5)
  np.testing.assert_allclose(MODEL.forward(theta_g, theta_c, x),
                             MODEL.classify(theta_c, h), rtol=1e-5)


@pytest.mark.xdist_group("fededs_generation")  # its module fixture computed once
def test_stochastic_layer_frozen_and_not_trainable(generation):
  gen, layers, x, y = generation
  w0, _, split = MODEL.flat(jax.random.PRNGKey(0))
  theta_g, theta_c = split(w0)
  n_gc = sum(a.size for a in jax.tree.leaves((theta_g, theta_c)))
  assert w0.shape == (n_gc,)  # the flat trainable vector holds theta_g, theta_c only
  layer = jax.tree.map(lambda a: a[0], layers)

  def loss(lay):
    logits = MODEL.forward(theta_g, theta_c, x[0], lay)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[jnp.arange(M), y[0]])

  grads = jax.grad(loss)(layer)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))
  # the shared layers after Alg. 1 are bit-identical to the ones drawn before it
  for k in ("gain", "bias"):
    np.testing.assert_array_equal(gen.shared.layers[k], layers[k])
  # and the layer really changes the output (it is not a no-op)
  assert not np.allclose(MODEL.forward(theta_g, theta_c, x[0], layer),
                         MODEL.forward(theta_g, theta_c, x[0]))


# ------------------------------------------------------------------- Alg. 1


@pytest.mark.xdist_group("fededs_generation")  # its module fixture computed once
def test_encryptor_training_lowers_loss(generation):
  gen, _, x, _ = generation
  enc = np.asarray(gen.encryptor_loss)
  assert enc.shape == (N, CFG.encryptor_epochs)
  assert np.all(enc[:, -1] < enc[:, 0]), enc
  pre = np.asarray(gen.pretrain_loss)
  assert np.all(pre[:, -1] < pre[:, 0]), pre
  s = gen.shared
  assert s.x.shape == x.shape and s.soft.shape == (N, M, C)
  np.testing.assert_allclose(np.asarray(s.soft).sum(-1), 1.0, rtol=1e-5)
  assert float(s.x.min()) >= 0.0 and float(s.x.max()) <= 1.0  # sigmoid image range
  np.testing.assert_array_equal(s.counts, COUNTS)


@pytest.mark.xdist_group("fededs_generation")  # its module fixture computed once
def test_soft_labels_use_own_layer(generation):
  gen, layers, _, _ = generation
  k = 1
  theta = jax.tree.map(lambda a: a[k], gen.theta)
  layer = jax.tree.map(lambda a: a[k], layers)
  logits = MODEL.forward(theta[0], theta[1], gen.shared.x[k, :5], layer)
  np.testing.assert_allclose(gen.shared.soft[k, :5], jax.nn.softmax(logits, -1), rtol=1e-4,
                             atol=1e-6)


# ----------------------------------------------------------------- transfer


def test_kl_hand_computed():
  # p = [0.7, 0.2, 0.1], q = [0.5, 0.3, 0.2]:
  # KL = 0.7 ln(1.4) + 0.2 ln(2/3) + 0.1 ln(0.5)
  #    = 0.7 * 0.336472 - 0.2 * 0.405465 - 0.1 * 0.693147 = 0.085121
  # p = [0.5, 0.5, 0], q = [0.25, 0.25, 0.5]: KL = 2 * 0.5 ln 2 = 0.693147 (0 ln 0 = 0)
  p = jnp.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]])) + 3.0  # shift-invariant
  assert float(fededs.kl_soft(p[:1], logits[:1])) == pytest.approx(0.085121, abs=1e-5)
  assert float(fededs.kl_soft(p[1:], logits[1:])) == pytest.approx(0.693147, abs=1e-5)
  assert float(fededs.kl_soft(p, logits)) == pytest.approx((0.085121 + 0.693147) / 2,
                                                           abs=1e-5)
  assert float(fededs.kl_soft(p, logits, jnp.array([True, False]))) == pytest.approx(
      0.085121, abs=1e-5)


def test_sample_sender_excludes_own_and_is_uniform():
  keys = jax.random.split(jax.random.PRNGKey(0), 3000)
  draws = np.asarray(jax.vmap(lambda k: fededs.sample_sender(k, 1, 4))(keys))
  assert 1 not in draws
  freq = np.bincount(draws, minlength=4)[[0, 2, 3]] / len(draws)
  np.testing.assert_allclose(freq, 1 / 3, atol=0.04)


def _two_client_shared():
  """Client 1 shares one encrypted row (counts=1), so every draw picks that row."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.uniform(size=(2, 4) + SHAPE).astype(np.float32))
  soft = jnp.asarray(np.array([[[1 / 3] * 3] * 4, [[0.6, 0.3, 0.1]] * 4], np.float32))
  layers = fededs.client_stochastic_layers(5, 2, F)
  return fededs.SharedData(x, soft, jnp.array([4, 1], jnp.int32), layers)


def test_transfer_uses_sender_layer():
  shared = _two_client_shared()
  w0, _, split = MODEL.flat(jax.random.PRNGKey(2))
  alg = fededs.wrap(fedavg.ALGORITHM, MODEL, split, shared, batch=6)
  cs = {fededs.ID_KEY: fededs.client_id_rows(2, w0.shape[0])[0]}  # client 0
  hp = {"fededs_lambda_c": 0.5, "fededs_lambda_dis": 0.5, "weight_decay": 0.0}
  pen = float(alg.local_penalty(w0, w0, cs, hp))
  # by hand: i* must be client 1, every row is its row 0, penalty = (0.5 KL) / 0.5 = KL
  theta_g, theta_c = split(w0)
  p = np.array([0.6, 0.3, 0.1])

  def manual(layer):
    logits = np.asarray(MODEL.forward(theta_g, theta_c, shared.x[1, :1], layer))[0]
    logq = logits - np.log(np.sum(np.exp(logits)))
    return float(np.sum(p * (np.log(p) - logq)))

  sender = jax.tree.map(lambda a: a[1], shared.layers)
  own = jax.tree.map(lambda a: a[0], shared.layers)
  assert pen == pytest.approx(manual(sender), rel=1e-4)
  assert abs(manual(own) - manual(sender)) > 1e-3  # the layer matters...
  swapped = shared._replace(layers=jax.tree.map(lambda a: a[::-1], shared.layers))
  alg_sw = fededs.wrap(fedavg.ALGORITHM, MODEL, split, swapped, batch=6)
  # ...and swapping the layers gives the loss with the (now) sender's = own layer
  assert float(alg_sw.local_penalty(w0, w0, cs, hp)) == pytest.approx(manual(own), rel=1e-4)


def test_transfer_excludes_own_encrypted_data():
  shared = _two_client_shared()
  shared3 = fededs.SharedData(
      jnp.concatenate([shared.x, shared.x[:1]]), jnp.concatenate([shared.soft, shared.soft[:1]]),
      jnp.array([4, 1, 4], jnp.int32), fededs.client_stochastic_layers(5, 3, F))
  poisoned = shared3._replace(x=shared3.x.at[2].set(jnp.nan))  # client 2's own data
  w0, _, split = MODEL.flat(jax.random.PRNGKey(2))
  hp = {"fededs_lambda_c": 1.0, "fededs_lambda_dis": 1.0}
  ids = fededs.client_id_rows(3, w0.shape[0])
  for mode in ("sample", "all"):
    alg = fededs.wrap(fedavg.ALGORITHM, MODEL, split, poisoned, batch=4, mode=mode)
    penalty = jax.jit(alg.local_penalty)  # compiled once, not op by op
    for step in range(5):  # several parameter vectors -> several step keys
      w = w0 + 0.01 * step
      assert np.isfinite(float(penalty(w, w0, {fededs.ID_KEY: ids[2]}, hp)))
    # client 0 in "all" mode sums over senders 1 and 2, so it sees the poison
    if mode == "all":
      assert np.isnan(float(penalty(w0, w0, {fededs.ID_KEY: ids[0]}, hp)))


def test_penalty_scaling_with_fedprox_and_weight_decay():
  # no shared data: pen = (mu/2 ||w - w_s||^2 + wd/2 ||w||^2) / lambda_c
  # w = [1, 2], w_s = 0, mu = 0.1, wd = 0.5, lambda_c = 0.5:
  #   (0.05 * 5 + 0.25 * 5) / 0.5 = (0.25 + 1.25) / 0.5 = 3.0
  alg = fededs.wrap(fedprox.ALGORITHM)
  w = jnp.array([1.0, 2.0])
  hp = {"mu": 0.1, "weight_decay": 0.5, "fededs_lambda_c": 0.5, "fededs_lambda_dis": 0.5}
  cs = alg.init_client_state(w)
  assert set(cs) == {fededs.ID_KEY}
  assert float(alg.local_penalty(w, jnp.zeros(2), cs, hp)) == pytest.approx(3.0)


@pytest.mark.xdist_group("fededs_generation")  # its module fixture computed once
def test_run_engine_annealing_and_transfer(generation, tmp_path):
  gen, _, x, y = generation
  w0, apply_flat, split = MODEL.flat(jax.random.PRNGKey(0))
  data = DeviceData(x, y, jnp.asarray(COUNTS), x[0], y[0])
  tl = timeline_lib.build(N, 4, 1.0, timeline_lib.DelayConfig(0.0, max_delay=1), seed=0)
  alg = fededs.wrap(fedavg.ALGORITHM, MODEL, split, gen.shared, batch=8)
  base_hp = {"lr": 0.05, "momentum": 0.9, **base.server_hparams(1.0), "weight_decay": 1e-4}
  mid = []  # the state after round 2, as a checkpoint stores it
  state, rows = fededs.run(apply_flat, alg, w0, data, tl, base_hp, CFG, anneal=True,
                           share=True, rounds_per_call=2,
                           on_chunk=lambda st, r: mid.append((jax.device_get(st),
                                                              [dict(x) for x in r])))
  # E_t with E_max=3, E_min=1, T_alpha=1, T_beta=3: t=1 -> 3, t=2 -> 3 - floor(2/2) = 2,
  # t=3, 4 -> 1. Steps per epoch ceil(n/8) = 3, 2, 2 -> 7 over the three clients.
  assert [r["local_epochs"] for r in rows] == [3, 2, 1, 1]
  assert [r["client_steps"] for r in rows] == [21, 14, 7, 7]
  assert rows[0]["lambda_dis"] == 0.5 and rows[2]["lambda_dis"] == 0.0
  assert all(np.isfinite(r["train_loss"]) for r in rows)
  np.testing.assert_array_equal(state.client_state[fededs.ID_KEY],
                                fededs.client_id_rows(N, w0.shape[0]))
  assert rows[-1]["test_accuracy"] > 1 / C  # learns the toy task
  # the rows an on_chunk sees (and a checkpoint stores) carry E_t and lambda_dis already
  assert [r["local_epochs"] for r in mid[0][1]] == [3, 2]
  # Resumed from a checkpoint of round 2 (orbax round trip into init_state's structure),
  # rounds 3-4 are the uninterrupted run's: same E_t, same draws, same model.
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save(2, mid[0][0], mid[0][1], {"run": "toy"})
  restored = ckpt.restore(fededs.init_state(alg, w0, N))
  ckpt.close()
  assert restored.round == 2 and [r["round"] for r in restored.rows] == [1, 2]
  state2, rows2 = fededs.run(apply_flat, alg, w0, data, tl, base_hp, CFG, anneal=True,
                             share=True, rounds_per_call=2,
                             state=jax.tree.map(jnp.asarray, restored.state))
  assert [r["round"] for r in rows2] == [3, 4]
  for a, b in zip(rows[2:], rows2):
    assert (a["local_epochs"], a["client_steps"]) == (b["local_epochs"], b["client_steps"])
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1e-6)
  np.testing.assert_allclose(state2.w, state.w, rtol=1e-5, atol=1e-6)


def test_equal_work_baseline_takes_fededs_local_steps():
  """CFG's E_t over 4 rounds: 3, 2, 1, 1 = 7 epochs; the equal-work schedule 1, 2, 2, 2
  (7 // 4 = 1, +1 in 3 rounds); with ceil(n / 8) = 3, 2, 2 steps per epoch, both take
  7 x 7 = 49 client steps in all."""
  x, y = _toy_data()
  w0, apply_flat, _ = MODEL.flat(jax.random.PRNGKey(0))
  data = DeviceData(x, y, jnp.asarray(COUNTS), x[0], y[0])
  tl = timeline_lib.build(N, 4, 1.0, timeline_lib.DelayConfig(0.0, max_delay=1), seed=0)
  alg = fededs.wrap(fedavg.ALGORITHM)
  hp = {"lr": 0.05, "momentum": 0.9, **base.server_hparams(1.0), "weight_decay": 1e-4}
  equal = fededs.equal_work_epochs(4, CFG)
  assert equal == [1, 2, 2, 2]
  _, rows = fededs.run(apply_flat, alg, w0, data, tl, hp, CFG, anneal=False, share=False,
                       fixed_epochs=equal, rounds_per_call=4)
  assert [r["client_steps"] for r in rows] == [7, 14, 14, 14]
  assert sum(r["client_steps"] for r in rows) == 21 + 14 + 7 + 7


def test_shared_set_utility_measures_what_the_labels_teach():
  """Trained on correctly labelled rows (one-hot soft labels, identity layers) the toy
  task is learnt (> 0.9 on held-out rows); on the same rows with uniform soft labels
  (an encryptor at chance) it is not (chance is 1/3)."""
  x, y = _toy_data()
  tx, ty = _toy_data(seed=5)
  tx, ty = tx.reshape((-1,) + SHAPE), ty.reshape(-1)
  w0, _, split = MODEL.flat(jax.random.PRNGKey(0))
  identity = {"gain": jnp.ones((N, F)), "bias": jnp.zeros((N, F))}
  cfg = fededs.FedEDSConfig(batch_size=B, lr=0.05)
  good = fededs.SharedData(x, jax.nn.one_hot(y, C), jnp.asarray(COUNTS), identity)
  acc = fededs.shared_set_utility(MODEL, good, split(w0), tx, ty, jax.random.PRNGKey(0),
                                  cfg, epochs=20)
  assert acc > 0.9
  flat = good._replace(soft=jnp.full((N, M, C), 1.0 / C))
  cfg0 = fededs.FedEDSConfig(batch_size=B, lr=0.05, weight_decay=0.0)
  chance = fededs.shared_set_utility(MODEL, flat, split(w0), tx, ty, jax.random.PRNGKey(0),
                                     cfg0, epochs=20)
  assert chance < 0.6


# ------------------------------------------------------------------- privacy


def test_psnr_ssim_hand_values():
  a = np.full((1, 12, 12, 1), 0.2)
  assert fededs.psnr(a, a + 0.1) == pytest.approx(20.0)  # 10 log10(1 / 0.01)
  assert fededs.psnr(a, a) == math.inf
  rng = np.random.default_rng(0)
  img = rng.uniform(size=(2, 16, 16, 1))
  assert fededs.ssim(img, img) == pytest.approx(1.0)
  # constant images 0.2 vs 0.6: variances 0, so SSIM = (2*0.2*0.6 + C1) / (0.04 + 0.36 + C1)
  # with C1 = 1e-4: 0.2401 / 0.4001 = 0.600100
  assert fededs.ssim(a, np.full_like(a, 0.6)) == pytest.approx(0.2401 / 0.4001, rel=1e-6)
  assert fededs.ssim(img, 1.0 - img) < 0.0  # anti-correlated structure


@pytest.mark.xdist_group("fededs_generation")  # its module fixture computed once
def test_privacy_report_and_grid(generation, tmp_path):
  gen, _, x, _ = generation
  rep = fededs.privacy_report(x[0, :4], gen.shared.x[0, :4], x[0, :4])
  assert rep["ssim_without_layer"] == pytest.approx(1.0)
  assert rep["psnr_with_layer"] < 40.0
  path = os.path.join(tmp_path, "grid.png")
  fededs.save_encryption_grid(x[0, :4], gen.shared.x[0, :4], path, x[0, :4])
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_resnet18_split_model_is_the_paper_model_without_batch_norm():
  # Shapes only: jax.eval_shape traces init and forward without running them (running the
  # 11M-parameter ResNet op by op cost ~50 s on 2 CPU cores and checked nothing more).
  model = fededs.SplitModel("resnet18", 10, (28, 28, 1))
  theta_g, theta_c = jax.eval_shape(model.init, jax.random.key(0))
  names = " ".join(jax.tree_util.keystr(p) for p, _ in
                   jax.tree_util.tree_flatten_with_path(theta_g)[0])
  assert "layer4_1" in names and "norm" not in names.lower()  # no normalisation layers
  # Convs without bias or norm, counted by hand: stem 3*3*1*64 = 576; layer1 4 * 3*3*64*64
  # = 147,456; layer2 3*3*64*128 + 3*3*128*128 * 3 + 64*128 (shortcut) = 524,288; layer3
  # 2,097,152 and layer4 8,388,608 likewise; head 512*10 + 10 = 5,130
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves((theta_g, theta_c)))
  assert n_params == 576 + 147_456 + 524_288 + 2_097_152 + 8_388_608 + 5_130
  x = jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)
  assert jax.eval_shape(model.features, theta_g, x).shape == (2, 512)
  assert jax.eval_shape(model.forward, theta_g, theta_c, x).shape == (2, 10)
  with pytest.raises(ValueError, match="512"):
    fededs.SplitModel("resnet18", 10, (28, 28, 1), hidden=64)
