"""LEAF's JSON folders (TalwalkarLab/leaf: ``data/utils/split_data.py`` writes them,
``models/utils/model_utils.py`` ``read_data`` reads them).

``data.data_dir`` is a data set's ``data/`` folder (``leaf/data/femnist/data``) with
``train/*.json`` and ``test/*.json``; each file is

  {"users": [id, ...], "num_samples": [n, ...], "user_data": {id: {"x": [...], "y": [...]}}}

(``hierarchies`` optional). The clients are the training files' ``users`` (files in name
order, users in file order), each with ``len(y)`` examples, checked against
``num_samples``; a user of ``user_data`` not listed (LEAF's split leaves users with fewer
than 2 samples out of ``users``) is skipped. The test set is every test file's examples.
Parsed into memory (``natural.RaggedStore``); the examples by data set (LEAF
``models/<name>/*.py`` ``process_x`` / ``process_y``):

* ``leaf_femnist``: x 784 floats -> [28, 28, 1], y in [0, 62);
* ``leaf_shakespeare``: x an 80-character string -> 80 character ids, y the next
  character's id (``text.leaf_shakespeare``; 80 classes);
* ``leaf_sent140``: x ``[id, date, query, user, tweet]`` -> the tweet's first 25 word ids
  (``text.sent140_ids``; the vocabulary of ``embs.json`` in ``data_dir`` or its parent when
  there is one, LEAF's ``get_embs.sh``, else the training tweets' words), y 0 / 1;
* ``leaf_synthetic``: x a vector of floats, y a class id.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from fedjax_async.data import natural, text
from fedjax_async.data.federated import FederatedData

DATASETS = ("leaf_femnist", "leaf_shakespeare", "leaf_sent140", "leaf_synthetic")


def _files(data_dir: str, split: str) -> List[str]:
  return sorted(glob.glob(os.path.join(data_dir, split, "*.json")))


def present(name: str, data_dir: Optional[str]) -> bool:
  return bool(data_dir) and bool(_files(data_dir, "train")) and bool(_files(data_dir, "test"))


def read_split(data_dir: str, split: str) -> Tuple[List[str], Dict[str, dict], List[str]]:
  """(users, user_data, files) of ``data_dir/split/*.json``; ValueError naming the file
  for a file that is not LEAF's layout, or a size that is not its ``num_samples``."""
  files = _files(data_dir, split)
  if not files:
    raise FileNotFoundError(f"{os.path.join(data_dir, split)}: no *.json files; data.data_dir "
                            "is a LEAF data set's data/ folder, with train/ and test/ "
                            "(leaf/data/<name>/preprocess.sh writes them)")
  users, data = [], {}
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        d = json.load(f)
      listed, sizes, user_data = d["users"], d["num_samples"], d["user_data"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: not a LEAF data file ('users', 'num_samples', "
                       f"'user_data'): {type(e).__name__}: {e}") from None
    if len(listed) != len(sizes):
      raise ValueError(f"{path}: {len(listed)} users but {len(sizes)} num_samples")
    for u, n in zip(listed, sizes):
      if u not in user_data:
        raise ValueError(f"{path}: user {u!r} is listed but has no user_data")
      got = len(user_data[u]["y"])
      if got != n or len(user_data[u]["x"]) != n:
        raise ValueError(f"{path}: user {u!r} has {len(user_data[u]['x'])} x and {got} y, "
                         f"num_samples says {n}")
      if u in data:
        raise ValueError(f"{path}: user {u!r} appears in two {split} files")
      users.append(str(u))
      data[str(u)] = user_data[u]
  return users, data, files


def _converter(name: str, data_dir: str, train: Dict[str, dict]) -> Tuple[Callable, dict]:
  """(convert(raw x, raw y) -> (x, y), properties) of ``name``."""
  if name == "leaf_femnist":
    return (lambda x, y: (np.asarray(x, np.float32).reshape(-1, 28, 28, 1),
                          np.asarray(y, np.int32)),
            dict(shape=(28, 28, 1), dtype=np.float32, classes=62, vocab=0))
  if name == "leaf_shakespeare":
    return (text.leaf_shakespeare,
            dict(shape=None, dtype=np.int32, classes=len(text.LEAF_LETTERS),
                 vocab=len(text.LEAF_LETTERS) + 1))
  if name == "leaf_sent140":
    emb = [p for p in (os.path.join(data_dir, "embs.json"),
                       os.path.join(os.path.dirname(os.path.abspath(data_dir)), "embs.json"))
           if os.path.isfile(p)]
    vocab = text.sent140_vocabulary(
        (e[4] for u in train.values() for e in u["x"]), emb[0] if emb else None)
    return (lambda x, y: (text.sent140_ids([e[4] for e in x], vocab), np.asarray(
        [int(v) for v in y], np.int32)),
            dict(shape=(text.SENT140_MAX_WORDS,), dtype=np.int32, classes=2,
                 vocab=len(vocab) + 1))
  if name == "leaf_synthetic":
    return (lambda x, y: (np.asarray(x, np.float32).reshape(len(y), -1),
                          np.asarray(y, np.int32)),
            dict(shape=None, dtype=np.float32, classes=0, vocab=0))
  raise ValueError(f"data.dataset: unknown LEAF data set {name!r}; choose from "
                   f"{list(DATASETS)}")


def load(name: str, data_dir: str, *, max_client_examples: int = 0,
         max_test_examples: int = 0, transform: Callable = lambda x: x) -> FederatedData:
  """The natural data set ``name`` (module docstring) from LEAF's folder ``data_dir``."""
  users, train, files = read_split(data_dir, "train")
  test_users, test, _ = read_split(data_dir, "test")
  convert, p = _converter(name, data_dir, train)
  where = f"{os.path.join(data_dir, 'train')} ({len(files)} files)"
  clients, ids = [], []
  for u in users:
    raw = train[u]
    if not raw["y"]:
      continue
    cap = max_client_examples or None
    x, y = convert(raw["x"][:cap], raw["y"][:cap])
    clients.append((transform(x) if p["dtype"] == np.float32 else x, y))
    ids.append(u)
  parts = []
  for u in test_users:
    if test[u]["y"]:
      tx, ty = convert(test[u]["x"], test[u]["y"])
      parts.append((transform(tx) if p["dtype"] == np.float32 else tx, ty))
  if not clients:
    raise ValueError(f"{where}: no user with training examples")
  shape = clients[0][0].shape[1:]
  test_x, test_y = natural.concatenated(parts, shape, p["dtype"], (), max_test_examples)
  classes = p["classes"] or int(max(max(int(c[1].max()) for c in clients),
                                    int(test_y.max(initial=0)))) + 1
  store = natural.RaggedStore.from_clients(ids, clients, where, p["dtype"])
  return natural.natural_data(store, np.asarray(test_x, p["dtype"]), test_y, classes, name,
                              p["vocab"])
