"""The natural data sets: fedjax's SQLite files, TFF's SQLite ClientData and LEAF's JSON
folders, written here as their own code writes them (tests/natural_files.py) and read
back: the clients (ids, sizes, examples) and test split the files hold, runs of FedAvg and
PAFed from Python and from experiments/run.py on each format, and the round engine's
streaming of a chunk's clients (the same rounds as with the whole padded arrays)."""

import json
import os

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async.core import streaming
from fedjax_async.data import natural, text, tff_sqlite
from fedjax_async.core import timeline as timeline_lib

import natural_files as nf
import run_script

SIZES = [3, 7, 1, 4, 5]  # the clients' examples, in the files' order
TEST_SIZES = [2, 3]
B = 2  # local batch of the runs: a round's steps are sum(ceil(n_i / B)) with E = 1


def _emnist_files(d, fmt):
  """EMNIST-shaped clients in format ``fmt``; returns (data set name, data_dir, client ids
  in the reader's order, [(pixels, labels)] in that order, test (pixels, labels))."""
  train = nf.emnist_clients(SIZES, 0)
  test = nf.emnist_clients(TEST_SIZES, 1)
  test_all = (np.concatenate([p for p, _ in test]), np.concatenate([l for _, l in test]))
  if fmt == "fedjax":
    ids = [f"{0x3a7 - 17 * i:04x}:f{i:04d}_0{i}" for i in range(len(SIZES))]  # rowid order
    for split, clients, names in (("train", train, ids), ("test", test, ["t0", "t1"])):
      nf.write_fedjax(os.path.join(d, f"federated_emnist_{split}.sqlite"),
                      [(n.encode(), {"pixels": p, "label": l.astype(np.int32)})
                       for n, (p, l) in zip(names, clients)])
    return "fedjax_emnist", d, ids, train, test_all
  if fmt == "tff":
    ids = [f"f{4 - i:04d}_{i:02d}" for i in range(len(SIZES))]  # TFF sorts client ids
    rows = lambda clients, names: [(n, [{"label": int(l[j]), "pixels": p[j]}
                                        for j in range(len(l))])
                                   for n, (p, l) in zip(names, clients)]
    nf.write_tff(os.path.join(d, "emnist_all.sqlite"),
                 {"all_train": rows(train, ids), "all_test": rows(test, ["t0", "t1"]),
                  "digits_only_train": rows(train[:1], ids[:1])})
    order = np.argsort(ids)
    return ("tff_emnist", d, [ids[i] for i in order], [train[i] for i in order], test_all)
  # LEAF: two training files (read in name order), a user with no examples left unlisted
  ids = [f"f{i:04d}_{i:02d}" for i in range(len(SIZES))]
  as_leaf = lambda c: (c[0].reshape(len(c[1]), -1).tolist(), [int(v) for v in c[1]])
  nf.write_leaf(d, "train", {"all_data_1_niid_0_keep_0_train_9.json":
                             {ids[i]: as_leaf(train[i]) for i in (3, 4)},
                             "all_data_0_niid_0_keep_0_train_9.json":
                             dict({ids[i]: as_leaf(train[i]) for i in (0, 1, 2)},
                                  f9999_99=([], []))})
  nf.write_leaf(d, "test", {"all_data_0_niid_0_keep_0_test_9.json":
                            {f"t{i}": as_leaf(c) for i, c in enumerate(test)}})
  return "leaf_femnist", d, ids, train, test_all


FORMATS = ("fedjax", "tff", "leaf")


def _expected_x(name, pixels):
  """The reader's features of raw pixels: fedjax and TFF x = 1 - pixels (fedjax
  emnist.preprocess_batch); LEAF's as stored."""
  x = pixels if name == "leaf_femnist" else 1.0 - pixels
  return x[..., None].astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_keeps_the_natural_clients_and_its_test_split(tmp_path, fmt):
  name, d, ids, clients, (tx, ty) = _emnist_files(str(tmp_path), fmt)
  fed = fa.data.load(name, data_dir=d, num_clients=999, partition="dirichlet")  # unused
  assert fa.data.is_lazy(fed) and fed.name == name and fed.num_classes == 62
  assert fa.data.client_ids(fed) == ids
  assert fed.counts.tolist() == [len(l) for _, l in clients]
  assert fed.x.shape == (len(ids), max(SIZES), 28, 28, 1)
  for i in (1, 2, 4):
    x, y = natural.padded_rows(fed, [i])
    n = len(clients[i][1])
    np.testing.assert_array_equal(x[0, :n], _expected_x(name, clients[i][0]))
    np.testing.assert_array_equal(y[0, :n], clients[i][1])
    assert not x[0, n:].any() and not y[0, n:].any()
  np.testing.assert_array_equal(fed.test_x, _expected_x(name, tx))
  np.testing.assert_array_equal(fed.test_y, ty)
  whole = np.asarray(fed.x)  # the paths that need every client at once
  np.testing.assert_array_equal(whole[3, :len(clients[3][1])], _expected_x(name, clients[3][0]))


def test_the_caps_keep_each_clients_first_examples_and_the_first_test_examples(tmp_path):
  name, d, ids, clients, (tx, ty) = _emnist_files(str(tmp_path), "fedjax")
  fed = fa.data.load(name, data_dir=d, max_client_examples=4, max_test_examples=3)
  assert fed.counts.tolist() == [min(n, 4) for n in SIZES]
  np.testing.assert_array_equal(natural.padded_rows(fed, [1])[1][0], clients[1][1][:4])
  np.testing.assert_array_equal(fed.test_y, ty[:3])


def test_fedjax_shakespeare_and_stackoverflow_token_ids_follow_fedjax(tmp_path):
  d = str(tmp_path)
  # fedjax datasets/shakespeare.py docstring, sequence_length=3: [b'ABCD', b'E'] ->
  # inputs [[BOS, A, B], [C, D, EOS], [BOS, E, PAD]], targets [[A, B, C], [D, EOS, BOS],
  # [E, EOS, PAD]]; a byte's id is 3 + its position in the vocabulary, others 89.
  vocab = (b'dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQU'
           b'Y]!%)-159\r')
  a, b_, c, d_, e = (3 + vocab.index(ch) for ch in b"ABCDE")
  x, y = text.shakespeare_sequences([b"ABCD", b"E"], 3)
  assert x.tolist() == [[1, a, b_], [c, d_, 2], [1, e, 0]]
  assert y.tolist() == [[a, b_, c], [d_, 2, 1], [e, 2, 0]]
  assert text.shakespeare_sequences([b"~"], 3)[1].tolist() == [[89, 2, 0]]  # OOV, 90 ids
  # Stack Overflow (fedjax StackoverflowTokenizer, vocabulary from the word_count file)
  with open(os.path.join(d, "stackoverflow.word_count"), "w") as f:
    f.write("the 9\n. 8\nis 7\nit 6\n")
  sentences = {"u1": [b"it is the cat .", b"the"], "u2": [b"is it"]}
  for split, users in (("train", sentences), ("test", {"t": [b"cat is"]})):
    nf.write_fedjax(os.path.join(d, f"stackoverflow_{split}.sqlite"),
                    [(u.encode(), {"tokens": np.array(s, object),
                                   "type": np.array([b"answer"] * len(s), object)})
                     for u, s in users.items()])
  fed = fa.data.load("fedjax_stackoverflow", data_dir=d)
  assert fed.num_classes == 4 + 4 and fed.counts.tolist() == [2, 1]
  x, y = natural.padded_rows(fed, [0])
  # ids: the 3, . 4, is 5, it 6, OOV 7; BOS 1, EOS 2; 20 positions
  assert x[0, 0, :6].tolist() == [1, 6, 5, 3, 7, 4] and not x[0, 0, 6:].any()
  assert y[0, 0, :6].tolist() == [6, 5, 3, 7, 4, 2] and not y[0, 0, 6:].any()
  assert fed.test_y[0, :3].tolist() == [7, 5, 2] and fed.x.shape[2:] == (20,)


def test_tff_examples_are_decoded_as_tensorflow_writes_them():
  """The protobuf library's encoding of tf.train.Example (negative int64s, packed floats,
  bytes) read back by the package's own decoder."""
  blob = nf.tf_example({"label": np.array([-3, 0, 2 ** 40]), "pixels": np.array([0.5, -1.25]),
                        "snippets": b"Hark!"})
  got = tff_sqlite.parse_example(blob)
  assert got["label"].tolist() == [-3, 0, 2 ** 40] and got["label"].dtype == np.int64
  assert got["pixels"].tolist() == [0.5, -1.25] and got["snippets"] == [b"Hark!"]


def test_a_client_whose_rows_disagree_with_its_metadata_is_named(tmp_path):
  path = os.path.join(str(tmp_path), "emnist_all.sqlite")
  ex = lambda n: [{"label": 1, "pixels": np.zeros((28, 28))}] * n
  nf.write_tff(path, {"all_train": [("a", ex(2)), ("b", ex(1))], "all_test": [("t", ex(1))]})
  import sqlite3
  con = sqlite3.connect(path)
  con.execute("UPDATE client_metadata SET num_examples = 3 WHERE client_id = 'b'")
  con.commit()
  con.close()
  fed = fa.data.load("tff_emnist", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r"client 'b': 1 examples and 1 labels read, the file "
                     r"says 3"):
    natural.padded_rows(fed, [1])


def test_leaf_sizes_are_checked_against_num_samples(tmp_path):
  d = str(tmp_path)
  nf.write_leaf(d, "train", {"a.json": {"u": ([[0.0] * 784] * 2, [1, 2])}})
  nf.write_leaf(d, "test", {"b.json": {"v": ([[0.0] * 784], [1])}})
  path = os.path.join(d, "train", "a.json")
  doc = json.load(open(path))
  doc["num_samples"] = [3]
  json.dump(doc, open(path, "w"))
  with pytest.raises(ValueError, match=r"a.json: user 'u' has 2 x and 2 y, num_samples says 3"):
    fa.data.load("leaf_femnist", data_dir=d)


def test_leaf_shakespeare_and_sent140_follow_leafs_processing(tmp_path):
  # models/utils/language_utils.py: letters by their position in ALL_LETTERS
  letters = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
  x, y = text.leaf_shakespeare(["To b", "e, o"], ["e", "r"])
  assert x.tolist() == [[letters.index(c) for c in "To b"], [letters.index(c) for c in "e, o"]]
  assert y.tolist() == [letters.index("e"), letters.index("r")]
  # sent140: x[4] the tweet; words [\w']+ or punctuation; unknown and padding = len(vocab)
  d = str(tmp_path)
  tweet = lambda t: ["1", "Mon Apr 06", "NO_QUERY", "user", t]
  nf.write_leaf(d, "train", {"s.json": {"a": ([tweet("good day, good!"), tweet("bad")], [1, 0]),
                                        "b": ([tweet("a good one")], [1])}})
  nf.write_leaf(d, "test", {"t.json": {"c": ([tweet("good bad zzz")], [1])}})
  fed = fa.data.load("leaf_sent140", data_dir=d)
  vocab = ["good", "!", ",", "a", "bad", "day", "one"]  # by count, then by word
  assert fed.input_vocab == len(vocab) + 1 and fed.num_classes == 2
  unk = len(vocab)
  assert fed.test_x[0].tolist() == [0, 4, unk] + [unk] * 22
  assert natural.padded_rows(fed, [0])[0][0, 0, :5].tolist() == [0, 5, 2, 0, 1]


def _run_checks(rows, counts):
  """Every round of a full-participation run without delays trains every client once:
  its arrivals are the N clients, its steps sum(ceil(n_i / B))."""
  steps = sum(-(-n // B) for n in counts)
  assert [(r["online"], r["delayed"], r["client_steps"]) for r in rows] == [
      (len(counts), 0, steps)] * 2


RUN_FLAGS = dict(rounds=2, participation=1.0, delay_fraction=0, model="logreg",
                 batch_size=B, local_epochs=1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_simulate_runs_fedavg_and_pafed_on_the_natural_clients(tmp_path, fmt):
  name, d, ids, clients, _ = _emnist_files(str(tmp_path), fmt)
  result = fa.simulate(algorithm="fedavg,pafed", dataset=name, data_dir=d, **RUN_FLAGS)
  for algorithm in ("fedavg", "pafed"):
    _run_checks(result.runs[algorithm].rows, [len(l) for _, l in clients])
    assert result.runs[algorithm].summary["dataset"] == name


@pytest.mark.parametrize("fmt", FORMATS)
def test_run_py_runs_fedavg_and_pafed_on_the_natural_clients(tmp_path, fmt):
  os.makedirs(tmp_path / "data")
  name, d, ids, clients, _ = _emnist_files(str(tmp_path / "data"), fmt)
  out = str(tmp_path / "out")
  flags = [f"--{k}={v}" for k, v in RUN_FLAGS.items()]
  proc = run_script.run(["--algorithm=fedavg,pafed", f"--dataset={name}", f"--data_dir={d}",
                         f"--output_dir={out}", "--quiet"] + flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for algorithm in ("fedavg", "pafed"):
    rows = run_script.read_rows(os.path.join(out, algorithm, "metrics.jsonl"))
    _run_checks(rows, [len(l) for _, l in clients])


def test_streamed_rounds_equal_rounds_on_the_whole_padded_arrays(tmp_path):
  """A chunk's clients copied to the device (core.streaming) give the rounds that the same
  clients give as one padded array on the device (data=from_clients), bit for bit: with
  partial participation, delays and several chunks, every client trains on its own rows."""
  name, d, ids, clients, (tx, ty) = _emnist_files(str(tmp_path), "fedjax")
  lazy = fa.data.load(name, data_dir=d)
  whole = fa.data.from_clients([(_expected_x(name, p), l) for p, l in clients],
                               (_expected_x(name, tx), ty), num_classes=62, name=name)
  flags = dict(rounds=4, participation=0.4, delay_fraction=0.5, rounds_per_call=2,
               model="logreg", batch_size=B, local_epochs=1, algorithm="fedavg,pafed")
  a = fa.simulate(data=lazy, **flags)
  b = fa.simulate(data=whole, **flags)
  for algorithm in ("fedavg", "pafed"):
    np.testing.assert_array_equal(np.asarray(a.runs[algorithm].state.w),
                                  np.asarray(b.runs[algorithm].state.w))
    assert ([r["train_loss"] for r in a.runs[algorithm].rows]
            == [r["train_loss"] for r in b.runs[algorithm].rows])


def test_a_chunk_holds_only_its_training_clients_rows(tmp_path):
  name, d, ids, clients, _ = _emnist_files(str(tmp_path), "fedjax")
  fed = fa.data.load(name, data_dir=d)
  tl = timeline_lib.build(len(SIZES), 6, 0.4, fa.DelayConfig(fraction=0.5, max_delay=2), 0)
  data = streaming.StreamedData(fed)
  chunk = data.for_rounds(tl, 2, 5)
  slots = tl.slice(2, 5)
  trained = np.unique(slots["client"][slots["valid"] | slots["lost"]])
  assert chunk.x.shape == (3 * tl.client.shape[1], max(SIZES), 28, 28, 1)  # L * K rows
  whole = np.asarray(fed.x)
  for c in trained:
    np.testing.assert_array_equal(np.asarray(chunk.x)[int(chunk.rows[c])], whole[c])
  assert len(set(np.asarray(chunk.rows)[trained].tolist())) == len(trained)


def test_missing_files_and_data_dir_are_named(tmp_path):
  with pytest.raises(ValueError, match="data.dataset=fedjax_emnist: reads its files from "
                     "data.data_dir, and none is given"):
    fa.data.load("fedjax_emnist")
  with pytest.raises(FileNotFoundError, match="federated_emnist_train.sqlite: no such file"):
    fa.data.load("fedjax_emnist", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"emnist_all.sqlite: no such file"):
    fa.data.load("tff_emnist", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"train: no \*.json files"):
    fa.data.load("leaf_femnist", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match="stackoverflow.word_count: no such file"):
    text.read_vocabulary(str(tmp_path))


def test_the_cost_estimate_counts_a_chunks_rows_of_a_streamed_data_set(tmp_path):
  from fedjax_async import config as config_lib
  from fedjax_async import cost
  from fedjax_async.core import building
  name, d, ids, clients, _ = _emnist_files(str(tmp_path), "fedjax")
  fed = fa.data.load(name, data_dir=d)
  cfg = config_lib.RunConfig().replace(dataset=name, model="logreg", participation=0.4,
                                       rounds_per_call=1)
  model = building.build_model(cfg, fed)
  lazy = cost.round_engine(cfg, fed, model).memory_bytes
  whole = cost.round_engine(cfg, fa.data.from_clients(
      [(_expected_x(name, p), l) for p, l in clients], (fed.test_x, fed.test_y),
      num_classes=62), model).memory_bytes
  row = 4 * max(SIZES) * 28 * 28  # the float32 features of one padded client
  # on the device: 0.4 x 5 = 2 clients a round, one round a chunk, against all 5
  assert whole - lazy == pytest.approx((len(SIZES) - 2) * row)


def test_a_large_federation_is_read_only_where_a_chunk_trains(tmp_path, monkeypatch):
  """3,000 Stack Overflow-format clients in fedjax's file: loading reads none of their
  data (sizes from the num_examples column, one client read for the checks), a chunk of
  rounds reads exactly the clients that train in it."""
  from fedjax_async.data import fedjax_sqlite
  d = str(tmp_path)
  with open(os.path.join(d, "stackoverflow.word_count"), "w") as f:
    f.write("the 3\nit 2\n")
  users = [(f"{i:05d}".encode(), {"tokens": np.array([b"the it"] * (1 + i % 3), object)})
           for i in range(3000)]
  nf.write_fedjax(os.path.join(d, "stackoverflow_train.sqlite"), users)
  nf.write_fedjax(os.path.join(d, "stackoverflow_test.sqlite"), users[:1])
  reads, original = [], fedjax_sqlite.SQLiteStore.read
  monkeypatch.setattr(fedjax_sqlite.SQLiteStore, "read",
                      lambda store, i: reads.append((store.path, i)) or original(store, i))
  fed = fa.data.load("fedjax_stackoverflow", data_dir=d)
  assert fed.counts.tolist() == [1 + i % 3 for i in range(3000)]
  assert len([r for r in reads if "train" in r[0]]) == 1
  reads.clear()
  tl = timeline_lib.build(3000, 4, 5 / 3000, fa.DelayConfig(fraction=0.0), 0)
  streaming.StreamedData(fed).for_rounds(tl, 0, 2)
  trained = set(tl.client[:2][tl.valid[:2]].tolist())
  assert sorted(i for _, i in reads) == sorted(trained) and len(trained) == 10


@pytest.mark.benchmarks
def test_the_natural_clients_benchmark_measures_a_chunk_against_the_whole_arrays(tmp_path):
  import subprocess
  import sys
  env = dict(run_script.env(), FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  script = os.path.join(run_script.ROOT, "benchmarks", "natural_clients.py")
  proc = subprocess.run([sys.executable, script, "--num_clients=40", "--per_round=4",
                         "--rounds=12", "--rounds_per_call=1", "--model=logreg"], env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  row = run_script.read_rows(os.path.join(str(tmp_path), "natural_clients.jsonl"))[-1]
  n, k, m = 40, 4, row["max_client"]
  example = 28 * 28 * 4 + 4  # float32 image, int32 label
  chunk = 1 * k * m * example + 2 * 4 * n + 1000 * example  # rows, map and sizes, test set
  assert row["device_data_mib"] == round(chunk / 2 ** 20, 1)
  assert row["whole_data_mib"] == round(n * m * example / 2 ** 20, 1)
  assert row["rounds_timed"] == 1 and row["rounds_per_s"] > 0
