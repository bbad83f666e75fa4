"""A chunked round's server: uploads folded in chunk by chunk, or kept as a [K, d] block.

For each algorithm (``--algorithms``) and K (``--clients``), the chunked round
(``--client_chunk`` clients per chunk, 30 % of the arrivals delayed by one round, so PAFed's
DUCC has both classes to weigh) is compiled twice, ``EngineConfig.stream_uploads`` on and
off, and timed taking turns (``common.timed_interleaved``):

* ``streamed_s`` / ``block_s``: seconds per round, and their ratio;
* ``streamed_temp_mib`` / ``block_temp_mib``: XLA's temp buffers of the compiled rounds
  (the block holds K uploads of d floats);
* ``server_streamed_ms`` / ``server_block_ms`` (``--server_only``): the server alone per
  client, on K random unit uploads already in memory: PAFed's ``ducc_add`` in a
  ``lax.scan`` over chunks against ``pafed.ducc`` on the block.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/server_stream.py

Rows go to ``benchmarks/results/server_stream.jsonl`` / ``.csv``. Nothing here asserts a
timing.
"""



from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks import flagcheck  # noqa: E402
from fedjax_async import algorithms  # noqa: E402
from fedjax_async.core import timeline as timeline_lib  # noqa: E402
from fedjax_async.algorithms import pafed  # noqa: E402

# The algorithms whose server folds the uploads in chunk by chunk (the others keep them
# as a [K, d] block whatever EngineConfig.stream_uploads says: nothing to compare).
STREAMED = tuple(n for n in algorithms.names("rounds")
                 if algorithms.get(n).streamed_server is not None)

FLAGS = flags.FLAGS
flagcheck.choice_list("algorithms", ["pafed", "fedavg"], STREAMED,
                      "Algorithms with a streamed server (Algorithm.streamed_server).")
flags.DEFINE_list("clients", ["50"], "Clients per round K (each >= 2).")
flags.DEFINE_enum("model", "cnn", sorted(common.MODELS), "Benchmark model.")
flags.DEFINE_integer("examples", 60, "Examples per client M.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("client_chunk", 1, "Clients per chunk.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Rounds fused per timed call (>= 2: the delayed updates "
                     "arrive from the second round on).", lower_bound=2)
flags.DEFINE_integer("reps", 3, "Timed repetitions, taking turns (best is reported).",
                     lower_bound=1)
flags.DEFINE_boolean("server_only", True, "Also time PAFed's server alone per client.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")

DELAYED = 0.3


def parse_clients(values):
  try:
    ks = [int(v) for v in values]
  except ValueError:
    raise app.UsageError(f"--clients: expected integers, got {values}") from None
  if not ks:
    raise app.UsageError("--clients: expected a non-empty comma-separated list of K")
  if any(k < 2 for k in ks):
    raise app.UsageError(f"--clients: need K >= 2 (two chunks or more), got {ks}")
  return ks


def _check_clients(values) -> bool:
  try:
    parse_clients(values)
  except app.UsageError as e:
    raise flags.ValidationError(str(e)) from None
  return True


flags.register_validator("clients", _check_clients)


def round_row(alg: str, k: int) -> dict:
  n = 2 * k  # half of the clients sampled per round, so delayed ones have slots
  wl = common.Workload(FLAGS.model, k, n, FLAGS.examples, FLAGS.batch, rounds=FLAGS.rounds,
                       algorithm=alg)
  wl.timeline = timeline_lib.build(n, FLAGS.rounds, k / n,
                                   timeline_lib.DelayConfig(DELAYED, "fixed", 1), 0)
  runners, temp = {}, {}
  for name, stream in (("streamed", True), ("block", False)):
    cfg = wl.engine_config(client_chunk=FLAGS.client_chunk, stream_uploads=stream)
    prepare, run, compiled = common.engine_runner(wl, cfg)
    temp[name] = compiled.memory_analysis().temp_size_in_bytes / 2 ** 20
    runners[name] = (prepare, run)
  best = common.timed_interleaved(runners, FLAGS.reps)
  return dict(bench="server_stream", model=FLAGS.model, algorithm=alg, clients_per_round=k,
              slots=int(wl.timeline.client.shape[1]),
              delayed=int((wl.timeline.valid & ~wl.timeline.online).sum()),
              params=wl.dim, client_chunk=FLAGS.client_chunk,
              streamed_s=best["streamed"] / FLAGS.rounds, block_s=best["block"] / FLAGS.rounds,
              streamed_over_block=best["streamed"] / best["block"],
              streamed_temp_mib=temp["streamed"], block_temp_mib=temp["block"])


def server_ms(k: int, dim: int) -> dict:
  """PAFed's server alone, per client: running sums over chunks of one vs the block."""
  rng = np.random.default_rng(0)
  u = rng.standard_normal((k, dim), dtype=np.float32)
  u = jnp.asarray(u / np.linalg.norm(u, axis=1, keepdims=True))
  online = jnp.arange(k) < round((1 - DELAYED) * k)

  @jax.jit
  def streamed(u):
    def body(c, xs):
      row, on = xs
      return pafed.ducc_add(c, row[None], on[None], ~on[None]), ()
    sums, _ = jax.lax.scan(body, pafed.ducc_init(u[0]), (u, online))
    return pafed.ducc_result(sums)

  @jax.jit
  def block(u):
    return pafed.ducc(u, u, online_mask=online, delayed_mask=~online)

  def runner(fn):
    return (lambda: None, lambda: jax.block_until_ready(fn(u)))

  best = common.timed_interleaved({"streamed": runner(streamed), "block": runner(block)},
                                  FLAGS.reps)
  return dict(server_streamed_ms=best["streamed"] / k * 1e3,
              server_block_ms=best["block"] / k * 1e3)


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  ks = parse_clients(FLAGS.clients)
  machine = common.machine()
  for alg in FLAGS.algorithms:
    for k in ks:
      row = round_row(alg, k)
      if FLAGS.server_only and alg == "pafed":
        row.update(server_ms(k, row["params"]))
      row.update(tag=FLAGS.tag, **machine)  # flat, as the other benchmarks: in the CSV too
      print("[server_stream] " + common.fmt_row(row, [
          "algorithm", "clients_per_round", "delayed", "streamed_s", "block_s",
          "streamed_over_block", "streamed_temp_mib", "block_temp_mib",
          "server_streamed_ms", "server_block_ms"]), flush=True)
      common.write_rows("server_stream", [row])


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
