"""Federated data sets on the host: generation, loading, partitioning and padding.

Everything here is numpy on the host; the engine moves the arrays to the device
(``rounds.engine.DeviceData.from_federated``). A :class:`FederatedData` holds every client's
training examples padded to the largest client size M, the real count per client and a
central test set.

One module a part: ``federated`` (``FederatedData``, partitions, padding, histograms),
``sources`` (synthetic, IDX, tfds), ``loader`` (``load``). Sources:

* :func:`synthetic` -- Synthetic(alpha, beta) of the FedProx paper (Li et al., MLSys 2020,
  ``generate_synthetic``), with its natural partition (one generator per client), and the
  IID variant (``synthetic_iid``);
* :func:`read_idx` / :func:`load_fashion_mnist` / :func:`load_mnist_idx` -- IDX files (the
  Debian package ``dataset-fashion-mnist`` installs them in /usr/share/datasets/fashion-mnist);
* :func:`load_tfds` -- any tensorflow-datasets image classification set (needs TensorFlow);
* :func:`load_natural` -- the natural client splits of fedjax's SQLite files
  (``fedjax_sqlite``), TFF's SQLite ClientData (``tff_sqlite``) and LEAF's JSON folders
  (``leaf``), clients held lazily (``natural``; ``text``: their token ids).

Partitions of a labelled pool into clients (each returns one int64 index array per client
and assigns every example exactly once): :func:`partition_iid` (equal class proportions,
PAFed), :func:`partition_shards` (McMahan et al.: 2 label-sorted shards per client) and
:func:`partition_dirichlet` (per-class Dir(alpha) proportions). :func:`federate` pads them.

:func:`from_arrays` (your labelled arrays, partitioned) and :func:`from_clients` (your own
split) make a :class:`FederatedData` for ``simulate(..., data=...)``; they and every loader
check their arrays once (:func:`check_pool`), a one-line ValueError naming the argument.
:func:`load` is the single entry point of ``experiments/run.py``. Label histograms:
:func:`label_histogram`, :func:`format_histogram`, :func:`save_histogram_png`, and the CLI

  python -m fedjax_async.cli.data --dataset=fashion_mnist --partition=dirichlet --alpha=0.1 \
      --num_clients=20 --png=/tmp/h.png
"""

from fedjax_async.data.federated import (DATA_SOURCES, DATASETS, DEFAULT_FASHION_MNIST_DIR,
                                         KNOWN_NUM_CLASSES, MAX_DATA_ENV, PARTITIONS,
                                         FederatedData, available_memory_bytes,
                                         check_padded_size, check_pool, federate,
                                         format_histogram,
                                         from_arrays, from_clients,
                                         label_histogram, make_partition,
                                         padded_data_limit_bytes, partition_dirichlet,
                                         partition_iid, partition_shards,
                                         save_histogram_png)
from fedjax_async.data.loader import NATURAL_DATASETS, load, load_natural
from fedjax_async.data.natural import client_ids, is_lazy
from fedjax_async.data.sources import (IDX_STEMS, SYNTHETIC_CLASSES, SYNTHETIC_DIM, find_idx,
                                       idx_files_present, load_fashion_mnist, load_idx_dataset,
                                       load_mnist_idx, load_tfds, parse_idx, read_idx,
                                       synthetic, synthetic_client_sizes,
                                       synthetic_covariance_diagonal)

__all__ = [
    "DATA_SOURCES", "DATASETS", "DEFAULT_FASHION_MNIST_DIR", "KNOWN_NUM_CLASSES",
    "MAX_DATA_ENV", "PARTITIONS", "FederatedData", "available_memory_bytes",
    "check_padded_size", "check_pool", "federate", "format_histogram", "from_arrays",
    "from_clients",
    "label_histogram",
    "make_partition", "padded_data_limit_bytes", "partition_dirichlet", "partition_iid",
    "partition_shards", "save_histogram_png", "load", "load_natural", "NATURAL_DATASETS",
    "client_ids", "is_lazy", "IDX_STEMS", "SYNTHETIC_CLASSES",
    "SYNTHETIC_DIM", "find_idx", "idx_files_present", "load_fashion_mnist",
    "load_idx_dataset", "load_mnist_idx", "load_tfds", "parse_idx", "read_idx", "synthetic",
    "synthetic_client_sizes", "synthetic_covariance_diagonal",
]
