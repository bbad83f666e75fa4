"""Writes tests/fixtures/peers/: small files of every natural data set written by the peers'
own code, and the arrays the peers' own readers and preprocessing give for them.

Run by a developer with the peers in side environments (outside the repository):

  python3.10 -m venv /tmp/peer_fedjax
  /tmp/peer_fedjax/bin/pip install fedjax==0.0.17 jax==0.6.2 jaxlib==0.6.2 tensorflow-cpu
  python3.10 -m venv /tmp/peer_tff
  /tmp/peer_tff/bin/pip install -U pip && /tmp/peer_tff/bin/pip install tensorflow-federated==0.61.0
  git clone https://github.com/TalwalkarLab/leaf /tmp/leaf   # (not committed here)
  python scripts/peer_fixtures.py --fedjax_python=/tmp/peer_fedjax/bin/python \\
      --tff_python=/tmp/peer_tff/bin/python --leaf=/tmp/leaf [--out=tests/fixtures/peers]

Stages (each runs in its peer's Python; ``STAGE`` picks one):

* ``leaf``: LEAF's ``data/utils/split_data.py`` (run as LEAF runs it, from a copy of its
  ``data/utils`` in a temporary tree) splits ``all_data.json`` files made here in LEAF's
  ``all_data`` layout (femnist by user, with a user of no samples; shakespeare, sent140 and
  synthetic by sample, synthetic's users from LEAF's ``data/synthetic`` generator); the
  expected arrays from LEAF's ``models/utils/model_utils.read_dir`` and the models'
  ``process_x`` / ``process_y`` (``language_utils``; femnist / synthetic ``np.array``);
* ``tff``: TFF's ``save_to_sql_client_data`` writes ``emnist_all.sqlite`` (splits
  all_* and digits_only_*), ``shakespeare.sqlite``, ``stackoverflow.sqlite`` and
  ``cifar100.sqlite``; TFF's readers (``SqlClientData(...).preprocess(<the data set's
  parsing>)``, as its ``load_data``) dump every client's raw examples;
* ``fedjax``: fedjax's ``SQLiteFederatedDataBuilder`` writes the fedjax files (CIFAR-100
  with the features of fedjax's ``cifar100.load_split`` conversion, ``image`` /
  ``label`` / ``coarse_label``); fedjax's
  readers (``SQLiteFederatedData``) and preprocessing (``emnist.preprocess_split``,
  ``shakespeare.preprocess_client``, ``StackoverflowTokenizer`` at 20 / 30 tokens,
  ``cifar100.preprocess_client``) give the expected arrays of the fedjax files, and the
  same preprocessing of TFF's raw dumps those of the TFF files.

Every ``expected/NAME.npz`` holds ``ids`` (the peer reader's clients, in its order, empty
ones included), ``counts``, ``x`` / ``y`` (every client's examples end to end), ``test_x``
/ ``test_y``; images as the peer gives them (fedjax CIFAR-100: uint8 pixels).
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "peers")
WORDS = ("the a to of is in i it how and for you on this with can not that my be but use "
         "have are do if get file code").split()


def save(out, name, ids, clients, test):
  """expected/NAME.npz of [(x_i, y_i)] per client and (test_x, test_y)."""
  os.makedirs(os.path.join(out, "expected"), exist_ok=True)
  first = next(c for c in clients if len(c[1]))
  cat = lambda parts, k: np.concatenate([np.asarray(p[k]) for p in parts if len(p[1])]) if any(
      len(p[1]) for p in parts) else np.zeros((0,) + np.asarray(first[k]).shape[1:])
  np.savez_compressed(os.path.join(out, "expected", name + ".npz"),
                      ids=np.array([str(i) for i in ids]),
                      counts=np.array([len(c[1]) for c in clients], np.int64),
                      x=cat(clients, 0), y=cat(clients, 1), test_x=cat(test, 0),
                      test_y=cat(test, 1))


# ----------------------------------------------------------------------- raw data


def sizes(seed, n, high):
  rng = np.random.default_rng(seed)
  s = rng.integers(1, high + 1, n)
  s[n // 3] = 0  # an empty client
  return [int(v) for v in s]


def pixels(rng, n):
  """EMNIST-like [n, 28, 28] float32: white (1.0) with a few ink strokes (k / 255)."""
  p = np.ones((n, 28, 28), np.float32)
  for i in range(n):
    r, c = rng.integers(4, 20, 2)
    p[i, r:r + 6, c:c + 3] = rng.integers(0, 255, (6, 3)) / np.float32(255)
  return p


def images(rng, n):
  """CIFAR-like [n, 32, 32, 3] uint8, smooth (small files)."""
  base = rng.integers(0, 100, (n, 1, 1, 3))
  ramp = np.arange(32)[None, :, None, None] // 4 + np.arange(32)[None, None, :, None] // 8
  return (base + ramp).astype(np.uint8)


SNIPPETS = [b"Hark!", b"When?", b"My name's Macbeth.", b"'Twas a rough fight.",
            b"Came they not by you?", b"No, nor more fearful.", b"Never.",
            b"But now, my lord.", b"How if fair and foolish?", b"Is not this man jealous?",
            b"Why, with my lord, madam.", b"[Within.] I do beseech you", b"\xc3\xa9t\xc3\xa9 ~"]


def sentences(rng, n):
  out = []
  for _ in range(n):
    k = int(rng.integers(1, 36))  # some longer than 20 and 30 tokens
    words = [WORDS[int(j)] if j < len(WORDS) else f"w{int(j)}" for j in
             rng.integers(0, len(WORDS) + 6, k)]
    out.append(" ".join(words).encode())
  return out


def raw_sets(seed=0):
  """{kind: (train [(id, examples)], test [(id, examples)])}, examples {feature: array}."""
  rng = np.random.default_rng(seed)
  sets = {}
  for kind, n, high, test_n in (("emnist", 20, 3, 4), ("emnist_digits", 10, 2, 3),
                                ("cifar100", 16, 2, 4), ("shakespeare", 14, 4, 4),
                                ("stackoverflow", 20, 5, 5)):
    split = {}
    for which, count in (("train", n), ("test", test_n)):
      ss = sizes(seed + len(kind) + count, count, high)
      clients = []
      for i, m in enumerate(ss):
        cid = f"{'t' if which == 'test' else 'f'}{(7 * i + 3) % 97:04d}_{i:02d}"
        if kind.startswith("emnist"):
          ex = {"pixels": pixels(rng, m),
                "label": rng.integers(0, 10 if "digits" in kind else 62, m).astype(np.int32)}
        elif kind == "cifar100":
          ex = {"image": images(rng, m), "label": rng.integers(0, 100, m).astype(np.int64),
                "coarse_label": rng.integers(0, 20, m).astype(np.int64)}
        elif kind == "shakespeare":
          ex = {"snippets": np.array([SNIPPETS[int(j)] for j in
                                      rng.integers(0, len(SNIPPETS), m)], dtype=object)}
        else:
          ex = {"tokens": np.array(sentences(rng, m), dtype=object),
                "creation_date": np.array([b"2018-02-28 19:06:18.34 UTC"] * m, dtype=object),
                "title": np.array([b"a title"] * m, dtype=object),
                "tags": np.array([b"python|sqlite"] * m, dtype=object),
                "type": np.array([b"question"] * m, dtype=object),
                "score": np.arange(m, dtype=np.int64)}
        clients.append((cid, ex))
      # shuffled row order: the readers' own order (fedjax rowid, TFF sorted ids) matters
      order = rng.permutation(len(clients))
      split[which] = [clients[j] for j in order]
    sets[kind] = split
  return sets


def write_word_count(path):
  with open(path, "w") as f:
    for j, w in enumerate(WORDS[:24]):
      f.write(f"{w} {1000 - j}\n")


# --------------------------------------------------------------------------- LEAF


def _load(name, path):
  """The file ``path`` (LEAF's own code, in its checkout) as the module ``name``,
  registered in ``sys.modules`` so that a later file importing ``name`` gets it."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
  return sys.modules[name]


def stage_leaf(out, leaf):
  utils = os.path.join(leaf, "models", "utils")  # LEAF's own
  language_utils = _load("language_utils", os.path.join(utils, "language_utils.py"))
  model_utils = _load("model_utils", os.path.join(utils, "model_utils.py"))
  work = tempfile.mkdtemp(prefix="leaf_work_")
  shutil.copytree(os.path.join(leaf, "data", "utils"), os.path.join(work, "data", "utils"))
  rng = np.random.default_rng(5)

  def split(name, all_data, how, frac, seed):
    d = os.path.join(work, "data", name, "data")
    for sub in ("all_data", "train", "test"):
      os.makedirs(os.path.join(d, sub), exist_ok=True)
    with open(os.path.join(d, "all_data", "all_data.json"), "w") as f:
      json.dump(all_data, f)
    subprocess.run([sys.executable, "split_data.py", "--name", name, how, "--frac",
                    str(frac), "--seed", str(seed)], cwd=os.path.join(work, "data", "utils"),
                   check=True, stdout=subprocess.DEVNULL)
    target = os.path.join(out, "leaf", "data", name, "data")
    shutil.rmtree(target, ignore_errors=True)
    for sub in ("train", "test"):
      shutil.copytree(os.path.join(d, sub), os.path.join(target, sub))
    return target

  def as_leaf(users):
    return {"users": list(users), "num_samples": [len(users[u]["y"]) for u in users],
            "user_data": users}

  def expected(name, target, process_x, process_y):
    train_ids, _, train = model_utils.read_dir(os.path.join(target, "train"))
    test_ids, _, test = model_utils.read_dir(os.path.join(target, "test"))
    clients = [(process_x(train[u]["x"]), process_y(train[u]["y"])) for u in train_ids]
    tests = [(process_x(test[u]["x"]), process_y(test[u]["y"])) for u in test_ids]
    save(out, name, train_ids, clients, tests)

  # femnist: by user (split_data.py --by_user), a user with no samples
  users = {}
  for i, m in enumerate(sizes(11, 30, 4)):
    users[f"f{(13 * i) % 100:04d}_{i:02d}"] = {
        "x": [[round(float(v), 4) for v in p.ravel()] for p in pixels(rng, m)],
        "y": [int(v) for v in rng.integers(0, 62, m)]}
  t = split("femnist", as_leaf(users), "--by_user", 0.8, 3)
  femnist_x = lambda raw: np.array(raw, np.float32).reshape(-1, 28, 28, 1)  # cnn.py reshape
  expected("leaf_femnist", t, femnist_x, lambda raw: np.array(raw))

  # shakespeare: by sample (test samples from n_train + 79 on); 80-character windows
  text = ("To be, or not to be: that is the question. Whether 'tis nobler in the mind to "
          "suffer the slings and arrows of outrageous fortune, or to take arms! ") * 6
  users = {}
  for i, m in enumerate([170, 3, 190, 1, 165, 200, 120]):
    start = int(rng.integers(0, 100))
    xs = [text[start + j:start + j + 80] for j in range(m)]
    users[f"PLAY_{i}_ROLE"] = {"x": xs, "y": [text[start + j + 80] for j in range(m)]}
  t = split("shakespeare", as_leaf(users), "--by_sample", 0.5, 4)
  expected("leaf_shakespeare", t,
           lambda raw: np.array([language_utils.word_to_indices(w) for w in raw]),
           lambda raw: np.argmax([language_utils.letter_to_vec(c) for c in raw], 1))

  # sent140: by sample, x = [id, date, query, user, tweet]; embs.json as get_embs.py writes
  vocab = ["good", "day", "bad", "!", ",", "a", "the", "i", "love", "it"]
  tweets = ["good day, good!", "bad", "a good one", "i love it !!", "the day is bad, bad",
            "zzz unknown words here and a lot more words than twenty five words in one "
            "tweet to see the cut at twenty five words ok ok ok ok ok"]
  users = {}
  for i, m in enumerate([4, 2, 1, 6, 3, 5]):
    users[f"user{i}"] = {"x": [[str(1000 + j), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY",
                                f"user{i}", tweets[int(k)]] for j, k in
                               enumerate(rng.integers(0, len(tweets), m))],
                         "y": [int(v) for v in rng.integers(0, 2, m)]}
  t = split("sent140", as_leaf(users), "--by_sample", 0.6, 5)
  emb_dir = os.path.join(out, "leaf", "models", "sent140")
  os.makedirs(emb_dir, exist_ok=True)
  emb_path = os.path.join(emb_dir, "embs.json")
  with open(emb_path, "w") as f:
    json.dump({"vocab": vocab, "emba": [[0.1 * j] * 3 for j in range(len(vocab) + 1)]}, f)
  _, indd, _ = language_utils.get_word_emb_arr(emb_path)
  expected("leaf_sent140", t,
           lambda raw: np.array([language_utils.line_to_indices(e[4], indd, 25) for e in raw]
                                ).reshape(-1, 25),
           lambda raw: np.array([int(e) for e in raw]))

  # synthetic: LEAF's generator (data/synthetic/data_generator.py, main.py's to_leaf_format)
  synthetic = os.path.join(leaf, "data", "synthetic")  # main.py imports data_generator
  data_generator = _load("data_generator", os.path.join(synthetic, "data_generator.py"))
  synthetic_main = _load("leaf_synthetic_main", os.path.join(synthetic, "main.py"))
  dataset = data_generator.SyntheticDataset(num_classes=3, prob_clusters=[1.0], num_dim=4,
                                            seed=7)
  tasks = [dataset.get_task(s) for s in [6, 9, 5, 12, 7, 8, 5, 10]]
  ids, num_samples, user_data = synthetic_main.to_leaf_format(tasks)
  for u in user_data:
    user_data[u]["x"] = [[round(v, 5) for v in row] for row in user_data[u]["x"]]
  t = split("synthetic", {"users": ids, "num_samples": num_samples, "user_data": user_data},
            "--by_sample", 0.7, 6)
  expected("leaf_synthetic", t, lambda raw: np.array(raw, np.float32),
           lambda raw: np.array(raw))
  shutil.rmtree(work)


# ---------------------------------------------------------------------------- TFF


def stage_tff(out, dump):
  import collections
  import pickle
  import tensorflow as tf
  from tensorflow_federated.python.simulation.datasets import (cifar100, emnist,
                                                               shakespeare, sql_client_data,
                                                               sql_client_data_utils,
                                                               stackoverflow)
  d = os.path.join(out, "tff")
  os.makedirs(d, exist_ok=True)
  sets = raw_sets()
  files = {"emnist_all.sqlite": [("emnist", "all_"), ("emnist_digits", "digits_only_")],
           "shakespeare.sqlite": [("shakespeare", "")],
           "stackoverflow.sqlite": [("stackoverflow", "")],
           "cifar100.sqlite": [("cifar100", "")]}
  parsing = {"emnist": emnist._add_proto_parsing, "emnist_digits": emnist._add_proto_parsing,
             "shakespeare": shakespeare._add_parsing,
             "stackoverflow": stackoverflow._add_proto_parsing,
             "cifar100": cifar100._add_proto_parsing}
  raw = {}
  for file, kinds in files.items():
    path = os.path.join(d, file)
    if os.path.exists(path):
      os.remove(path)
    examples, split_of = {}, {}
    for kind, prefix in kinds:
      for which in ("train", "test"):
        for cid, ex in sets[kind][which]:
          # (one split per client id in save_to_sql_client_data: the digits' ids differ)
          key = cid[0] + "1" + cid[2:] if kind == "emnist_digits" else cid
          examples[key] = ex
          split_of[key] = prefix + which
    def dataset_fn(cid):
      ex = examples[cid]
      cols = collections.OrderedDict(
          (k, tf.constant(list(v), dtype=tf.string, shape=(len(v),))
           if np.asarray(v).dtype == object else tf.constant(v)) for k, v in sorted(ex.items()))
      if kind_of(cid) == "cifar100":  # TFF's file: int64 pixels
        cols["image"] = tf.cast(cols["image"], tf.int64)
      return tf.data.Dataset.from_tensor_slices(cols)
    kind_of = lambda cid: "cifar100" if file.startswith("cifar") else ""
    ids = list(examples)  # in a shuffled order; TFF's reader sorts
    sql_client_data_utils.save_to_sql_client_data(ids, dataset_fn, path, True, split_of)
    for kind, prefix in kinds:
      for which in ("train", "test"):
        cd = sql_client_data.SqlClientData(path, prefix + which).preprocess(parsing[kind])
        clients = []
        for cid in cd.client_ids:
          rows = list(cd.create_tf_dataset_for_client(cid).as_numpy_iterator())
          clients.append((cid, {k: np.array([r[k] for r in rows]) for k in
                                (rows[0] if rows else {})}))
        raw[(kind, which)] = clients
  with open(dump, "wb") as f:
    pickle.dump(raw, f)
  write_word_count(os.path.join(d, "stackoverflow.word_count"))


# ------------------------------------------------------------------------- fedjax


def stage_fedjax(out, dump):
  import functools
  import pickle
  from fedjax.core import sqlite_federated_data as sfd
  from fedjax.datasets import cifar100, emnist, shakespeare, stackoverflow
  d = os.path.join(out, "fedjax")
  os.makedirs(d, exist_ok=True)
  sets = raw_sets()
  stems = {"emnist": "federated_emnist", "emnist_digits": "federated_emnist_digitsonly",
           "shakespeare": "shakespeare", "stackoverflow": "stackoverflow"}
  for kind, stem in stems.items():
    for which in ("train", "test"):
      path = os.path.join(d, f"{stem}_{which}.sqlite")
      if os.path.exists(path):
        os.remove(path)
      keep = ("pixels", "label") if kind.startswith("emnist") else None
      with sfd.SQLiteFederatedDataBuilder(path) as builder:
        builder.add_many((cid.encode(), {k: v for k, v in ex.items()
                                         if keep is None or k in keep})
                         for cid, ex in sets[kind][which])
  # CIFAR-100: the features fedjax's cifar100.load_split converts TFF's file to (its
  # _parse_tf_examples: coarse_label int64, image uint8, label int64), written by the same
  # builder; load_split's own conversion (TFFSQLiteClientsIterator) fails on an empty client
  # (tf.io.parse_example of no examples: "Tensor conversion requested dtype string for
  # Tensor with dtype float32"), so the examples are given to the builder directly.
  for which in ("train", "test"):
    path = os.path.join(d, f"federated_cifar100_{which}.sqlite")
    if os.path.exists(path):
      os.remove(path)
    with sfd.SQLiteFederatedDataBuilder(path) as builder:
      builder.add_many((cid.encode(), {"coarse_label": ex["coarse_label"],
                                       "image": ex["image"], "label": ex["label"]})
                       for cid, ex in sets["cifar100"][which])
  write_word_count(os.path.join(d, "stackoverflow.word_count"))
  with open(os.path.join(d, "stackoverflow.word_count")) as f:
    vocab = [line.split()[0] for line in f][:10000]
  tokenizer = stackoverflow.StackoverflowTokenizer(vocab=vocab)

  def prep(kind, which):
    """fedjax's preprocessing: (client_id, examples) -> (x, y)."""
    if kind.startswith("emnist"):
      def f(cid, ex):
        ex = emnist.preprocess_batch(emnist.preprocess_client(
            cid, {"pixels": ex["pixels"], "label": ex["label"]}))
        return ex["x"], ex["y"]
    elif kind == "shakespeare":
      def f(cid, ex):
        ex = shakespeare.preprocess_client(cid, {"snippets": ex["snippets"]}, 80)
        return ex["x"], ex["y"]
    elif kind == "stackoverflow":
      batch = tokenizer.as_preprocess_batch(20 if which == "train" else 30)
      def f(cid, ex):
        ex = batch(stackoverflow.preprocess_client(cid, {"tokens": ex["tokens"],
                                                          "type": ex["type"]}))
        return ex["x"], ex["y"]
    else:
      def f(cid, ex):
        ex = cifar100.preprocess_client(cid, {"image": ex["image"].astype(np.uint8),
                                              "label": ex["label"]})
        return ex["x"], ex["y"]
    return f

  def from_fedjax(path, kind, which):
    fd = sfd.SQLiteFederatedData.new(path)
    f = prep(kind, which)
    ids, clients = [], []
    for cid, ds in fd.clients():
      ex = ds.all_examples()
      ids.append(cid.decode())
      clients.append(f(cid, ex))
    return ids, clients

  names = dict(stems, cifar100="federated_cifar100")
  for kind, stem in names.items():
    ids, clients = from_fedjax(os.path.join(d, f"{stem}_train.sqlite"), kind, "train")
    _, tests = from_fedjax(os.path.join(d, f"{stem}_test.sqlite"), kind, "test")
    save(out, f"fedjax_{kind}", ids, clients, tests)
  with open(dump, "rb") as f:
    raw = pickle.load(f)
  for kind in names:
    per = {}
    for which in ("train", "test"):
      clients = raw[(kind, which)]
      f = prep(kind, which)
      per[which] = ([c for c, _ in clients],
                    [f(c.encode(), ex) if ex else _empty(kind, which) for c, ex in clients])
    save(out, f"tff_{kind}", per["train"][0], per["train"][1], per["test"][1])


def _empty(kind, which):
  shape = {"emnist": (28, 28, 1), "emnist_digits": (28, 28, 1), "cifar100": (32, 32, 3),
           "shakespeare": (80,), "stackoverflow": (20 if which == "train" else 30,)}[kind]
  label = shape if kind in ("shakespeare", "stackoverflow") else ()
  return np.zeros((0,) + shape), np.zeros((0,) + label)


# --------------------------------------------------------------------------- main


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=DEFAULT_OUT)
  p.add_argument("--fedjax_python", default="/tmp/peer_fedjax/bin/python")
  p.add_argument("--tff_python", default="/tmp/peer_tff/bin/python")
  p.add_argument("--leaf", default="/tmp/leaf", help="a checkout of TalwalkarLab/leaf")
  p.add_argument("--stage", choices=("all", "leaf", "tff", "fedjax"), default="all")
  p.add_argument("--dump", default=os.path.join(tempfile.gettempdir(), "peer_tff_raw.pkl"))
  a = p.parse_args()
  if a.stage == "leaf":
    return stage_leaf(a.out, a.leaf)
  if a.stage == "tff":
    return stage_tff(a.out, a.dump)
  if a.stage == "fedjax":
    return stage_fedjax(a.out, a.dump)
  for stage, python in (("leaf", a.fedjax_python), ("tff", a.tff_python),
                        ("fedjax", a.fedjax_python)):
    print(f"stage {stage} ({python})", flush=True)
    subprocess.run([python, __file__, "--stage", stage, "--out", a.out, "--leaf", a.leaf,
                    "--dump", a.dump], check=True)
  total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.out) for f in fs)
  print(f"wrote {a.out}: {total / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
  main()
