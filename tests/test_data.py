"""Tests of fedjax_async.data: synthetic generator, IDX reader, partitions, padding, tfds."""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_async import data

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
HAVE_FMNIST = os.path.isfile(os.path.join(FMNIST_DIR, "train-labels-idx1-ubyte.gz"))
needs_fmnist = pytest.mark.skipif(
    not HAVE_FMNIST, reason=f"Fashion-MNIST IDX files not in {FMNIST_DIR} "
    "(apt-get install dataset-fashion-mnist)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def idx_bytes(code, dims, payload):
  """An IDX file by hand: 0x00 0x00 <dtype code> <ndim>, big-endian u32 dims, payload."""
  head = bytes([0, 0, code, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
  return head + payload


def balanced_labels(n_per_class=6000, classes=10, seed=0):
  return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), n_per_class))


def assert_exact_cover(parts, n):
  allidx = np.concatenate(parts)
  assert allidx.dtype == np.int64
  np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


# --------------------------------------------------------------------------- synthetic


@pytest.fixture(scope="module")
def syn():
  return data.synthetic(1.0, 1.0, num_clients=30, seed=0)


def test_synthetic_shapes_and_split(syn):
  assert syn.x.shape[0] == syn.num_clients == 30
  assert syn.feature_shape == (60,) and syn.test_x.shape[1:] == (60,)
  assert syn.num_classes == 10 and syn.name == "synthetic_1_1"
  assert syn.x.dtype == np.float32 and syn.y.dtype == np.int32
  assert syn.counts.dtype == np.int32 and syn.test_y.dtype == np.int32
  assert syn.max_examples == syn.counts.max()
  assert 0 <= syn.y.min() and syn.y.max() <= 9 and syn.test_y.max() <= 9
  # Sizes: int(lognormal(4, 2)) + 50 >= 50, 80/20 train/test with test = round(0.2 n).
  sizes = data.synthetic_client_sizes(30, seed=0)
  assert sizes.min() >= 50
  n_test = np.round(0.2 * sizes).astype(int)
  np.testing.assert_array_equal(syn.counts, sizes - n_test)
  assert len(syn.test_y) == n_test.sum()
  for i in range(30):  # padding rows are zero
    assert not syn.x[i, syn.counts[i]:].any() and not syn.y[i, syn.counts[i]:].any()


def test_synthetic_sizes_lognormal():
  sizes = data.synthetic_client_sizes(1000, seed=3)
  assert sizes.min() >= 50
  # median of int(lognormal(4, 2)) + 50 is about exp(4) + 50 = 104.6 (SE of the log-median
  # ~ 1.25 * 2 / sqrt(1000) = 0.08, so this band is > 3 SE wide each side).
  assert 88 <= np.median(sizes) <= 125
  # 84th percentile ~ exp(4 + 2) + 50 = 453.
  assert 300 <= np.percentile(sizes, 84.13) <= 700


def test_synthetic_feature_covariance_matches_sigma(syn):
  # Within each client x ~ N(v_k, Sigma): pooled within-client variance of x_j ~ j^-1.2.
  xs = [syn.x[i, :syn.counts[i]].astype(np.float64) for i in range(syn.num_clients)]
  resid = np.concatenate([x - x.mean(0) for x in xs])
  dof = len(resid) - len(xs)
  var = (resid ** 2).sum(0) / dof
  expected = np.arange(1, 61) ** -1.2
  np.testing.assert_allclose(var / expected, 1.0, atol=0.12)
  # Non-IID client means v_k ~ N(B_k, 1), B_k ~ N(0, 1): they spread out across clients.
  assert np.std([x.mean(0)[0] for x in xs]) > 0.5


def test_synthetic_iid_means_zero_and_less_label_skew(syn):
  iid = data.synthetic(num_clients=30, iid=True, seed=0)
  assert iid.name == "synthetic_iid"
  big = iid.counts >= 200
  means = np.stack([iid.x[i, :iid.counts[i]].mean(0) for i in np.flatnonzero(big)])
  # x ~ N(0, Sigma): the first coordinate (variance 1) has mean ~ 0 +- 1/sqrt(n).
  assert np.abs(means[:, 0]).max() < 0.3
  skew = lambda d: np.mean(data.label_histogram(d).max(1) / d.counts)
  assert skew(syn) > skew(iid) + 0.2


def test_synthetic_deterministic():
  a, b = data.synthetic(num_clients=5, seed=7), data.synthetic(num_clients=5, seed=7)
  for f in ("x", "y", "counts", "test_x", "test_y"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  c = data.synthetic(num_clients=5, seed=8)
  assert a.x.shape != c.x.shape or not np.array_equal(a.x, c.x)
  one = data.synthetic(num_clients=1, seed=0)
  assert one.num_clients == 1 and one.counts[0] >= 40
  with pytest.raises(ValueError, match="num_clients"):
    data.synthetic(num_clients=0)


def test_synthetic_central_logistic_regression_learns(syn):
  x = np.concatenate([syn.x[i, :syn.counts[i]] for i in range(30)]).astype(np.float64)
  y = np.concatenate([syn.y[i, :syn.counts[i]] for i in range(30)])
  w, b, onehot = np.zeros((60, 10)), np.zeros(10), np.eye(10)[y]
  for _ in range(300):
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - onehot) / len(y)
    w -= 0.5 * x.T @ g
    b -= 0.5 * g.sum(0)
  acc = np.mean(np.argmax(syn.test_x @ w + b, 1) == syn.test_y)
  assert acc > 0.5  # chance is 0.1; measured ~0.82 for seed 0 (0.63-0.95 over seeds 0-4)


# -------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_hand_made(tmp_path, gz):
  raw = idx_bytes(0x08, [2, 3], bytes([0, 1, 2, 250, 4, 5]))
  path = tmp_path / ("tiny-idx2-ubyte" + (".gz" if gz else ""))
  path.write_bytes(gzip.compress(raw) if gz else raw)
  arr = data.read_idx(str(path))
  np.testing.assert_array_equal(arr, [[0, 1, 2], [250, 4, 5]])
  assert arr.dtype == np.uint8


def test_read_idx_gzip_by_magic_and_int32(tmp_path):
  raw = idx_bytes(0x0C, [3], (-1).to_bytes(4, "big", signed=True) + (258).to_bytes(4, "big")
                  + (7).to_bytes(4, "big"))
  path = tmp_path / "ints"  # no .gz suffix: detected by the gzip magic 1f 8b
  path.write_bytes(gzip.compress(raw))
  np.testing.assert_array_equal(data.read_idx(str(path)), [-1, 258, 7])


@pytest.fixture(scope="module")
def fmnist():
  if not HAVE_FMNIST:
    pytest.skip(f"Fashion-MNIST IDX files not in {FMNIST_DIR}")
  return data.load_fashion_mnist(FMNIST_DIR)


@needs_fmnist
@pytest.mark.xdist_group("fmnist")  # its module fixture computed once
def test_fashion_mnist_real_files(fmnist):
  train_x, train_y, test_x, test_y = fmnist
  assert train_x.shape == (60000, 28, 28, 1) and test_x.shape == (10000, 28, 28, 1)
  assert train_x.dtype == np.float32 and train_y.dtype == np.int32
  assert 0.0 <= train_x.min() and train_x.max() == 1.0
  # Fashion-MNIST is balanced: 6000 / 1000 of each of the 10 classes.
  np.testing.assert_array_equal(np.bincount(train_y), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(test_y), [1000] * 10)
  # The published first labels (ankle boot, T-shirt, T-shirt, dress, ...; test: 9, 2, 1, 1).
  np.testing.assert_array_equal(train_y[:10], [9, 0, 0, 3, 0, 2, 7, 2, 5, 5])
  np.testing.assert_array_equal(test_y[:4], [9, 2, 1, 1])


@pytest.fixture
def label_copy(tmp_path):
  """Uncompressed bytes of a labels file: the real one if present, else a hand-made one."""
  if HAVE_FMNIST:
    with gzip.open(os.path.join(FMNIST_DIR, "train-labels-idx1-ubyte.gz"), "rb") as f:
      raw = f.read()
  else:
    raw = idx_bytes(0x08, [60000], bytes(60000))
  return raw


def test_read_idx_bad_magic(tmp_path, label_copy):
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  path.write_bytes(gzip.compress(bytes.fromhex("12345678") + label_copy[4:]))
  with pytest.raises(ValueError) as e:
    data.read_idx(str(path))
  msg = str(e.value)
  assert str(path) in msg and "0x12345678" in msg and "0x00000801" in msg


def test_read_idx_truncated(tmp_path, label_copy):
  path = tmp_path / "train-labels-idx1-ubyte"
  path.write_bytes(label_copy[:8 + 123])
  with pytest.raises(ValueError) as e:
    data.read_idx(str(path))
  msg = str(e.value)
  assert str(path) in msg and "truncated" in msg and "60000 items" in msg
  assert "123 bytes" in msg
  path.write_bytes(label_copy + b"\x00")
  with pytest.raises(ValueError, match="trailing"):
    data.read_idx(str(path))
  path.write_bytes(label_copy[:6])
  with pytest.raises(ValueError, match="header"):
    data.read_idx(str(path))


def test_read_idx_wrong_dimension_count(tmp_path, label_copy):
  # A 3-dim header (60000 x 1 x 1) in a file that should hold 1-dim labels.
  bad = idx_bytes(0x08, [60000, 1, 1], label_copy[8:])
  path = tmp_path / "train-labels-idx1-ubyte"
  path.write_bytes(bad)
  with pytest.raises(ValueError) as e:
    data.read_idx(str(path))
  assert "train-labels-idx1-ubyte" in str(e.value) and "0x00000803" in str(e.value)
  other = tmp_path / "labels.bin"  # no idxN in the name: checked against ndim=
  other.write_bytes(bad)
  assert data.read_idx(str(other)).shape == (60000, 1, 1)
  with pytest.raises(ValueError, match="labels.bin"):
    data.read_idx(str(other), ndim=1)


def test_read_idx_corrupt_gzip_and_missing(tmp_path):
  path = tmp_path / "x-idx1-ubyte.gz"
  path.write_bytes(b"\x1f\x8b\x08\x00garbage")
  with pytest.raises(ValueError, match="x-idx1-ubyte.gz"):
    data.read_idx(str(path))
  with pytest.raises(FileNotFoundError) as e:
    data.read_idx(str(tmp_path / "nope-idx1-ubyte"))
  assert "nope-idx1-ubyte" in str(e.value) and "apt-get install dataset-fashion-mnist" in str(
      e.value) and "--data_dir" in str(e.value)


def write_tiny_idx_dir(d, n_train=40, n_test=10, side=28, n_train_labels=None, gz=False):
  rng = np.random.default_rng(0)
  suffix = ".gz" if gz else ""
  for split, n, nl in (("train", n_train, n_train_labels or n_train), ("t10k", n_test, n_test)):
    images = rng.integers(0, 256, (n, side, side), dtype=np.uint8)
    labels = (np.arange(nl) % 10).astype(np.uint8)
    for stem, arr in ((f"{split}-images-idx3-ubyte", images), (f"{split}-labels-idx1-ubyte",
                                                                labels)):
      raw = idx_bytes(0x08, list(arr.shape), arr.tobytes())
      (d / (stem + suffix)).write_bytes(gzip.compress(raw) if gz else raw)


def test_load_fashion_mnist_small_dir_and_checks(tmp_path):
  write_tiny_idx_dir(tmp_path)
  train_x, train_y, test_x, test_y = data.load_fashion_mnist(str(tmp_path))
  assert train_x.shape == (40, 28, 28, 1) and test_x.shape == (10, 28, 28, 1)
  np.testing.assert_array_equal(train_y, np.arange(40) % 10)
  raw = data.read_idx(str(tmp_path / "train-images-idx3-ubyte"))
  np.testing.assert_allclose(train_x[..., 0], raw / 255.0, rtol=1e-6)
  bad = tmp_path / "count"
  bad.mkdir()
  write_tiny_idx_dir(bad, n_train_labels=39, gz=True)
  with pytest.raises(ValueError, match="40 images.*39 labels"):
    data.load_fashion_mnist(str(bad))
  small = tmp_path / "side"
  small.mkdir()
  write_tiny_idx_dir(small, side=27)
  with pytest.raises(ValueError, match="28x28"):
    data.load_fashion_mnist(str(small))
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
    data.load_fashion_mnist(str(tmp_path / "missing"))


# ------------------------------------------------------------------------- partitions


def test_partition_iid_equal_class_proportions():
  counts = [1000, 333, 77, 5]
  labels = np.random.default_rng(1).permutation(np.repeat(np.arange(4), counts))
  parts = data.partition_iid(labels, 7, seed=0)
  assert_exact_cover(parts, len(labels))
  for c, n_c in enumerate(counts):
    per = [np.sum(labels[p] == c) for p in parts]
    assert set(per) <= {n_c // 7, -(-n_c // 7)}
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1
  labels = balanced_labels()
  hist = np.stack([np.bincount(labels[p], minlength=10) for p in data.partition_iid(labels, 100, 0)])
  assert (hist == 60).all()


def test_partition_shards_two_labels_per_client():
  labels = balanced_labels()
  parts = data.partition_shards(labels, 100, 2, seed=0)
  assert len(parts) == 100
  assert_exact_cover(parts, 60000)
  assert all(len(p) == 600 for p in parts)
  assert max(len(np.unique(labels[p])) for p in parts) <= 2
  # uneven sizes: still an exact cover, shard sizes differ by at most one
  parts = data.partition_shards(np.arange(1003) % 7, 10, 3, seed=1)
  assert_exact_cover(parts, 1003)
  assert {len(p) for p in parts} <= {99, 100, 101, 102, 103}


@needs_fmnist
@pytest.mark.xdist_group("fmnist")  # its module fixture computed once
def test_partition_shards_on_fashion_mnist_labels():
  labels = data.read_idx(os.path.join(FMNIST_DIR, "train-labels-idx1-ubyte.gz"))
  parts = data.partition_shards(labels, 100, 2, seed=0)
  assert_exact_cover(parts, 60000)
  assert max(len(np.unique(labels[p])) for p in parts) <= 2


def test_partition_shards_errors():
  with pytest.raises(ValueError, match="num_clients=6.*shards_per_client=2"):
    data.partition_shards(np.zeros(10), 6, 2)
  with pytest.raises(ValueError, match="num_clients"):
    data.partition_shards(np.zeros(10), 0, 2)
  with pytest.raises(ValueError, match="shards_per_client"):
    data.partition_shards(np.zeros(10), 2, 0)


def test_partition_dirichlet_skew_grows_as_alpha_falls():
  labels = balanced_labels()
  skew = {}
  for alpha in (0.1, 0.5, 10.0):
    parts = data.partition_dirichlet(labels, 20, alpha, min_size=10, seed=0)
    assert_exact_cover(parts, 60000)
    assert min(len(p) for p in parts) >= 10
    skew[alpha] = np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])
  # uniform would be 0.1; measured ~0.65, ~0.35, ~0.15
  assert skew[0.1] > 0.55 > skew[0.5] > 0.25 > 0.2 > skew[10.0]
  parts = data.partition_dirichlet(labels, 100, 0.1, min_size=10, seed=1)
  assert min(len(p) for p in parts) >= 10


def test_partition_dirichlet_errors():
  labels = balanced_labels(20, 10)
  for alpha in (0.0, -1.0):
    with pytest.raises(ValueError, match=r"^--alpha: the Dirichlet concentration must be "
                       r"> 0, got -?[01]\.0$"):
      data.partition_dirichlet(labels, 5, alpha)
  with pytest.raises(ValueError, match="num_clients"):
    data.partition_dirichlet(labels, 0, 0.5)
  with pytest.raises(ValueError, match=r"^data\.num_clients=21: .* at least 10 examples, and "
                     r"21 x 10 exceeds the 200 examples; use at most 20 clients$"):
    data.partition_dirichlet(labels, 21, 0.5, min_size=10)  # 210 > 200 examples
  with pytest.raises(ValueError, match=r"^--alpha=0.01: no Dirichlet draw in 5 tries .* 10 "
                     r"clients \(data\.num_clients\) at least 20 examples"):
    data.partition_dirichlet(labels, 10, 0.01, min_size=20, max_tries=5)  # an exact split


@pytest.mark.parametrize("fn", [
    lambda l, s: data.partition_iid(l, 10, s),
    lambda l, s: data.partition_shards(l, 10, 2, s),
    lambda l, s: data.partition_dirichlet(l, 10, 0.5, 10, s)])
def test_partition_seeded(fn):
  labels = balanced_labels(100, 10)
  a, b, c = fn(labels, 0), fn(labels, 0), fn(labels, 1)
  assert all(np.array_equal(p, q) for p, q in zip(a, b))
  assert not all(np.array_equal(p, q) for p, q in zip(a, c))


# ------------------------------------------------------------------- federate / hist


def test_federate_padding_and_histogram():
  train_x = np.arange(20, dtype=np.float64).reshape(10, 2) + 1
  train_y = np.arange(10) % 3
  parts = [np.array([3, 1]), np.array([0, 4, 5, 9]), np.array([8])]
  test_x, test_y = np.ones((4, 2)), np.array([2, 1, 0, 2])
  fd = data.federate(train_x, train_y, parts, test_x, test_y, 3, "toy")
  assert fd.num_clients == 3 and fd.max_examples == 4 and fd.feature_shape == (2,)
  np.testing.assert_array_equal(fd.counts, [2, 4, 1])
  np.testing.assert_array_equal(fd.x[0], [[7, 8], [3, 4], [0, 0], [0, 0]])
  np.testing.assert_array_equal(fd.y[0], [0, 1, 0, 0])
  np.testing.assert_array_equal(fd.x[2, 1:], 0)
  np.testing.assert_array_equal(fd.y[1], [0, 1, 2, 0])
  assert fd.x.dtype == np.float32 and fd.y.dtype == np.int32 and fd.counts.dtype == np.int32
  np.testing.assert_array_equal(fd.test_x, test_x)
  np.testing.assert_array_equal(fd.test_y, test_y)
  assert fd.test_x.dtype == np.float32 and fd.test_y.dtype == np.int32
  # labels: client 0 {0, 1}, client 1 {0, 1, 2, 0}, client 2 {2}; padding (0s) excluded.
  hist = data.label_histogram(fd)
  np.testing.assert_array_equal(hist, [[1, 1, 0], [2, 1, 1], [0, 0, 1]])
  table = data.format_histogram(hist).splitlines()
  assert table[0].split() == ["client", "total", "c0", "c1", "c2"]
  assert table[2].split() == ["0", "2", "1", "1", "0"]
  assert table[-1].split() == ["all", "7", "3", "2", "2"]


def test_save_histogram_png(tmp_path):
  path = tmp_path / "h.png"
  data.save_histogram_png(np.arange(12).reshape(4, 3), str(path), "toy")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------- load


def test_load_synthetic_and_errors():
  fd = data.load("synthetic", partition="dirichlet", num_clients=4, seed=2)
  ref = data.synthetic(1.0, 1.0, num_clients=4, seed=2)
  np.testing.assert_array_equal(fd.x, ref.x)
  assert data.load("synthetic_iid", num_clients=3).name == "synthetic_iid"
  with pytest.raises(ValueError, match="'bogus'.*iid.*shards.*dirichlet"):
    data.load("fashion_mnist", partition="bogus")
  with pytest.raises(ValueError, match="'no_such_set_xyz'.*synthetic"):
    data.load("no_such_set_xyz")


def test_load_idx_auto(tmp_path):
  write_tiny_idx_dir(tmp_path, n_train=100, gz=True)
  fd = data.load("fashion_mnist", partition="iid", num_clients=5, data_dir=str(tmp_path))
  assert fd.x.shape == (5, 20, 28, 28, 1) and fd.num_classes == 10
  np.testing.assert_array_equal(data.label_histogram(fd), np.full((5, 10), 2))
  assert fd.test_x.shape == (10, 28, 28, 1)


def test_import_defines_no_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  assert "tfds_download" not in flags.FLAGS and "synthetic_beta" not in flags.FLAGS


def test_cli_synthetic(tmp_path):
  png = tmp_path / "h.png"
  out = subprocess.run(
      [sys.executable, "-m", "fedjax_async.cli.data", "--dataset=synthetic", "--num_clients=4",
       f"--png={png}"], cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"), check=True)
  assert "client" in out.stdout and "synthetic_1_1" in out.stdout
  assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_png_is_written_under_the_name_given(tmp_path):
  """--png=NAME without an extension: matplotlib appended ".png", the CLI said "wrote NAME"."""
  png = tmp_path / "hist"
  out = subprocess.run(
      [sys.executable, "-m", "fedjax_async.cli.data", "--dataset=synthetic", "--num_clients=4",
       f"--png={png}"], cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"), check=True)
  assert f"wrote {png}" in out.stdout
  assert png.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "hist.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["--dataset=nope"], "error: --dataset: unknown dataset 'nope'; choose from"),
    (["--dataset=synthetic", "--png=/nonexistent_dir/h.png"],
     "error: --png: cannot write /nonexistent_dir/h.png: folder /nonexistent_dir does not "
     "exist"),
    # a directory: it wrote <dir>.png and said "wrote <dir>"
    (["--dataset=synthetic", f"--png={REPO}"], f"error: --png: {REPO} is a directory"),
    # numpy's "expected non-negative integer" / partition_shards' and "scale < 0" named
    # no flag
    (["--dataset=synthetic", "--seed=-1"], "error: --seed: must be >= 0, got -1"),
    (["--dataset=synthetic", "--shards_per_client=0"],
     "error: --shards_per_client: must be >= 1, got 0"),
    (["--dataset=synthetic", "--synthetic_alpha=-1"],
     "error: --synthetic_alpha: must be >= 0, got -1.0"),
])
def test_cli_errors_are_one_line_naming_what_was_wrong(argv, message):
  out = subprocess.run([sys.executable, "-m", "fedjax_async.cli.data"] + argv, cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1].startswith(message)
  assert "Traceback" not in out.stderr


# ------------------------------------------------------------------------------- tfds


def test_load_tfds_with_stubbed_tfds(monkeypatch):
  # tfds.testing.mock_data needs TensorFlow (it patches tf.io.gfile), which is not
  # installed, and tfds.as_numpy imports TensorFlow too. So stub tfds.load (returning
  # what as_supervised + batch_size=-1 gives: one (images, labels) pair per split) and
  # tfds.as_numpy (identity on numpy), and check the call and the conversion.
  tfds = pytest.importorskip("tensorflow_datasets")
  calls = []
  rng = np.random.default_rng(0)
  train = (rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8), np.arange(12) % 10)
  test = (np.full((5, 32, 32, 3), 255, np.uint8), np.arange(5, dtype=np.int64))

  def fake_load(name, **kw):
    calls.append((name, kw))
    return [train, test]

  monkeypatch.setattr(tfds, "load", fake_load)
  monkeypatch.setattr(tfds, "as_numpy", lambda x: x)
  train_x, train_y, test_x, test_y, k = data.load_tfds("cifar10", data_dir="/some/dir")
  assert calls == [("cifar10", dict(split=["train", "test"], batch_size=-1,
                                    as_supervised=True, data_dir="/some/dir",
                                    download=False))]
  assert k == 10 and train_x.dtype == np.float32 and train_y.dtype == np.int32
  np.testing.assert_allclose(train_x, train[0] / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(test_x, 1.0)
  np.testing.assert_array_equal(test_y, np.arange(5))
  fd = data.load("cifar10", partition="shards", num_clients=3, shards_per_client=2)
  assert fd.x.shape == (3, 4, 32, 32, 3) and fd.num_classes == 10 and fd.name == "cifar10"


def test_load_tfds_not_prepared_offline(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(RuntimeError) as e:
    data.load_tfds("fashion_mnist", data_dir=str(tmp_path), download=False)
  msg = str(e.value)
  for hint in ("apt-get install dataset-fashion-mnist", "--data_source=idx", "--data_dir",
               "tfds.builder('fashion_mnist', data_dir=", ").download_and_prepare()"):
    assert hint in msg
  # the experiment scripts have no --tfds_download: it is named only as the data CLI's flag
  assert "python -m fedjax_async.cli.data --dataset=fashion_mnist --tfds_download" in msg
  assert msg.count("--tfds_download") == 1
  (tmp_path / "empty").mkdir()
  with pytest.raises(RuntimeError, match="download_and_prepare"):
    data.load("fashion_mnist", data_source="tfds", data_dir=str(tmp_path / "empty"))
  with pytest.raises(RuntimeError) as e:
    data.load("cifar10", data_dir=str(tmp_path))
  assert "--data_dir" in str(e.value) and "apt-get" not in str(e.value)


# ------------------------------------------------------------- checks before loading


def test_data_dir_missing_or_partial_names_the_flag_and_files(tmp_path):
  missing = tmp_path / "nope"
  for source in ("auto", "idx", "tfds"):  # not tensorflow-datasets' AssertionError
    with pytest.raises(ValueError, match=rf"^data\.data_dir={missing}: no such directory"):
      data.load("fashion_mnist", data_dir=str(missing), data_source=source)
  with pytest.raises(ValueError, match="data.data_dir=.*no such directory.*cifar10"):
    data.load("cifar10", data_dir=str(missing))
  # 3 of the 4 IDX files: read as an IDX directory, the missing file named
  write_tiny_idx_dir(tmp_path, gz=True)
  os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
  for source in ("auto", "idx"):
    with pytest.raises(FileNotFoundError, match=r"^data\.data_dir=.*: holds 3 of the 4 IDX files "
                       r"but not t10k-labels-idx1-ubyte\[\.gz\]$"):
      data.load("fashion_mnist", data_dir=str(tmp_path), data_source=source)


def test_partition_and_data_source_checked_for_every_dataset():
  for name in ("synthetic", "synthetic_iid", "fashion_mnist"):
    with pytest.raises(ValueError, match=r"^data\.partition: unknown partition 'foo'; choose "
                       r"from \['iid', 'shards', 'dirichlet'\]"):
      data.load(name, partition="foo", num_clients=3)
    with pytest.raises(ValueError, match=r"^data\.data_source: unknown data source 'foo'; "
                       r"choose from \['auto', 'idx', 'tfds'\]"):
      data.load(name, data_source="foo", num_clients=3)


def test_more_clients_than_examples_is_refused(tmp_path):
  write_tiny_idx_dir(tmp_path)  # 40 training examples
  for partition in ("iid", "dirichlet"):
    with pytest.raises(ValueError, match=r"^data\.num_clients=41: more clients than the 40 "
                       "training examples of fashion_mnist"):
      data.load("fashion_mnist", partition=partition, num_clients=41, data_dir=str(tmp_path))
  fd = data.load("fashion_mnist", partition="iid", num_clients=40, data_dir=str(tmp_path))
  assert fd.counts.min() == 1


def test_padded_arrays_over_the_memory_limit_are_refused(monkeypatch):
  monkeypatch.setenv(data.MAX_DATA_ENV, "0.001")  # ~1 MiB
  sizes = data.synthetic_client_sizes(30)
  with pytest.raises(ValueError, match=r"^data\.num_clients=30: the padded client data \[30 "
                     r"clients x M=\d+ x 60\] would take .* GiB, more than "
                     r"\$FEDJAX_ASYNC_MAX_DATA_GIB.*largest client's size of the synthetic"):
    data.synthetic(num_clients=30)
  train_x = np.zeros((2000, 28, 28, 1), np.float32)
  parts = [np.arange(1000), np.arange(1000, 2000)]
  with pytest.raises(ValueError, match="data.num_clients=2: .*M=1000 x 28 x 28 x 1.*'iid'"):
    data.federate(train_x, np.zeros(2000), parts, train_x[:1], np.zeros(1), 10, "t",
                  partition="'iid'")
  monkeypatch.setenv(data.MAX_DATA_ENV, "1")
  assert data.synthetic(num_clients=30).max_examples <= sizes.max()  # under the limit
  monkeypatch.delenv(data.MAX_DATA_ENV)
  limit, what = data.padded_data_limit_bytes()
  assert limit > 0 and "available memory" in what


def test_too_many_synthetic_clients_fail_fast():
  """100000 clients (M ~ 560000): refused before the per-client loop (it ran for minutes
  to fill memory); 5000 (33 GiB) likewise instead of numpy's _ArrayMemoryError."""
  import time  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  for n in (100000, 5000):
    if n == 5000 and data.padded_data_limit_bytes()[0] > 33.5 * 2 ** 30:
      continue  # a machine with > 67 GiB free can hold it
    with pytest.raises(ValueError, match=rf"^data\.num_clients={n}: the padded client data"):
      data.load("synthetic", num_clients=n)
  assert time.perf_counter() - t0 < 10
