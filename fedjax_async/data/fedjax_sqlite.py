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
  ``stackoverflow.word_count`` (``text.WordTokenizer``):
  one sequence of 20 word ids per training sentence, 30 per test sentence (fedjax
  ``stackoverflow.load_data``'s ``train_max_length, eval_max_length = 20, 30``);
* ``fedjax_cifar100``: ``federated_cifar100_{train,test}.sqlite`` (fedjax converts TFF's
  file to these, ``cifar100.load_split``): ``image`` [n, 32, 32, 3] uint8 -> /255
  float32, ``label`` [n] (``coarse_label`` unused; ``x`` / ``y`` too, the names after
  fedjax's ``preprocess_client``); 100 classes.

Each file is checked when loaded (``check_file``): ``integrity.sqlite_file`` (header,
size, ``PRAGMA quick_check``), the table, then every client's blob decompressed and
decoded (zlib's checksum covers every byte), its features present and as long as its
``num_examples``; a damaged file is refused in one line naming it and the fix. A client
with no examples is left out, counted on the console.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import zlib
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from fedjax_async.data import integrity, natural, text
from fedjax_async.data.federated import FederatedData

TABLE = "federated_data"
COLUMNS = ("client_id", "data", "num_examples")
# a file up to this size has every client's blob decoded at load (zlib verifies each
# byte); a larger one the first 64 KiB of each (every client read decodes its own whole)
FULL_DECODE_MAX_BYTES = 4 << 30


def fix(name: str) -> str:
  """What to do about a damaged file of data set ``name``."""
  return (f"delete it and download it again (python -m fedjax_async.cli.data download "
          f"{name}, or fedjax's load_data into ~/.cache/fedjax)")


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
  y)`` when read; at most ``limit`` examples each (0: all). Clients with no examples are
  left out (counted on the console)."""

  def __init__(self, path: str, prepare: Callable, item_shape, dtype, label_shape,
               limit: int = 0, counts_of: Optional[Callable] = None, fix_text: str = ""):
    self.path, self.prepare, self.limit = path, prepare, int(limit)
    self.fix = fix_text or fix("fedjax_emnist")
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
    ids = [_id(k) for k in self.keys]
    self.empty = [i for i, kept in zip(ids, keep) if not kept]
    natural.note_empty(path, ids, self.empty)
    self.keys = [k for k, kept in zip(self.keys, keep) if kept]
    super().__init__([i for i, kept in zip(ids, keep) if kept], counts[keep], item_shape,
                     dtype, label_shape, path)

  def _examples(self, key) -> Dict[str, np.ndarray]:
    try:
      with self._lock:
        row = self.connection.execute(f"SELECT data FROM {TABLE} WHERE client_id = ?",
                                      (key,)).fetchone()
    except sqlite3.DatabaseError as e:
      raise integrity.database_error(self.path, e, self.fix) from None
    if row is None:
      raise integrity.DamagedFile(f"{self.path}: client {_id(key)!r} is gone from the file; "
                                  f"{self.fix}")
    try:
      return decode(row[0])
    except Exception as e:  # pylint: disable=broad-except
      raise integrity.DamagedFile(
          f"{self.path}: client {_id(key)!r}: its data blob is not fedjax's zlib-compressed "
          f"msgpack ({type(e).__name__}: {e}); {self.fix}") from None

  def read(self, i: int):
    x, y = self.prepare(self._examples(self.keys[i]))
    return (x[:self.limit], y[:self.limit]) if self.limit else (x, y)


def _id(key) -> str:
  return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def check_file(path: str, features, fix_text: str) -> None:
  """The load-time check of fedjax's SQLite file ``path`` (module docstring): DamagedFile
  naming the file and ``fix_text`` unless it is whole; ``features``: the names a client
  must have (a tuple of alternatives: any one of them, e.g. ``image`` or ``x``)."""
  integrity.sqlite_file(path, fix_text)
  full = os.path.getsize(path) <= FULL_DECODE_MAX_BYTES
  con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
  try:
    have = [r[1] for r in con.execute(f"PRAGMA table_info({TABLE})")]
    if not set(COLUMNS) <= set(have):
      tables = sorted(r[0] for r in con.execute(
          "SELECT name FROM sqlite_master WHERE type = 'table'"))
      raise integrity.DamagedFile(
          f"{path}: not fedjax's SQLite federated data: no table {TABLE}({', '.join(COLUMNS)})"
          f" (tables: {tables}; a TFF file is read as tff_*)")
    for key, blob, n in con.execute(f"SELECT client_id, data, num_examples FROM {TABLE} "
                                    "ORDER BY rowid"):
      what = f"{path}: client {_id(key)!r}"
      try:
        if full:
          examples = decode(blob)
        else:
          head = zlib.decompressobj().decompress(blob, 1 << 16)
          if not head or head[0] >> 4 not in (0x8,) and head[0] not in (0xde, 0xdf):
            raise ValueError("no msgpack map")
          examples = None
      except Exception as e:  # pylint: disable=broad-except
        raise integrity.DamagedFile(f"{what}: its data blob does not decode ("
                                    f"{type(e).__name__}: {e}); {fix_text}") from None
      if examples is None:
        continue
      if not isinstance(examples, dict):
        raise integrity.DamagedFile(f"{what}: its data blob is no map of features; {fix_text}")
      for alternatives in features:
        alternatives = (alternatives,) if isinstance(alternatives, str) else alternatives
        if not any(a in examples for a in alternatives):
          raise integrity.DamagedFile(
              f"{what}: no feature {' or '.join(map(repr, alternatives))} (has "
              f"{sorted(examples)}): not this data set's file")
      for fname, v in examples.items():
        if np.ndim(v) and len(v) != n:
          raise integrity.DamagedFile(f"{what}: feature {fname!r} has {len(v)} examples, "
                                      f"num_examples says {n}; {fix_text}")
  except sqlite3.DatabaseError as e:
    raise integrity.database_error(path, e, fix_text) from None
  finally:
    con.close()


def connect(path: str) -> sqlite3.Connection:
  """A read-only connection (shared by the host loop's threads)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(path)
  return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


def _emnist(ex):
  return (1.0 - np.asarray(ex["pixels"], np.float32))[..., None], np.asarray(ex["label"],
                                                                              np.int32)


def _cifar(ex):
  """fedjax's stored ``image`` / ``label`` (or ``x`` / ``y``, its names after
  ``cifar100.preprocess_client``)."""
  x, y = ("image", "label") if "image" in ex else ("x", "y")
  return np.asarray(ex[x], np.float32) / np.float32(255.0), np.asarray(ex[y], np.int32)


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
  ``transform`` maps image features (normalisation).

  Args:
    name: the data set (``DATASETS``).
    data_dir: the directory of fedjax's files.
    max_client_examples: each client's first k examples (0: all).
    max_test_examples: the first k test examples (0: all).
    transform: maps image features (normalisation).
  """
  train_path, test_path = paths(name, data_dir)
  for p in (train_path, test_path):
    if not os.path.isfile(p):
      raise FileNotFoundError(f"{p}: no such file; data.dataset={name} reads fedjax's "
                              f"{os.path.basename(train_path)} and "
                              f"{os.path.basename(test_path)} from data.data_dir (fedjax "
                              "downloads them to ~/.cache/fedjax)")
  counts_of, vocab, test_prepare = None, 0, None
  if name.startswith("fedjax_emnist"):
    prepare = _images(_emnist, transform)
    shape, dtype, label, classes = (28, 28, 1), np.float32, (), 10 if "digits" in name else 62
    features = ("pixels", "label")
  elif name == "fedjax_cifar100":
    prepare = _images(_cifar, transform)
    shape, dtype, label, classes = (32, 32, 3), np.float32, (), 100
    features = (("image", "x"), ("label", "y"))
  elif name == "fedjax_shakespeare":
    length = text.SHAKESPEARE_SEQUENCE_LENGTH
    prepare = lambda ex: text.shakespeare_sequences(_field(ex, "snippets", train_path), length)
    counts_of = lambda ex: text.shakespeare_count(_field(ex, "snippets", train_path), length)
    shape, dtype, label = (length,), np.int32, (length,)
    classes = vocab = text.SHAKESPEARE_NUM_CLASSES
    features = ("snippets",)
  elif name == "fedjax_stackoverflow":
    words = text.read_vocabulary(data_dir)
    tokenize = text.WordTokenizer(words)
    test_tokenize = text.WordTokenizer(words, text.STACKOVERFLOW_EVAL_MAX_LENGTH)
    prepare = lambda ex: tokenize(_field(ex, "tokens", train_path))
    test_prepare = lambda ex: test_tokenize(_field(ex, "tokens", test_path))
    shape, dtype, label = (tokenize.max_length,), np.int32, (tokenize.max_length,)
    classes = vocab = tokenize.num_classes
    features = ("tokens",)
  else:
    raise ValueError(f"data.dataset: unknown fedjax data set {name!r}; choose from "
                     f"{list(DATASETS)}")
  for p in (train_path, test_path):
    integrity.checked_once(p, name, lambda p=p: check_file(p, features, fix(name)))
  store = SQLiteStore(train_path, prepare, shape, dtype, label, max_client_examples, counts_of,
                      fix(name))
  test_shape = shape if test_prepare is None else (text.STACKOVERFLOW_EVAL_MAX_LENGTH,)
  test = SQLiteStore(test_path, test_prepare or prepare, test_shape, dtype,
                     test_shape if label else label, fix_text=fix(name))
  parts = natural.read_until(test.read, len(test.keys), max_test_examples)
  test_x, test_y = natural.concatenated(parts, test_shape, dtype,
                                        test_shape if label else label, max_test_examples)
  return natural.natural_data(store, np.asarray(test_x, dtype), test_y, classes, name, vocab)
