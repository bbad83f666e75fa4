"""``load``: a data set by name, from its source, partitioned and padded (the entry point
of the runs)."""

from __future__ import annotations

import importlib
import os
from typing import List, Optional

import numpy as np

from fedjax_async.data import fedjax_sqlite, leaf, tff_sqlite
from fedjax_async.data.federated import (DATA_SOURCES, DATASETS,
                                         DEFAULT_FASHION_MNIST_DIR, PARTITIONS,
                                         FederatedData, federate, make_partition)
from fedjax_async.data.sources import IDX_STEMS, find_idx, load_idx_dataset, load_tfds, synthetic


def _missing_idx(data_dir: str) -> List[str]:
  """The (Fashion-)MNIST IDX file names (without .gz) that ``data_dir`` lacks."""
  missing = []
  for stem in IDX_STEMS:
    try:
      find_idx(data_dir, stem)
    except FileNotFoundError:
      missing.append(stem)
  return missing


def _check_data_dir(dataset: str, data_dir: Optional[str], data_source: str,
                    tfds_download: bool) -> None:
  """A data.data_dir that is not a directory: ValueError naming the flag and the path (unless
  tensorflow-datasets may download into it)."""
  if not data_dir or os.path.isdir(data_dir) or (data_source != "idx" and tfds_download):
    return
  what = "is not a directory" if os.path.exists(data_dir) else "no such directory"
  idx = (f"the four IDX files ({', '.join(s + '[.gz]' for s in IDX_STEMS)}) or "
         if dataset in ("fashion_mnist", "mnist") and data_source != "tfds" else "")
  raise ValueError(f"data.data_dir={data_dir}: {what}; expected a directory with {idx}a "
                   f"prepared tensorflow-datasets copy of {dataset}")


def _load_idx_dir(data_dir: str, user_dir: bool):
  """load_idx_dataset with the missing files named up front (``user_dir``: from data.data_dir)."""
  missing = _missing_idx(data_dir) if os.path.isdir(data_dir) else []
  if missing and len(missing) < len(IDX_STEMS):
    flag = f"data.data_dir={data_dir}" if user_dir else data_dir
    raise FileNotFoundError(
        f"{flag}: holds {len(IDX_STEMS) - len(missing)} of the 4 IDX files but not "
        f"{', '.join(m + '[.gz]' for m in missing)}")
  return load_idx_dataset(data_dir) + (10,)


def _load_pool(dataset: str, data_dir: Optional[str], data_source: str, tfds_download: bool):
  """(train_x, train_y, test_x, test_y, num_classes) of an image data set (``load`` has
  checked ``data_source``)."""
  _check_data_dir(dataset, data_dir, data_source, tfds_download)
  idx_dir = data_dir or (DEFAULT_FASHION_MNIST_DIR if dataset == "fashion_mnist" else None)
  if data_source == "idx":
    if dataset not in ("fashion_mnist", "mnist"):
      raise ValueError(f"data.data_source=idx reads only fashion_mnist or mnist, not {dataset!r}")
    if idx_dir is None:
      raise ValueError("data.data_source=idx for mnist needs data.data_dir with the IDX files")
    return _load_idx_dir(idx_dir, bool(data_dir))
  # auto: a directory with any of the IDX files is an IDX directory (missing ones named)
  if (data_source == "auto" and dataset in ("fashion_mnist", "mnist") and idx_dir
      and os.path.isdir(idx_dir) and len(_missing_idx(idx_dir)) < len(IDX_STEMS)):
    return _load_idx_dir(idx_dir, bool(data_dir))
  return load_tfds(dataset, data_dir=data_dir, download=tfds_download)


def load(dataset: str, *, partition: str = "shards", num_clients: int = 100,
         alpha: float = 0.5, shards_per_client: int = 2, min_size: int = 10, seed: int = 0,
         data_dir: Optional[str] = None, data_source: str = "auto",
         synthetic_alpha: float = 1.0, synthetic_beta: float = 1.0,
         tfds_download: bool = False, normalize: str = "none",
         max_client_examples: int = 0, max_test_examples: int = 0) -> FederatedData:
  """The federated data set named ``dataset`` (see module docstring); seeded.

  synthetic / synthetic_iid use their natural partition (``partition`` is checked, then
  ignored); image sets are partitioned by ``partition`` in {iid, shards, dirichlet}.
  data_source 'auto' reads IDX files for fashion_mnist (mnist) when data_dir (default
  /usr/share/datasets/fashion-mnist for fashion_mnist) holds any of the four (a missing
  one is named), else tfds. Errors (ValueError, FileNotFoundError, RuntimeError for tfds)
  name the flag or the file; more clients than examples, or padded arrays that would not
  fit in memory (:func:`check_padded_size`), are refused naming data.num_clients, and
  data failing :func:`federated.check_pool` (NaN/Inf features, labels outside
  [0, num_classes), ...) naming the data set.

  Args:
    dataset: the data set's name (``DATASETS``, a natural one, or a tfds name).
    partition: ``iid``, ``shards`` or ``dirichlet``.
    num_clients: N, the number of clients.
    alpha: the Dirichlet concentration.
    shards_per_client: label shards per client.
    min_size: a Dirichlet partition's fewest examples per client.
    seed: the partition's (and the synthetic data's) seed.
    data_dir: the IDX directory, tfds data_dir, or a natural data set's files.
    data_source: ``auto``, ``idx`` or ``tfds``.
    synthetic_alpha: Synthetic(alpha, beta)'s alpha.
    synthetic_beta: Synthetic(alpha, beta)'s beta.
    tfds_download: let tensorflow-datasets download the data set.
    normalize: the image inputs' normalisation (``NORMALIZATIONS``).
    max_client_examples: natural data sets: each client's first k examples (0: all).
    max_test_examples: natural data sets: the first k test examples (0: all).
  """
  name = dataset.lower().replace("-", "_")
  if normalize not in NORMALIZATIONS:
    raise ValueError(f"data.normalize: unknown normalisation {normalize!r}; choose from "
                     f"{list(NORMALIZATIONS)}")
  if normalize != "none" and name.startswith("synthetic"):
    raise ValueError(f"data.normalize={normalize}: normalises image inputs in [0, 1]; "
                     f"{dataset} is not an image data set (use data.normalize=none)")
  # checked for every data set (the synthetic ones ignore both, but a typo is a typo)
  if partition not in PARTITIONS:
    raise ValueError(f"data.partition: unknown partition {partition!r}; choose from "
                     f"{list(PARTITIONS)}")
  if data_source not in DATA_SOURCES:
    raise ValueError(f"data.data_source: unknown data source {data_source!r}; choose from "
                     f"{list(DATA_SOURCES)}")
  if num_clients < 1:
    raise ValueError(f"data.num_clients: must be >= 1, got {num_clients}")
  if seed < 0:  # numpy's own message ("expected non-negative integer") names nothing
    raise ValueError(f"run.seed: must be >= 0, got {seed}")
  if partition == "shards" and shards_per_client < 1:
    raise ValueError(f"data.shards_per_client: must be >= 1, got {shards_per_client}")
  if partition == "dirichlet" and min_size < 1:
    raise ValueError(f"--min_size: must be >= 1 (every client needs an example), got "
                     f"{min_size}")
  for flag, v in (("synthetic_alpha", synthetic_alpha), ("synthetic_beta", synthetic_beta)):
    if not v >= 0:  # a normal's scale ("scale < 0" from numpy otherwise)
      raise ValueError(f"--{flag}: must be >= 0, got {v}")
  if name == "synthetic":
    return synthetic(synthetic_alpha, synthetic_beta, num_clients, iid=False, seed=seed)
  if name == "synthetic_iid":
    return synthetic(num_clients=num_clients, iid=True, seed=seed)
  if name in NATURAL_DATASETS:  # their own clients: num_clients and partition unused
    return load_natural(name, data_dir, normalize=normalize,
                        max_client_examples=max_client_examples,
                        max_test_examples=max_test_examples)
  if name not in DATASETS and not is_tfds_name(name):
    raise ValueError(f"data.dataset: unknown dataset {dataset!r}; choose from "
                     f"{list(DATASETS) + list(NATURAL_DATASETS)} or any tensorflow-datasets "
                     "name")
  train_x, train_y, test_x, test_y, num_classes = _load_pool(name, data_dir, data_source,
                                                             tfds_download)
  train_x, test_x = (normalized(x, normalize) for x in (train_x, test_x))
  if num_clients > len(train_y):
    raise ValueError(f"data.num_clients={num_clients}: more clients than the {len(train_y)} "
                     f"training examples of {name}; some clients would have no data")
  parts = make_partition(train_y, partition, num_clients, alpha=alpha,
                         shards_per_client=shards_per_client, min_size=min_size, seed=seed)
  return federate(train_x, train_y, parts, test_x, test_y, num_classes, name,
                  partition=f"{partition!r}")


# data.normalize -> (mean, std) applied to inputs in [0, 1]; fedadmm: Gong et al.'s FedADMM
# code (src/utils.py: transforms.Normalize((0.1307,), (0.3081,)) for (Fashion-)MNIST);
# cifar: per channel (RGB), fedjax datasets/cifar100.py's CIFAR100_PIXELS_MEAN and 1 /
# CIFAR100_PIXELS_INVERSE_STDDEV (pytorch-cifar's).
NORMALIZATIONS = {"none": None, "fedadmm": (0.1307, 0.3081),
                  "cifar": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))}


def normalized(x, normalize: str = "none"):
  """``x`` (float32 inputs in [0, 1]) as ``(x - mean) / std`` of ``NORMALIZATIONS``
  (per channel, the last axis, for ``cifar``)."""
  stats = NORMALIZATIONS[normalize]
  if stats is None:
    return x
  mean, std = (np.asarray(v, np.float32) for v in stats)
  if mean.ndim and (np.ndim(x) < 2 or np.shape(x)[-1] != mean.size):
    raise ValueError(f"data.normalize={normalize}: per-channel statistics of {mean.size} "
                     f"channels, the data's examples have shape {np.shape(x)[1:]}")
  return ((x - mean) / std).astype(np.float32)


def black(normalize: str = "none", channels: int = 1) -> tuple:
  """The stored value of a black pixel (0 in [0, 1]) per channel under ``normalize``
  (``core.augment``'s padding)."""
  stats = NORMALIZATIONS[normalize]
  if stats is None:
    return ()
  mean, std = (np.broadcast_to(np.asarray(v, np.float32), (channels,)) for v in stats)
  return tuple(float(v) for v in -mean / std)


# natural data sets: name -> (reader module's load, its format)
NATURAL_FORMATS = (("fedjax_", "fedjax_sqlite"), ("tff_", "tff_sqlite"), ("leaf_", "leaf"))


def _natural_names():
  return fedjax_sqlite.DATASETS + tff_sqlite.DATASETS + leaf.DATASETS


NATURAL_DATASETS = _natural_names()
TEXT_DATASETS = ("fedjax_shakespeare", "fedjax_stackoverflow", "tff_shakespeare",
                 "tff_stackoverflow", "leaf_shakespeare", "leaf_sent140")


def load_natural(name: str, data_dir: Optional[str], *, normalize: str = "none",
                 max_client_examples: int = 0, max_test_examples: int = 0) -> FederatedData:
  """A natural data set from its format's files in ``data_dir`` (``fedjax_sqlite``,
  ``tff_sqlite``, ``leaf``): its own clients and test split, clients held lazily
  (``natural``); errors name data.data_dir or the file.

  Args:
    name: the natural data set (``NATURAL_DATASETS``).
    data_dir: the directory of its files.
    normalize: the image inputs' normalisation (``NORMALIZATIONS``).
    max_client_examples: each client's first k examples (0: all).
    max_test_examples: the first k test examples (0: all).
  """
  module = importlib.import_module(
      "fedjax_async.data." + next(m for p, m in NATURAL_FORMATS if name.startswith(p)))
  if not data_dir:
    raise ValueError(f"data.dataset={name}: reads its files from data.data_dir, and none is "
                     "given (docs/api.md, natural data sets)")
  if not os.path.isdir(data_dir):
    raise ValueError(f"data.data_dir={data_dir}: no such directory")
  if normalize != "none" and (name in TEXT_DATASETS or name == "leaf_synthetic"):
    raise ValueError(f"data.normalize={normalize}: normalises images; {name} has none")
  for flag, v in (("data.max_client_examples", max_client_examples),
                  ("data.max_test_examples", max_test_examples)):
    if v < 0:
      raise ValueError(f"{flag}: must be >= 0 (0: all), got {v}")
  return module.load(name, data_dir, max_client_examples=max_client_examples,
                     max_test_examples=max_test_examples,
                     transform=lambda x: normalized(x, normalize))


def is_tfds_name(name: str) -> bool:
  """Whether ``name`` (``mnist``, ``cifar10:3.0.2``, ``x/y``) is a tensorflow-datasets
  builder (False where tfds is not installed)."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return name.split("/")[0].split(":")[0] in tfds.list_builders(with_community_datasets=False)
