"""The local training's compute precision (``LocalConfig.precision``, ``--precision``):
float32 is the code as it was, tf32 marks every dot and convolution of the step TF32, bf16
runs the loss and its gradient on bfloat16 parameters and inputs with float32 master
weights."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async.core import client as client_lib
from fedjax_async import cli
from fedjax_async import config
from fedjax_async import models
from fedjax_async.algorithms import fedavg, fedprox

D, C, M = 8, 4, 40


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(M, D)).astype(np.float32))
  y = jnp.asarray(rng.integers(0, C, M))
  w0 = jnp.asarray(rng.normal(size=D * C + C).astype(np.float32) * 0.3)
  return x, y, w0


def _apply(w, xb, train=True, rng=None):
  return xb @ w[:D * C].reshape(D, C) + w[D * C:]


def _train(precision=None, algorithm=fedavg.ALGORITHM, steps_cfg=None):
  x, y, w0 = _problem()
  kw = {} if precision is None else {"precision": precision}
  cfg = client_lib.LocalConfig(batch_size=10, max_epochs=3, max_examples=M, **kw)
  hp = {"lr": jnp.float32(0.2), "momentum": jnp.float32(0.5), "mu": jnp.float32(0.1)}
  fn = functools.partial(client_lib.train, _apply, algorithm, w0, {}, hp=hp, cfg=cfg)
  return jax.jit(fn)(x, y, jnp.int32(M), jax.random.PRNGKey(3)), w0


def test_float32_is_the_code_without_the_option_bit_for_bit():
  before, _ = _train(None)
  after, _ = _train("float32")
  assert np.array_equal(before.w_end, after.w_end)
  assert np.array_equal(before.mean_loss, after.mean_loss)
  # and the engine's configuration passes it on: the default config is float32
  assert config.RunConfig().local.precision == "float32"


def test_bf16_differs_from_float32_but_stays_close_with_float32_master_weights():
  for alg in (fedavg.ALGORITHM, fedprox.ALGORITHM):  # fedprox: the penalty in float32
    f32, w0 = _train("float32", alg)
    bf16, _ = _train("bf16", alg)
    assert bf16.w_end.dtype == jnp.float32 and bf16.mean_loss.dtype == jnp.float32
    moved = float(jnp.max(jnp.abs(f32.w_end - w0)))
    gap = float(jnp.max(jnp.abs(bf16.w_end - f32.w_end)))
    assert moved > 0.1  # it trained
    # bfloat16 keeps 8 bits of mantissa: its steps differ from float32's by ~2^-8 relative
    assert 0 < gap < 0.03 * moved, (gap, moved)
    assert abs(float(bf16.mean_loss) - float(f32.mean_loss)) < 0.02 * float(f32.mean_loss)


def test_one_bf16_step_is_sgd_on_the_bfloat16_loss_gradient():
  """One step of plain SGD from w0 on one example: w0 - lr * the gradient of the
  cross-entropy of the bfloat16 model on the bfloat16 input (the gradient taken back to the
  float32 parameters), to a bfloat16 ulp or two (XLA:CPU rounds bfloat16 results where its
  fusions end, which differ between the two programs); the float32 step to float32's."""
  x, y, w0 = _problem(1)
  x, y = x[:1], y[:1]
  lr = 0.3
  hp = {"lr": jnp.float32(lr), "momentum": jnp.float32(0.0)}

  def reference_step(dtype):
    def loss(w):
      logits = _apply(w.astype(dtype), x.astype(dtype)).astype(jnp.float32)
      return -jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, C))
    return -lr * jax.grad(loss)(w0)

  steps = {}
  for precision, dtype, tol in (("bf16", jnp.bfloat16, 2.0**-6), ("float32", jnp.float32,
                                                                  1e-6)):
    cfg = client_lib.LocalConfig(batch_size=1, max_epochs=1, max_examples=1, momentum=False,
                                 precision=precision)
    out = jax.jit(lambda w: client_lib.train(_apply, fedavg.ALGORITHM, w, {}, x, y,
                                             jnp.int32(1), jax.random.PRNGKey(0), hp,
                                             cfg))(w0)
    steps[precision] = step = out.w_end - w0
    expected = reference_step(dtype)
    scale = float(jnp.max(jnp.abs(expected)))
    assert scale > 0.05 and float(jnp.max(jnp.abs(step - expected))) <= tol * scale, precision
  assert not np.array_equal(steps["bf16"], steps["float32"])


def _eqns(jaxpr):
  """Every equation of ``jaxpr`` and of the jaxprs nested in its equations' parameters."""
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from _eqns(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from _eqns(sub)


PRODUCTS = ("dot_general", "conv_general_dilated")


def _cnn_step_products(precision):
  """The dots and convolutions of one local step of the paper's CNN (impl 'vjp', the
  custom backward convolutions and dense input gradient included)."""
  net = models.get_model("cnn", 10, (28, 28, 1))
  w0, apply_flat = models.flat_model(net, (28, 28, 1), jax.random.key(0))
  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=1, max_examples=4,
                               precision=precision)
  hp = {"lr": jnp.float32(0.1), "momentum": jnp.float32(0.5)}
  opt, step = client_lib.make_client_step(apply_flat, fedavg.ALGORITHM, w0, {}, hp, cfg,
                                          jnp.int32(1), jax.random.PRNGKey(0))
  w = client_lib.local_params(apply_flat, w0)
  batch = (jnp.int32(0), jnp.zeros((4, 28, 28, 1)), jnp.zeros((4,), jnp.int32),
           jnp.ones((4,), bool))
  jaxpr = jax.make_jaxpr(step)((w, opt.init(w), jnp.float32(0.0)), batch)
  products = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name in PRODUCTS]
  out_dtypes = {v.aval.dtype for v in jaxpr.jaxpr.outvars}
  return products, out_dtypes


def test_each_precision_reaches_every_dot_and_convolution_of_the_cnn_step():
  for precision in ("float32", "tf32", "bf16"):
    products, out_dtypes = _cnn_step_products(precision)
    # forward, input and kernel gradients: 2 convolutions x 3, 2 dense layers x 3
    assert len(products) >= 12, precision
    assert out_dtypes == {jnp.dtype(jnp.float32)}, precision  # master weights, state, loss
    for e in products:
      dtypes = {v.aval.dtype for v in e.invars}
      prec = e.params.get("precision")
      if precision == "bf16":
        assert dtypes == {jnp.dtype(jnp.bfloat16)}, (e.primitive, dtypes)
      else:
        assert dtypes == {jnp.dtype(jnp.float32)}, (e.primitive, dtypes)
      if precision == "tf32":
        assert prec == (jax.lax.Precision.HIGH, jax.lax.Precision.HIGH), (e.primitive, prec)
      else:  # JAX's default (config.jax_default_matmul_precision)
        assert prec is None, (precision, e.primitive, prec)


def test_a_bad_precision_names_the_field_and_the_flag():
  with pytest.raises(config.ConfigError) as e:
    config.validate(config.RunConfig().replace(precision="fp16"))
  assert str(e.value) == "local.precision: must be one of float32, tf32, bf16, got 'fp16'"
  assert cli.as_flags(str(e.value)).startswith("--precision: must be one of")
  with pytest.raises(ValueError, match="^local.precision: must be one of"):
    client_lib.LocalConfig(precision="half")
  assert config.flag_specs(config.RunConfig)["precision"].choices == ("float32", "tf32", "bf16")


def test_the_round_engine_and_sweeps_train_in_the_configured_precision(monkeypatch):
  from fedjax_async.rounds import experiment
  from fedjax_async.sweeps import sweep
  cfg = config.RunConfig().replace(algorithm="fedavg", num_clients=6, rounds=2,
                                   precision="bf16")
  fed_data = experiment.load_data(cfg)
  setup = experiment._setup(cfg, "fedavg", fed_data, experiment.build_model(cfg, fed_data))
  assert setup.run_ecfg.local.precision == "bf16"

  class Built(Exception):
    pass

  def runner(apply_flat, algorithm, ecfg):
    raise Built(ecfg.local.precision)

  monkeypatch.setattr(sweep, "make_sweep_runner", runner)
  for precision in ("bf16", "tf32"):
    with pytest.raises(Built, match=f"^{precision}$"):
      sweep.prepare([cfg.replace(precision=precision)], "fedavg", fed_data)
