"""Where the examples come from: Synthetic(alpha, beta) of the FedProx paper (Li et al.,
MLSys 2020, ``generate_synthetic``) with its natural partition and the IID variant; IDX
files (the Debian package ``dataset-fashion-mnist`` installs them in
/usr/share/datasets/fashion-mnist); any tensorflow-datasets image classification set.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from typing import Optional, Tuple

import numpy as np

from fedjax_async.data.federated import (DATASETS, DEFAULT_FASHION_MNIST_DIR,
                                         KNOWN_NUM_CLASSES, FederatedData,
                                         check_padded_size, federate)

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

  Args:
    alpha: the spread of the clients' models (non-IID).
    beta: the spread of the clients' inputs (non-IID).
    num_clients: the number of clients.
    iid: ``synthetic_iid``: one shared model, the same inputs' law.
    seed: the draws' seed.
    test_fraction: each client's share of examples in the test set.
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


def find_idx(data_dir: str, stem: str) -> str:
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
    for stem in IDX_STEMS:
      find_idx(data_dir, stem)
  except FileNotFoundError:
    return False
  return True


IDX_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
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
  paths = [find_idx(data_dir, stem) for stem in IDX_STEMS]
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
               f"fedjax_async.cli.data --dataset={name} --tfds_download).")
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
  num_classes = KNOWN_NUM_CLASSES.get(
      name, int(max(train_y.max(initial=0), test_y.max(initial=0))) + 1)
  return _to_images(train_x), train_y, _to_images(test_x), test_y, num_classes
