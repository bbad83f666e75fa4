"""Thousands of natural clients of ragged size on one device: EMNIST-shaped clients held
lazily on the host, each chunk of rounds' sampled clients copied to the device
(``core.streaming``), against what the whole padded arrays would take.

The data: ``--num_clients`` (3,400, EMNIST-62's writers) clients of 28 x 28 x 1 float32
images and labels in [0, 62), sizes drawn around EMNIST's mean (671,585 / 3,400 = 197.5
examples; normal, std 77, clipped to [19, 465]), images mostly background (1.0 after
fedjax's 1 - pixels) with a block of strokes, written to fedjax's SQLite file
(``--source=sqlite``: one zlib-compressed msgpack blob per client, read per chunk) or kept
as ragged arrays in memory (``--source=memory``, LEAF's way). The run: FedAvg, K =
``--per_round`` (10) clients per round, no delays, one local epoch of batch 20, the
default EMNIST model (``cnn``, 62 outputs) or ``--model=logreg``, ``--rounds_per_call``
rounds per compiled chunk; the test set capped at 1,000 examples.

Reported per row: ``rounds_per_s`` over the chunks after the first (compilation) whose
rounds evaluate nothing (the engine evaluates the last 10 rounds), host reads included;
``device_data_mib``: the device arrays of one chunk (its ``L * K`` clients' rows, the
client-to-row map, the sizes and the test set) and ``whole_data_mib``: the padded
``[N, M, 28, 28, 1]`` / ``[N, M]`` arrays the other paths would put on the device;
``live_device_mib``: every live device array after the run (model state included);
``peak_device_bytes`` (accelerators) or ``peak_rss`` (CPU, where the device is the host).

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/natural_clients.py
  PYTHONPATH=. .venv/bin/python benchmarks/natural_clients.py --model=logreg --rounds=40

Rows go to ``benchmarks/results/natural_clients.jsonl`` / ``.csv``. Nothing here asserts a
timing.
"""

import os
import sqlite3
import tempfile
import time
import zlib

from absl import app, flags
import jax
import numpy as np

from benchmarks import common
from benchmarks import flagcheck
from fedjax_async import algorithms
from fedjax_async import config as config_lib
from fedjax_async.core import building, streaming
from fedjax_async.core import client as client_lib
from fedjax_async.data import fedjax_sqlite, natural
from fedjax_async.rounds import engine
from fedjax_async.core import timeline as timeline_lib

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_clients", 3400, "N, natural clients.", lower_bound=1)
flags.DEFINE_integer("per_round", 10, "K, clients sampled per round.", lower_bound=1)
flags.DEFINE_integer("rounds", 30, "Rounds run.", lower_bound=2)
flags.DEFINE_integer("rounds_per_call", 10, "L, rounds per compiled chunk.", lower_bound=1)
flags.DEFINE_enum("model", "cnn", ["cnn", "logreg"], "The model (cnn: EMNIST's default).")
flags.DEFINE_enum("source", "sqlite", ["sqlite", "memory"], "Where the clients are held.")
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")

MEAN, STD, LOW, HIGH = 197.5, 77.0, 19, 465


def client_data(i: int, n: int):
  """(pixels [n, 28, 28] float32, labels [n]) of client i: background 1.0, a block of
  strokes (0.0 / 0.5) at a random place per image."""
  rng = np.random.default_rng(i)
  pixels = np.ones((n, 28, 28), np.float32)
  at = rng.integers(4, 16, (n, 2))
  strokes = rng.integers(0, 2, (n, 8, 8)).astype(np.float32) * 0.5
  for j in range(n):
    pixels[j, at[j, 0]:at[j, 0] + 8, at[j, 1]:at[j, 1] + 8] = strokes[j]
  return pixels, rng.integers(0, 62, n).astype(np.int32)


def _blob(examples):
  """fedjax's ``zlib.compress(msgpack_serialize(examples))`` (core/serialization.py)."""
  import msgpack  # pylint: disable=g-import-not-at-top
  ext = lambda a: msgpack.ExtType(1, msgpack.packb((a.shape, a.dtype.name, a.tobytes("C")),
                                                   use_bin_type=True))
  return zlib.compress(msgpack.packb(examples, default=ext, strict_types=True))


def write_sqlite(path: str, sizes):
  con = sqlite3.connect(path)
  con.execute(f"CREATE TABLE {fedjax_sqlite.TABLE} (client_id BLOB NOT NULL PRIMARY KEY, "
              "data BLOB NOT NULL, num_examples INTEGER NOT NULL)")
  for i, n in enumerate(sizes):
    p, l = client_data(i, int(n))
    con.execute(f"INSERT INTO {fedjax_sqlite.TABLE} VALUES (?, ?, ?)",
                (f"writer_{i:05d}".encode(), _blob({"pixels": p, "label": l}), int(n)))
  con.commit()
  con.close()


def load(sizes, directory: str):
  """The natural data set of ``sizes`` clients from ``--source``, and its host bytes."""
  if FLAGS.source == "sqlite":
    for split, s in (("train", sizes), ("test", [500, 500])):
      write_sqlite(os.path.join(directory, f"federated_emnist_{split}.sqlite"), s)
    fed = fedjax_sqlite.load("fedjax_emnist", directory)
    return fed, os.path.getsize(os.path.join(directory, "federated_emnist_train.sqlite"))
  clients = []
  for i, n in enumerate(sizes):
    p, l = client_data(i, int(n))
    clients.append(((1.0 - p)[..., None], l))
  store = natural.RaggedStore.from_clients([f"writer_{i:05d}" for i in range(len(sizes))],
                                           clients, "memory")
  tp, tl = client_data(10 ** 6, 1000)
  fed = natural.natural_data(store, (1.0 - tp)[..., None], tl, 62, "fedjax_emnist")
  return fed, store.x.nbytes + store.y.nbytes


def main(_):
  rng = np.random.default_rng(0)
  sizes = np.clip(rng.normal(MEAN, STD, FLAGS.num_clients).round(), LOW, HIGH).astype(int)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as directory:
    fed, host_bytes = load(sizes, directory)
    prepare_s = time.perf_counter() - t0
    participation = FLAGS.per_round / FLAGS.num_clients
    cfg = config_lib.RunConfig().replace(
        dataset="fedjax_emnist", model=FLAGS.model, algorithm="fedavg", batch_size=20,
        local_epochs=1, momentum=0.0, lr=0.05, rounds=FLAGS.rounds,
        participation=participation, delay_fraction=0.0)
    name, w0, apply_flat = building.build_model(cfg, fed)
    algorithm = algorithms.get("fedavg")
    tl = timeline_lib.build(fed.num_clients, FLAGS.rounds, participation, cfg.delay, 0)
    ecfg = engine.EngineConfig(
        client_lib.LocalConfig(20, 1, fed.max_examples, momentum=False), cfg.delay.ring_size,
        client_chunk=engine.auto_client_chunk(int(np.size(w0))))
    runner = engine.make_runner(apply_flat, algorithm, ecfg)
    state = engine.init_state(algorithm, w0, fed.num_clients, ecfg.ring_size, 0)
    data = streaming.StreamedData(fed)
    state, rows = engine.run_rounds(runner, state, tl, cfg.hparams(algorithm), data,
                                    eval_every=10 ** 9, rounds_per_call=FLAGS.rounds_per_call)
    jax.block_until_ready(state.w)
    chunk = data.last
    device_bytes = sum(int(a.nbytes) for a in (chunk.x, chunk.y, chunk.rows, chunk.counts,
                                               chunk.test_x, chunk.test_y))
    live = sum(int(a.nbytes) for a in jax.live_arrays())
  L = FLAGS.rounds_per_call
  timed = [r for r in rows[L:] if r.get("test_accuracy") is None]
  whole = fed.num_clients * fed.max_examples * (28 * 28 * 4 + 4)
  mib = lambda b: round(b / 2 ** 20, 1)
  row = {**common.machine(), "tag": FLAGS.tag, "model": name, "source": FLAGS.source,
         "num_clients": fed.num_clients, "per_round": FLAGS.per_round,
         "examples": int(sizes.sum()), "max_client": int(fed.max_examples),
         "rounds_per_call": L, "rounds_timed": len(timed),
         "rounds_per_s": len(timed) / sum(r["wall_time"] for r in timed) if timed else None,
         "device_data_mib": mib(device_bytes), "whole_data_mib": mib(whole),
         "live_device_mib": mib(live), "host_store_mib": mib(host_bytes),
         "prepare_s": round(prepare_s, 1), "peak_device_bytes": common.device_peak_bytes(),
         "peak_rss": common.peak_rss_bytes(),
         "train_loss_first_last": [rows[0]["train_loss"], rows[-1]["train_loss"]]}
  common.write_rows("natural_clients", [row])
  print(common.fmt_row(row, ["model", "source", "num_clients", "per_round", "examples",
                             "max_client", "rounds_timed", "rounds_per_s", "device_data_mib",
                             "whole_data_mib", "live_device_mib", "host_store_mib",
                             "peak_rss", "device_kind"]))


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
