"""Tiny files in the three natural-data formats, written as their own code writes them
(not with this package's readers), for tests/test_natural_data.py and test_text_models.py.

* fedjax: ``core/sqlite_federated_data.py`` ``SQLiteFederatedDataBuilder`` (the table,
  ``zlib.compress(msgpack_serialize(examples))``) and ``core/serialization.py`` (numpy
  arrays as msgpack extension 1 ``(shape, dtype name, bytes)``, arrays of bytes as
  extension 4 ``(shape, [bytes])``);
* TFF: ``simulation/datasets/sql_client_data_utils.py`` ``save_to_sql_client_data`` (the
  two tables, one serialized ``tf.train.Example`` per row), the protos built with the
  protobuf library from tensorflow's ``example.proto`` / ``feature.proto``;
* LEAF: ``data/utils/split_data.py`` (``users``, ``num_samples``, ``user_data``).
"""

import json
import os
import sqlite3
import zlib

import numpy as np


# ------------------------------------------------------------------------ fedjax


def fedjax_blob(examples: dict) -> bytes:
  import msgpack

  def ext(obj):
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
      return msgpack.ExtType(4, msgpack.packb((obj.shape, list(obj.flatten())),
                                              use_bin_type=True))
    if isinstance(obj, np.ndarray):
      return msgpack.ExtType(1, msgpack.packb((obj.shape, obj.dtype.name, obj.tobytes("C")),
                                              use_bin_type=True))
    return obj

  return zlib.compress(msgpack.packb(examples, default=ext, strict_types=True))


def write_fedjax(path: str, clients):
  """``clients``: [(client id bytes, {feature: array})], in row order."""
  con = sqlite3.connect(path)
  con.execute("CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, "
              "data BLOB NOT NULL, num_examples INTEGER NOT NULL);")
  con.executemany("INSERT INTO federated_data VALUES (?, ?, ?);",
                  [(cid, fedjax_blob(ex), len(next(iter(ex.values())))) for cid, ex in clients])
  con.commit()
  con.close()


# --------------------------------------------------------------------------- TFF


def example_class():
  """tf.train.Example from the protobuf library (tensorflow/core/example/*.proto)."""
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
  f = descriptor_pb2.FileDescriptorProto(name="fedjax_async_test_example.proto",
                                         package="fedjax_async_test", syntax="proto3")
  T = descriptor_pb2.FieldDescriptorProto
  pkg = ".fedjax_async_test."

  def message(name, fields, nested=()):
    m = f.message_type.add(name=name)
    for fname, number, ftype, label, type_name, oneof in fields:
      field = m.field.add(name=fname, number=number, type=ftype, label=label)
      if type_name:
        field.type_name = type_name
      if oneof is not None:
        field.oneof_index = oneof
    for n in nested:
      m.nested_type.add().CopyFrom(n)
    return m

  rep, opt = T.LABEL_REPEATED, T.LABEL_OPTIONAL
  message("BytesList", [("value", 1, T.TYPE_BYTES, rep, None, None)])
  message("FloatList", [("value", 1, T.TYPE_FLOAT, rep, None, None)])
  message("Int64List", [("value", 1, T.TYPE_INT64, rep, None, None)])
  feature = message("Feature", [("bytes_list", 1, T.TYPE_MESSAGE, opt, pkg + "BytesList", 0),
                                ("float_list", 2, T.TYPE_MESSAGE, opt, pkg + "FloatList", 0),
                                ("int64_list", 3, T.TYPE_MESSAGE, opt, pkg + "Int64List", 0)])
  feature.oneof_decl.add(name="kind")
  entry = descriptor_pb2.DescriptorProto(name="FeatureEntry")
  entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=opt)
  entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=opt,
                  type_name=pkg + "Feature")
  entry.options.map_entry = True
  message("Features", [("feature", 1, T.TYPE_MESSAGE, rep, pkg + "Features.FeatureEntry",
                        None)], nested=[entry])
  message("Example", [("features", 1, T.TYPE_MESSAGE, opt, pkg + "Features", None)])
  pool = descriptor_pool.DescriptorPool()
  pool.Add(f)
  return message_factory.GetMessageClass(pool.FindMessageTypeByName("fedjax_async_test.Example"))


def tf_example(features: dict) -> bytes:
  """``features``: name -> bytes, a float array or an int array."""
  ex = example_class()()
  for name, value in features.items():
    feat = ex.features.feature[name]
    if isinstance(value, (bytes, str)):
      feat.bytes_list.value.append(value.encode() if isinstance(value, str) else value)
    elif np.asarray(value).dtype.kind == "f":
      feat.float_list.value.extend(np.asarray(value, np.float32).ravel().tolist())
    else:
      feat.int64_list.value.extend(int(v) for v in np.asarray(value).ravel())
  return ex.SerializeToString()


def write_tff(path: str, splits: dict):
  """``splits``: split name -> [(client id, [features dict per example])]."""
  con = sqlite3.connect(path)
  con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
              "serialized_example_proto BLOB NOT NULL);")
  con.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT "
              "NULL, num_examples INTEGER NOT NULL);")
  for split, clients in splits.items():
    for cid, examples in clients:
      for e in examples:
        con.execute("INSERT INTO examples (split_name, client_id, serialized_example_proto) "
                    "VALUES (?, ?, ?);", (split, cid, tf_example(e)))
      con.execute("INSERT INTO client_metadata (client_id, split_name, num_examples) "
                  "VALUES (?, ?, ?);", (cid, split, len(examples)))
  con.commit()
  con.close()


# -------------------------------------------------------------------------- LEAF


def write_leaf(data_dir: str, split: str, files: dict):
  """``files``: file name -> {user: (x list, y list)}; users with fewer than one example
  are kept in user_data but not listed (as split_data.py does)."""
  os.makedirs(os.path.join(data_dir, split), exist_ok=True)
  for fname, users in files.items():
    listed = [u for u, (x, y) in users.items() if len(y)]
    doc = {"users": listed, "num_samples": [len(users[u][1]) for u in listed],
           "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
    with open(os.path.join(data_dir, split, fname), "w") as f:
      json.dump(doc, f)


# ------------------------------------------------------------------ the test sets


def emnist_clients(sizes, seed: int, classes: int = 62):
  """[(pixels [n, 28, 28] float32 in [0, 1], labels [n] int)] per client."""
  rng = np.random.default_rng(seed)
  return [(rng.random((n, 28, 28), dtype=np.float32), rng.integers(0, classes, n))
          for n in sizes]


SNIPPETS = {  # TFF shakespeare.get_synthetic's snippets, more of them
    "THE_TRAGEDY_OF_KING_LEAR_MACBETH": [b"Hark!", b"When?", b"My name's Macbeth.",
                                         b"'Twas a rough fight.", b"Came they not by you?",
                                         b"No, nor more fearful."],
    "MUCH_ADO_ABOUT_NOTHING_EMILIA": [b"Never.", b"But now, my lord.",
                                      b"How if fair and foolish?", b"Is not this man jealous?",
                                      b"Why, with my lord, madam.",
                                      b"[Within.] I do beseech you"],
    "THE_TAMING_OF_THE_SHREW_CUPID": [b"Hail to thee, worthy Timon, and to all"],
}
