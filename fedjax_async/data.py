"""Federated data sets on the host: generation, loading, partitioning and padding.

Everything here is numpy on the host; the engine moves the arrays to the device
(``engine.DeviceData.from_federated``). A :class:`FederatedData` holds every client's
training examples padded to the largest client size M, the real count per client and a
central test set.

Sources:

* :func:`synthetic` -- Synthetic(alpha, beta) of the FedProx paper (Li et al., MLSys 2020,
  ``generate_synthetic``), with its natural partition (one generator per client), and the
  IID variant (``synthetic_iid``);
* :func:`read_idx` / :func:`load_fashion_mnist` / :func:`load_mnist_idx` -- IDX files (the
  Debian package ``dataset-fashion-mnist`` installs them in /usr/share/datasets/fashion-mnist);
* :func:`load_tfds` -- any tensorflow-datasets image classification set (needs TensorFlow).

Partitions of a labelled pool into clients (each returns one int64 index array per client
and assigns every example exactly once): :func:`partition_iid` (equal class proportions,
PAFed), :func:`partition_shards` (McMahan et al.: 2 label-sorted shards per client) and
:func:`partition_dirichlet` (per-class Dir(alpha) proportions). :func:`federate` pads them.

:func:`load` is the single entry point of ``experiments/run.py``. Label histograms:
:func:`label_histogram`, :func:`format_histogram`, :func:`save_histogram_png`, and the CLI

  python -m fedjax_async.data --dataset=fashion_mnist --partition=dirichlet --alpha=0.1 \
      --num_clients=20 --png=/tmp/h.png
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DATASETS = ("synthetic", "synthetic_iid", "fashion_mnist", "mnist", "cifar10", "cifar100")
PARTITIONS = ("iid", "shards", "dirichlet")
DATA_SOURCES = ("auto", "idx", "tfds")
_KNOWN_NUM_CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100,
                      "kmnist": 10, "emnist": 62, "svhn_cropped": 10}


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """Padded per-client training data plus a central test set (numpy, host)."""

  x: np.ndarray  # float32 [N, M, ...] padded per-client features (M = max client size)
  y: np.ndarray  # int32 [N, M] padded labels (pad value 0)
  counts: np.ndarray  # int32 [N] real examples per client; rows >= counts[i] are padding
  test_x: np.ndarray  # float32 [T, ...] central test set
  test_y: np.ndarray  # int32 [T]
  num_classes: int
  name: str

  @property
  def num_clients(self) -> int:
    return int(self.x.shape[0])

  @property
  def max_examples(self) -> int:
    return int(self.x.shape[1])

  @property
  def feature_shape(self) -> Tuple[int, ...]:
    return tuple(int(d) for d in self.x.shape[2:])


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
  """Raises ValueError naming --num_clients when the padded [N, M, ...] arrays would not
  fit (see :func:`padded_data_limit_bytes`); M is the largest client's size."""
  per_example = 4 * (int(np.prod(feature_shape, dtype=np.int64)) + 1)  # float32 x, int32 y
  need = int(num_clients) * max(int(max_examples), 1) * per_example
  limit, what = padded_data_limit_bytes()
  if need <= limit:
    return
  dims = " x ".join(str(int(d)) for d in feature_shape)
  part = f" of the {partition} partition" if partition else ""
  raise ValueError(
      f"--num_clients={num_clients}: the padded client data [{num_clients} clients x "
      f"M={max_examples} x {dims or 1}] would take {need / 2 ** 30:.1f} GiB, more than "
      f"{what} ({limit / 2 ** 30:.1f} GiB); M is the largest client's size{part}. Use "
      f"fewer clients (or set ${MAX_DATA_ENV} to raise the limit)")


# ------------------------------------------------------------------------- synthetic

SYNTHETIC_DIM = 60
SYNTHETIC_CLASSES = 10


def synthetic_client_sizes(num_clients: int, seed: int = 0) -> np.ndarray:
  """Client sizes of :func:`synthetic` (same seed): int(lognormal(4, 2)) + 50 each.

  ``synthetic`` draws these first from ``np.random.default_rng(seed)``, so the two agree.
  """
  rng = np.random.default_rng(seed)
  return _draw_sizes(rng, num_clients)


def _draw_sizes(rng: np.random.Generator, num_clients: int) -> np.ndarray:
  return rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50


def synthetic_covariance_diagonal(dim: int = SYNTHETIC_DIM) -> np.ndarray:
  """Sigma_jj = j^(-1.2), j = 1..dim (FedProx's diagonal covariance of x)."""
  return np.arange(1, dim + 1, dtype=np.float64) ** -1.2


def _split_counts(n: int, test_fraction: float) -> Tuple[int, int]:
  """(train, test) sizes of a client with n examples: test = round(test_fraction * n)."""
  n_test = int(round(test_fraction * n))
  return n - n_test, n_test


def synthetic(alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30,
              iid: bool = False, seed: int = 0, test_fraction: float = 0.2) -> FederatedData:
  """Synthetic(alpha, beta) of FedProx with its natural partition (one client each).

  Non-IID (``generate_synthetic``): u_k ~ N(0, alpha), W_k ~ N(u_k, 1) [60x10],
  b_k ~ N(u_k, 1) [10]; B_k ~ N(0, beta), v_k ~ N(B_k, 1) [60]; x ~ N(v_k, Sigma) with
  Sigma_jj = j^-1.2; y = argmax(softmax(x W_k + b_k)). IID (``synthetic_iid``): one shared
  W, b ~ N(0, 1) and x ~ N(0, Sigma) for every client. Client sizes int(lognormal(4, 2)) + 50.
  Each client's examples are shuffled and split into train (1 - test_fraction) and test;
  the central test set is the union of the test parts.
  """
  if num_clients < 1:
    raise ValueError(f"synthetic: num_clients must be >= 1, got {num_clients}")
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"synthetic: test_fraction must be in [0, 1), got {test_fraction}")
  rng = np.random.default_rng(seed)
  sizes = _draw_sizes(rng, num_clients)
  d, c = SYNTHETIC_DIM, SYNTHETIC_CLASSES
  # before the per-client loop, which would take minutes to fill memory first
  check_padded_size(num_clients, _split_counts(int(sizes.max()), test_fraction)[0], (d,),
                    "synthetic (lognormal client sizes)")
  std_x = np.sqrt(synthetic_covariance_diagonal(d))
  u = rng.normal(0.0, alpha, num_clients)
  big_b = rng.normal(0.0, beta, num_clients)
  if iid:
    v = np.zeros((num_clients, d))
    w_shared = rng.normal(0.0, 1.0, (d, c))
    b_shared = rng.normal(0.0, 1.0, c)
  else:
    v = rng.normal(big_b[:, None], 1.0, (num_clients, d))
  train_x, train_y, test_x, test_y = [], [], [], []
  for k in range(num_clients):
    if iid:
      w, b = w_shared, b_shared
    else:
      w = rng.normal(u[k], 1.0, (d, c))
      b = rng.normal(u[k], 1.0, c)
    n = int(sizes[k])
    x = v[k] + rng.standard_normal((n, d)) * std_x
    y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
    order = rng.permutation(n)
    n_train, _ = _split_counts(n, test_fraction)
    train_x.append(x[order[:n_train]])
    train_y.append(y[order[:n_train]])
    test_x.append(x[order[n_train:]])
    test_y.append(y[order[n_train:]])
  offsets = np.cumsum([0] + [len(t) for t in train_y])
  parts = [np.arange(offsets[k], offsets[k + 1], dtype=np.int64) for k in range(num_clients)]
  name = "synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}"
  return federate(np.concatenate(train_x), np.concatenate(train_y), parts,
                  np.concatenate(test_x), np.concatenate(test_y), c, name,
                  partition="synthetic (lognormal client sizes)")


# ------------------------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: (np.dtype(np.uint8), "ubyte"), 0x09: (np.dtype(np.int8), "sbyte"),
               0x0B: (np.dtype(">i2"), "int16"), 0x0C: (np.dtype(">i4"), "int32"),
               0x0D: (np.dtype(">f4"), "float32"), 0x0E: (np.dtype(">f8"), "float64")}
_IDX_NAME_NDIM = re.compile(r"idx(\d)")


def _idx_missing_hint(path: str) -> str:
  return (f"{path}: no such file. Fashion-MNIST IDX files: `apt-get install "
          f"dataset-fashion-mnist` (installs {DEFAULT_FASHION_MNIST_DIR}), or pass "
          "--data_dir=DIR with train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
          "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]")


def _read_maybe_gzip(path: str) -> bytes:
  if not os.path.isfile(path):
    raise FileNotFoundError(_idx_missing_hint(path))
  with open(path, "rb") as f:
    raw = f.read()
  if path.endswith(".gz") or raw[:2] == b"\x1f\x8b":
    try:
      return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: not a readable gzip file ({e})") from e
  return raw


def _expected_magic(ndim: Optional[int], code: int = 0x08) -> str:
  nd = 1 if ndim is None else ndim
  kind = _IDX_DTYPES.get(code, _IDX_DTYPES[0x08])[1]
  text = f"0x{code:06X}{nd:02X}" if ndim is not None else f"0x{code:06X}NN"
  dims = "N dims" if ndim is None else f"{nd} dim{'s' if nd != 1 else ''}"
  return f"{text} (IDX {kind}, {dims})"


def parse_idx(buf: bytes, path: str = "<bytes>", ndim: Optional[int] = None) -> np.ndarray:
  """Decodes an IDX buffer; ``ndim`` (if given) is the required number of dimensions."""
  if len(buf) < 4:
    raise ValueError(f"{path}: too short for an IDX header ({len(buf)} bytes, need >= 4)")
  magic = int.from_bytes(buf[:4], "big")
  zero, code, nd = buf[0] | buf[1], buf[2], buf[3]
  if zero != 0 or code not in _IDX_DTYPES or (ndim is not None and nd != ndim):
    expected = _expected_magic(ndim, code if code in _IDX_DTYPES else 0x08)
    raise ValueError(f"{path}: bad magic number 0x{magic:08X}, expected {expected}"
                     + (f"; the file declares {nd} dims" if zero == 0 else ""))
  header = 4 + 4 * nd
  if len(buf) < header:
    raise ValueError(f"{path}: truncated dimension header: {nd} dims need {header} bytes, "
                     f"the file has {len(buf)}")
  dims = tuple(int.from_bytes(buf[4 + 4 * i:8 + 4 * i], "big") for i in range(nd))
  dtype = _IDX_DTYPES[code][0]
  items = int(np.prod(dims, dtype=np.int64)) if dims else 1
  want, have = items * dtype.itemsize, len(buf) - header
  if have != want:
    what = "truncated" if have < want else "trailing bytes"
    raise ValueError(f"{path}: {what}: header says {items} items ({want} bytes, dims "
                     f"{list(dims)}) but the payload has {have} bytes")
  arr = np.frombuffer(buf, dtype=dtype, count=items, offset=header).reshape(dims)
  return arr.astype(dtype.newbyteorder("="))  # a writable native-endian copy


def read_idx(path: str, ndim: Optional[int] = None) -> np.ndarray:
  """Reads an IDX file (gzip when named .gz or starting with the gzip magic, else raw).

  The number of dimensions is checked against ``ndim`` or, when None, against the
  ``idxN`` in the file name (``train-labels-idx1-ubyte`` -> 1) if there is one. Problems
  raise ``ValueError`` naming the file; a missing file ``FileNotFoundError``.
  """
  path = os.fspath(path)
  if ndim is None:
    m = _IDX_NAME_NDIM.search(os.path.basename(path))
    ndim = int(m.group(1)) if m else None
  return parse_idx(_read_maybe_gzip(path), path, ndim)


def _find_idx(data_dir: str, stem: str) -> str:
  for name in (stem, stem + ".gz"):
    path = os.path.join(data_dir, name)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(_idx_missing_hint(os.path.join(data_dir, stem + "[.gz]")))


def idx_files_present(data_dir: Optional[str]) -> bool:
  """Whether ``data_dir`` holds all four (Fashion-)MNIST IDX files (raw or .gz)."""
  if not data_dir or not os.path.isdir(data_dir):
    return False
  try:
    for stem in _IDX_STEMS:
      _find_idx(data_dir, stem)
  except FileNotFoundError:
    return False
  return True


_IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_split(images_path: str, labels_path: str) -> Tuple[np.ndarray, np.ndarray]:
  images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
  if images.shape[1:] != (28, 28):
    raise ValueError(f"{images_path}: images are {images.shape[1]}x{images.shape[2]}, "
                     "expected 28x28")
  if images.shape[0] != labels.shape[0]:
    raise ValueError(f"{images_path} has {images.shape[0]} images but {labels_path} has "
                     f"{labels.shape[0]} labels")
  if labels.size and int(labels.max()) > 9:
    raise ValueError(f"{labels_path}: label {int(labels.max())} outside 0..9")
  x = (images.astype(np.float32) / np.float32(255.0))[..., None]
  return x, labels.astype(np.int32)


def load_idx_dataset(data_dir: str):
  """(train_x, train_y, test_x, test_y) from the four (Fashion-)MNIST IDX files in data_dir."""
  paths = [_find_idx(data_dir, stem) for stem in _IDX_STEMS]
  train_x, train_y = _idx_split(paths[0], paths[1])
  test_x, test_y = _idx_split(paths[2], paths[3])
  return train_x, train_y, test_x, test_y


def load_fashion_mnist(data_dir: str = DEFAULT_FASHION_MNIST_DIR):
  """Fashion-MNIST from IDX files: float32 [n, 28, 28, 1] in [0, 1] and int32 labels."""
  return load_idx_dataset(data_dir)


def load_mnist_idx(data_dir: str):
  """MNIST from IDX files (same names and format as Fashion-MNIST)."""
  return load_idx_dataset(data_dir)


# ------------------------------------------------------------------------------ tfds


def _tfds_hint(name: str, data_dir: Optional[str]) -> str:
  lines = [f"tensorflow-datasets has no prepared copy of {name!r} in "
           f"{data_dir or 'its default data_dir (~/tensorflow_datasets)'} and may not "
           "download it. To get the data:"]
  if name == "fashion_mnist":
    lines.append("  * `apt-get install dataset-fashion-mnist`, then "
                 "--dataset=fashion_mnist --data_source=idx (IDX files, no TensorFlow needed);")
  if name == "mnist":
    lines.append("  * put the MNIST IDX files in a directory and pass "
                 "--data_source=idx --data_dir=DIR;")
  lines.append("  * pass --data_dir pointing at a prepared tensorflow-datasets directory;")
  where = f", data_dir={data_dir!r}" if data_dir else ""
  lines.append("  * or prepare it once, online: python -c \"import tensorflow_datasets as tfds; "
               f"tfds.builder({name!r}{where}).download_and_prepare()\" (or python -m "
               f"fedjax_async.data --dataset={name} --tfds_download).")
  return "\n".join(lines)


def _to_images(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim == 3:  # grayscale without a channel axis
    x = x[..., None]
  if np.issubdtype(x.dtype, np.integer):
    return x.astype(np.float32) / np.float32(255.0)
  return x.astype(np.float32)


def load_tfds(name: str, data_dir: Optional[str] = None, download: bool = False):
  """(train_x, train_y, test_x, test_y, num_classes) of a tensorflow-datasets set.

  Images are float32 NHWC in [0, 1], labels int32. A set that is neither prepared nor
  downloadable raises ``RuntimeError`` saying how to get it.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise RuntimeError("the tfds data source needs tensorflow-datasets "
                       "(pip install tensorflow-datasets)\n" + _tfds_hint(name, data_dir)) from e
  try:
    train, test = tfds.load(name, split=["train", "test"], batch_size=-1, as_supervised=True,
                            data_dir=data_dir, download=download)
    (train_x, train_y), (test_x, test_y) = tfds.as_numpy(train), tfds.as_numpy(test)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(f"--dataset: unknown dataset {name!r}: neither one of {list(DATASETS)} "
                     "nor a tensorflow-datasets name") from e
  except ModuleNotFoundError as e:
    if "tensorflow" not in str(e):
      raise
    raise RuntimeError(f"reading {name!r} with tensorflow-datasets needs TensorFlow "
                       "(pip install tensorflow-cpu), which is not installed.\n"
                       + _tfds_hint(name, data_dir)) from e
  except Exception as e:  # not prepared (AssertionError), download failures, ...
    raise RuntimeError(f"{type(e).__name__}: {e}\n" + _tfds_hint(name, data_dir)) from e
  train_y, test_y = np.asarray(train_y).astype(np.int32), np.asarray(test_y).astype(np.int32)
  num_classes = _KNOWN_NUM_CLASSES.get(
      name, int(max(train_y.max(initial=0), test_y.max(initial=0))) + 1)
  return _to_images(train_x), train_y, _to_images(test_x), test_y, num_classes


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
  """
  _check_clients(num_clients, "partition_dirichlet")
  if not alpha > 0:
    raise ValueError(f"--alpha: the Dirichlet concentration must be > 0, got {alpha}")
  labels = np.asarray(labels)
  if num_clients * min_size > len(labels):
    raise ValueError(f"--num_clients={num_clients}: a Dirichlet partition gives every "
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
                   f"of the {num_clients} clients (--num_clients) at least {min_size} "
                   "examples; raise --alpha or use fewer clients")


# ---------------------------------------------------------------------- federate


def federate(train_x: np.ndarray, train_y: np.ndarray, parts: Sequence[np.ndarray],
             test_x: np.ndarray, test_y: np.ndarray, num_classes: int,
             name: str, partition: str = "") -> FederatedData:
  """Pads each client's examples (``train_x[parts[i]]``) with zeros to M = max part size.

  Raises ValueError naming --num_clients (and ``partition``) when the padded arrays would
  not fit in memory (:func:`check_padded_size`)."""
  train_x, train_y = np.asarray(train_x), np.asarray(train_y)
  counts = np.array([len(p) for p in parts], dtype=np.int32)
  m = max(int(counts.max(initial=0)), 1)
  check_padded_size(len(parts), m, train_x.shape[1:], partition)
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
  """Dispatches to partition_iid / partition_shards / partition_dirichlet by name."""
  if kind == "iid":
    return partition_iid(labels, num_clients, seed)
  if kind == "shards":
    return partition_shards(labels, num_clients, shards_per_client, seed)
  if kind == "dirichlet":
    return partition_dirichlet(labels, num_clients, alpha, min_size, seed)
  raise ValueError(f"--partition: unknown partition {kind!r}; choose from {list(PARTITIONS)}")


def _missing_idx(data_dir: str) -> List[str]:
  """The (Fashion-)MNIST IDX file names (without .gz) that ``data_dir`` lacks."""
  missing = []
  for stem in _IDX_STEMS:
    try:
      _find_idx(data_dir, stem)
    except FileNotFoundError:
      missing.append(stem)
  return missing


def _check_data_dir(dataset: str, data_dir: Optional[str], data_source: str,
                    tfds_download: bool) -> None:
  """A --data_dir that is not a directory: ValueError naming the flag and the path (unless
  tensorflow-datasets may download into it)."""
  if not data_dir or os.path.isdir(data_dir) or (data_source != "idx" and tfds_download):
    return
  what = "is not a directory" if os.path.exists(data_dir) else "no such directory"
  idx = (f"the four IDX files ({', '.join(s + '[.gz]' for s in _IDX_STEMS)}) or "
         if dataset in ("fashion_mnist", "mnist") and data_source != "tfds" else "")
  raise ValueError(f"--data_dir={data_dir}: {what}; expected a directory with {idx}a "
                   f"prepared tensorflow-datasets copy of {dataset}")


def _load_idx_dir(data_dir: str, user_dir: bool):
  """load_idx_dataset with the missing files named up front (``user_dir``: from --data_dir)."""
  missing = _missing_idx(data_dir) if os.path.isdir(data_dir) else []
  if missing and len(missing) < len(_IDX_STEMS):
    flag = f"--data_dir={data_dir}" if user_dir else data_dir
    raise FileNotFoundError(
        f"{flag}: holds {len(_IDX_STEMS) - len(missing)} of the 4 IDX files but not "
        f"{', '.join(m + '[.gz]' for m in missing)}")
  return load_idx_dataset(data_dir) + (10,)


def _load_pool(dataset: str, data_dir: Optional[str], data_source: str, tfds_download: bool):
  """(train_x, train_y, test_x, test_y, num_classes) of an image data set (``load`` has
  checked ``data_source``)."""
  _check_data_dir(dataset, data_dir, data_source, tfds_download)
  idx_dir = data_dir or (DEFAULT_FASHION_MNIST_DIR if dataset == "fashion_mnist" else None)
  if data_source == "idx":
    if dataset not in ("fashion_mnist", "mnist"):
      raise ValueError(f"--data_source=idx reads only fashion_mnist or mnist, not {dataset!r}")
    if idx_dir is None:
      raise ValueError("--data_source=idx for mnist needs --data_dir with the IDX files")
    return _load_idx_dir(idx_dir, bool(data_dir))
  # auto: a directory with any of the IDX files is an IDX directory (missing ones named)
  if (data_source == "auto" and dataset in ("fashion_mnist", "mnist") and idx_dir
      and os.path.isdir(idx_dir) and len(_missing_idx(idx_dir)) < len(_IDX_STEMS)):
    return _load_idx_dir(idx_dir, bool(data_dir))
  return load_tfds(dataset, data_dir=data_dir, download=tfds_download)


def load(dataset: str, *, partition: str = "shards", num_clients: int = 100,
         alpha: float = 0.5, shards_per_client: int = 2, min_size: int = 10, seed: int = 0,
         data_dir: Optional[str] = None, data_source: str = "auto",
         synthetic_alpha: float = 1.0, synthetic_beta: float = 1.0,
         tfds_download: bool = False) -> FederatedData:
  """The federated data set named ``dataset`` (see module docstring); seeded.

  synthetic / synthetic_iid use their natural partition (``partition`` is checked, then
  ignored); image sets are partitioned by ``partition`` in {iid, shards, dirichlet}.
  data_source 'auto' reads IDX files for fashion_mnist (mnist) when data_dir (default
  /usr/share/datasets/fashion-mnist for fashion_mnist) holds any of the four (a missing
  one is named), else tfds. Errors (ValueError, FileNotFoundError, RuntimeError for tfds)
  name the flag or the file; more clients than examples, or padded arrays that would not
  fit in memory (:func:`check_padded_size`), are refused naming --num_clients.
  """
  name = dataset.lower().replace("-", "_")
  # checked for every data set (the synthetic ones ignore both, but a typo is a typo)
  if partition not in PARTITIONS:
    raise ValueError(f"--partition: unknown partition {partition!r}; choose from "
                     f"{list(PARTITIONS)}")
  if data_source not in DATA_SOURCES:
    raise ValueError(f"--data_source: unknown data source {data_source!r}; choose from "
                     f"{list(DATA_SOURCES)}")
  if num_clients < 1:
    raise ValueError(f"--num_clients: must be >= 1, got {num_clients}")
  if seed < 0:  # numpy's own message ("expected non-negative integer") names nothing
    raise ValueError(f"--seed: must be >= 0, got {seed}")
  if partition == "shards" and shards_per_client < 1:
    raise ValueError(f"--shards_per_client: must be >= 1, got {shards_per_client}")
  for flag, v in (("synthetic_alpha", synthetic_alpha), ("synthetic_beta", synthetic_beta)):
    if not v >= 0:  # a normal's scale ("scale < 0" from numpy otherwise)
      raise ValueError(f"--{flag}: must be >= 0, got {v}")
  if name == "synthetic":
    return synthetic(synthetic_alpha, synthetic_beta, num_clients, iid=False, seed=seed)
  if name == "synthetic_iid":
    return synthetic(num_clients=num_clients, iid=True, seed=seed)
  if name not in DATASETS and not _is_tfds_name(name):
    raise ValueError(f"--dataset: unknown dataset {dataset!r}; choose from {list(DATASETS)} "
                     "or any tensorflow-datasets name")
  train_x, train_y, test_x, test_y, num_classes = _load_pool(name, data_dir, data_source,
                                                             tfds_download)
  if num_clients > len(train_y):
    raise ValueError(f"--num_clients={num_clients}: more clients than the {len(train_y)} "
                     f"training examples of {name}; some clients would have no data")
  parts = make_partition(train_y, partition, num_clients, alpha=alpha,
                         shards_per_client=shards_per_client, min_size=min_size, seed=seed)
  return federate(train_x, train_y, parts, test_x, test_y, num_classes, name,
                  partition=f"{partition!r}")


def _is_tfds_name(name: str) -> bool:
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return name.split("/")[0].split(":")[0] in tfds.list_builders(with_community_datasets=False)


# ----------------------------------------------------------------------- histograms


def label_histogram(data: FederatedData) -> np.ndarray:
  """[N, num_classes] int64: each client's real (non-padding) examples per class."""
  return np.stack([np.bincount(data.y[i, :data.counts[i]], minlength=data.num_classes)
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
  """Heat map clients x classes with a colorbar (Agg canvas; the global backend is untouched)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  hist = np.asarray(hist)
  n, c = hist.shape
  fig = Figure(figsize=(max(4.0, 0.35 * c + 2.5), max(3.0, min(0.18 * n + 1.5, 20.0))))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  im = ax.imshow(hist, aspect="auto", interpolation="nearest", cmap="viridis")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("class")
  ax.set_ylabel("client")
  ax.set_title(title)
  fig.colorbar(im, ax=ax, label="examples")
  fig.tight_layout()
  fig.savefig(path, dpi=100, format="png")  # to ``path`` as given (no ".png" appended)


if __name__ == "__main__":  # the command line: fedjax_async/cli.py
  from fedjax_async import cli  # pylint: disable=g-import-not-at-top
  cli.data_main()
