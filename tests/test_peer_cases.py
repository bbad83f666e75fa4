"""The peers' own unit tests, run on this project: each case builds the fixture of a test
of google/fedjax, adap/flower, apple/pfl-research, facebookresearch/FLSim or
tensorflow/federated (TFF) through this project's public API and asserts the PEER's
expected numbers. Where a convention differs, the case sets the option that gives the
peer's form (docs/api.md, "Conventions beside the peers'").

Sources (file::test at the commit read): fedjax c57ee19, Flower fdef7af, pfl-research
c9d1f32, FLSim 7311f2d, TFF 19114c5.

A peer's toy loss L(w; batch) is a flax model whose cross-entropy equals it
(``ToyLoss``): logits [-c, log(1 - e^-c)] with label 0 give CE = c exactly, and its
gradient is dc. Where the peer feeds hand-made minibatches, each of our examples holds
one of the peer's batches (batch_size=1): our shuffle then only permutes steps whose
order does not change the result.
"""

from math import log10, sqrt

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedasync
from fedjax_async.algorithms import fedavg
from fedjax_async.algorithms import fedbuff
from fedjax_async.algorithms import server_optimizers as so
from fedjax_async.asynchronous import config as async_config


# ------------------------------------------------------------------------------ helpers

def logits_of_loss(c):
  """Two logits whose softmax cross-entropy for label 0 is c (c > 0)."""
  c = jnp.maximum(c, 1e-6)
  return jnp.stack([-c, jnp.log(-jnp.expm1(-c))], -1)


class ToyLoss(nn.Module):
  """Parameters ``w`` [d] starting at ``w0``; per-example loss ``loss(w, x)`` as its CE."""
  w0: tuple
  loss: object

  @nn.compact
  def __call__(self, x, train: bool = False):
    w = self.param("w", lambda key, shape: jnp.asarray(self.w0, jnp.float32),
                   (len(self.w0),))
    return logits_of_loss(self.loss(w, x))


def clients_data(xs, num_classes=2):
  """``fa.data.from_clients`` of per-client feature rows, label 0, test = client 0."""
  pairs = [(np.asarray(x, np.float32), np.zeros(len(x), np.int32)) for x in xs]
  return fa.data.from_clients(pairs, pairs[0], num_classes=num_classes)


def one_round(algorithm, data, model, **fields):
  """One round, every client sampled, none delayed, plain local SGD: the Result."""
  kw = dict(rounds=1, participation=1.0, delay_fraction=0.0, momentum=0.0, quiet=True)
  kw.update(fields)
  return fa.simulate(algorithm=algorithm, data=data, model=model, **kw)


def one_run(algorithm, data, model, **fields):
  """``one_round``'s run."""
  return one_round(algorithm, data, model, **fields).runs[algorithm]


def arrivals(num_examples, staleness=None):
  """The round rules' ``Arrivals`` of valid, online clients with these example counts."""
  n = jnp.asarray(num_examples, jnp.float32)
  k = n.shape[0]
  stale = jnp.zeros(k, jnp.int32) if staleness is None else jnp.asarray(staleness, jnp.int32)
  return base.Arrivals(valid=jnp.ones(k, bool), online=stale == 0, delayed=stale > 0,
                       staleness=stale, num_examples=n, num_steps=jnp.ones(k, jnp.float32),
                       start_params=None)


def arrival(num_examples=1.0, staleness=0, flush=True, d=1):
  """One virtual-clock ``Arrival``."""
  return base.Arrival(valid=jnp.bool_(True), staleness=jnp.int32(staleness),
                      flush=jnp.bool_(flush), w_start=jnp.zeros(d), mask=jnp.ones(d),
                      num_examples=jnp.float32(num_examples), num_steps=jnp.float32(1))


def weighting(name):
  """``hp['client_weighting']``'s code of ``name``."""
  return float(base.CLIENT_WEIGHTINGS.index(name))


SERVER_HP = base.server_hparams(1.0)  # (client weighting auto)


def server_rounds(w0, uploads_per_round, num_examples, tx=None, server_lr=1.0, hp=None):
  """FedAvg's server rule (with ``tx``, a server optimiser) fed the given deltas; the model
  after each round."""
  alg = fedavg.ALGORITHM if tx is None else so.with_server_optimizer(fedavg.ALGORITHM, tx)
  w = jnp.asarray(w0, jnp.float32)
  state = alg.init_server_state(w)
  h = dict(SERVER_HP, server_lr=server_lr, server_lr2=server_lr, **(hp or {}))
  out = []
  for t, uploads in enumerate(uploads_per_round):
    ups = uploads(w) if callable(uploads) else jnp.asarray(uploads, jnp.float32)
    w, state, _ = alg.server_update(w, state, ups, arrivals(num_examples), t, h)
    out.append(np.asarray(w))
  return out


# ------------------------------------------------------------------------------ fedjax

def fedjax_shuffle_repeat_batch(n, batch_size, num_epochs, seed):
  """fedjax.core.client_datasets.ShuffleRepeatBatchView's example indices, batch by batch
  (np.random.RandomState(seed).shuffle per pass; a last batch filled from the next)."""
  buf, i, rng = np.arange(n), n, np.random.RandomState(seed)
  out = []
  for _ in range((n * num_epochs + batch_size - 1) // batch_size):
    idx = []
    while len(idx) < batch_size:
      if i == n:
        rng.shuffle(buf)
        i = 0
      used = min(n - i, batch_size - len(idx))
      idx += list(buf[i:i + used])
      i += used
    out.append(idx)
  return out


def fedjax_grad_fn_loss(w, x):
  """fedjax's test grad_fn (params / sum(batch['x'])) as a loss: 0.5 ||w||^2 / sum(batch);
  x = the batch's values, then 1 (a real batch) or 0 (a row of zero gradient)."""
  real = x[:, -1] > 0
  total = jnp.where(real, jnp.sum(x[:, :-1], -1), 1.0)
  return jnp.where(real, 0.5 * jnp.sum(w * w) / total, 1.0)


def fedjax_client_rows(values, batch_size, num_epochs):
  """One row per fedjax batch of ``values`` (seed 0), then zero-gradient rows up to
  len(values): the client weighs n_k = len(values) examples, as fedjax's FedAvg does."""
  batches = fedjax_shuffle_repeat_batch(len(values), batch_size, num_epochs, seed=0)
  rows = [[values[i] for i in b] + [1.0] for b in batches]
  rows += [[0.0] * (batch_size + 1)] * (len(values) - len(rows))
  return rows


@pytest.mark.parametrize("num_epochs,expected", [
    # fedjax/algorithms/fed_avg_test.py::FedAvgTest::test_federated_averaging
    pytest.param(1, [0., 1.5655555, 3.131111], id="fedjax-fed_avg_test-federated_averaging"),
    # fedjax/examples/fed_avg_test.py::FedAvgTest::test_federated_averaging
    pytest.param(2, [0., 1.4425802, 2.8851604],
                 id="fedjax-examples_fed_avg_test-federated_averaging"),
])
def test_fedjax_federated_averaging(num_epochs, expected):
  # clients x=[2, 4, 6] and [8, 10], ShuffleRepeatBatchHParams(batch_size=2, seed=0),
  # client and server sgd(1.0), w0 = [0, 2, 4]; fedjax weighs by len(client dataset)
  data = clients_data([fedjax_client_rows([2., 4., 6.], 2, num_epochs),
                       fedjax_client_rows([8., 10.], 2, num_epochs)])
  run = one_run("fedavg", data, ToyLoss((0., 2., 4.), fedjax_grad_fn_loss),
                  local_epochs=1, batch_size=1, lr=1.0, client_weighting="examples")
  np.testing.assert_allclose(np.asarray(run.state.w), expected, rtol=1e-6)


def test_fedjax_create_train_for_each_client():
  # fedjax/algorithms/fed_avg_test.py::FedAvgTest::test_create_train_for_each_client:
  # server w = 4, batches cid0 [2,4,6], [8,10,12]; cid1 [1,3,5], [7,9,11]; sgd(1.0);
  # fedjax's client outputs (deltas server - client) 0.45555544 and 0.5761316. One
  # round of FedAvg over the two (2 examples each) steps by minus their mean.
  rows = lambda b1, b2: [b1 + [1.0], b2 + [1.0]]
  data = clients_data([rows([2., 4., 6.], [8., 10., 12.]), rows([1., 3., 5.], [7., 9., 11.])])
  run = one_run("fedavg", data, ToyLoss((4.0,), fedjax_grad_fn_loss),
                  local_epochs=1, batch_size=1, lr=1.0)
  np.testing.assert_allclose(np.asarray(run.state.w),
                             [4.0 - (0.45555544 + 0.5761316) / 2], rtol=1e-6)


def test_fedjax_mean_aggregator():
  # fedjax/aggregators/aggregator_test.py::AggregatorTest::test_mean_aggregator
  deltas = [[1., 2., 3.], [2., 4., 6.], [1., 3., 5.]]
  (w,) = server_rounds(np.zeros(3), [deltas], [2., 4., 2.])
  np.testing.assert_array_equal(w, [1.5, 3.25, 5.])


def test_fedjax_tree_mean():
  # fedjax/core/tree_util_test.py::TreeUtilTest::test_tree_mean
  (w,) = server_rounds(np.zeros(2), [[[0., 1.], [2., 3.], [4., 5.]]], [6., 7., 8.])
  np.testing.assert_array_almost_equal(w, (2.1904761904761907, 3.1904761904761907))


# ------------------------------------------------------------------------------ Flower

FLOWER_WEIGHTS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], np.float32)  # [[1,2,3],[4,5,6]], [7..10]


def test_flower_aggregate():
  # framework/py/flwr/server/strategy/aggregate_test.py::test_aggregate: the same
  # weights from clients of 1 and 2 examples average to themselves
  (w,) = server_rounds(np.zeros(10), [[FLOWER_WEIGHTS, FLOWER_WEIGHTS]], [1., 2.])
  np.testing.assert_equal(w, FLOWER_WEIGHTS)


@pytest.mark.parametrize("momentum,rounds", [
    # fedavgm_test.py::test_aggregate_fit_using_near_one_server_lr_and_no_momentum
    pytest.param(0.0, 1, id="flower-fedavgm_test-near_one_server_lr_and_no_momentum"),
    # fedavgm_test.py::test_aggregate_fit_server_learning_rate_and_momentum
    pytest.param(1e-9, 2, id="flower-fedavgm_test-server_learning_rate_and_momentum"),
])
def test_flower_fedavgm(momentum, rounds):
  # w0 = 0, both clients (1 and 2 examples) return FLOWER_WEIGHTS every round;
  # server_learning_rate = 1 + 1e-9. Flower's momentum v = beta v + (w - avg), as optax.trace.
  tx = so.transformation("momentum", beta1=momentum) if momentum else None
  out = server_rounds(np.zeros(10), [lambda w: jnp.stack([FLOWER_WEIGHTS - w] * 2)] * rounds,
                      [1., 2.], tx=tx, server_lr=1.0 + 1e-9)
  np.testing.assert_almost_equal(out[-1], FLOWER_WEIGHTS)


def test_flower_fedadagrad_aggregate_fit():
  # framework/py/flwr/server/strategy/fedadagrad_test.py::test_aggregate_fit: w0 =
  # 0.1, clients 0.2 and 1.0 (5 examples each), FedAdagrad(eta=0.1, tau=0.5): beta_1 = 0,
  # v = v + Delta^2 from 0, w + eta m / (sqrt(v) + tau)
  tx = so.transformation("adagrad", beta1=0.0, tau=0.5, eps_root=0.0, accumulator=0.0)
  w0 = np.full(4, 0.1, np.float32)
  (w,) = server_rounds(w0, [[np.full(4, 0.2) - w0, np.full(4, 1.0) - w0]], [5., 5.], tx=tx,
                       server_lr=0.1)
  np.testing.assert_allclose(w, np.full(4, 0.15, np.float32), rtol=1e-6)


def linear_loss(w, x):
  """10 - x . w: one full-batch SGD step of rate 1 moves w by x (the client's row)."""
  return 10.0 - jnp.sum(x * w, -1)


def test_flower_fedadagrad_aggregate_fit_through_the_engine():
  # fedadagrad_test.py::test_aggregate_fit again, on the round engine: one local step
  # takes each client from 0.1 to 0.2 and to 1.0 (5 examples each)
  data = clients_data([np.full((5, 4), 0.1), np.full((5, 4), 0.9)])
  run = one_run("fedavg", data, ToyLoss((0.1,) * 4, linear_loss), local_epochs=1,
                  batch_size=5, lr=1.0, server_optimizer="adagrad", server_lr=0.1,
                  server_beta1=0.0, server_tau=0.5, server_eps_root=0.0,
                  server_accumulator=0.0)
  np.testing.assert_allclose(np.asarray(run.state.w), np.full(4, 0.15), rtol=1e-6)


def constant_loss(w, x):
  """The loss written in each example's first feature (no gradient)."""
  return x[:, 0] + 0.0 * w[0]


@pytest.mark.parametrize("results,expected", [
    # aggregate_test.py::test_weighted_loss_avg_single_value
    pytest.param([(5, 0.5)], 0.5, id="flower-aggregate_test-weighted_loss_avg_single_value"),
    # aggregate_test.py::test_weighted_loss_avg_multiple_values
    pytest.param([(1, 2.0), (2, 1.0), (1, 2.0)], 1.5,
                 id="flower-aggregate_test-weighted_loss_avg_multiple_values"),
])
def test_flower_weighted_loss_avg(results, expected):
  # (num_examples, loss) per client: the round's train_loss is example-weighted
  data = clients_data([np.full((n, 1), loss) for n, loss in results])
  run = one_run("fedavg", data, ToyLoss((0.0,), constant_loss), local_epochs=1,
                  batch_size=2, lr=0.1)
  assert run.rows[0]["train_loss"] == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------ TFF

def tff_history(name, lr, grads, w0, **kw):
  """TFF's optimizer.next(state, weights, gradients) loop: our server optimiser fed the
  pseudo-gradient g (the round's step Delta = -g); w0 and the weights after each step."""
  tx = so.transformation(name, **kw) if name != "sgd" else None
  return [np.asarray(w0, np.float32)] + server_rounds(
      w0, [[-np.asarray(g, np.float32)] for g in grads], [1.0], tx=tx, server_lr=lr)


TFF_MATH = [
    # learning/optimizers/sgdm_test.py::SGDTest::test_math_no_momentum
    pytest.param("sgd", 0.01, {}, [[1.0], [0.98], [0.96], [0.94], [0.92]],
                 id="tff-sgdm_test-math_no_momentum"),
    # sgdm_test.py::SGDTest::test_math_momentum_0_5 (accumulator m = 0.5 m + g)
    pytest.param("momentum", 0.01, dict(beta1=0.5),
                 [[1.0], [0.98], [0.95], [0.915], [0.8775]],
                 id="tff-sgdm_test-math_momentum_0_5"),
    # adam_test.py::AdamTest::test_math: build_adam(0.1, 0.9, 0.999, epsilon=0.0); TFF's
    # lr sqrt(1 - b2^t) / (1 - b1^t) is the bias correction ("step")
    pytest.param("adam", 0.1, dict(beta1=0.9, beta2=0.999, tau=0.0, bias_correction="step"),
                 [[1.0], [0.9000007], [0.8000017], [0.700002], [0.600003]],
                 id="tff-adam_test-math"),
    # yogi_test.py::YogiTest::test_math: epsilon=0.0, initial_preconditioner_value=0.0
    pytest.param("yogi", 0.1, dict(beta1=0.9, beta2=0.999, tau=0.0, accumulator=0.0,
                                   bias_correction="step"),
                 [[1.0], [0.9000007], [0.8000267], [0.700077], [0.600153]],
                 id="tff-yogi_test-math"),
    # adagrad_test.py::AdagradTest::test_math_no_momentum: w - lr g / sqrt(a + eps),
    # a from initial_preconditioner_value=0.0, epsilon=0.0
    pytest.param("adagrad", 0.01, dict(beta1=0.0, tau=0.0, eps_root=0.0, accumulator=0.0),
                 [[1.0], [0.99], [0.9829289], [0.9771554], [0.9721554]],
                 id="tff-adagrad_test-math_no_momentum"),
]


@pytest.mark.parametrize("name,lr,kw,expected", TFF_MATH)
def test_tff_optimizer_math(name, lr, kw, expected):
  # weights [1.0], gradients [2.0], four steps
  history = tff_history(name, lr, [[2.0]] * 4, [1.0], **kw)
  np.testing.assert_allclose(history, expected, rtol=1e-6, atol=1e-6)  # assertAllClose


@pytest.mark.parametrize("name,kw", [
    # sgdm_test.py::SGDTest::test_executes_with_indexed_slices: build_sgdm(0.5)
    pytest.param("sgd", {}, id="tff-sgdm_test-executes_with_indexed_slices"),
    # adam_test.py: build_adam(0.5, beta_1=0.0, beta_2=0.0), epsilon's default 1e-7
    pytest.param("adam", dict(beta1=0.0, beta2=0.0, tau=1e-7),
                 id="tff-adam_test-executes_with_indexed_slices"),
    # yogi_test.py: build_yogi(0.5, 0.0, 0.0, epsilon=1e-7, initial_preconditioner_value=0)
    pytest.param("yogi", dict(beta1=0.0, beta2=0.0, tau=1e-7, accumulator=0.0),
                 id="tff-yogi_test-executes_with_indexed_slices"),
    # adagrad_test.py: build_adagrad(0.5, initial_preconditioner_value=0.0), epsilon 1e-7
    pytest.param("adagrad", dict(beta1=0.0, tau=0.0, eps_root=1e-7, accumulator=0.0),
                 id="tff-adagrad_test-executes_with_indexed_slices"),
])
def test_tff_optimizer_indexed_slices(name, kw):
  # weights ones [4, 2]; gradient rows 0 and 2 ones, rows 1 and 3 zero
  grad = np.array([[1., 1.], [0., 0.], [1., 1.], [0., 0.]]).ravel()
  history = tff_history(name, 0.5, [grad], np.ones(8), **kw)
  np.testing.assert_allclose(history[-1].reshape(4, 2),
                             [[0.5, 0.5], [1.0, 1.0], [0.5, 0.5], [1.0, 1.0]],
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("client_weighting,expected", [
    # aggregators/mean_test.py::MeanFactoryExecutionTest::test_scalar_value
    pytest.param("examples", 10.0 / 6.0, id="tff-mean_test-scalar_value"),
    # aggregators/mean_test.py::MeanFactoryExecutionTest::test_scalar_value_unweighted
    pytest.param("uniform", 2.0, id="tff-mean_test-scalar_value_unweighted"),
])
def test_tff_mean(client_weighting, expected):
  # client values [1, 2, 3], weights [3, 2, 1]
  (w,) = server_rounds([0.0], [[[1.0], [2.0], [3.0]]], [3., 2., 1.],
                       hp={"client_weighting": weighting(client_weighting)})
  np.testing.assert_allclose(w, [expected], rtol=1e-6)


# ------------------------------------------------------------------------------ pfl-research

def pfl_mae(w, x):
  """pfl's test model: y = x @ W (W [2, 2] = w), loss sum_j |y_j - t_j| per example;
  x = (x_0, x_1, t_0, t_1). The derivative of |d| at 0 is 0, as torch's."""
  d = jnp.einsum("bi,ij->bj", x[:, :2], w.reshape(2, 2)) - x[:, 2:]
  return jnp.sum(jnp.sign(d) * d, -1)


# tests/conftest.py::user_dataset: x = [[1, 0], [0, 2]], t = [[4, 6], [8, 12]]; the
# pytorch_model_setup's weight [[2, 4], [3, 5]]
PFL_USER = [[1., 0., 4., 6.], [0., 2., 8., 12.]]
PFL_W0 = (2., 4., 3., 5.)


def test_pfl_fedavg_simulate_one_user():
  # tests/algorithm/test_fedavg.py::TestFederatedAveraging::test_simulate_one_user:
  # 10 epochs of full-batch GD at 0.25; update [[1.25, 1.25], [1, 1]], loss 4 before
  # and 0.75 after training (the user's data is the test set here)
  run = one_run("fedavg", clients_data([PFL_USER]), ToyLoss(PFL_W0, pfl_mae),
                  local_epochs=10, batch_size=2, lr=0.25)
  _, w0, apply_flat = run.model
  x = jnp.asarray(PFL_USER)
  assert float(np.mean(-np.asarray(jax.nn.log_softmax(apply_flat(w0, x, train=False)))[:, 0])) == (
      pytest.approx(4.0, rel=1e-6))
  np.testing.assert_allclose(np.asarray(run.state.w) - np.asarray(PFL_W0),
                             np.array([[1.25, 1.25], [1., 1.]]).ravel(), rtol=1e-6)
  assert run.rows[0]["test_loss"] == pytest.approx(0.75, rel=1e-5)


@pytest.fixture(scope="module")
def pfl_fedprox_runs():
  """Both mu of pfl's FedProx test in one vmapped sweep: {mu: run}."""
  result = one_round("fedprox", clients_data([PFL_USER]), ToyLoss(PFL_W0, pfl_mae),
                     local_epochs=2, batch_size=2, lr=0.5, sweep={"mu": [0.0, 1.0]})
  return {run.summary["config"]["mu"]: run for run in result.runs.values()}


@pytest.mark.parametrize("mu,diff,loss", [
    # tests/algorithm/test_fedprox.py::TestFedProx::test_simulate_one_user's cases
    pytest.param(0.0, [[0.5, 0.5], [1., 1.]], 1.5, id="pfl-test_fedprox-simulate_one_user-mu0"),
    pytest.param(1.0, [[0.375, 0.375], [0.75, 0.75]], 2.125,
                 id="pfl-test_fedprox-simulate_one_user-mu1"),
])
def test_pfl_fedprox_simulate_one_user(pfl_fedprox_runs, mu, diff, loss):
  # 2 epochs of full-batch GD at 0.5 with mu/2 ||w - w_c||^2: the update and the loss
  # after training
  run = pfl_fedprox_runs[mu]
  np.testing.assert_allclose(np.asarray(run.state.w) - np.asarray(PFL_W0), np.ravel(diff),
                             rtol=1e-6)
  assert run.rows[0]["test_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("client_weighting,expected", [
    # tests/aggregate/test_weighting.py::test_weight_by_user: reweight(1)
    pytest.param("uniform", 1.0, id="pfl-test_weighting-weight_by_user"),
    # tests/aggregate/test_weighting.py::test_weight_by_datapoints: reweight(2)
    pytest.param("examples", 2.0, id="pfl-test_weighting-weight_by_datapoints"),
])
def test_pfl_weighting(client_weighting, expected):
  # the user_context fixture: num_datapoints=2
  p = fedavg.example_weights(arrivals([2.0]), {"client_weighting": weighting(client_weighting)})
  np.testing.assert_array_equal(np.asarray(p), [expected])


# ------------------------------------------------------------------------------ FLSim

STALENESS = async_config.STALENESS  # staleness_fn's codes


def flsim_threshold_wt(staleness, cutoff, value_after_cutoff):
  # flsim/utils/tests/helpers/test_async_weights_utils.py::get_threshold_wt
  return 1.0 if staleness <= cutoff else value_after_cutoff


def flsim_polynomial_wt(staleness, exponent):
  # test_async_weights_utils.py::get_polynomial_wt
  return 1 / ((1 + staleness) ** exponent)


FLSIM_STALENESS = [1, 2, 7, 100, 5000, 9999]  # FLSim draws randint(1, 10000)


def staleness_weights(hp):
  hp = base.with_defaults(fedasync.ALGORITHM, hp)
  return np.array([float(fedasync.staleness_weight(s, hp)) for s in FLSIM_STALENESS])


@pytest.mark.parametrize("avg_staleness", [1, 10000])  # AVG_TEST_STALENESS
def test_flsim_constant_weight_compute(avg_staleness):
  # flsim/utils/tests/test_async_staleness_weights.py::test_constant_weight_compute
  hp = {"staleness_fn": STALENESS["constant"], "avg_staleness": avg_staleness}
  np.testing.assert_array_equal(staleness_weights(hp), 1.0)


@pytest.mark.parametrize("avg_staleness", [1, 10000])
def test_flsim_threshold_weight_compute(avg_staleness):
  # test_async_staleness_weights.py::test_threshold_weight_compute, with the
  # STALENESS_WEIGHT_TEST_CONFIGS' ThresholdStalenessWeightConfig(cutoff=1,
  # value_after_cutoff=0.1) and FLSim's normalisation weight(s) = raw(s) / raw(avg)
  hp = {"staleness_fn": STALENESS["threshold"], "threshold_cutoff": 1.0,
        "threshold_value": 0.1, "avg_staleness": avg_staleness}
  expected = [flsim_threshold_wt(s, 1, 0.1) / flsim_threshold_wt(avg_staleness, 1, 0.1)
              for s in FLSIM_STALENESS]
  np.testing.assert_allclose(staleness_weights(hp), expected, rtol=1e-6)


@pytest.mark.parametrize("avg_staleness", [1, 10000])
def test_flsim_polynomial_weight_compute(avg_staleness):
  # test_async_staleness_weights.py::test_polynomial_weight_compute, with the
  # STALENESS_WEIGHT_TEST_CONFIGS' PolynomialStalenessWeightConfig(exponent=0.5)
  hp = {"staleness_fn": STALENESS["polynomial"], "poly_a": 0.5,
        "avg_staleness": avg_staleness}
  expected = [flsim_polynomial_wt(s, 0.5) / flsim_polynomial_wt(avg_staleness, 0.5)
              for s in FLSIM_STALENESS]
  np.testing.assert_allclose(staleness_weights(hp), expected, rtol=1e-5)


def test_flsim_polynomial_weight_zero_exponent():
  # test_async_staleness_weights.py::test_polynomial_weight_zero_exponent: 1 for any
  # staleness and avg_staleness
  for avg in [1, 37, 9999]:
    hp = {"staleness_fn": STALENESS["polynomial"], "poly_a": 0.0, "avg_staleness": avg}
    np.testing.assert_array_equal(staleness_weights(hp), 1.0)


def flsim_expected_example_weight(avg_num_examples, num_examples, kind):
  # test_async_weights_utils.py::AsyncExampleWeightsTestUtils::expected_weight
  if kind == "none":  # EqualExampleWeight
    return 1.0
  if kind == "linear":
    return num_examples / avg_num_examples
  if kind == "sqrt":
    return sqrt(num_examples) / sqrt(avg_num_examples)
  return log10(1 + num_examples) / log10(1 + avg_num_examples)  # Log10ExampleWeight


FLSIM_NUM_EXAMPLES = [1, 3, 64, 1000, 9999]  # FLSim draws randint(1, 10000)


@pytest.mark.parametrize("kind", ["none", "linear", "sqrt", "log10"])  # EXAMPLE_WEIGHT_TEST_CONFIGS
@pytest.mark.parametrize("avg_num_examples", [1, 10000])  # AVG_NUMBER_OF_EXAMPLES
def test_flsim_example_weight_compute(avg_num_examples, kind):
  # flsim/utils/tests/test_async_example_weights.py::test_example_weight_compute
  hp = {"example_weight": float(fedasync.EXAMPLE_WEIGHTS.index(kind)),
        "avg_num_examples": avg_num_examples}
  got = [float(fedasync.example_weight(n, hp)) for n in FLSIM_NUM_EXAMPLES]
  expected = [flsim_expected_example_weight(avg_num_examples, n, kind)
              for n in FLSIM_NUM_EXAMPLES]
  np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("kind", ["none", "linear", "sqrt", "log10"])
def test_flsim_async_weight_compute(kind):
  # flsim/utils/tests/test_async_weights.py::TestAsyncExampleWeights::test_weight_compute:
  # AsyncWeight = example weight x staleness weight (avg_num_examples = avg_staleness = 1;
  # constant, threshold cutoff 5000 value 0.001, polynomial exponent 0.5), as FedAsync's
  # mixing weight: lr * weight (FLSim's fed_async step), from w = 0 towards 1
  lr = 1e-5
  for fn, extra, raw in [
      ("constant", {}, lambda s: 1.0),
      ("threshold", {"threshold_cutoff": 5000.0, "threshold_value": 0.001},
       lambda s: flsim_threshold_wt(s, 5000, 0.001)),
      ("polynomial", {"poly_a": 0.5}, lambda s: flsim_polynomial_wt(s, 0.5))]:
    hp = {"mix_alpha": lr, "staleness_fn": STALENESS[fn], "avg_staleness": 1.0,
          "example_weight": float(fedasync.EXAMPLE_WEIGHTS.index(kind)),
          "avg_num_examples": 1.0, **extra}
    for n, s in [(1, 1), (17, 4999), (250, 5001), (9999, 9999)]:
      w, _ = fedasync.server_step(jnp.zeros(1), (), jnp.ones(1), arrival(n, s),
                                  base.with_defaults(fedasync.ALGORITHM, hp))
      expected = flsim_expected_example_weight(1, n, kind) * raw(s) / raw(1)
      np.testing.assert_allclose(float(w[0]) / lr, expected, rtol=1e-5,
                                 err_msg=f"{fn} n={n} staleness={s}")


# (param_after_local_training a, param_after_global_training b, weight): FLSim draws them
# from np.random.random_sample()
FLSIM_STEPS = [(0.3, 0.7, 0.25), (0.9, 0.1, 0.6), (0.05, 0.55, 0.95)]


def test_flsim_fed_async_aggregation():
  # flsim/optimizers/tests/test_async_aggregator.py::test_fed_async_aggregation:
  # global = (1 - weight) b + weight a
  for a, b, weight in FLSIM_STEPS:
    hp = base.with_defaults(fedasync.ALGORITHM, {
        "mix_alpha": weight, "staleness_fn": STALENESS["constant"], "example_weight": 0.0})
    w, _ = fedasync.server_step(jnp.array([b]), (), jnp.array([a]), arrival(), hp)
    np.testing.assert_allclose(np.asarray(w), [(1 - weight) * b + weight * a], atol=1e-7)


def fedbuff_hp(**kw):
  hp = {"server_lr": 1.0, "server_momentum": 0.0, "fedbuff_staleness": 0.0, "mu": 0.0,
        "example_weight": 0.0, "avg_num_examples": 1.0}
  hp.update(kw)
  return hp


def test_flsim_fed_buff_aggregation():
  # test_async_aggregator.py::test_fed_buff_aggregation (buffer_size=1, lr=1.0): global =
  # b + weight (a - 1) from init 1; the weight as FLSim's linear example weight n / avg
  for a, b, weight in FLSIM_STEPS:
    hp = fedbuff_hp(example_weight=float(fedasync.EXAMPLE_WEIGHTS.index("linear")),
                    avg_num_examples=100.0)
    w, _ = fedbuff.server_step(jnp.array([b]), fedbuff.init_server_state(jnp.zeros(1)),
                               jnp.array([a - 1.0]), arrival(100.0 * weight), hp)
    np.testing.assert_allclose(np.asarray(w), [b + weight * (a - 1)], atol=1e-7)


def test_flsim_fedbuff_async_equivalence():
  # test_async_aggregator.py::test_fedbuff_async_equivalence: 10 users from one start,
  # FedBuff(lr=1, buffer_size=10) = pure async (lr=1): w0 + the SUM of the deltas. Our
  # buffer applies its mean: server_lr = buffer_size gives FLSim's sum.
  deltas = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
  w0 = jnp.array([0.5, -1.0, 2.0])
  w, state = w0, fedbuff.init_server_state(w0)
  for i, delta in enumerate(deltas):
    w, state = fedbuff.server_step(w, state, jnp.asarray(delta),
                                   arrival(flush=i == 9, d=3), fedbuff_hp(server_lr=10.0))
  np.testing.assert_allclose(np.asarray(w), np.asarray(w0) + deltas.sum(0), rtol=1e-5,
                             atol=1e-6)
