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
  unused), ``tokens``, with ``stackoverflow.word_count``; 20 word ids per training
  sentence, 30 per test one (fedjax's lengths);
* ``tff_cifar100``: ``cifar100.sqlite``, ``train`` / ``test``, ``image`` 32 x 32 x 3
  int64, ``label``.

TFF distributes them LZMA-compressed (``emnist_all.sqlite.lzma``, ...): decompress once
(``xz -dk FILE.lzma``; ``python -m fedjax_async.cli.data download NAME`` does both).

The file is checked when loaded (``check_file``): ``integrity.sqlite_file`` (header, size,
``PRAGMA quick_check``), the two tables, every client's ``examples`` rows counted against
its ``client_metadata`` and its first example decoded with the data set's features; a
damaged or wrong file is refused in one line naming it and the fix. A client with no
examples is left out, counted on the console.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from fedjax_async.data import integrity, natural, text
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


def fix(file: str) -> str:
  """What to do about a damaged TFF file ``file``."""
  return (f"download {file}.lzma again and decompress it (python -m fedjax_async.cli.data "
          f"download, or TFF's load_data; then xz -dk {file}.lzma)")


class TFFStore(natural.ClientStore):
  """A split of a TFF SQLite file; ``prepare(examples: [parsed Example]) -> (x, y)``."""

  def __init__(self, path: str, split: str, prepare: Callable, item_shape, dtype,
               label_shape, limit: int = 0, counts_of: Optional[Callable] = None):
    self.path, self.split, self.prepare, self.limit = path, split, prepare, int(limit)
    self.fix = fix(os.path.basename(path))
    self.connection = connect(path)
    self._lock = threading.Lock()
    try:
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
    except sqlite3.DatabaseError as e:
      raise integrity.database_error(path, e, self.fix) from None
    self.keys = [r[0] for r in rows]
    counts = np.array([r[1] for r in rows], np.int64)
    if counts_of is not None:
      counts = np.array([counts_of(self._examples(k)) for k in self.keys], np.int64)
    if self.limit:
      counts = np.minimum(counts, self.limit)
    keep = counts > 0
    self.empty = [str(k) for k, kept in zip(self.keys, keep) if not kept]
    natural.note_empty(f"{path} ({split})", self.keys, self.empty)
    self.keys = [k for k, kept in zip(self.keys, keep) if kept]
    super().__init__(self.keys, counts[keep], item_shape, dtype, label_shape,
                     f"{path} ({split})")

  def _examples(self, key, limit: int = 0) -> List[Dict[str, object]]:
    query = ("SELECT serialized_example_proto FROM examples WHERE split_name = ? AND "
             "client_id = ? ORDER BY rowid")
    try:
      with self._lock:
        blobs = self.connection.execute(query + (f" LIMIT {int(limit)}" if limit else ""),
                                        (self.split, key)).fetchall()
    except sqlite3.DatabaseError as e:
      raise integrity.database_error(self.path, e, self.fix) from None
    try:
      return [parse_example(b[0]) for b in blobs]
    except Exception as e:  # pylint: disable=broad-except
      raise integrity.DamagedFile(
          f"{self.path}: client {key!r}: an example that is not a serialized "
          f"tf.train.Example ({type(e).__name__}: {e}); {self.fix}") from None

  def read(self, i: int):
    x, y = self.prepare(self._examples(self.keys[i], self.limit))
    return (x[:self.limit], y[:self.limit]) if self.limit else (x, y)


def check_file(path: str, splits, features: Dict[str, int]) -> None:
  """The load-time check of TFF's file ``path`` (module docstring) for ``splits``;
  ``features``: name -> number of values an example has (0: any). DamagedFile naming the
  file and the fix unless it is whole."""
  fix_text = fix(os.path.basename(path))
  integrity.sqlite_file(path, fix_text)
  con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
  try:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not {"examples", "client_metadata"} <= tables:
      other = " (a fedjax file is read as fedjax_*)" if "federated_data" in tables else ""
      raise integrity.DamagedFile(f"{path}: not a TFF SqlClientData file: tables "
                                  f"{sorted(tables)}, not examples and client_metadata{other}")
    wanted = set(splits)
    meta = {(s, c): n for c, s, n in con.execute(
        "SELECT client_id, split_name, num_examples FROM client_metadata") if s in wanted}
    seen: Dict[tuple, int] = {}
    for s, c, blob in con.execute("SELECT split_name, client_id, serialized_example_proto "
                                  "FROM examples"):
      if s not in wanted:
        continue
      key = (s, c)
      if key not in seen:
        seen[key] = 0
        _check_example(path, c, s, blob, features, fix_text)
      seen[key] += 1
  except sqlite3.DatabaseError as e:
    raise integrity.database_error(path, e, fix_text) from None
  finally:
    con.close()
  for key in sorted(set(meta) | set(seen)):
    if meta.get(key) != seen.get(key, 0):
      s, c = key
      said = meta.get(key)
      raise integrity.DamagedFile(
          f"{path}: client {c!r} of split {s!r} has {seen.get(key, 0)} examples, "
          + (f"client_metadata says {said}" if said is not None else "and no client_metadata")
          + f"; {fix_text}")


def _check_example(path, client, split, blob, features, fix_text):
  where = f"{path}: client {client!r} of split {split!r}"
  try:
    ex = parse_example(blob)
  except Exception as e:  # pylint: disable=broad-except
    raise integrity.DamagedFile(f"{where}: its first example is not a serialized "
                                f"tf.train.Example ({type(e).__name__}: {e}); "
                                f"{fix_text}") from None
  for name, size in features.items():
    if name not in ex:
      raise integrity.DamagedFile(f"{where}: an example without the feature {name!r} (has "
                                  f"{sorted(ex)}): not this data set's file")
    if size and len(ex[name]) != size:
      raise integrity.DamagedFile(f"{where}: feature {name!r} has {len(ex[name])} values, "
                                  f"expected {size}; {fix_text}")


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
  """The natural data set ``name`` (module docstring) from TFF's file in ``data_dir``.

  Args:
    name: the data set (``DATASETS``).
    data_dir: the directory of TFF's file.
    max_client_examples: each client's first k examples (0: all).
    max_test_examples: the first k test examples (0: all).
    transform: maps image features (normalisation).
  """
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
  counts_of, vocab, test_prepare, test_shape = None, 0, None, None
  if "emnist" in name:
    prepare = _images((28, 28, 1), 1.0, True, transform, path)
    shape, dtype, label, classes = (28, 28, 1), np.float32, (), 10 if "digits" in name else 62
    features = {"pixels": 28 * 28, "label": 1}
  elif name == "tff_cifar100":
    prepare = _images((32, 32, 3), 255.0, False, transform, path)
    shape, dtype, label, classes = (32, 32, 3), np.float32, (), 100
    features = {"image": 32 * 32 * 3, "label": 1}
  elif name == "tff_shakespeare":
    length = text.SHAKESPEARE_SEQUENCE_LENGTH
    prepare = lambda ex: text.shakespeare_sequences(_strings(ex, "snippets", path), length)
    counts_of = lambda ex: text.shakespeare_count(_strings(ex, "snippets", path), length)
    shape, dtype, label = (length,), np.int32, (length,)
    classes = vocab = text.SHAKESPEARE_NUM_CLASSES
    features = {"snippets": 1}
  else:  # tff_stackoverflow
    words = text.read_vocabulary(data_dir)
    tokenize = text.WordTokenizer(words)
    test_tokenize = text.WordTokenizer(words, text.STACKOVERFLOW_EVAL_MAX_LENGTH)
    prepare = lambda ex: tokenize(_strings(ex, "tokens", path))
    test_prepare = lambda ex: test_tokenize(_strings(ex, "tokens", path))
    shape, dtype, label = (tokenize.max_length,), np.int32, (tokenize.max_length,)
    test_shape = (test_tokenize.max_length,)
    classes = vocab = tokenize.num_classes
    features = {"tokens": 1}
  integrity.checked_once(path, f"{name} {train_split} {test_split}", lambda: check_file(
      path, (train_split, test_split), features))
  store = TFFStore(path, train_split, prepare, shape, dtype, label, max_client_examples,
                   counts_of)
  test_shape = test_shape or shape
  test_label = test_shape if label else label
  test = TFFStore(path, test_split, test_prepare or prepare, test_shape, dtype, test_label)
  parts = natural.read_until(test.read, len(test.keys), max_test_examples)
  test_x, test_y = natural.concatenated(parts, test_shape, dtype, test_label,
                                        max_test_examples)
  return natural.natural_data(store, np.asarray(test_x, dtype), test_y, classes, name, vocab)
