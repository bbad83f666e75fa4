"""Data sets with a natural client split, held lazily on the host.

A natural data set (the readers of ``fedjax_sqlite``, ``tff_sqlite`` and ``leaf``) keeps
its clients as the format has them: their ids, their sizes, each client's examples read on
demand from a :class:`ClientStore` (a SQLite file, or ragged arrays in memory for JSON).
It is a :class:`~fedjax_async.data.federated.FederatedData` whose ``x`` and ``y`` are
:class:`PaddedClients` views: ``shape`` ``[N, M, ...]`` (M the largest client), and
``rows(clients)`` pads only the clients asked for. On one device the round engine copies a
chunk of rounds' sampled clients to the device before the chunk (``core.streaming``);
everything else (``np.asarray(fed.x)``: the virtual clock, sweeps, FedEDS, several
devices) gets the whole padded arrays, made once and kept, after the same memory check
as every padded data set (``federated.padded_data_limit_bytes``).

Labels are ``[n]`` class ids or, for next-token data sets, ``[n, T]`` token ids
(``core.tokens``); every client read is checked (its size, labels in [0, num_classes),
finite features): a ValueError names the file and the client.
"""

from __future__ import annotations

import threading
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async import console
from fedjax_async.data.federated import (FederatedData, _label_range, _nonfinite,
                                         check_pool, padded_data_limit_bytes)


class ClientStore:
  """The clients of a natural data set: ``client_ids`` (the format's, as str), ``counts``
  (int64 [N], examples per client after preprocessing), one example's ``item_shape`` /
  ``dtype`` and label shape; ``read(i) -> (x_i, y_i)`` the client's examples. ``where``
  names the source in messages."""

  def __init__(self, client_ids: Sequence[str], counts, item_shape, dtype, label_shape,
               where: str):
    self.client_ids = [str(c) for c in client_ids]
    self.counts = np.asarray(counts, np.int64)
    self.item_shape = tuple(int(d) for d in item_shape)
    self.dtype = np.dtype(dtype)
    self.label_shape = tuple(int(d) for d in label_shape)
    self.where = where

  def read(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
    raise NotImplementedError


class RaggedStore(ClientStore):
  """Clients held in memory as one array of every example (``x [sum n_i, ...]``, ``y``)
  and each client's offset (``offsets [N + 1]``)."""

  def __init__(self, client_ids, x, y, offsets, where: str):
    x, y = np.asarray(x), np.asarray(y)
    super().__init__(client_ids, np.diff(offsets), x.shape[1:], x.dtype, y.shape[1:], where)
    self.x, self.y, self.offsets = x, y, np.asarray(offsets, np.int64)

  def read(self, i: int):
    a, b = self.offsets[i], self.offsets[i + 1]
    return self.x[a:b], self.y[a:b]

  @classmethod
  def from_clients(cls, client_ids, clients: Sequence[Tuple[np.ndarray, np.ndarray]],
                   where: str, dtype=None) -> "RaggedStore":
    """One ``(x_i, y_i)`` per client."""
    sizes = [len(c[1]) for c in clients]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    x = np.concatenate([np.asarray(c[0]) for c in clients])
    return cls(client_ids, x if dtype is None else x.astype(dtype),
               np.concatenate([np.asarray(c[1]) for c in clients]), offsets, where)


class PaddedClients:
  """``x`` or ``y`` of a lazily held data set: ``[N, M, ...]`` by its ``shape``, padded
  (zeros) only for the clients asked for (``rows``), whole by ``np.asarray``."""

  def __init__(self, clients: "LazyClients", which: int):
    self.clients, self.which = clients, which
    item = (clients.store.item_shape, clients.store.label_shape)[which]
    self.dtype = clients.store.dtype if which == 0 else np.dtype(np.int32)
    self.shape = (len(clients.store.counts), clients.max_examples) + item

  ndim = property(lambda self: len(self.shape))
  size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
  nbytes = property(lambda self: self.size * self.dtype.itemsize)

  def __len__(self):
    return self.shape[0]

  def rows(self, clients: Sequence[int], num_rows: Optional[int] = None) -> np.ndarray:
    return self.clients.rows(clients, num_rows)[self.which]

  def __array__(self, dtype=None, copy=None):
    whole = self.clients.whole()[self.which]
    return whole if dtype is None else whole.astype(dtype)

  def __getitem__(self, index):
    return np.asarray(self)[index]


class LazyClients:
  """Reads, checks and pads a store's clients (thread-safe; the whole arrays, when asked
  for, are made once and kept)."""

  def __init__(self, store: ClientStore, num_classes: int, name: str):
    self.store, self.num_classes, self.name = store, int(num_classes), name
    self.max_examples = max(int(store.counts.max(initial=0)), 1)
    self._lock = threading.Lock()
    self._whole = None

  def read(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
    """Client i's examples, checked (ValueError naming the source and the client)."""
    s = self.store
    x, y = s.read(int(i))
    what = f"{s.where}: client {s.client_ids[i]!r}"
    if len(x) != s.counts[i] or len(y) != s.counts[i]:
      raise ValueError(f"{what}: {len(x)} examples and {len(y)} labels read, the file says "
                       f"{int(s.counts[i])}")
    if x.shape[1:] != s.item_shape or y.shape[1:] != s.label_shape:
      raise ValueError(f"{what}: examples of shape {x.shape[1:]} and labels {y.shape[1:]}, "
                       f"the first client's {s.item_shape} and {s.label_shape}")
    _label_range(y.reshape(-1), self.num_classes, f"{what} labels")
    _nonfinite(x, f"{what} features")
    return x, y

  def rows(self, clients: Sequence[int], num_rows: Optional[int] = None):
    """(x [R, M, ...], y [R, M, ...]): the clients' examples in rows 0.. in order, zero
    padded (rows past ``len(clients)`` all zeros; R = ``num_rows`` or ``len(clients)``)."""
    clients = [int(c) for c in clients]
    r = len(clients) if num_rows is None else int(num_rows)
    s, m = self.store, self.max_examples
    x = np.zeros((r, m) + s.item_shape, s.dtype)
    y = np.zeros((r, m) + s.label_shape, np.int32)
    for row, c in enumerate(clients):
      cx, cy = self.read(c)
      x[row, :len(cx)] = cx
      y[row, :len(cy)] = cy
    return x, y

  def whole(self):
    """(x [N, M, ...], y [N, M, ...]), after the padded-size check."""
    with self._lock:
      if self._whole is None:
        n, m = len(self.store.counts), self.max_examples
        need = n * m * (self.store.dtype.itemsize * int(np.prod(self.store.item_shape))
                        + 4 * int(np.prod(self.store.label_shape)))
        limit, what = padded_data_limit_bytes()
        if need > limit:
          raise ValueError(
              f"data.dataset={self.name}: its {n} clients padded to the largest "
              f"(M={m}) would take {need / 2 ** 30:.1f} GiB, more than {what} "
              f"({limit / 2 ** 30:.1f} GiB); the round engine on one device (run.devices=1) "
              "copies only each chunk of rounds' clients to the device: use it, or "
              "data.max_client_examples")
        self._whole = self.rows(range(n))
      return self._whole


def natural_data(store: ClientStore, test_x: np.ndarray, test_y: np.ndarray,
                 num_classes: int, name: str, input_vocab: int = 0) -> FederatedData:
  """The :class:`FederatedData` of ``store``'s clients (``x``, ``y`` lazy views) and a
  central test set (checked by ``check_pool``).

  Args:
    store: the clients' store.
    test_x: the central test features.
    test_y: the central test labels.
    num_classes: the number of classes.
    name: the data set's name.
    input_vocab: the text data sets' input vocabulary (0: none).
  """
  if not len(store.counts):
    raise ValueError(f"{store.where}: no clients with training examples")
  if store.counts.min() < 1:
    i = int(np.argmin(store.counts))
    raise ValueError(f"{store.where}: client {store.client_ids[i]!r} has no examples")
  lazy = LazyClients(store, num_classes, name)
  first = lazy.read(0)
  sequence = len(store.label_shape) > 0
  check_pool(first[0], first[1], test_x, test_y, int(num_classes),
             {k: f"{store.where} {v}" for k, v in (
                 ("x", "training features"), ("y", "training labels"),
                 ("test_x", "test features"), ("test_y", "test labels"),
                 ("train", "training set"), ("test", "test set"))},
             sequence=sequence)
  return FederatedData(PaddedClients(lazy, 0), PaddedClients(lazy, 1),
                       store.counts.astype(np.int32), test_x, test_y.astype(np.int32),
                       int(num_classes), name, input_vocab=int(input_vocab))


def note(message: str) -> None:
  """A line on the console (stderr) while a data set loads."""
  console.err(message)


def note_empty(where: str, ids: Sequence[str], empty: Sequence[str]) -> None:
  """Says how many of the ``ids`` clients of ``where`` have no examples and are left out
  (a client with nothing to train on is no client of the run)."""
  if len(empty):
    shown = ", ".join(repr(str(e)) for e in list(empty)[:3]) + (", ..." if len(empty) > 3
                                                              else "")
    console.warn(f"{where}: {len(empty)} of {len(ids)} clients have no examples and are "
                 f"left out ({shown}); the run has {len(ids) - len(empty)}")


def is_lazy(fed) -> bool:
  """Whether ``fed``'s clients are held lazily (a natural data set)."""
  return isinstance(getattr(fed, "x", None), PaddedClients)


def client_ids(fed) -> List[str]:
  """A natural data set's client ids, in client order."""
  if not is_lazy(fed):
    raise ValueError(f"{getattr(fed, 'name', fed)}: not a natural data set")
  return list(fed.x.clients.store.client_ids)


def padded_rows(fed, clients: Sequence[int], num_rows: Optional[int] = None):
  """(x, y) of ``clients`` of a lazily held data set, padded (``LazyClients.rows``)."""
  return fed.x.clients.rows(clients, num_rows)


def concatenated(parts: Sequence[Tuple[np.ndarray, np.ndarray]], item_shape, dtype,
                 label_shape, limit: int = 0) -> Tuple[np.ndarray, np.ndarray]:
  """(x, y) of ``parts`` end to end, the first ``limit`` examples (0: all).

  Args:
    parts: (x, y) pairs.
    item_shape: one example's shape (for no parts).
    dtype: the features' dtype (for no parts).
    label_shape: one label's shape (for no parts).
    limit: the examples kept (0: all).
  """
  xs = [np.asarray(p[0]) for p in parts]
  ys = [np.asarray(p[1]) for p in parts]
  x = np.concatenate(xs) if xs else np.zeros((0,) + tuple(item_shape), dtype)
  y = np.concatenate(ys) if ys else np.zeros((0,) + tuple(label_shape), np.int32)
  return (x[:limit], y[:limit]) if limit else (x, y)


def read_until(read: Callable[[int], Tuple[np.ndarray, np.ndarray]], n: int,
               limit: int = 0) -> List[Tuple[np.ndarray, np.ndarray]]:
  """``read(i)`` for i = 0.. until ``limit`` examples (0: all ``n``)."""
  out, total = [], 0
  for i in range(n):
    if limit and total >= limit:
      break
    part = read(i)
    out.append(part)
    total += len(part[1])
  return out
