"""Tests for fedjax_async.models: PatchConv vs lax/flax conv, shapes, flat models."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

from fedjax_async import layers  # noqa: E402
from fedjax_async import models  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def _ref_conv(x, kernel, strides, padding):
  """Reference: XLA's direct convolution, NHWC x HWIO."""
  return lax.conv_general_dilated(
      x, kernel, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
      precision=lax.Precision.HIGHEST)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("ksize,cin,cout,strides", [
    ((1, 1), 3, 4, (1, 1)),
    ((3, 3), 1, 8, (1, 1)),
    ((5, 5), 3, 16, (1, 1)),
    ((3, 5), 7, 5, (1, 1)),
    ((3, 3), 4, 6, (2, 2)),
])
def test_patch_conv_matches_flax_conv(padding, ksize, cin, cout, strides):
  kx, kp = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (2, 11, 10, cin))
  ref = nn.Conv(cout, ksize, strides, padding)
  params = ref.init(kp, x)
  # Non-zero bias so that it is exercised.
  shifted = jax.tree.map(lambda a: a + 0.1, params)
  y_ref = ref.apply(shifted, x)
  y_lax = _ref_conv(x, shifted["params"]["kernel"], strides, padding)
  for extract in layers.PATCH_EXTRACTORS:
    ours = layers.PatchConv(cout, ksize, strides, padding, extract=extract)
    # Same names, shapes and (same rng => same) initial values as nn.Conv.
    jax.tree.map(np.testing.assert_array_equal, params, ours.init(kp, x))
    np.testing.assert_allclose(ours.apply(shifted, x), y_ref, **TOL)
    np.testing.assert_allclose(ours.apply(shifted, x),
                               y_lax + shifted["params"]["bias"], **TOL)


@pytest.mark.parametrize("padding", ["SAME", "VALID", ((2, 0), (1, 3))])
@pytest.mark.parametrize("ksize,cin,cout", [((1, 1), 3, 4), ((3, 3), 1, 8), ((5, 5), 3, 6),
                                            ((3, 5), 7, 5)])
def test_canonical_conv_backward_equals_autodiff(padding, ksize, cin, cout):
  """The hand-written VJP (two NHWC/HWIO convolutions) against XLA's autodiff."""
  kx, kk, kg = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(kx, (2, 11, 10, cin))
  kernel = jax.random.normal(kk, (*ksize, cin, cout))
  pads = (lax.padtype_to_pads((11, 10), ksize, (1, 1), padding)
          if isinstance(padding, str) else padding)
  pads = tuple(tuple(p) for p in pads)
  y, vjp = jax.vjp(lambda x, k: layers.canonical_conv(x, k, pads), x, kernel)
  y_ref, vjp_ref = jax.vjp(lambda x, k: _ref_conv(x, k, (1, 1), pads), x, kernel)
  np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
  g = jax.random.normal(kg, y.shape)
  for got, want in zip(vjp(g), vjp_ref(g)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_patch_kernel_ordering_is_cin_kh_kw():
  # conv_general_dilated_patches of a one-hot kernel position picks one input pixel.
  x = jnp.arange(1 * 4 * 4 * 2, dtype=jnp.float32).reshape(1, 4, 4, 2)
  p = lax.conv_general_dilated_patches(x, (2, 3), (1, 1), "VALID",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
  c, i, j = 1, 1, 2  # feature index c*kh*kw + i*kw + j reads x[h+i, w+j, c]
  np.testing.assert_array_equal(p[0, 0, 0, c * 6 + i * 3 + j], x[0, i, j, c])


@pytest.mark.parametrize("padding,extract", [("SAME", "xla"), ("VALID", "xla"),
                                             ("SAME", "slices"), ("VALID", "vjp")])
def test_patch_conv_vmapped_over_client_kernels(padding, extract):
  clients, ksize, cin, cout = 4, (3, 3), 3, 8
  kx, kk, kb = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(kx, (clients, 5, 9, 9, cin))
  kernels = jax.random.normal(kk, (clients, *ksize, cin, cout))
  biases = jax.random.normal(kb, (clients, cout))
  layer = layers.PatchConv(cout, ksize, padding=padding, extract=extract)

  def one(kernel, bias, xc):
    return layer.apply({"params": {"kernel": kernel, "bias": bias}}, xc)

  got = jax.vmap(one)(kernels, biases, x)
  for c in range(clients):
    want = _ref_conv(x[c], kernels[c], (1, 1), padding) + biases[c]
    np.testing.assert_allclose(got[c], want, **TOL)


def test_cnn_param_count_and_shape():
  model = models.get_model("cnn", 10, (28, 28, 1))
  assert models.count_params(model, (28, 28, 1)) == 1_663_370
  x = jax.ShapeDtypeStruct((3, 28, 28, 1), jnp.float32)
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), x)["params"]
  assert params["fc1"]["kernel"].shape == (7 * 7 * 64, 512)
  assert jax.eval_shape(lambda p, x: model.apply({"params": p}, x), params, x).shape == (
      3, 10)


def test_pafed_cifar_networks_have_the_papers_layers():
  """Table II's CIFAR-10 CNN and Table IV's CIFAR-100 CNN, counted by hand."""
  conv = lambda k, cin, cout: k * k * cin * cout + cout
  dense = lambda n, m: n * m + m
  cifar10 = conv(5, 3, 32) + conv(5, 32, 64) + dense(4096, 256) + dense(256, 10)
  assert cifar10 == 1_105_098
  assert models.count_params(models.get_model("cifar10_cnn", 10, (32, 32, 3)),
                             (32, 32, 3)) == cifar10
  # 32 -> conv1 (pad 1) 32 -> conv2 30 -> pool 15 -> conv3 13 -> pool 6 -> conv4 4 -> pool 2
  bn = lambda c: 2 * c
  cifar100 = (conv(3, 3, 32) + bn(32) + conv(3, 32, 64) + conv(3, 64, 128) + bn(128)
              + conv(3, 128, 256) + bn(256) + dense(2 * 2 * 256, 512) + dense(512, 100))
  assert cifar100 == 965_348
  model = models.get_model("cifar100_cnn", 100, (32, 32, 3))
  assert models.count_params(model, (32, 32, 3)) == cifar100
  params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x),
                          jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32))["params"]
  assert params["fc1"]["kernel"].shape == (1024, 512)  # Table IV's FC_1 in_features
  assert sorted(k for k in params if k.startswith("bn")) == ["bn1", "bn3", "bn4"]


def test_resnet18_param_count():
  # The usual CIFAR ResNet-18 (bias-free convs, BN) has 11,173,962 parameters; GroupNorm
  # has the same per-channel scale/bias.
  assert models.count_params(models.get_model("resnet18", 10, (32, 32, 3)),
                             (32, 32, 3)) == 11_173_962


@pytest.mark.parametrize("name,shape,classes", [
    ("logreg", (60,), 10),
    ("mlp", (28, 28, 1), 10),
    ("cnn", (28, 28, 1), 10),
    ("cifar10_cnn", (32, 32, 3), 10),
    ("cifar100_cnn", (32, 32, 3), 100),
    ("simple_cnn", (32, 32, 3), 10),
    ("resnet18", (32, 32, 3), 10),
])
def test_output_shapes(name, shape, classes):
  model = models.get_model(name, classes, shape)
  x = jax.ShapeDtypeStruct((4, *shape), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), x)
  assert set(variables) == {"params"}
  out = jax.eval_shape(
      lambda v, x: model.apply(v, x, train=True, rngs={"dropout": jax.random.key(1)}),
      variables, x)
  assert out.shape == (4, classes)


@pytest.mark.parametrize("name,shape", [("cnn", (12, 12, 1)), ("simple_cnn", (10, 10, 3)),
                                        ("cifar100_cnn", (24, 24, 3))])
def test_impls_agree_on_models(name, shape):
  key = jax.random.key(2)
  x = jax.random.normal(key, (3, *shape))
  lax_model = models.get_model(name, 10, shape, impl="lax")
  params = jax.jit(lax_model.init)(key, x)
  want = jax.jit(lax_model.apply)(params, x)
  for impl in ("patches", "slices", "vjp"):
    got = jax.jit(models.get_model(name, 10, shape, impl=impl).apply)(params, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cifar100_batch_norm_is_stateless_and_dropout_only_in_training():
  model = models.CIFAR100CNN()
  x = jax.random.normal(jax.random.key(0), (8, 24, 24, 3))
  variables = jax.jit(model.init)(jax.random.key(1), x)
  assert set(variables) == {"params"}
  assert set(variables["params"]["bn1"]) == {"scale", "bias"}
  run = jax.jit(lambda k, train: model.apply(variables, x, train=train,
                                             rngs={"dropout": jax.random.key(k)}),
                static_argnums=1)
  eval_a = jax.jit(model.apply)(variables, x)
  eval_b = run(2, False)
  np.testing.assert_allclose(eval_a, eval_b, **TOL)  # rng unused when not training
  train_a, train_b = run(2, True), run(3, True)
  assert not np.allclose(train_a, eval_a)
  assert not np.allclose(train_a, train_b)


def test_batch_stat_norm_normalises_with_batch_statistics():
  x = 3.0 + 2.0 * jax.random.normal(jax.random.key(0), (6, 5, 5, 4))
  norm = layers.BatchStatNorm()
  params = {"params": {"scale": jnp.full((4,), 2.0), "bias": jnp.full((4,), -1.0)}}
  y = norm.apply(params, x)
  np.testing.assert_allclose(np.mean(y, axis=(0, 1, 2)), -1.0, atol=1e-5)
  np.testing.assert_allclose(np.std(y, axis=(0, 1, 2)), 2.0, rtol=1e-3)


def test_flat_model_round_trip():
  model = models.get_model("simple_cnn", 10, (8, 8, 3))
  key = jax.random.key(0)
  w0, apply_flat = models.flat_model(model, (8, 8, 3), key)
  params = jax.jit(model.init)({"params": key}, jnp.zeros((1, 8, 8, 3)))["params"]
  assert w0.shape == (models.count_params(model, (8, 8, 3)),)
  x = jax.random.normal(jax.random.key(1), (5, 8, 8, 3))
  flat = jax.jit(apply_flat, static_argnames="train")
  ref = jax.jit(lambda p, x, rng, train: model.apply(
      {"params": p}, x, train=train, rngs={"dropout": rng}), static_argnums=3)
  rng = jax.random.key(4)
  np.testing.assert_allclose(flat(w0, x), ref(params, x, rng, False), **TOL)
  np.testing.assert_allclose(flat(w0, x, train=True, rng=rng), ref(params, x, rng, True),
                             **TOL)
  # vmap over a client axis of flat parameters.
  ws = jnp.stack([w0, 2.0 * w0])
  out = jax.jit(jax.vmap(lambda w: apply_flat(w, x)))(ws)
  np.testing.assert_allclose(out[0], flat(w0, x), **TOL)


def test_flat_model_pieces_are_the_leaves_in_ravel_order():
  """``apply_flat.split(w)``: one 1-D piece per leaf (what local training carries); the
  model called on the pieces equals the model called on ``w``, and so do its gradients."""
  model = models.get_model("simple_cnn", 10, (8, 8, 3))  # conv and dense leaves
  key = jax.random.key(0)
  w0, apply_flat = models.flat_model(model, (8, 8, 3), key)
  params = jax.jit(model.init)({"params": key}, jnp.zeros((1, 8, 8, 3)))["params"]
  leaves = jax.tree.leaves(params)
  pieces = apply_flat.split(w0)
  assert [p.shape for p in pieces] == [(leaf.size,) for leaf in leaves]
  for p, leaf in zip(pieces, leaves):
    np.testing.assert_array_equal(p, np.ravel(leaf))
  np.testing.assert_array_equal(jnp.concatenate(pieces), w0)
  x = jax.random.normal(jax.random.key(1), (3, 8, 8, 3))
  y = jnp.array([1, 7, 3])
  np.testing.assert_allclose(apply_flat(pieces, x), apply_flat(w0, x), **TOL)

  def loss(w):
    return -jnp.mean(jax.nn.log_softmax(apply_flat(w, x))[jnp.arange(3), y])

  g_flat, g_pieces = jax.grad(loss)(w0), jax.grad(loss)(pieces)
  assert isinstance(g_pieces, tuple) and len(g_pieces) == len(leaves)
  np.testing.assert_allclose(jnp.concatenate(g_pieces), g_flat, **TOL)


def test_registry_and_defaults():
  with pytest.raises(ValueError, match="cifar100_cnn"):
    models.get_model("vgg", 10, (32, 32, 3))
  with pytest.raises(ValueError):
    models.get_model("cnn", 10, (28, 28, 1), impl="fft")
  assert isinstance(models.get_model("cnn", 10, (28, 28, 1), impl="lax"), models.CNN)
  assert models.default_model_for("synthetic_1_1") == "logreg"
  assert models.default_model_for("mnist") == "cnn"
  assert models.default_model_for("fashion_mnist") == "cnn"
  assert models.default_model_for("cifar10") == "cifar10_cnn"
  assert models.default_model_for("cifar100") == "cifar100_cnn"


def _same_conv_macs(size, k, cin, cout):
  """Multiply-adds of a stride-1 SAME conv counting only taps inside the image."""
  pad = (k - 1) // 2
  taps = sum(min(i + pad, size - 1) - max(i - pad, 0) + 1 for i in range(size))
  return taps * taps * cin * cout


def test_flop_counts():
  # The CNN's multiply-adds per example (XLA does not count taps on SAME padding).
  macs = (_same_conv_macs(28, 5, 1, 32) + _same_conv_macs(14, 5, 32, 64)
          + 3136 * 512 + 512 * 10)
  batch = 2
  fwd = models.count_flops(models.CNN(impl="lax"), (28, 28, 1), batch)
  assert 2 * macs * batch <= fwd <= 1.03 * 2 * macs * batch
  # The patches formulation adds the (counted) patch extraction on top; "vjp" runs the
  # same convolutions as "lax", forward and (hand-written) backward.
  assert models.count_flops(models.CNN(impl="slices"), (28, 28, 1), batch) > fwd
  assert models.count_flops(models.CNN(impl="vjp"), (28, 28, 1), batch) == fwd
  step = models.train_step_flops(models.CNN(impl="lax"), (28, 28, 1), batch)
  assert 2.5 * fwd <= step <= 3.5 * fwd
  step_vjp = models.train_step_flops(models.CNN(impl="vjp"), (28, 28, 1), batch)
  assert abs(step_vjp - step) <= 0.05 * step


def test_analytic_flops_count_every_tap_as_pytorchs_flop_counter_does():
  # By hand: 2 x batch x multiply-adds, every output position against the whole kernel.
  batch = 10
  conv1, conv2 = 784 * 25 * 1 * 32, 196 * (25 * 32) * 64
  fc1, fc2 = 3136 * 512, 512 * 10
  fwd = models.count_flops(models.CNN(impl="lax"), (28, 28, 1), batch, count="analytic")
  assert fwd == 2 * batch * (conv1 + conv2 + fc1 + fc2)
  # The step: each layer's forward and kernel gradient, and the input gradient of every
  # layer but the first (the images are not differentiated).
  step = models.train_step_flops(models.CNN(impl="lax"), (28, 28, 1), batch,
                                 count="analytic")
  assert step == 2 * batch * (2 * conv1 + 3 * (conv2 + fc1 + fc2))
  # torch.utils.flop_counter on the same CNN in PyTorch gives 245.46304 and 723.84512
  # MFLOP: the same numbers.
  assert (fwd, step) == (245_463_040, 723_845_120)
  # XLA's count skips the taps that fall on SAME padding, so it is lower for the CNN ...
  xla = models.train_step_flops(models.CNN(impl="lax"), (28, 28, 1), batch)
  assert 0.8 * step < xla < step
  # ... and, with no padding, agrees on a plain product; a scan counts its body per trip.
  a, b = jnp.ones((64, 128)), jnp.ones((128, 32))
  product = 2 * 64 * 128 * 32
  assert models.analytic_flops(jnp.dot, a, b) == models._flops(jnp.dot, a, b) == product
  scanned = lambda a, b: lax.scan(lambda c, _: (c, jnp.dot(a, b)), 0.0, None, length=3)[1]
  assert models.analytic_flops(scanned, a, b) == 3 * product
  # a cond runs one branch: the dearer one (three products) is counted
  branchy = lambda p, a, b: lax.cond(p, lambda: jnp.dot(a, b),
                                     lambda: jnp.dot(a, b) @ b.T @ b)
  assert models.analytic_flops(branchy, True, a, b) == 3 * product


def test_analytic_flops_refuse_what_they_cannot_count():
  loop = lambda a: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ c[1]),
                                  (0, a))[1]
  with pytest.raises(ValueError, match="while loop"):
    models.analytic_flops(loop, jnp.ones((4, 4)))
  with pytest.raises(ValueError, match=r"unknown FLOP count 'hand'.*'xla', 'analytic'"):
    models.train_step_flops(models.LogisticRegression(10), (60,), 10, count="hand")


def test_max_pool2_equals_flax_max_pool_in_value_and_gradient():
  # As in the CNNs, pooling follows a ReLU: windows of zeros tie, and the two poolings
  # route those ties' gradient differently, but the ReLU's gradient at 0 is 0, so the
  # gradient with respect to the pre-activation must agree exactly.
  v = jax.random.normal(jax.random.key(3), (2, 28, 28, 8))
  for h, w in ((28, 28), (7, 7)):  # 7: odd sizes crop the last row/column (VALID)
    vs = v[:, :h, :w]
    np.testing.assert_array_equal(layers.max_pool2(jax.nn.relu(vs)),
                                  layers.max_pool2_window(jax.nn.relu(vs)))
    g = jax.random.normal(jax.random.key(4), layers.max_pool2(vs).shape)
    grad = lambda pool: jax.grad(lambda u: jnp.sum(pool(jax.nn.relu(u)) * g))(vs)
    np.testing.assert_array_equal(grad(layers.max_pool2), grad(layers.max_pool2_window))
    assert np.count_nonzero(grad(layers.max_pool2)) > 0


@pytest.mark.parametrize("x_shape", [(5, 37), (2, 3, 37)])
def test_dense_matches_flax_dense_in_value_and_gradients(x_shape):
  kx, kp, kg = jax.random.split(jax.random.key(5), 3)
  x = jax.random.normal(kx, x_shape)
  ref = nn.Dense(11)
  params = jax.tree.map(lambda a: a + 0.1, ref.init(kp, x))  # non-zero bias
  ours = layers.Dense(11)
  assert jax.tree.map(jnp.shape, ours.init(kp, x)) == jax.tree.map(jnp.shape, params)
  cot = jax.random.normal(kg, x_shape[:-1] + (11,))

  def grads(module):
    f = lambda p, x: jnp.sum(jnp.tanh(module.apply(p, x)) * cot)
    return jax.jit(jax.grad(f, argnums=(0, 1)))(params, x)

  np.testing.assert_allclose(jax.jit(ours.apply)(params, x), jax.jit(ref.apply)(params, x),
                             **TOL)
  (gp, gx), (gp_ref, gx_ref) = grads(ours), grads(ref)
  np.testing.assert_allclose(gx, gx_ref, **TOL)
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gp_ref)):
    np.testing.assert_allclose(a, b, **TOL)


def test_dense_input_gradient_under_vmap_over_client_kernels():
  kx, kw, kg = jax.random.split(jax.random.key(6), 3)
  x = jax.random.normal(kx, (3, 4, 9))  # 3 clients, batch 4
  w = jax.random.normal(kw, (3, 9, 6))  # each client its own kernel
  g = jax.random.normal(kg, (3, 4, 6))
  vjp = lambda f: jax.vmap(lambda x, w, g: jax.vjp(f, x, w)[1](g))(x, w, g)
  (dx, dw), (dx_ref, dw_ref) = vjp(layers.dense_matmul), vjp(jnp.matmul)
  for c in range(3):  # hand-written: dx = g W^T, dW = x^T g
    np.testing.assert_allclose(dx[c], np.asarray(g[c]) @ np.asarray(w[c]).T, **TOL)
    np.testing.assert_allclose(dw[c], np.asarray(x[c]).T @ np.asarray(g[c]), **TOL)
  np.testing.assert_allclose(dx, dx_ref, **TOL)
  np.testing.assert_allclose(dw, dw_ref, **TOL)


def _dot_output_shapes(fn, *args):
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  return [line.split("=")[1].split("{")[0].strip() for line in hlo.splitlines()
          if " dot(" in line]


def test_dense_input_gradient_is_compiled_with_the_kernel_as_left_operand():
  # The speed of Dense rests on XLA computing g @ W^T as (W g^T)^T: a [n, batch] dot
  # plus a small transpose, not the [batch, n] dot that contracts W on its minor axis
  # (4-14x slower on XLA:CPU). Without the optimisation barrier XLA folds it back.
  x, w, g = jnp.ones((10, 300)), jnp.ones((300, 40)), jnp.ones((10, 40))
  ours = _dot_output_shapes(lambda x, w, g: jax.vjp(layers.dense_matmul, x, w)[1](g)[0],
                            x, w, g)
  autodiff = _dot_output_shapes(lambda x, w, g: jax.vjp(jnp.matmul, x, w)[1](g)[0], x, w, g)
  assert ours == ["f32[300,10]"]
  assert autodiff == ["f32[10,300]"]


@pytest.mark.parametrize("name,shape", [("cnn", (12, 12, 1))])
def test_dense_impls_agree_on_models(name, shape):
  key = jax.random.key(7)
  x = jax.random.normal(key, (3, *shape))
  y = jnp.arange(3) % 10
  flax_model = models.get_model(name, 10, shape, dense="flax")
  fast_model = models.get_model(name, 10, shape, dense="fast")
  params = jax.jit(flax_model.init)(key, x)
  assert (jax.tree.map(jnp.shape, jax.jit(fast_model.init)(key, x))
          == jax.tree.map(jnp.shape, params))

  def grad(model):
    loss = lambda p: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
        model.apply(p, x), y))
    return jax.jit(jax.grad(loss))(params)

  np.testing.assert_allclose(jax.jit(fast_model.apply)(params, x),
                             jax.jit(flax_model.apply)(params, x), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(grad(fast_model)), jax.tree.leaves(grad(flax_model))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="dense"):
    models.get_model(name, 10, shape, dense="bogus")
