"""Runs that must stay bounded with the defaults: the main job, the Fashion-MNIST logistic
regression, every built-in data set x model (what a diverging run leaves behind:
tests/test_checkpoint.py).

The bounds. The global model's scale must settle: ||w|| at the last round is at most twice
its value halfway (a run whose scale diverges compounds round over round: FedADMM with
Eq. 16 read literally, ``--admm_upload=last_local``, went from test loss 98 to 6.1e4
between rounds 50 and 100 of the main job, and its ||w|| with it). The test loss of every
evaluated round in the second half stays below 5 on Synthetic(1,1) and below 10 on
Fashion-MNIST (chance is ln 10 = 2.3; measured with the defaults: at most 3.1 on the
main job's second half, 5.2 on Fashion-MNIST's).
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from fedjax_async import config as config_lib
from fedjax_async import data as data_lib
from fedjax_async.rounds import experiment
from run_script import ROOT, read_rows, run

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
needs_fmnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(FMNIST_DIR, "train-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST IDX files not installed (apt-get install dataset-fashion-mnist)")
ALGS = ("pafed", "fedadmm", "fedavg", "fedprox", "fednova")


def assert_bounded(out, names, rounds, max_loss):
  for name in names:
    rows = read_rows(out / name / "metrics.jsonl")
    assert len(rows) == rounds, name
    norms = [r["model_norm"] for r in rows]
    half = rounds // 2
    assert norms[-1] <= 2 * norms[half - 1], (name, norms[half - 1], norms[-1])
    losses = [r["test_loss"] for r in rows[half:] if r["test_loss"] is not None]
    assert losses and max(losses) < max_loss, (name, max(losses))


def test_main_job_keeps_every_algorithms_scale_and_loss_bounded(tmp_path):
  # ./run.sh as printed: the CLI's defaults, 100 rounds.
  res = run([f"--output_dir={tmp_path}", "--checkpoint_every=0", "--tensorboard=false"])
  assert res.returncode == 0, res.stderr[-3000:]
  assert_bounded(tmp_path, config_lib.MAIN_JOB_ALGORITHMS.split(","), 100, 5.0)
  for name in config_lib.MAIN_JOB_ALGORITHMS.split(","):  # and each one learns
    with open(tmp_path / name / "summary.json") as f:
      assert json.load(f)["final_accuracy"] > 0.6, name


@needs_fmnist
def test_fashion_mnist_logreg_keeps_every_algorithms_scale_and_loss_bounded(tmp_path):
  flags = os.path.join(ROOT, "experiments", "flags", "pafed_fmnist_common.flags")
  res = run([f"--flagfile={flags}", "--model=logreg",
             "--rounds=40", "--local_epochs=2", "--partition=shards",
             "--delay_fraction=0.5", "--eval_every=1", f"--output_dir={tmp_path}",
             "--checkpoint_every=0", "--tensorboard=false"])
  assert res.returncode == 0, res.stderr[-3000:]
  assert_bounded(tmp_path, ("fedadmm", "fedavg", "fedprox", "pafed"), 40, 10.0)


def gaussian_images(shape, num_classes, n, seed):
  """Stand-in image data (CIFAR is not installed here): class-dependent means in [0, 1]
  plus noise, so that the models have something to fit."""
  rng = np.random.default_rng(seed)
  means = rng.uniform(0.2, 0.8, (num_classes,) + shape).astype(np.float32)
  y = rng.integers(0, num_classes, n).astype(np.int32)
  x = np.clip(means[y] + 0.2 * rng.standard_normal((n,) + shape), 0, 1).astype(np.float32)
  return x, y


def small_data(dataset, clients=6, per_client=10, test=100):
  """``dataset`` at test size: ``clients`` clients of ``per_client`` examples each."""
  if dataset.startswith("synthetic"):
    fd = data_lib.load(dataset, num_clients=clients)
    m = 5 * per_client
    return dataclasses.replace(fd, x=fd.x[:, :m], y=fd.y[:, :m],
                               counts=np.minimum(fd.counts, m), test_x=fd.test_x[:test],
                               test_y=fd.test_y[:test])
  if dataset in ("fashion_mnist", "mnist"):  # MNIST's stand-in: Fashion-MNIST's pixels
    if not os.path.exists(os.path.join(FMNIST_DIR, "train-images-idx3-ubyte.gz")):
      pytest.skip("Fashion-MNIST IDX files not installed")
    x, y, tx, ty = data_lib.load_fashion_mnist(FMNIST_DIR)
    classes = 10
  else:
    classes = 100 if dataset == "cifar100" else 10
    x, y = gaussian_images((32, 32, 3), classes, clients * per_client + test, seed=0)
    x, y, tx, ty = x[test:], y[test:], x[:test], y[:test]
  parts = data_lib.make_partition(y[:clients * per_client * 20], "shards", clients)
  parts = [p[:per_client] for p in parts]
  return data_lib.federate(x, y, parts, tx[:test], ty[:test], classes, dataset)


# Each built-in data set with its default model and the small ones. The convolutional
# pairs compile for 1-3 minutes each (5 algorithms) on 2 cores: -m slow. The fast suite
# keeps logreg on Synthetic and the MLP on Fashion-MNIST (whose logreg runs every
# algorithm in test_fashion_mnist_logreg_keeps_every_algorithms_scale_and_loss_bounded);
# the other small cells (20-27 s each) run with -m slow.
slow = pytest.mark.slow
PAIRS = [("synthetic", "logreg"), pytest.param("synthetic", "mlp", marks=slow),
         pytest.param("synthetic_iid", "logreg", marks=slow),
         pytest.param("fashion_mnist", "logreg", marks=slow), ("fashion_mnist", "mlp"),
         pytest.param("fashion_mnist", "cnn", marks=slow),
         pytest.param("fashion_mnist", "simple_cnn", marks=slow),
         pytest.param("mnist", "cnn", marks=slow),
         pytest.param("cifar10", "cifar10_cnn", marks=slow),
         pytest.param("cifar100", "cifar100_cnn", marks=slow)]


@pytest.mark.parametrize("dataset,model", PAIRS)
def test_defaults_run_30_rounds_without_a_non_finite_loss(dataset, model, tmp_path):
  # The library's (= the CLI's) defaults for everything but the data's size.
  cfg = config_lib.RunConfig().replace(dataset=dataset, model=model, num_clients=6, rounds=30,
                             rounds_per_call=30, checkpoint_every=0, tensorboard=False)
  fed = small_data(dataset)
  built = experiment.build_model(cfg, fed)
  for name in ALGS:
    experiment.run(cfg, name, fed, built, out_dir=str(tmp_path / name), quiet=True)
    rows = read_rows(tmp_path / name / "metrics.jsonl")
    assert len(rows) == 30 and not any(r["nonfinite"] for r in rows), name
    assert all(np.isfinite(r["test_loss"]) for r in rows if r["test_loss"] is not None)
