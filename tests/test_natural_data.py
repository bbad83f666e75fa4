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
  with pytest.raises(ValueError, match=r"emnist_all.sqlite: client 'b' of split 'all_train' "
                     r"has 1 examples, client_metadata says 3; download"):
    fa.data.load("tff_emnist", data_dir=str(tmp_path))  # refused at load


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


# ------------------------------------------------------------ the peers' own files
# tests/fixtures/peers: written by fedjax's, TFF's and LEAF's own code, with the arrays the
# peers' own readers and preprocessing give (scripts/peer_fixtures.py).

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "peers")
PEER_NAMES = tuple(fa.data.NATURAL_DATASETS)


def _peer_dir(name):
  fmt, short = name.split("_", 1)
  if fmt == "leaf":
    return os.path.join(PEERS, "leaf", "data", short, "data")
  return os.path.join(PEERS, fmt)


def _expected(name):
  with np.load(os.path.join(PEERS, "expected", name + ".npz")) as e:
    e = {k: e[k] for k in e.files}
  if name.endswith("cifar100"):  # fedjax gives uint8 pixels; the reader's x is pixels / 255
    e["x"] = e["x"].astype(np.float32) / np.float32(255)
    e["test_x"] = e["test_x"].astype(np.float32) / np.float32(255)
  return e


def test_every_natural_name_has_a_peer_written_fixture_and_the_cli_accepts_it():
  from absl import flags
  from fedjax_async.cli import help as help_lib, run_flags
  assert sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(PEERS, "expected"))
                ) == sorted(PEER_NAMES)
  fv = flags.FlagValues()
  flags.DEFINE_string("dataset", "fashion_mnist", "", flag_values=fv)
  help_lib.GROUPS.setdefault("dataset", "data")
  for name in PEER_NAMES + ("fashion_mnist",):
    fv(["prog", f"--dataset={name}"])
    run_flags.check_names(fv)  # no "did you mean"
  fv(["prog", "--dataset=tff_cifar10"])
  with pytest.raises(ValueError, match="did you mean"):
    run_flags.check_names(fv)
  for name in PEER_NAMES:  # a typo of each is answered with the name itself
    fv(["prog", f"--dataset={name}x"])
    with pytest.raises(ValueError, match=f"did you mean {name}[ ?]"):
      run_flags.check_names(fv)


@pytest.mark.parametrize("name", PEER_NAMES)
def test_a_peer_written_file_reads_as_the_peers_own_reader_gives_it(name, capsys):
  e = _expected(name)
  fed = fa.data.load(name, data_dir=_peer_dir(name))
  kept = e["counts"] > 0
  ids = [str(i) for i in e["ids"][kept]]
  assert fa.data.client_ids(fed) == ids
  assert fed.counts.tolist() == e["counts"][kept].tolist()
  offsets = np.concatenate([[0], np.cumsum(e["counts"][kept])])
  x, y = natural.padded_rows(fed, range(len(ids)))
  for i in range(len(ids)):
    n = fed.counts[i]
    np.testing.assert_array_equal(x[i, :n], e["x"][offsets[i]:offsets[i + 1]].reshape(
        (n,) + fed.x.shape[2:]), err_msg=f"{name} client {ids[i]} x")
    np.testing.assert_array_equal(y[i, :n], e["y"][offsets[i]:offsets[i + 1]],
                                  err_msg=f"{name} client {ids[i]} y")
  np.testing.assert_array_equal(fed.test_x, e["test_x"].reshape(fed.test_x.shape))
  np.testing.assert_array_equal(fed.test_y, e["test_y"])
  empty = [str(i) for i in e["ids"][~kept]]
  err = capsys.readouterr().err
  if empty:  # counted on the console
    assert f"{len(empty)} of {len(e['ids'])} clients have no examples and are left out" in err
    assert repr(empty[0]) in err


def test_the_data_cli_reads_every_peer_written_fixture_in_one_process(tmp_path):
  import subprocess
  import sys
  proc = subprocess.run([sys.executable, "-m", "fedjax_async.cli.data", "describe",
                         f"--npz={tmp_path}"] + [f"{n}={_peer_dir(n)}" for n in PEER_NAMES],
                        env=run_script.env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in PEER_NAMES:
    e = _expected(name)
    kept = e["counts"] > 0
    assert (f"{name}: {int(kept.sum())} clients, {int(e['counts'].sum())} train examples (max "
            f"{int(e['counts'].max())} per client), {len(e['test_y'])} test") in proc.stdout
    with np.load(os.path.join(tmp_path, name + ".npz")) as got:
      assert got["ids"].tolist() == [str(i) for i in e["ids"][kept]], name
      assert got["counts"].tolist() == e["counts"][kept].tolist(), name
      for k in ("x", "y", "test_x", "test_y"):
        np.testing.assert_array_equal(got[k].reshape(e[k].shape), e[k], err_msg=f"{name} {k}")


def test_run_py_trains_on_the_names_the_cli_refused_before(tmp_path):
  out = str(tmp_path / "out")
  flags = [f"--{k}={v}" for k, v in RUN_FLAGS.items()]
  proc = run_script.run(["--algorithm=fedavg", "--dataset=tff_cifar100",
                         f"--data_dir={_peer_dir('tff_cifar100')}", f"--output_dir={out}",
                         "--quiet", "--max_client_examples=1"] + flags)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "left out" in proc.stderr  # the empty client, counted
  rows = run_script.read_rows(os.path.join(out, "fedavg", "metrics.jsonl"))
  assert len(rows) == 2


def test_a_leaf_user_without_samples_is_left_out_and_counted(tmp_path, capsys):
  import shutil
  d = str(tmp_path / "d")
  shutil.copytree(_peer_dir("leaf_femnist"), d)
  path = os.path.join(d, "train", os.listdir(os.path.join(d, "train"))[0])
  doc = json.load(open(path))
  gone = doc["users"][1]
  doc["user_data"][gone] = {"x": [], "y": []}
  doc["num_samples"][1] = 0
  json.dump(doc, open(path, "w"))
  e = _expected("leaf_femnist")
  fed = fa.data.load("leaf_femnist", data_dir=d)
  assert gone not in fa.data.client_ids(fed)
  assert fed.num_clients == (e["counts"] > 0).sum() - 1
  assert (f"1 of {len(e['ids'])} clients have no examples and are left out ({gone!r})"
          in capsys.readouterr().err)


def test_leaf_shakespeares_by_sample_split_and_sent140s_embeddings_are_leafs():
  e = _expected("leaf_shakespeare")
  # split_data.py wrote num_samples = n - n_train for the test users, 79 more than it kept
  doc = json.load(open(next(os.path.join(_peer_dir("leaf_shakespeare"), "test", f) for f in
                            os.listdir(os.path.join(_peer_dir("leaf_shakespeare"), "test")))))
  u = doc["users"][0]
  assert doc["num_samples"][0] - len(doc["user_data"][u]["y"]) == 79
  fed = fa.data.load("leaf_shakespeare", data_dir=_peer_dir("leaf_shakespeare"))
  assert len(fed.test_y) == len(e["test_y"])
  # leaf/models/sent140/embs.json (where get_embs.sh writes it) is found: its 10 words
  fed = fa.data.load("leaf_sent140", data_dir=_peer_dir("leaf_sent140"))
  assert fed.input_vocab == 10 + 1


# ------------------------------------------------------------------ damaged files

def _damage(path, how):
  """Plants damage in ``path``: truncated to half, one page-sized block in the middle
  overwritten, or the wrong format (LZMA-compressed / another format's file)."""
  import lzma
  data = open(path, "rb").read()
  if how == "truncated":
    data = data[:len(data) // 2 + 1000]
  elif how == "overwritten":
    block = 4096 if data.startswith(b"SQLite") else 64
    start = (len(data) // 2) // block * block
    data = data[:start] + b"\xa5" * block + data[start + block:]
  else:
    data = lzma.compress(data, format=lzma.FORMAT_ALONE)
  open(path, "wb").write(data)


DAMAGE_CASES = [(fmt, how) for fmt in ("fedjax_emnist", "tff_emnist", "leaf_femnist")
                for how in ("truncated", "overwritten", "wrong_format")]


def _damaged_copy(tmp_path, name, how):
  import shutil
  src = _peer_dir(name)
  d = str(tmp_path / "d")
  shutil.copytree(src, d)
  if name.startswith("fedjax"):
    target = os.path.join(d, "federated_emnist_train.sqlite")
  elif name.startswith("tff"):
    target = os.path.join(d, "emnist_all.sqlite")
  else:
    target = os.path.join(d, "train", sorted(os.listdir(os.path.join(d, "train")))[0])
  _damage(target, how)
  return d, target


@pytest.mark.parametrize("name,how", DAMAGE_CASES)
def test_a_damaged_file_is_refused_at_load_in_one_line_naming_it(tmp_path, name, how):
  d, target = _damaged_copy(tmp_path, name, how)
  with pytest.raises(ValueError) as e:
    fa.data.load(name, data_dir=d)
  msg = str(e.value)
  assert msg.startswith(target + ":") and "\n" not in msg, msg
  fix = {"fedjax": "download it again", "tff": "decompress it", "leaf": "preprocess.sh"}
  if how == "wrong_format":
    assert "LZMA-compressed" in msg, msg
  else:
    assert fix[name.split("_")[0]] in msg, msg
  if how == "overwritten" and not name.startswith("leaf"):  # SQLite's check names the page
    assert "damaged (SQLite quick_check: Page " in msg, msg


def test_a_wrong_formats_file_names_the_format_to_read_it_as(tmp_path):
  import shutil
  d = str(tmp_path)
  for split in ("train", "test"):
    shutil.copy(os.path.join(_peer_dir("tff_emnist"), "emnist_all.sqlite"),
                os.path.join(d, f"federated_emnist_{split}.sqlite"))
  with pytest.raises(ValueError, match=r"federated_emnist_train.sqlite: not fedjax's .*a TFF "
                     r"file is read as tff_\*"):
    fa.data.load("fedjax_emnist", data_dir=d)
  shutil.copy(os.path.join(_peer_dir("fedjax_emnist"), "federated_emnist_train.sqlite"),
              os.path.join(d, "emnist_all.sqlite"))
  with pytest.raises(ValueError, match=r"emnist_all.sqlite: not a TFF SqlClientData file.*a "
                     r"fedjax file is read as fedjax_\*"):
    fa.data.load("tff_emnist", data_dir=d)
  with pytest.raises(ValueError, match=r"cifar100_train.sqlite: client .*: no feature 'image' or 'x'"):
    for split in ("train", "test"):
      shutil.copy(os.path.join(_peer_dir("fedjax_emnist"), f"federated_emnist_{split}.sqlite"),
                  os.path.join(d, f"federated_cifar100_{split}.sqlite"))
    fa.data.load("fedjax_cifar100", data_dir=d)


def test_run_py_refuses_a_damaged_file_in_one_line_before_training(tmp_path):
  import concurrent.futures
  cases = [("fedjax_emnist", "overwritten"), ("tff_emnist", "truncated"),
           ("leaf_femnist", "overwritten")]
  dirs = []
  for i, (name, how) in enumerate(cases):
    os.makedirs(tmp_path / str(i))
    dirs.append(_damaged_copy(tmp_path / str(i), name, how))

  def run(i):
    name, _ = cases[i]
    return run_script.run(["--algorithm=fedavg", f"--dataset={name}",
                           f"--data_dir={dirs[i][0]}", "--participation=0.33", "--rounds=1",
                           f"--output_dir={tmp_path / str(i) / 'out'}", "--quiet"])

  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    procs = list(pool.map(run, range(len(cases))))
  for (name, how), (_, target), proc in zip(cases, dirs, procs):
    assert proc.returncode == 1, (name, how, proc.stdout[-1000:])
    lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {target}:"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / str(cases.index((name, how))) / "out" /
                              "metrics.jsonl")


# ---------------------------------------------------------------------- downloads

def _serve(files, cut_first=False):
  """An HTTP server on 127.0.0.1 serving ``files`` (name -> bytes) with Range requests;
  ``cut_first``: the first response of each file stops halfway. Returns (server, base URL,
  the Range headers seen)."""
  import http.server
  import threading
  seen, cut = [], set()

  class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
      pass

    def do_GET(self):
      name = self.path.lstrip("/")
      if name not in files:
        self.send_error(404)
        return
      data = files[name]
      rng = self.headers.get("Range")
      seen.append((name, rng))
      start = int(rng.split("=")[1].split("-")[0]) if rng else 0
      self.send_response(206 if rng else 200)
      self.send_header("Content-Length", str(len(data) - start))
      self.end_headers()
      body = data[start:]
      if cut_first and name not in cut:
        cut.add(name)
        body = body[:len(body) // 2]
      self.wfile.write(body)
      self.wfile.flush()

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server, f"http://127.0.0.1:{server.server_address[1]}", seen


def test_download_resumes_checks_and_decompresses_from_a_loopback_server(tmp_path, capsys):
  import hashlib
  import lzma
  from fedjax_async.data import download
  raw = open(os.path.join(_peer_dir("tff_emnist"), "emnist_all.sqlite"), "rb").read()
  packed = lzma.compress(raw, format=lzma.FORMAT_ALONE)
  server, url, seen = _serve({"emnist_all.sqlite.lzma": packed,
                              "cifar100.sqlite.lzma": packed}, cut_first=True)
  try:
    d = str(tmp_path / "d")
    args = ["tff_emnist", f"--data_dir={d}", f"--mirror={url}"]
    assert download.main(args) == 1  # cut halfway: resumable
    assert "run the command again to resume" in capsys.readouterr().err
    assert os.path.getsize(os.path.join(d, "emnist_all.sqlite.lzma.partial")) == len(packed) // 2
    assert download.main(args + [f"--sha256={hashlib.sha256(packed).hexdigest()}"]) == 0
    assert seen[-1] == ("emnist_all.sqlite.lzma", f"bytes={len(packed) // 2}-")
    assert open(os.path.join(d, "emnist_all.sqlite"), "rb").read() == raw
    err = capsys.readouterr().err
    assert "resuming at" in err and "100.0%" in err and "tff_emnist: ready" in err
    fa.data.load("tff_emnist", data_dir=d)
    # fedjax's published checksum of TFF's cifar100.sqlite.lzma does not match this file
    seen.clear()
    proc = __import__("subprocess").run(
        [__import__("sys").executable, "-m", "fedjax_async.cli.data", "download",
         "tff_cifar100", f"--data_dir={d}", f"--mirror={url}"], env=run_script.env(),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "interrupted" in proc.stderr  # the server's cut, then the mismatch on resuming
    assert download.main(["tff_cifar100", f"--data_dir={d}", f"--mirror={url}"]) == 1
    assert "checksum mismatch, removed" in capsys.readouterr().err
    assert not any(f.startswith("cifar100") for f in os.listdir(d))
    assert download.main(["leaf_femnist"]) == 1
    assert "preprocess.sh" in capsys.readouterr().err
  finally:
    server.shutdown()
