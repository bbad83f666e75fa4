"""Clients of different sizes: one vmapped local-training call, and the shuffle it replaced.

Data padded to M rows per client (the federation's largest client), K clients of one
round, logistic regression on 60 features, batch 10, one local epoch. For each mix of
client sizes (``--mixes``: K sizes each, written ``nxK`` or as a list ``n1/n2/...``):

* ``train_s``: one jitted ``jax.vmap`` of ``client.train`` over the K clients (best of
  ``--reps``). Its local loop runs the clients' own budgets (the largest among them), and
  each step draws its rows with ``client.index_shuffle``;
* ``argsort_s``: the step the shuffle replaced, timed alone: an argsort of [M] random keys
  per client (one epoch), what every client paid every round whatever its size;
* ``steps_run``: the trip count of the loop (the largest budget of the K), against
  ``max_steps`` = ceil(M / B), the trip count of the scan over padded steps it replaced.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/client_sizes.py

Rows go to ``benchmarks/results/client_sizes.jsonl`` / ``.csv``. Nothing here asserts a
timing.
"""

import functools


from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async.core import client as client_lib  # noqa: E402
from fedjax_async.algorithms import fedavg  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("max_examples", 33_600, "M, the padded rows per client (the largest "
                     "client of Synthetic(1,1) with 30 clients, seed 3, has 33,659).",
                     lower_bound=1)
flagcheck.item_list("mixes", ["200x10", "200/200/200/200/200/200/200/200/200/33600",
                              "2600x10"],
                    "Client-size mixes, each 'nxK' or 'n1/n2/...'; sizes in [1, "
                    "--max_examples].", "client-size mixes, each 'nxK' or 'n1/n2/...'")
flags.DEFINE_integer("batch", 10, "Local batch size B.", lower_bound=1)
flags.DEFINE_integer("reps", 3, "Timed repetitions (best is reported).", lower_bound=1)
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")

D, C = 60, 10


def parse_mix(text: str, max_examples: int):
  """'200x10' -> [200] * 10; '20/30' -> [20, 30]; a bad mix names the flag."""
  try:
    if "x" in text:
      n, k = text.split("x")
      sizes = [int(n)] * int(k)
    else:
      sizes = [int(v) for v in text.split("/")]
  except ValueError:
    raise app.UsageError(f"--mixes: expected 'nxK' or 'n1/n2/...', got {text!r}") from None
  if not sizes or min(sizes) < 1 or max(sizes) > max_examples:
    raise app.UsageError(f"--mixes: sizes must be in [1, --max_examples={max_examples}] and "
                         f"at least one client, got {text!r}")
  return sizes


def _check_mixes(v) -> bool:
  """Each of ``--mixes`` parses, its sizes in [1, --max_examples] (checked with the flags,
  so that ``--only_check_args`` sees a bad mix)."""
  if v["mixes"] and v["max_examples"] is not None:
    for text in v["mixes"]:
      if text:  # an empty item: the list's own check names it
        try:
          parse_mix(text, v["max_examples"])
        except app.UsageError as e:
          raise flags.ValidationError(str(e)) from None
  return True


flags.register_multi_flags_validator(["mixes", "max_examples"], _check_mixes)


def main(_):
  m, b = FLAGS.max_examples, FLAGS.batch
  mixes = [parse_mix(t, m) for t in FLAGS.mixes]
  mach = common.machine()
  print(f"[client_sizes] {mach}; M = {m}, B = {b}, logreg {D} -> {C}", flush=True)
  cfg = client_lib.LocalConfig(batch_size=b, max_epochs=1, max_examples=m)
  hp = {"lr": jnp.float32(0.05), "momentum": jnp.float32(0.0)}
  rows = []
  for sizes in mixes:
    k = len(sizes)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(k, m, D)).astype(np.float32))
    y = jnp.asarray(rng.integers(0, C, (k, m)).astype(np.int32))

    def apply_flat(w, xb, train=True, rng=None):
      return xb @ w[:D * C].reshape(D, C) + w[D * C:]

    train = jax.jit(jax.vmap(functools.partial(
        client_lib.train, apply_flat, fedavg.ALGORITHM, jnp.zeros(D * C + C), {}, hp=hp,
        cfg=cfg)))
    counts = jnp.asarray(sizes, jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), k)
    res = train(x, y, counts, keys)
    train_s = common.best_time(
        lambda: jax.block_until_ready(train(x, y, counts, keys)), FLAGS.reps)

    @jax.jit
    def argsort_shuffle(keys, counts):
      def one(key, n):  # the replaced shuffle: padding rows sort last
        u = jax.random.uniform(key, (m,))
        return jnp.argsort(jnp.where(jnp.arange(m) < n, u, 2.0))
      return jax.vmap(one)(keys, counts)

    argsort_s = common.best_time(
        lambda: jax.block_until_ready(argsort_shuffle(keys, counts)), FLAGS.reps)
    row = dict(bench="client_sizes", clients=k, sizes="/".join(map(str, sizes)),
               max_examples=m, batch=b, steps_run=int(jnp.max(res.num_steps)),
               max_steps=cfg.max_steps, train_s=train_s, argsort_s=argsort_s,
               tag=FLAGS.tag, **mach)
    print("[client_sizes] " + common.fmt_row(
        row, ("clients", "sizes", "steps_run", "max_steps", "train_s", "argsort_s")),
          flush=True)
    rows.append(row)
  common.write_rows("client_sizes", rows)


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
