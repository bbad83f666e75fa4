"""PAFed on Fashion-MNIST's CNN with its server under CKKS, against the plaintext server
with the same Min: a few rounds end to end, the parameters and accuracy compared.

Both runs share the data, the initial model and the timeline (40 clients, half of them
sampled each round, half of those delayed by one round: 10 online + 10 delayed uploads
from round 2 on). The plaintext run is ``pafed.make_algorithm`` with Cheon's Min of the
from fedjax_async import config as config_lib
same d and the same empty-class tolerance, on the round engine; the encrypted one is
``rounds.host_server.run_encrypted_rounds`` (clients encrypt, S0 and S1 run DUCC, Eq. 17 and Alg. 5, a
client decrypts). One JSON row per run with the per-round accuracies of both, the largest
parameter difference, and the encrypted round's timings:

  python benchmarks/ducc_e2e.py --rounds=3 --out_jsonl=benchmarks/results/ducc_e2e.jsonl
"""

from __future__ import annotations

import json
import resource
import time

from absl import app
from absl import flags
import numpy as np

from benchmarks import flagcheck
from benchmarks import host

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 3, "Rounds of both runs.", lower_bound=1)
flags.DEFINE_enum("design", "streamed", ["one_context", "streamed"], "--ckks_design.")
flags.DEFINE_enum("preset", "secure", ["secure", "insecure_test"], "--ckks_preset.")
flags.DEFINE_integer("min_depth", 10, "Cheon Min iterations d.", lower_bound=1)
flags.DEFINE_string("dataset", "fashion_mnist", "Data set.")
flags.DEFINE_string("model", "cnn", "Model.")
flags.DEFINE_integer("local_steps", 10, "Local minibatch steps per client and round.",
                     lower_bound=1)
flags.DEFINE_string("out_jsonl", "", "Append the row to this file.")


def round_by_round(states, tl, hparams, data, apply_flat, plain_alg, ecfg):
  """Per round, from the encrypted run's own state: the largest difference between its
  next model and the plaintext server's on the same uploads (the encryption's error
  alone, apart from how training amplifies it over rounds)."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import engine  # pylint: disable=g-import-not-at-top
  hp = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
  phase_fn = jax.jit(functools.partial(engine.client_phase, apply_flat=apply_flat,
                                       algorithm=plain_alg, cfg=ecfg))
  diffs = []
  for t in range(len(states) - 1):
    slots = jax.tree.map(lambda a: jnp.asarray(a[0]), tl.slice(t, t + 1))
    phase = phase_fn(states[t], slots, hp, data)
    w_plain, _, _ = plain_alg.server_update(states[t].w, states[t].server_state,
                                            phase.uploads, phase.arrivals, states[t].round, hp)
    diffs.append(float(np.max(np.abs(np.asarray(states[t + 1].w) - np.asarray(w_plain)))))
  return diffs


def main(argv):
  del argv
  from fedjax_async.core import client as client_lib  # pylint: disable=g-import-not-at-top
  from fedjax_async import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import engine  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_async.core import timeline as timeline_lib  # pylint: disable=g-import-not-at-top
  from fedjax_async.algorithms import pafed  # pylint: disable=g-import-not-at-top
  from fedjax_async.crypto import cheon  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import host_server  # pylint: disable=g-import-not-at-top

  cfg = config_lib.RunConfig().replace(
      algorithm="pafed", dataset=FLAGS.dataset, model=FLAGS.model, num_clients=40,
      participation=0.5, delay=timeline_lib.DelayConfig(0.5, "fixed", 1),
      rounds=FLAGS.rounds, local_epochs=1, local_steps=FLAGS.local_steps, lr=0.05,
      checkpoint_every=0, tensorboard=False)
  fed = experiment.load_data(cfg)
  _, w0, apply_flat = experiment.build_model(cfg, fed)
  tl = timeline_lib.build(fed.num_clients, cfg.run.rounds, cfg.run.participation, cfg.delay,
                          cfg.run.seed)
  ecfg = engine.EngineConfig(
      client_lib.LocalConfig(cfg.local.batch_size, cfg.local.local_epochs, fed.max_examples,
                             local_steps=cfg.local.local_steps), cfg.delay.ring_size)
  data = engine.DeviceData.from_federated(fed)
  d = FLAGS.min_depth
  plain_alg = pafed.make_algorithm(cheon.make_cheon_min(d), cheon.max_min_error(d))
  state = engine.init_state(plain_alg, w0, fed.num_clients, ecfg.ring_size, cfg.run.seed)
  runner = engine.make_runner(apply_flat, plain_alg, ecfg)
  plain_state, plain_rows = engine.run_rounds(runner, state, tl, cfg.hparams(), data,
                                            rounds_per_call=1)
  state = engine.init_state(pafed.ALGORITHM, w0, fed.num_clients, ecfg.ring_size, cfg.run.seed)
  states = [state]
  t0 = time.perf_counter()
  sec_state, sec_rows, totals = host_server.run_encrypted_rounds(
      apply_flat, pafed.ALGORITHM, ecfg, state, tl, cfg.hparams(), data,
      preset=FLAGS.preset, min_depth=d, design=FLAGS.design,
      on_chunk=lambda s, rows: states.append(s))
  wall = time.perf_counter() - t0
  round_diffs = round_by_round(states, tl, cfg.hparams(), data, apply_flat, plain_alg, ecfg)
  diff = float(np.max(np.abs(np.asarray(sec_state.w) - np.asarray(plain_state.w))))
  row = {
      "dataset": FLAGS.dataset, "model": FLAGS.model, "dim": int(w0.shape[0]),
      "rounds": FLAGS.rounds, "design": FLAGS.design, "preset": FLAGS.preset,
      "min_depth": d, "online": [r["online"] for r in sec_rows],
      "delayed": [r["delayed"] for r in sec_rows],
      "acc_encrypted": [r["test_accuracy"] for r in sec_rows],
      "acc_plaintext": [r["test_accuracy"] for r in plain_rows],
      "max_param_diff": diff, "round_param_diffs": round_diffs,
      "param_scale": float(np.max(np.abs(np.asarray(plain_state.w)))),
      "encrypted_wall_s": wall, "stage_totals_s": totals,
      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
      **host.openfhe_host()}
  print(json.dumps({k: row[k] for k in ("online", "delayed", "acc_encrypted",
                                        "acc_plaintext", "max_param_diff",
                                        "round_param_diffs", "param_scale",
                                        "encrypted_wall_s", "peak_rss_gib")}))
  if FLAGS.out_jsonl:
    with open(FLAGS.out_jsonl, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
