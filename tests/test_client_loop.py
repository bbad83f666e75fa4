"""The local loop runs each client's own budget of steps (``client.train``)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async.core import client as client_lib
from fedjax_async.algorithms import fedavg


def test_a_client_trains_alike_alone_and_vmapped_with_a_larger_one():
  """The local loop runs each client's own budget; vmapped with a client 20x larger (the
  loop then runs that client's budget), the small client's result is its result alone."""
  D, C, M = 6, 3, 400
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, M, D)).astype(np.float32))
  y = jnp.asarray(rng.integers(0, C, (2, M)))
  w0 = jnp.asarray(rng.normal(size=D * C + C).astype(np.float32) * 0.1)

  def apply_flat(w, xb, train=True, rng=None):
    return xb @ w[:D * C].reshape(D, C) + w[D * C:]

  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M)
  hp = {"lr": jnp.float32(0.1), "momentum": jnp.float32(0.5)}
  train = functools.partial(client_lib.train, apply_flat, fedavg.ALGORITHM, w0, {}, hp=hp,
                            cfg=cfg)
  keys = jax.random.split(jax.random.PRNGKey(4), 2)
  counts = jnp.asarray([20, 400], jnp.int32)
  both = jax.jit(jax.vmap(train))(x, y, counts, keys)
  alone = jax.jit(train)(x[0], y[0], counts[0], keys[0])
  assert both.num_steps.tolist() == [10, 200]
  np.testing.assert_allclose(both.w_end[0], alone.w_end, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(both.mean_loss[0], alone.mean_loss, rtol=1e-6)
  assert float(jnp.max(jnp.abs(alone.w_end - w0))) > 1e-3  # it trained


def test_local_steps_caps_a_clients_round_at_its_first_minibatches():
  """LocalConfig.local_steps (--local_steps): a client takes min(S, E ceil(n / B)) steps,
  the first ones of its E epochs' shuffles; checked against plain SGD over those
  minibatches (momentum 0.5 by hand), vmapped with a client whose budget is smaller."""
  D, C, M = 4, 3, 30
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, M, D)).astype(np.float32))
  y = jnp.asarray(rng.integers(0, C, (2, M)))
  w0 = jnp.asarray(rng.normal(size=D * C + C).astype(np.float32) * 0.1)

  def apply_flat(w, xb, train=True, rng=None):
    return xb @ w[:D * C].reshape(D, C) + w[D * C:]

  cfg = client_lib.LocalConfig(batch_size=4, max_epochs=2, max_examples=M, local_steps=5)
  assert cfg.max_steps == 5  # (not 2 * ceil(30 / 4) = 16)
  hp = {"lr": jnp.float32(0.1), "momentum": jnp.float32(0.5)}
  keys = jax.random.split(jax.random.PRNGKey(2), 2)
  counts = jnp.asarray([30, 6], jnp.int32)  # budgets 16 and 2 * ceil(6 / 4) = 4
  train = functools.partial(client_lib.train, apply_flat, fedavg.ALGORITHM, w0, {}, hp=hp,
                            cfg=cfg)
  out = jax.jit(jax.vmap(train))(x, y, counts, keys)
  assert out.num_steps.tolist() == [5, 4]
  for i in range(2):
    n = int(counts[i])
    init = client_lib.client_init(jax.random.split(keys[i])[0], n, cfg)
    w, v = w0, jnp.zeros_like(w0)
    for s in range(int(out.num_steps[i])):
      rows, m = client_lib.step_minibatch(init, s, n, cfg)
      g = jax.grad(lambda w: client_lib.masked_cross_entropy(
          apply_flat(w, x[i][rows]), y[i][rows], m))(w)
      v = 0.5 * v + g
      w = w - 0.1 * v
    np.testing.assert_allclose(out.w_end[i], w, rtol=1e-5, atol=1e-6)
