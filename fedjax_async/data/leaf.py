"""LEAF's JSON folders (TalwalkarLab/leaf: ``data/utils/split_data.py`` writes them,
``models/utils/model_utils.py`` ``read_data`` reads them).

``data.data_dir`` is a data set's ``data/`` folder (``leaf/data/femnist/data``) with
``train/*.json`` and ``test/*.json``; each file is

  {"users": [id, ...], "num_samples": [n, ...], "user_data": {id: {"x": [...], "y": [...]}}}

(``hierarchies`` optional). The clients are, as LEAF's ``read_dir`` has them, every
``user_data`` id of the training files in sorted order, each with ``len(y)`` examples; a
listed user's size is checked against its ``num_samples`` (LEAF's by-sample split of
Shakespeare keeps a user's test samples from ``n_train + 79`` on and writes
``num_samples = n - n_train``: a test size 79 under ``num_samples`` is that split's). A
user with no examples is left out, counted on the console. The test set is every test
user's examples, in sorted id order. Parsed into memory (``natural.RaggedStore``); a file
that does not parse (truncated, overwritten, not JSON) is refused in one line naming it.
The examples by data set (LEAF ``models/<name>/*.py`` ``process_x`` / ``process_y``):

* ``leaf_femnist``: x 784 floats -> [28, 28, 1], y in [0, 62);
* ``leaf_shakespeare``: x an 80-character string -> 80 character ids, y the next
  character's id (``text.leaf_shakespeare``; 80 classes);
* ``leaf_sent140``: x ``[id, date, query, user, tweet]`` -> the tweet's first 25 word ids
  (``text.sent140_ids``) in the vocabulary of LEAF's ``embs.json`` (``get_embs.sh`` writes
  it in ``leaf/models/sent140/``; looked for in ``data_dir``, its parent and
  ``../../models/sent140/`` from the data set's folder); without one, the training
  tweets' words, said on the console; y 0 / 1;
* ``leaf_synthetic``: x a vector of floats, y a class id.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from fedjax_async.data import integrity, natural, text
from fedjax_async.data.federated import FederatedData

DATASETS = ("leaf_femnist", "leaf_shakespeare", "leaf_sent140", "leaf_synthetic")


def _files(data_dir: str, split: str) -> List[str]:
  return sorted(glob.glob(os.path.join(data_dir, split, "*.json")))


def present(name: str, data_dir: Optional[str]) -> bool:
  return bool(data_dir) and bool(_files(data_dir, "train")) and bool(_files(data_dir, "test"))


FIX = "run LEAF's preprocess.sh for the data set again (leaf/data/<name>/preprocess.sh)"
SHAKESPEARE_TEST_GAP = 80 - 1  # split_data.py: test_indices from num_train_samples + 80 - 1


def read_split(data_dir: str, split: str, name: str = ""
               ) -> Tuple[List[str], Dict[str, dict], List[str]]:
  """(users: every user_data id, sorted, user_data, files) of ``data_dir/split/*.json``;
  ValueError naming the file for a file that is not LEAF's layout, or a size that is not
  its ``num_samples``."""
  files = _files(data_dir, split)
  if not files:
    raise FileNotFoundError(f"{os.path.join(data_dir, split)}: no *.json files; data.data_dir "
                            "is a LEAF data set's data/ folder, with train/ and test/ "
                            "(leaf/data/<name>/preprocess.sh writes them)")
  data = {}
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        d = json.load(f)
      listed, sizes, user_data = d["users"], d["num_samples"], d["user_data"]
      if not isinstance(user_data, dict):
        raise TypeError("user_data is no map")
    except UnicodeDecodeError as e:
      with open(path, "rb") as f:
        head = f.read(100)
      raise ValueError(f"{path}: not a LEAF JSON file ({integrity.looks_like(head)}: "
                       f"{e.reason} at byte {e.start}); {FIX}") from None
    except ValueError as e:
      raise ValueError(f"{path}: not a LEAF JSON file, damaged or truncated ({e}); "
                       f"{FIX}") from None
    except (OSError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: not a LEAF data file ('users', 'num_samples', "
                       f"'user_data'): {type(e).__name__}: {e}") from None
    if len(listed) != len(sizes):
      raise ValueError(f"{path}: {len(listed)} users but {len(sizes)} num_samples")
    for u, raw in user_data.items():
      if not isinstance(raw, dict) or not isinstance(raw.get("x"), list) or not isinstance(
          raw.get("y"), list):
        raise ValueError(f"{path}: user {u!r}: no lists 'x' and 'y'; {FIX}")
      if len(raw["x"]) != len(raw["y"]):
        raise ValueError(f"{path}: user {u!r} has {len(raw['x'])} x and {len(raw['y'])} y; "
                         f"{FIX}")
      if str(u) in data:
        raise ValueError(f"{path}: user {u!r} appears in two {split} files")
      data[str(u)] = raw
    for u, n in zip(listed, sizes):
      if u not in user_data:
        raise ValueError(f"{path}: user {u!r} is listed but has no user_data")
      got = len(user_data[u]["y"])
      gap = SHAKESPEARE_TEST_GAP if name == "leaf_shakespeare" and split == "test" else None
      if got != n and not (gap and got == n - gap):
        raise ValueError(f"{path}: user {u!r} has {len(user_data[u]['x'])} x and {got} y, "
                         f"num_samples says {n}")
  return sorted(data), data, files


def embeddings_file(data_dir: str) -> Optional[str]:
  """LEAF's ``embs.json`` for Sent140 (module docstring), or None."""
  folder = os.path.abspath(data_dir)
  for p in (os.path.join(folder, "embs.json"),
            os.path.join(os.path.dirname(folder), "embs.json"),
            os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(folder))), "models",
                         "sent140", "embs.json")):
    if os.path.isfile(p):
      return p
  return None


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
    emb = embeddings_file(data_dir)
    if emb is None:
      natural.note(f"{data_dir}: no LEAF embs.json (leaf/models/sent140/get_embs.sh writes "
                   "it; looked in data_dir, its parent and ../../models/sent140/): "
                   "leaf_sent140's vocabulary is the training tweets' words, most frequent "
                   "first")
    try:
      vocab = text.sent140_vocabulary((e[4] for u in train.values() for e in u["x"]), emb)
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{emb}: not LEAF's embs.json (a map with 'vocab'): "
                       f"{type(e).__name__}: {e}; run leaf/models/sent140/get_embs.sh "
                       "again") from None
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
  """The natural data set ``name`` (module docstring) from LEAF's folder ``data_dir``.

  Args:
    name: the data set (``DATASETS``).
    data_dir: LEAF's data folder (with ``train/`` and ``test/``).
    max_client_examples: each client's first k examples (0: all).
    max_test_examples: the first k test examples (0: all).
    transform: maps image features (normalisation).
  """
  users, train, files = read_split(data_dir, "train", name)
  test_users, test, _ = read_split(data_dir, "test", name)
  convert, p = _converter(name, data_dir, train)
  where = f"{os.path.join(data_dir, 'train')} ({len(files)} files)"
  clients, ids = [], []
  cap = max_client_examples or None
  for u in users:
    raw = train[u]
    if not raw["y"]:
      continue
    x, y = convert(raw["x"][:cap], raw["y"][:cap])
    clients.append((transform(x) if p["dtype"] == np.float32 else x, y))
    ids.append(u)
  natural.note_empty(where, users, [u for u in users if not train[u]["y"]])
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
