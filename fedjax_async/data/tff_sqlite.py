"""TensorFlow Federated's SQLite ClientData (TFF ``simulation/datasets/sql_client_data.py``
and ``sql_client_data_utils.py``; fedjax ``core/sqlite_federated_data.py``
``TFFSQLiteClientsIterator`` reads the same files).

One file holds every split, one row per example:

  CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                         serialized_example_proto BLOB NOT NULL);
  CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL,
                                num_examples INTEGER NOT NULL);

A split's clients are its ``client_metadata`` rows, in sorted id order (``SqlClientData``);
a client's examples its ``examples`` rows of the split in ``rowid`` order, each a
serialized ``tf.train.Example`` (tensorflow ``core/example/example.proto`` and
``feature.proto``: ``Example.features`` (1) -> ``Features.feature`` (1), a map from name to
``Feature``, one of ``bytes_list`` (1), ``float_list`` (2, packed float), ``int64_list``
(3, packed varint)), decoded here without TensorFlow (:func:`parse_example`). The data
sets, as TFF's loaders read them (``emnist.py``, ``shakespeare.py``, ``stackoverflow.py``,
``cifar100`` via fedjax ``datasets/cifar100.py``), preprocessed as fedjax does the same
data (``fedjax_sqlite``):

* ``tff_emnist`` (``_digits``): ``emnist_all.sqlite``, splits ``all_train`` / ``all_test``
  (``digits_only_*``): ``pixels`` 28 x 28 floats, ``label``; x = 1 - pixels;
* ``tff_shakespeare``: ``shakespeare.sqlite``, ``train`` / ``test``, ``snippets``;
* ``tff_stackoverflow``: ``stackoverflow.sqlite``, ``train`` / ``test`` (``heldout``
  unused), ``tokens``, with ``stackoverflow.word_count``;
* ``tff_cifar100``: ``cifar100.sqlite``, ``train`` / ``test``, ``image`` 32 x 32 x 3
  int64, ``label``.

TFF distributes them LZMA-compressed (``emnist_all.sqlite.lzma``, ...): decompress once
(``xz -d FILE.lzma``).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from fedjax_async.data import natural, text
from fedjax_async.data.federated import FederatedData
from fedjax_async.data.fedjax_sqlite import connect

# ----------------------------------------------------------------- tf.train.Example


def _varint(buf: memoryview, i: int) -> Tuple[int, int]:
  shift = value = 0
  while True:
    b = buf[i]
    i += 1
    value |= (b & 0x7F) << shift
    if b < 0x80:
      return value, i
    shift += 7


def _fields(buf: memoryview):
  """(field number, wire type, value) of a message: ints for varints and fixed fields,
  memoryviews for length-delimited ones."""
  i, n = 0, len(buf)
  while i < n:
    key, i = _varint(buf, i)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, i = _varint(buf, i)
    elif wire == 2:
      size, i = _varint(buf, i)
      value, i = buf[i:i + size], i + size
    elif wire == 5:
      value, i = buf[i:i + 4], i + 4
    elif wire == 1:
      value, i = buf[i:i + 8], i + 8
    else:
      raise ValueError(f"unsupported protobuf wire type {wire}")
    yield number, wire, value


def packed_varints(buf) -> np.ndarray:
  """int64 values of a run of varints (two's complement, as protobuf's int64)."""
  b = np.frombuffer(buf, np.uint8)
  if not b.size:
    return np.zeros(0, np.int64)
  ends = np.flatnonzero(b < 0x80)
  starts = np.concatenate([[0], ends[:-1] + 1])
  position = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
  parts = (b & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
  return np.add.reduceat(parts, starts).view(np.int64)


def _feature(buf: memoryview):
  for number, _, value in _fields(buf):
    if number == 1:  # BytesList
      return [bytes(v) for n, _, v in _fields(value) if n == 1]
    values = []
    for n, wire, v in _fields(value):
      if n != 1:
        continue
      if number == 2:  # FloatList: packed, or one fixed32 each
        values.append(np.frombuffer(v, "<f4"))
      elif wire == 2:  # Int64List packed
        values.append(packed_varints(v))
      else:
        values.append(np.array([v], np.uint64).view(np.int64))
    dtype = np.float32 if number == 2 else np.int64
    return np.concatenate(values).astype(dtype) if values else np.zeros(0, dtype)
  return []


def parse_example(blob: bytes) -> Dict[str, object]:
  """A serialized ``tf.train.Example`` as {name: float32 / int64 array or [bytes]}."""
  out = {}
  for number, _, features in _fields(memoryview(blob)):
    if number != 1:
      continue
    for n, _, entry in _fields(features):
      if n != 1:
        continue
      key, value = None, memoryview(b"")
      for m, _, v in _fields(entry):
        if m == 1:
          key = bytes(v).decode("utf-8")
        elif m == 2:
          value = v
      out[key] = _feature(value)
  return out


# ----------------------------------------------------------------------- the store


class TFFStore(natural.ClientStore):
  """A split of a TFF SQLite file; ``prepare(examples: [parsed Example]) -> (x, y)``."""

  def __init__(self, path: str, split: str, prepare: Callable, item_shape, dtype,
               label_shape, limit: int = 0, counts_of: Optional[Callable] = None):
    self.path, self.split, self.prepare, self.limit = path, split, prepare, int(limit)
    self.connection = connect(path)
    self._lock = threading.Lock()
    tables = {r[0] for r in self.connection.execute("SELECT name FROM sqlite_master")}
    missing = {"examples", "client_metadata"} - tables
    if missing:
      raise ValueError(f"{path}: not a TFF SqlClientData file: no table "
                       f"{', '.join(sorted(missing))}")
    rows = self.connection.execute(
        "SELECT client_id, num_examples FROM client_metadata WHERE split_name = ? "
        "ORDER BY client_id", (split,)).fetchall()
    if not rows:
      splits = sorted(r[0] for r in self.connection.execute(
          "SELECT DISTINCT split_name FROM client_metadata"))
      raise ValueError(f"{path}: no clients of split {split!r} (splits: {splits})")
    self.keys = [r[0] for r in rows]
    counts = np.array([r[1] for r in rows], np.int64)
    if counts_of is not None:
      counts = np.array([counts_of(self._examples(k)) for k in self.keys], np.int64)
    if self.limit:
      counts = np.minimum(counts, self.limit)
    keep = counts > 0
    self.keys = [k for k, kept in zip(self.keys, keep) if kept]
    super().__init__(self.keys, counts[keep], item_shape, dtype, label_shape,
                     f"{path} ({split})")

  def _examples(self, key, limit: int = 0) -> List[Dict[str, object]]:
    query = ("SELECT serialized_example_proto FROM examples WHERE split_name = ? AND "
             "client_id = ? ORDER BY rowid")
    with self._lock:
      blobs = self.connection.execute(query + (f" LIMIT {int(limit)}" if limit else ""),
                                      (self.split, key)).fetchall()
    try:
      return [parse_example(b[0]) for b in blobs]
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{self.path}: client {key!r}: an example that is not a serialized "
                       f"tf.train.Example ({type(e).__name__}: {e})") from None

  def read(self, i: int):
    x, y = self.prepare(self._examples(self.keys[i], self.limit))
    return (x[:self.limit], y[:self.limit]) if self.limit else (x, y)


def _values(examples, name: str, where: str):
  try:
    return [e[name] for e in examples]
  except KeyError:
    have = sorted(examples[0]) if examples else []
    raise ValueError(f"{where}: an example without the feature {name!r} (has {have})") from None


def _images(shape, scale: float, invert: bool, transform: Callable, where: str):
  def prepare(examples):
    x = np.stack([np.asarray(v, np.float32).reshape(shape)
                  for v in _values(examples, "pixels" if invert else "image", where)]
                 ) if examples else np.zeros((0,) + shape, np.float32)
    x = (1.0 - x) if invert else x / np.float32(scale)
    y = np.array([int(v[0]) for v in _values(examples, "label", where)], np.int32)
    return transform(x.astype(np.float32)), y
  return prepare


def _strings(examples, name: str, where: str):
  return [v[0] for v in _values(examples, name, where)]


# name -> (file, train split, test split)
FILES = {"tff_emnist": ("emnist_all.sqlite", "all_train", "all_test"),
         "tff_emnist_digits": ("emnist_all.sqlite", "digits_only_train", "digits_only_test"),
         "tff_shakespeare": ("shakespeare.sqlite", "train", "test"),
         "tff_stackoverflow": ("stackoverflow.sqlite", "train", "test"),
         "tff_cifar100": ("cifar100.sqlite", "train", "test")}
DATASETS = tuple(FILES)


def present(name: str, data_dir: Optional[str]) -> bool:
  return bool(data_dir) and os.path.isfile(os.path.join(data_dir, FILES[name][0]))


def load(name: str, data_dir: str, *, max_client_examples: int = 0,
         max_test_examples: int = 0, transform: Callable = lambda x: x) -> FederatedData:
  """The natural data set ``name`` (module docstring) from TFF's file in ``data_dir``."""
  if name not in FILES:
    raise ValueError(f"data.dataset: unknown TFF data set {name!r}; choose from "
                     f"{list(DATASETS)}")
  file, train_split, test_split = FILES[name]
  path = os.path.join(data_dir, file)
  if not os.path.isfile(path):
    lzma = " (its .lzma is there: decompress it, xz -d)" if os.path.isfile(
        path + ".lzma") else ""
    raise FileNotFoundError(f"{path}: no such file{lzma}; data.dataset={name} reads TFF's "
                            f"{file} from data.data_dir (TFF downloads {file}.lzma)")
  counts_of, vocab = None, 0
  if "emnist" in name:
    prepare = _images((28, 28, 1), 1.0, True, transform, path)
    shape, dtype, label, classes = (28, 28, 1), np.float32, (), 10 if "digits" in name else 62
  elif name == "tff_cifar100":
    prepare = _images((32, 32, 3), 255.0, False, transform, path)
    shape, dtype, label, classes = (32, 32, 3), np.float32, (), 100
  elif name == "tff_shakespeare":
    length = text.SHAKESPEARE_SEQUENCE_LENGTH
    prepare = lambda ex: text.shakespeare_sequences(_strings(ex, "snippets", path), length)
    counts_of = lambda ex: text.shakespeare_count(_strings(ex, "snippets", path), length)
    shape, dtype, label = (length,), np.int32, (length,)
    classes = vocab = text.SHAKESPEARE_NUM_CLASSES
  else:  # tff_stackoverflow
    tokenize = text.WordTokenizer(text.read_vocabulary(data_dir))
    prepare = lambda ex: tokenize(_strings(ex, "tokens", path))
    shape, dtype, label = (tokenize.max_length,), np.int32, (tokenize.max_length,)
    classes = vocab = tokenize.num_classes
  store = TFFStore(path, train_split, prepare, shape, dtype, label, max_client_examples,
                   counts_of)
  test = TFFStore(path, test_split, prepare, shape, dtype, label)
  parts = natural.read_until(test.read, len(test.keys), max_test_examples)
  test_x, test_y = natural.concatenated(parts, shape, dtype, label, max_test_examples)
  return natural.natural_data(store, np.asarray(test_x, dtype), test_y, classes, name, vocab)
