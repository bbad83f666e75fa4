"""A federated data set on the host (``FederatedData``), the memory check of its padded
arrays, the partitions of a labelled pool into clients, the padding (``federate``) and
the label histograms.

Partitions (each returns one int64 index array per client and assigns every example
exactly once): ``partition_iid`` (equal class proportions, PAFed), ``partition_shards``
(McMahan et al.: 2 label-sorted shards per client) and ``partition_dirichlet`` (per-class
Dir(alpha) proportions).
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from fedjax_async import figures

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DATASETS = ("synthetic", "synthetic_iid", "fashion_mnist", "mnist", "cifar10", "cifar100")
PARTITIONS = ("iid", "shards", "dirichlet")
DATA_SOURCES = ("auto", "idx", "tfds")
KNOWN_NUM_CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100,
                      "kmnist": 10, "emnist": 62, "svhn_cropped": 10}


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """Padded per-client training data plus a central test set (numpy, host)."""

  x: np.ndarray  # float32 [N, M, ...] padded per-client features (M = max client size)
  y: np.ndarray  # int32 [N, M] padded labels (pad value 0); [N, M, T]: token sequences
  counts: np.ndarray  # int32 [N] real examples per client; rows >= counts[i] are padding
  test_x: np.ndarray  # float32 [T, ...] central test set
  test_y: np.ndarray  # int32 [T]
  num_classes: int
  name: str
  # token inputs (int32 x): ids in [0, input_vocab); 0: not token inputs. (A natural data
  # set's x and y may be lazy views: ``natural.PaddedClients``.)
  input_vocab: int = 0

  @property
  def num_clients(self) -> int:
    return int(self.x.shape[0])

  @property
  def max_examples(self) -> int:
    return int(self.x.shape[1])

  @property
  def feature_shape(self) -> Tuple[int, ...]:
    return tuple(int(d) for d in self.x.shape[2:])


def largest_label(fed: "FederatedData") -> str:
  """Where ``fed``'s largest class label is, for an error about ``num_classes``: "test split:
  label 9 at index 7" or "train split: label 9 at client 3's example 9", with the other
  split's largest (a label in the test split only said so); '' for sequence labels or
  where the labels cannot be read."""
  try:
    if np.ndim(fed.test_y) != 1:
      return ""
    counts = np.asarray(fed.counts)
    real = np.arange(fed.y.shape[1])[None, :] < counts[:, None]
    train = np.where(real, np.asarray(fed.y), -1)
    test = np.asarray(fed.test_y)
    a, b = int(train.max(initial=-1)), int(test.max(initial=-1))
  except Exception:  # pylint: disable=broad-except  (a lazy view that cannot be read whole)
    return ""
  if b > a:
    return (f"test split: label {b} at index {int(np.argmax(test))} (in the test split "
            f"only: the clients' labels go up to {a})")
  c, j = np.unravel_index(int(np.argmax(train)), train.shape)
  return (f"train split: label {a} at client {int(c)}'s example {int(j)} (the test split's "
          f"labels go up to {b})")


def _outside(y, ty, parts, num_classes: int, names: dict) -> str:
  """The error for the first label >= ``num_classes`` (the training split's first), headed
  by ``num_classes=``: its split, value and index (for ``from_clients``, the client and example), what to pass."""
  k = int(max(y.max(initial=0), ty.max(initial=0))) + 1
  bad = np.flatnonzero(y >= num_classes)
  if bad.size:
    i = int(bad[0])
    split, value = f"train split ({names['y']})", int(y[i])
    where = f"index {i}"
    if names["y"] == "clients":  # the clients' arrays one after another
      c = next(c for c, p in enumerate(parts) if p[0] <= i <= p[-1])
      where = f"client {c}'s example {i - int(parts[c][0])}"
  else:
    i = int(np.flatnonzero(ty >= num_classes)[0])
    split, value, where = "test split", int(ty[i]), f"index {i}"
  return (f"num_classes={num_classes}: {split}: label {value} at {where} is outside [0, "
          f"{num_classes}); pass num_classes={k} (and give the model's last layer {k} "
          "outputs), or fix the label")


# ------------------------------------------------------------------------ memory

MAX_DATA_ENV = "FEDJAX_ASYNC_MAX_DATA_GIB"  # overrides the limit of check_padded_size
_FALLBACK_MEMORY = 24 * 2 ** 30  # assumed available memory when it cannot be read


def available_memory_bytes() -> int:
  """The host memory available now (psutil, /proc/meminfo or sysconf; else 24 GiB)."""
  try:
    import psutil  # pylint: disable=g-import-not-at-top
    return int(psutil.virtual_memory().available)
  except Exception:  # pylint: disable=broad-except
    pass
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
  except (ValueError, OSError, AttributeError):
    return _FALLBACK_MEMORY


def padded_data_limit_bytes() -> Tuple[int, str]:
  """(limit, what it is): $FEDJAX_ASYNC_MAX_DATA_GIB, else half the available memory (the
  engine makes a device copy of the padded arrays)."""
  env = os.environ.get(MAX_DATA_ENV)
  if env:
    try:
      return int(float(env) * 2 ** 30), f"${MAX_DATA_ENV}"
    except ValueError:
      raise ValueError(f"${MAX_DATA_ENV}: expected a number of GiB, got {env!r}") from None
  avail = available_memory_bytes()
  return avail // 2, f"half of the {avail / 2 ** 30:.1f} GiB of available memory"


def check_padded_size(num_clients: int, max_examples: int, feature_shape: Sequence[int],
                      partition: str = "") -> None:
  """Raises ValueError naming data.num_clients when the padded [N, M, ...] arrays would not
  fit (see :func:`padded_data_limit_bytes`); M is the largest client's size."""
  per_example = 4 * (int(np.prod(feature_shape, dtype=np.int64)) + 1)  # float32 x, int32 y
  need = int(num_clients) * max(int(max_examples), 1) * per_example
  limit, what = padded_data_limit_bytes()
  if need <= limit:
    return
  dims = " x ".join(str(int(d)) for d in feature_shape)
  part = f" of the {partition} partition" if partition else ""
  raise ValueError(
      f"data.num_clients={num_clients}: the padded client data [{num_clients} clients x "
      f"M={max_examples} x {dims or 1}] would take {need / 2 ** 30:.1f} GiB, more than "
      f"{what} ({limit / 2 ** 30:.1f} GiB); M is the largest client's size{part}. Use "
      f"fewer clients (or set ${MAX_DATA_ENV} to raise the limit)")


# ------------------------------------------------------------------------ partitions


def _check_clients(num_clients: int, fn: str) -> None:
  if num_clients < 1:
    raise ValueError(f"{fn}: num_clients must be >= 1, got {num_clients}")


def partition_iid(labels: np.ndarray, num_clients: int, seed: int = 0) -> List[np.ndarray]:
  """Equal class proportions per client (PAFed's IID split).

  Each class's indices are shuffled; the classes are laid end to end and dealt
  round-robin, so every client gets floor or ceil of n_c / N examples of each class c and
  client sizes differ by at most one.
  """
  _check_clients(num_clients, "partition_iid")
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  dealt = np.concatenate([rng.permutation(np.flatnonzero(labels == c))
                          for c in np.unique(labels)] + [np.zeros(0, np.int64)])
  return [dealt[k::num_clients].astype(np.int64) for k in range(num_clients)]


def partition_shards(labels: np.ndarray, num_clients: int, shards_per_client: int = 2,
                     seed: int = 0) -> List[np.ndarray]:
  """McMahan et al.'s pathological non-IID split.

  Examples sorted by label (ties in a seeded random order) are cut into
  num_clients * shards_per_client equal shards (sizes differ by at most one); each client
  gets shards_per_client random shards.
  """
  _check_clients(num_clients, "partition_shards")
  labels = np.asarray(labels)
  n, num_shards = len(labels), num_clients * shards_per_client
  if shards_per_client < 1:
    raise ValueError(f"partition_shards: shards_per_client must be >= 1, got "
                     f"{shards_per_client}")
  if num_shards > n:
    raise ValueError(f"partition_shards: num_clients={num_clients} x shards_per_client="
                     f"{shards_per_client} = {num_shards} shards but only {n} examples")
  rng = np.random.default_rng(seed)
  perm = rng.permutation(n)
  order = perm[np.argsort(labels[perm], kind="stable")]
  shards = np.array_split(order, num_shards)
  owner = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return [np.concatenate([shards[s] for s in row]).astype(np.int64) for row in owner]


def partition_dirichlet(labels: np.ndarray, num_clients: int, alpha: float,
                        min_size: int = 10, seed: int = 0,
                        max_tries: int = 1000) -> List[np.ndarray]:
  """Per class c, proportions p_c ~ Dir(alpha * 1_N) over the clients split c's examples.

  The whole draw is repeated until every client has >= min_size examples (at most
  ``max_tries`` draws, then ValueError).

  Args:
    labels: [n] the examples' labels.
    num_clients: N.
    alpha: the Dirichlet concentration (> 0).
    min_size: every client's fewest examples.
    seed: the draws' seed.
    max_tries: the draws tried before the ValueError.
  """
  _check_clients(num_clients, "partition_dirichlet")
  if not alpha > 0:
    raise ValueError(f"--alpha: the Dirichlet concentration must be > 0, got {alpha}")
  labels = np.asarray(labels)
  if num_clients * min_size > len(labels):
    raise ValueError(f"data.num_clients={num_clients}: a Dirichlet partition gives every "
                     f"client at least {min_size} examples, and {num_clients} x {min_size} "
                     f"exceeds the {len(labels)} examples; use at most "
                     f"{len(labels) // min_size} clients")
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for c in classes:
      idx = rng.permutation(np.flatnonzero(labels == c))
      p = rng.dirichlet(np.full(num_clients, float(alpha)))
      cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
      for k, piece in enumerate(np.split(idx, cuts)):
        parts[k].append(piece)
    parts = [np.concatenate(p).astype(np.int64) for p in parts]
    if min(len(p) for p in parts) >= min_size:
      return parts
  raise ValueError(f"--alpha={alpha}: no Dirichlet draw in {max_tries} tries gave every one "
                   f"of the {num_clients} clients (data.num_clients) at least {min_size} "
                   "examples; raise --alpha or use fewer clients")


# ---------------------------------------------------------------------- federate


def _short(value) -> str:
  """``repr(value)`` on one line, at most 60 characters (for error messages)."""
  text = " ".join(repr(value).split())
  return text if len(text) <= 60 else text[:57] + "..."


def _nonfinite(x: np.ndarray, what: str) -> None:
  """ValueError naming ``what`` when features ``x [n, ...]`` hold NaN or Inf (read in
  blocks of examples: no full-size temporary)."""
  if x.dtype.kind not in "fc" or not x.size:
    return
  flat, bad = x.reshape(len(x), -1), []
  for start in range(0, len(flat), 4096):
    bad.extend(start + np.flatnonzero(~np.isfinite(flat[start:start + 4096]).all(axis=1)))
  if bad:
    n = len(bad)
    raise ValueError(f"{what}: {n} example{'s' if n > 1 else ''} with NaN or Inf features "
                     f"(the first is example {int(bad[0])}); drop or impute them")


def _label_range(y: np.ndarray, num_classes: int, what: str) -> None:
  """ValueError naming ``what`` for a label outside [0, num_classes)."""
  bad = (y < 0) | (y >= num_classes)
  if bad.any():
    i = int(np.argmax(bad))
    raise ValueError(f"{what}: label {y[i]} (example {i}) is outside [0, num_classes="
                     f"{num_classes}); labels are class indices 0..{num_classes - 1}")


def check_pool(train_x, train_y, test_x, test_y, num_classes: int,
               names: Optional[dict] = None, sequence: bool = False) -> None:
  """The checks at the boundary of every data set (``federate`` runs them): finite
  features, integer labels in [0, num_classes) (``sequence``: a ``[T]`` row of token ids
  per example, T of the test set's own features, which may be longer than the training
  ones: fedjax's Stack Overflow), one label per example in the training and
  the test set, test examples shaped like the training ones, a non-empty test set.
  ``names``: what each message names (keys x, y, train (both), test_x, test_y, test);
  ValueError otherwise.

  Args:
    train_x: the training features.
    train_y: the training labels.
    test_x: the test features.
    test_y: the test labels.
    num_classes: the labels' upper bound (an int).
    names: what each message names (default: generic names).
    sequence: the labels are [T] rows of token ids.
  """
  names = names or {}
  nx, ny = names.get("x", "training features"), names.get("y", "training labels")
  ntx, nty = names.get("test_x", "test features"), names.get("test_y", "test labels")
  pairs = names.get("train", "training set"), names.get("test", "test set")
  if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes,
                                                                 (int, np.integer)):
    raise ValueError(f"num_classes: expected an int, got {_short(num_classes)}")
  for x, y, pair in ((train_x, train_y, pairs[0]), (test_x, test_y, pairs[1])):
    if len(x) != len(y):
      raise ValueError(f"{pair}: {len(x)} examples against {len(y)} labels; give one label "
                       "per example")
    if not len(y):
      raise ValueError(f"{pair}: no examples")
  if test_x.shape[1:] != train_x.shape[1:] and not (
      sequence and test_x.ndim == train_x.ndim == 2):  # (test sequences may be longer)
    raise ValueError(f"{ntx}: examples of shape {test_x.shape[1:]}, the training ones "
                     f"{train_x.shape[1:]}")
  for x, y, wy in ((train_x, train_y, ny), (test_x, test_y, nty)):
    length = x.shape[-1] if x.ndim == 2 else train_y.shape[-1]
    if y.ndim != 1 + sequence or y.dtype.kind not in "iuf" or (
        y.dtype.kind == "f" and not np.array_equal(y, np.floor(y))) or (
            sequence and y.shape[1:] != (length,)):
      kind = f"[n, {length}] array of token ids" if sequence else (
          "1-D array of integer labels")
      raise ValueError(f"{wy}: expected a {kind}, got shape {y.shape} dtype {y.dtype}")
    _label_range(y.reshape(-1), int(num_classes), wy)
  _nonfinite(train_x, nx)
  _nonfinite(test_x, ntx)


def federate(train_x: np.ndarray, train_y: np.ndarray, parts: Sequence[np.ndarray],
             test_x: np.ndarray, test_y: np.ndarray, num_classes: int,
             name: str, partition: str = "", names: Optional[dict] = None) -> FederatedData:
  """Pads each client's examples (``train_x[parts[i]]``) with zeros to M = max part size.

  Raises ValueError naming data.num_clients (and ``partition``) when the padded arrays would
  not fit in memory (:func:`check_padded_size`), and one naming the array at fault when
  the data fail :func:`check_pool` or a client has no examples (``names``: the names in
  those messages, keys x, y, test_x, test_y, num_clients; default: the data set's).

  Args:
    train_x: the training features.
    train_y: the training labels.
    parts: each client's indices into ``train_x``.
    test_x: the test features.
    test_y: the test labels.
    num_classes: the number of classes.
    name: the data set's name.
    partition: the partition, named in the memory error.
    names: the names in the messages (default: the data set's).
  """
  train_x, train_y = np.asarray(train_x), np.asarray(train_y)
  test_x, test_y = np.asarray(test_x), np.asarray(test_y)
  counts = np.array([len(p) for p in parts], dtype=np.int32)
  m = max(int(counts.max(initial=0)), 1)
  check_padded_size(len(parts), m, train_x.shape[1:], partition)
  names = names or {k: f"{name} {what}" for k, what in (
      ("x", "training features"), ("y", "training labels"), ("test_x", "test features"),
      ("test_y", "test labels"), ("train", "training set"), ("test", "test set"))}
  check_pool(train_x, train_y, test_x, test_y, num_classes, names)
  if len(parts) and not counts.min():
    empty = int(np.sum(counts == 0))
    raise ValueError(f"{names.get('num_clients', 'data.num_clients')}={len(parts)}: "
                     f"{empty} client{'s' if empty > 1 else ''} (the first is client "
                     f"{int(np.argmin(counts))}) would have no examples; use fewer clients")
  x = np.zeros((len(parts), m) + train_x.shape[1:], np.float32)
  y = np.zeros((len(parts), m), np.int32)
  for i, p in enumerate(parts):
    x[i, :len(p)] = train_x[p]
    y[i, :len(p)] = train_y[p]
  return FederatedData(x, y, counts, np.asarray(test_x, np.float32),
                       np.asarray(test_y, np.int32), int(num_classes), name)


def make_partition(labels: np.ndarray, kind: str, num_clients: int, *, alpha: float = 0.5,
              shards_per_client: int = 2, min_size: int = 10,
              seed: int = 0) -> List[np.ndarray]:
  """Dispatches to partition_iid / partition_shards / partition_dirichlet by name.

  Args:
    labels: [n] the examples' labels.
    kind: ``iid``, ``shards`` or ``dirichlet``.
    num_clients: N.
    alpha: the Dirichlet concentration.
    shards_per_client: label shards per client.
    min_size: a Dirichlet partition's fewest examples per client.
    seed: the partition's seed.
  """
  if kind == "iid":
    return partition_iid(labels, num_clients, seed)
  if kind == "shards":
    return partition_shards(labels, num_clients, shards_per_client, seed)
  if kind == "dirichlet":
    return partition_dirichlet(labels, num_clients, alpha, min_size, seed)
  raise ValueError(f"data.partition: unknown partition {kind!r}; choose from {list(PARTITIONS)}")


# ----------------------------------------------------------------------- histograms


def label_histogram(data: FederatedData) -> np.ndarray:
  """[N, num_classes] int64: each client's real (non-padding) examples per class (token
  labels: its tokens per id)."""
  return np.stack([np.bincount(np.ravel(data.y[i, :data.counts[i]]), minlength=data.num_classes)
                   for i in range(data.num_clients)])


def format_histogram(hist: np.ndarray) -> str:
  """A fixed-width text table: one row per client (total, then per-class counts)."""
  hist = np.asarray(hist)
  width = max(5, len(str(int(hist.sum())))) + 1
  head = "client".rjust(6) + "total".rjust(width) + "".join(
      f"c{j}".rjust(width) for j in range(hist.shape[1]))
  rows = [head, "-" * len(head)]
  for i, row in enumerate(hist):
    rows.append(f"{i:6d}" + f"{int(row.sum()):{width}d}"
                + "".join(f"{int(v):{width}d}" for v in row))
  rows.append("-" * len(head))
  rows.append("   all" + f"{int(hist.sum()):{width}d}"
              + "".join(f"{int(v):{width}d}" for v in hist.sum(axis=0)))
  return "\n".join(rows)


def save_histogram_png(hist: np.ndarray, path: str, title: str = "") -> None:
  """Heat map clients x classes with a colorbar (Agg canvas; the global backend is
  untouched), titled ``title`` (default: the clients, classes and examples counted)."""
  hist = np.asarray(hist)
  n, c = hist.shape
  fig = figures.new_figure((max(4.0, 0.35 * c + 2.5), max(3.0, min(0.18 * n + 1.5, 20.0))))
  ax = fig.add_subplot(1, 1, 1)
  im = ax.imshow(hist, aspect="auto", interpolation="nearest", cmap="viridis")
  figures.integer_ticks(ax)
  ax.set_xlabel("class")
  ax.set_ylabel("client")
  ax.set_title(title or f"examples per client and class: {n} clients, {c} classes, "
               f"{int(hist.sum())} examples", fontsize=9)
  fig.colorbar(im, ax=ax, label="examples")
  fig.tight_layout()
  fig.savefig(path, dpi=100, format="png")  # to ``path`` as given (no ".png" appended)


def _array(value, what: str) -> np.ndarray:
  """``np.asarray(value)`` of a numeric array (bool, int or float), else ValueError
  naming ``what``."""
  try:
    a = np.asarray(value)
  except (ValueError, TypeError, OverflowError) as e:
    raise ValueError(f"{what}: expected a numeric array, got {type(value).__name__} ("
                     f"{' '.join(str(e).split())[:80]})") from None
  if a.dtype.kind not in "biuf":
    raise ValueError(f"{what}: expected a numeric array, got dtype {a.dtype} "
                     f"({_short(value)})")
  return a


def _features(x, what: str) -> np.ndarray:
  """Features ``[n, ...]`` as float32 (values beyond float32's range become Inf, which
  ``check_pool`` refuses), else ValueError naming ``what``."""
  a = _array(x, what)
  if a.ndim < 2:
    raise ValueError(f"{what}: expected one row per example ([n, features...]), got shape "
                     f"{a.shape}" + ("; use x[:, None] for one feature" if a.ndim else ""))
  with np.errstate(over="ignore", invalid="ignore"):
    return a.astype(np.float32)


def _labels(y, what: str) -> np.ndarray:
  """Labels as int32 (a 1-D array of non-negative ints below 2^31), else ValueError
  naming ``what``."""
  y = _array(y, what)
  if y.ndim != 1 or y.dtype.kind not in "iu" or (y.size and (y.min() < 0
                                                             or y.max() > 2 ** 31 - 2)):
    bad = (f", label {y.min() if y.min() < 0 else y.max()}" if y.ndim == 1 and y.size
           and y.dtype.kind in "iu" else "")
    raise ValueError(f"{what}: expected a 1-D array of non-negative integer labels (class "
                     f"indices), got shape {y.shape} dtype {y.dtype}{bad}; cast float "
                     "labels with .astype(int)")
  return y.astype(np.int32)


def _int_arg(value, what: str, low: int) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{what}: expected an int, got {_short(value)}")
  if value < low:
    raise ValueError(f"{what}: must be >= {low}, got {value}")
  return int(value)


# the names of the partitions' messages (written for the CLI) as from_arrays's arguments
_ARGUMENTS = (("data.num_clients", "num_clients"), ("--alpha", "alpha"),
              ("partition_shards: ", ""), ("partition_dirichlet: ", ""),
              ("partition_iid: ", ""))


def from_arrays(x, y, test, *, num_clients: int, partition: str = "iid",
                alpha: float = 0.5, shards_per_client: int = 2, min_size: int = 1,
                seed: int = 0, num_classes: Optional[int] = None,
                name: str = "arrays") -> FederatedData:
  """Your labelled arrays as a federated data set: ``x [n, ...]`` (float features),
  ``y [n]`` (int labels), ``test = (x_test, y_test)``, split over ``num_clients`` by the
  project's partitions (``partition``: iid | shards | dirichlet, with ``alpha`` /
  ``shards_per_client``; seeded). ``num_classes`` defaults to the largest label + 1.
  Bad input (NaN/Inf features, labels outside [0, num_classes), lengths or example shapes
  that do not match, an empty client) is a one-line ValueError naming the argument.

  Args:
    x: [n, ...] float features.
    y: [n] int labels.
    test: ``(x_test, y_test)``, the central test set.
    num_clients: the clients to split ``x`` over.
    partition: ``iid``, ``shards`` or ``dirichlet``.
    alpha: the Dirichlet concentration.
    shards_per_client: label shards per client.
    min_size: a Dirichlet partition's fewest examples per client.
    seed: the partition's seed.
    num_classes: the number of classes (None: the largest label + 1).
    name: the data set's name.

  Example::

    fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=20, partition="dirichlet", alpha=0.1)
    fa.simulate(algorithm="fedavg", data=fed)
  """
  x, y = _features(x, "x"), _labels(y, "y")
  if len(x) != len(y):
    raise ValueError(f"x and y: {len(x)} examples against {len(y)} labels; give one label "
                     "per example")
  if not len(y):
    raise ValueError("x: no examples")
  if not isinstance(partition, str) or partition not in PARTITIONS:
    raise ValueError(f"partition: unknown partition {_short(partition)}; choose from "
                     f"{list(PARTITIONS)}")
  if (isinstance(alpha, (bool, np.bool_))
      or not isinstance(alpha, (int, float, np.integer, np.floating))
      or not 0 < alpha < float("inf")):
    raise ValueError(f"alpha: the Dirichlet concentration must be a number > 0, got "
                     f"{_short(alpha)}")
  shards_per_client = _int_arg(shards_per_client, "shards_per_client", 1)
  min_size = _int_arg(min_size, "min_size", 1)
  seed = _int_arg(seed, "seed", 0)
  num_clients = _int_arg(num_clients, "num_clients", 1)
  if num_clients > len(y):
    raise ValueError(f"num_clients: must be in [1, {len(y)}] (the examples), got "
                     f"{num_clients}")
  if partition == "dirichlet" and num_clients * min_size > len(y):
    raise ValueError(f"min_size={min_size}: {num_clients} clients (num_clients) of at least "
                     f"{min_size} examples need {num_clients * min_size}, x has {len(y)}; "
                     "lower min_size or num_clients")
  try:
    parts = make_partition(y, partition, num_clients, alpha=float(alpha),
                           shards_per_client=shards_per_client, min_size=min_size, seed=seed)
  except ValueError as e:
    message = str(e)
    for flag, argument in _ARGUMENTS:
      message = message.replace(flag, argument)
    raise ValueError(message) from None
  return _federated(x, y, parts, test, num_classes, name, partition,
                    {"x": "x", "y": "y", "train": "x and y", "num_clients": "num_clients"})


def from_clients(clients: Sequence[Tuple[np.ndarray, np.ndarray]], test, *,
                 num_classes: Optional[int] = None, name: str = "clients") -> FederatedData:
  """Your own split: one ``(x_i, y_i)`` pair per client, ``test = (x_test, y_test)``;
  bad input is a one-line ValueError naming the argument (``clients[i]``, ``test``)."""
  if isinstance(clients, (str, bytes, dict, np.ndarray)):
    raise ValueError(f"clients: expected a list of (x, y) pairs, got {type(clients).__name__}")
  try:
    clients = list(clients)
  except TypeError:
    raise ValueError(f"clients: expected a list of (x, y) pairs, got "
                     f"{type(clients).__name__}") from None
  if not clients:
    raise ValueError("clients: expected at least one (x, y) pair")
  xs, ys, parts, start = [], [], [], 0
  for i, pair in enumerate(clients):
    what = f"clients[{i}]"
    try:
      cx, cy = pair
    except (TypeError, ValueError):
      raise ValueError(f"{what}: expected a pair (x, y), got {_short(pair)}") from None
    cx, cy = _features(cx, f"{what} x"), _labels(cy, f"{what} y")
    if len(cx) != len(cy) or not len(cy):
      raise ValueError(f"{what}: {len(cx)} examples against {len(cy)} labels (each "
                       "client needs at least one, and one label per example)")
    if xs and cx.shape[1:] != xs[0].shape[1:]:
      raise ValueError(f"{what}: examples of shape {cx.shape[1:]}, those of clients[0] "
                       f"{xs[0].shape[1:]}")
    _nonfinite(cx, f"{what} x")
    xs.append(cx)
    ys.append(cy)
    parts.append(np.arange(start, start + len(cy)))
    start += len(cy)
  return _federated(np.concatenate(xs), np.concatenate(ys), parts, test, num_classes, name,
                    "given", {"x": "clients", "y": "clients", "train": "clients",
                              "num_clients": "clients"})


def _federated(x, y, parts, test, num_classes, name, partition, names) -> FederatedData:
  if isinstance(test, (str, bytes, np.ndarray)) or not isinstance(test, (tuple, list)):
    raise ValueError(f"test: expected a pair (x_test, y_test), got {type(test).__name__}")
  if len(test) != 2:
    raise ValueError(f"test: expected a pair (x_test, y_test), got {len(test)} items")
  tx, ty = _features(test[0], "test"), _labels(test[1], "test labels")
  k = int(max(y.max(initial=0), ty.max(initial=0))) + 1
  if num_classes is None:
    num_classes = k
  elif isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes,
                                                                   (int, np.integer)):
    raise ValueError(f"num_classes: expected an int, got {_short(num_classes)}")
  elif num_classes < k:
    raise ValueError(_outside(y, ty, parts, int(num_classes), names))
  if not isinstance(name, str) or not name:
    raise ValueError(f"name: expected a non-empty string, got {_short(name)}")
  return federate(x, y, parts, tx, ty, int(num_classes), name, partition=partition,
                  names=dict(names, test_x="test", test_y="test labels", test="test"))
