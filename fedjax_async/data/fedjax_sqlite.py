"""fedjax's SQLite federated data (fedjax ``core/sqlite_federated_data.py``).

One file per split, one row per client in the table

  CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY,
                               data BLOB NOT NULL, num_examples INTEGER NOT NULL);

``data`` is ``zlib.compress(msgpack_serialize(examples))`` (fedjax
``core/serialization.py``): a map from feature name to a numpy array, each array a msgpack
extension of type 1 holding ``(shape, dtype name, C-order bytes)``, an array of bytes
objects type 4 ``(shape, [bytes, ...])``, a numpy scalar type 3. Clients are read in
``rowid`` order (fedjax's ``client_ids()``), one query per client when a chunk of rounds
needs it. The data sets (fedjax ``datasets/*.py``; file names as fedjax downloads them into
``~/.cache/fedjax``):

* ``fedjax_emnist`` (``_digits``): ``federated_emnist_{train,test}.sqlite``
  (``federated_emnist_digitsonly_*``): ``pixels`` [n, 28, 28] float32, ``label`` [n];
  x = 1 - pixels, [28, 28, 1] (fedjax ``emnist.preprocess_batch``); 62 (10) classes;
* ``fedjax_shakespeare``: ``shakespeare_{train,test}.sqlite``, ``snippets`` [n] bytes:
  sequences of 80 character ids (``text.shakespeare_sequences``), a client's size the
  number of its sequences;
* ``fedjax_stackoverflow``: ``stackoverflow_{train,test}.sqlite`` (the ``held_out``
  split unused), ``tokens`` [n] bytes, and the vocabulary file
  ``stackoverflow.word_count``: one sequence of 20 word ids per sentence
  (``text.WordTokenizer``);
* ``fedjax_cifar100``: ``federated_cifar100_{train,test}.sqlite`` (fedjax converts TFF's
  file to these): ``x`` [n, 32, 32, 3] uint8 -> /255 float32, ``y`` [n]; 100 classes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import zlib
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from fedjax_async.data import natural, text
from fedjax_async.data.federated import FederatedData

TABLE = "federated_data"


def decode(blob: bytes) -> Dict[str, np.ndarray]:
  """A client's examples from its ``data`` blob (zlib, then fedjax's msgpack encoding)."""
  import msgpack  # pylint: disable=g-import-not-at-top  (a dependency of flax)

  def array(payload):
    shape, dtype, buffer = msgpack.unpackb(payload, raw=True)
    name = dtype.decode() if isinstance(dtype, bytes) else dtype
    return np.frombuffer(buffer, np.dtype(name)).reshape(shape)

  def ext(code, payload):
    if code == 1:  # ndarray
      return array(payload)
    if code == 3:  # numpy scalar
      return array(payload)[()]
    if code == 4:  # ndarray of bytes
      shape, flat = msgpack.unpackb(payload, raw=True)
      out = np.empty(len(flat), object)
      out[:] = list(flat)
      return out.reshape(shape)
    return msgpack.ExtType(code, payload)

  return msgpack.unpackb(zlib.decompress(blob), ext_hook=ext, raw=False)


class SQLiteStore(natural.ClientStore):
  """The clients of a fedjax SQLite file, each preprocessed by ``prepare(examples) -> (x,
  y)`` when read; at most ``limit`` examples each (0: all)."""

  def __init__(self, path: str, prepare: Callable, item_shape, dtype, label_shape,
               limit: int = 0, counts_of: Optional[Callable] = None):
    self.path, self.prepare, self.limit = path, prepare, int(limit)
    self.connection = connect(path)
    self._lock = threading.Lock()
    try:
      rows = self.connection.execute(
          f"SELECT client_id, num_examples FROM {TABLE} ORDER BY rowid").fetchall()
    except sqlite3.DatabaseError as e:
      raise ValueError(f"{path}: not fedjax's SQLite federated data (a table {TABLE}"
                       f"(client_id, data, num_examples)): {e}") from None
    self.keys = [r[0] for r in rows]
    counts = np.array([r[1] for r in rows], np.int64)
    if counts_of is not None:  # the sizes after preprocessing (Shakespeare's sequences)
      counts = np.array([counts_of(self._examples(k)) for k in self.keys], np.int64)
    if self.limit:
      counts = np.minimum(counts, self.limit)
    keep = counts > 0
    self.keys = [k for k, kept in zip(self.keys, keep) if kept]
    ids = [k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k) for k in self.keys]
    super().__init__(ids, counts[keep], item_shape, dtype, label_shape, path)

  def _examples(self, key) -> Dict[str, np.ndarray]:
    with self._lock:
      row = self.connection.execute(f"SELECT data FROM {TABLE} WHERE client_id = ?",
                                    (key,)).fetchone()
    try:
      return decode(row[0])
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{self.path}: client {key!r}: its data blob is not fedjax's "
                       f"zlib-compressed msgpack ({type(e).__name__}: {e})") from None

  def read(self, i: int):
    x, y = self.prepare(self._examples(self.keys[i]))
    return (x[:self.limit], y[:self.limit]) if self.limit else (x, y)


def connect(path: str) -> sqlite3.Connection:
  """A read-only connection (shared by the host loop's threads)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(path)
  return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def _emnist(ex):
  return (1.0 - np.asarray(ex["pixels"], np.float32))[..., None], np.asarray(ex["label"],
                                                                              np.int32)


def _cifar(ex):
  return np.asarray(ex["x"], np.float32) / np.float32(255.0), np.asarray(ex["y"], np.int32)


def _images(features: Callable, transform: Callable) -> Callable:
  """``features(examples) -> (x, y)`` with ``transform`` applied to x."""

  def prepare(examples):
    x, y = features(examples)
    return transform(x), y

  return prepare


def _field(ex, name: str, path: str):
  if name not in ex:
    raise ValueError(f"{path}: a client without the feature {name!r} (has {sorted(ex)})")
  return ex[name]


# name -> (file stem, test split)
FILES = {"fedjax_emnist": "federated_emnist", "fedjax_emnist_digits":
         "federated_emnist_digitsonly", "fedjax_shakespeare": "shakespeare",
         "fedjax_stackoverflow": "stackoverflow", "fedjax_cifar100": "federated_cifar100"}
DATASETS = tuple(FILES)


def paths(name: str, data_dir: str) -> Tuple[str, str]:
  """(train file, test file) of ``name`` in ``data_dir``."""
  stem = FILES[name]
  return tuple(os.path.join(data_dir, f"{stem}_{split}.sqlite") for split in ("train", "test"))


def present(name: str, data_dir: Optional[str]) -> bool:
  return bool(data_dir) and all(os.path.isfile(p) for p in paths(name, data_dir))


def load(name: str, data_dir: str, *, max_client_examples: int = 0,
         max_test_examples: int = 0, transform: Callable = lambda x: x) -> FederatedData:
  """The natural data set ``name`` (module docstring) from fedjax's files in ``data_dir``;
  ``transform`` maps image features (normalisation)."""
  train_path, test_path = paths(name, data_dir)
  for p in (train_path, test_path):
    if not os.path.isfile(p):
      raise FileNotFoundError(f"{p}: no such file; data.dataset={name} reads fedjax's "
                              f"{os.path.basename(train_path)} and "
                              f"{os.path.basename(test_path)} from data.data_dir (fedjax "
                              "downloads them to ~/.cache/fedjax)")
  counts_of, vocab = None, 0
  if name.startswith("fedjax_emnist"):
    prepare = _images(_emnist, transform)
    shape, dtype, label, classes = (28, 28, 1), np.float32, (), 10 if "digits" in name else 62
  elif name == "fedjax_cifar100":
    prepare = _images(_cifar, transform)
    shape, dtype, label, classes = (32, 32, 3), np.float32, (), 100
  elif name == "fedjax_shakespeare":
    length = text.SHAKESPEARE_SEQUENCE_LENGTH
    prepare = lambda ex: text.shakespeare_sequences(_field(ex, "snippets", train_path), length)
    counts_of = lambda ex: text.shakespeare_count(_field(ex, "snippets", train_path), length)
    shape, dtype, label = (length,), np.int32, (length,)
    classes = vocab = text.SHAKESPEARE_NUM_CLASSES
  elif name == "fedjax_stackoverflow":
    tokenize = text.WordTokenizer(text.read_vocabulary(data_dir))
    prepare = lambda ex: tokenize(_field(ex, "tokens", train_path))
    shape, dtype, label = (tokenize.max_length,), np.int32, (tokenize.max_length,)
    classes = vocab = tokenize.num_classes
  else:
    raise ValueError(f"data.dataset: unknown fedjax data set {name!r}; choose from "
                     f"{list(DATASETS)}")
  store = SQLiteStore(train_path, prepare, shape, dtype, label, max_client_examples, counts_of)
  test = SQLiteStore(test_path, prepare, shape, dtype, label)
  parts = natural.read_until(test.read, len(test.keys), max_test_examples)
  test_x, test_y = natural.concatenated(parts, shape, dtype, label, max_test_examples)
  return natural.natural_data(store, np.asarray(test_x, dtype), test_y, classes, name, vocab)
