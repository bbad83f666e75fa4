"""The clients' minibatch shuffle (``client.index_shuffle``, swap-or-not): a permutation of
the real rows, uniform over orders, positions and minibatch pairs (the local loop over each
client's own budget: ``test_client_loop.py``)."""

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async.core import client as client_lib

R = client_lib.SHUFFLE_ROUNDS


@functools.partial(jax.jit, static_argnums=(0, 1))
def _orders(width, samples, n, seed):
  keys = jax.random.bits(jax.random.PRNGKey(seed), (samples, R, 2), jnp.uint32)
  positions = jnp.minimum(jnp.arange(width), n - 1)
  return jax.vmap(lambda k: client_lib.index_shuffle(positions, k, n))(keys)


def orders(n, samples, seed, width=None):
  """[samples, n]: shuffles of n rows (n traced: one compilation per width)."""
  return np.asarray(_orders(width or n, samples, n, seed))[:, :n]


def test_index_shuffle_is_a_permutation_of_the_real_rows():
  for n in list(range(1, 70)) + [255, 256, 257, 1000, 4097]:
    for p in orders(n, 3, n, width=4097):
      assert sorted(p.tolist()) == list(range(n)), n
  for p in orders(33_600, 2, 0):
    assert sorted(p.tolist()) == list(range(33_600))


def test_index_shuffle_draws_every_order_of_five_rows_equally_often():
  """12,000 shuffles of 5 rows over the 120 orders: Pearson's chi-square (119 degrees of
  freedom, mean 119, 99.99 % quantile ~ 186) stays under 190; a shuffle missing orders or
  favouring some (e.g. a Feistel network on 3 bits reaches only 1,344 of 8! orders of 8
  rows) lands in the thousands."""
  counts = collections.Counter(map(tuple, orders(5, 12_000, 1).tolist()))
  expected = 12_000 / 120
  chi2 = sum((counts.get(p, 0) - expected) ** 2 / expected
             for p in itertools.permutations(range(5)))
  assert len(counts) == 120 and chi2 < 190, (len(counts), chi2)


def test_index_shuffle_of_a_thousand_rows_looks_uniform():
  """Position 0's row over 2,000 shuffles of 1,000 rows: chi-square < 1,200 (999 degrees of
  freedom, 99.99 % quantile ~ 1,165); fixed points per shuffle average 1 (as a uniform
  permutation's); the identity (no shuffle) would put row 0 at position 0 every time."""
  p = orders(1000, 2000, 2)
  counts = np.bincount(p[:, 0], minlength=1000)
  chi2 = float(((counts - 2.0) ** 2 / 2.0).sum())
  assert chi2 < 1200, chi2
  fixed = float((p == np.arange(1000)).sum(1).mean())
  assert 0.85 < fixed < 1.15, fixed


def same_batch_counts(p, batch_size):
  """[n, n]: how many of the shuffles ``p`` ([S, n]: row at each position) put rows r and q
  in the same minibatch of ``batch_size`` consecutive positions."""
  s, n = p.shape
  batch = np.empty_like(p)
  batch[np.arange(s)[:, None], p] = np.arange(n)[None] // batch_size
  one_hot = np.eye(n // batch_size)[batch]  # [S, row, batch]
  return np.einsum("srb,sqb->rq", one_hot, one_hot)


def test_index_shuffle_puts_every_pair_of_rows_in_one_minibatch_equally_often():
  """4,000 shuffles of 100 rows into 10 minibatches of 10: each of the 4,950 pairs shares a
  minibatch Binomial(4000, 9/99) times (mean 363.6, sd 18.2). SGD sees correlated
  minibatches if pairs (adjacent rows, or x and K - x, which one round of swap-or-not
  exchanges together) co-occur more often. Measured: max |z| 3.5-3.8 over the pairs,
  mean z^2 0.98-1.01; 2 / 4 / 8 rounds instead of 24 give max |z| 51 / 14 / 4.3 and
  mean z^2 163 / 11 / 1.05."""
  def z_scores(p):
    co = same_batch_counts(p, 10)[np.triu_indices(100, 1)]
    mean = p.shape[0] * 9 / 99
    return (co - mean) / np.sqrt(mean * (1 - 9 / 99))

  z = z_scores(orders(100, 4000, 3))
  assert np.abs(z).max() < 5.5 and 0.9 < float((z ** 2).mean()) < 1.1
  keys = jax.random.bits(jax.random.PRNGKey(3), (4000, 2, 2), jnp.uint32)
  two_rounds = np.asarray(jax.vmap(lambda k: client_lib.index_shuffle(jnp.arange(100), k,
                                                                      100))(keys))
  assert np.abs(z_scores(two_rounds)).max() > 20  # the test can tell a poor shuffle


def test_step_minibatch_draws_each_real_row_once_per_epoch():
  """n = 23 rows padded to M = 40, batches of 5: steps 0-4 are epoch 0 (the last batch has
  3 real rows, 2 masked), steps 5-9 epoch 1, in a different order; no padding row."""
  cfg = client_lib.LocalConfig(batch_size=5, max_epochs=2, max_examples=40)
  init = client_lib.client_init(jax.random.PRNGKey(0), 23, cfg)
  steps, rows, masks = client_lib.minibatches(init, 23, cfg)
  rows, masks = np.asarray(rows), np.asarray(masks)
  assert rows.shape == (16, 5) and int(init.spe) == 5
  for e in range(2):
    drawn = rows[5 * e:5 * e + 5][masks[5 * e:5 * e + 5]]
    assert sorted(drawn.tolist()) == list(range(23))
    assert masks[5 * e + 4].tolist() == [True, True, True, False, False]
  assert rows[:5][masks[:5]].tolist() != rows[5:10][masks[5:10]].tolist()
  assert rows.max() < 23
