"""Every figure the project draws is titled and its axes labelled from its data: each is
built from small hand-made rows (no training) and its title, axis labels and legend are
read back from the matplotlib objects (not the PNG).

The figures: ``outputs.plot_curves`` (``Result.plot``, the round engine's and the virtual
clock's curves.png), ``sweeps/store.plot_aggregate`` (aggregate.png, swept and not),
``data.save_histogram_png``, ``fededs.privacy.save_encryption_grid``,
experiments/pafed_table.py's curves, benchmarks/min_depth.py's and benchmarks/report.py's.
"""

import os

import numpy as np
import pytest

from fedjax_async import results as results_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def saved(monkeypatch):
  """The Figures the code under test saves, in order (nothing is written)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figs = []
  monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
  return figs


def title(fig):
  return fig._suptitle.get_text() if fig._suptitle is not None else ""  # pylint: disable=protected-access


def legend(ax):
  leg = ax.get_legend()
  return [t.get_text() for t in leg.get_texts()] if leg is not None else []


def rows(accs, losses, x_key="round"):
  return [{x_key: i + 1, "test_accuracy": a, "train_loss": l}
          for i, (a, l) in enumerate(zip(accs, losses))]


def test_result_plot_names_its_metrics_configurations_and_seeds(saved):
  run = lambda seed, accs: results_lib.Run({"seed": seed, "algorithm": "fedavg"},
                                           rows(accs, [1.0, 0.5]))
  result = results_lib.Result(
      config=None, runs={}, by_seed={0: {"fedavg": run(0, [0.2, 0.4]),
                                         "fedprox": run(0, [0.1, 0.3])},
                                     1: {"fedavg": run(1, [0.4, 0.6]),
                                         "fedprox": run(1, [0.3, 0.5])}})
  result.plot("curves.png")
  acc, loss = saved[-1].axes
  assert [acc.get_xlabel(), loss.get_xlabel()] == ["round", "round"]
  assert acc.get_ylabel() == "test accuracy"
  assert loss.get_ylabel().startswith("train loss")
  assert legend(acc) == ["fedavg (mean ± std over 2 seeds)",
                         "fedprox (mean ± std over 2 seeds)"]
  assert title(saved[-1]) == "fedavg, fedprox; seeds 0, 1: mean ± sample std (ddof 1)"


def test_the_virtual_clocks_curves_are_against_simulated_seconds(saved, tmp_path):
  from fedjax_async.asynchronous import config as async_config  # pylint: disable=g-import-not-at-top
  from fedjax_async.asynchronous import experiment  # pylint: disable=g-import-not-at-top
  cfg = async_config.AsyncRunConfig().replace(output_dir=str(tmp_path))
  run = lambda accs: results_lib.Run({"dataset": "synthetic", "model": "logreg"},
                                     rows(accs, [1.0, 0.5], "virtual_time"))
  result = results_lib.Result(config=cfg, runs={}, by_seed={
      0: {"fedasync": run([0.2, 0.4]), "fedbuff": run([0.1, 0.2])},
      1: {"fedasync": run([0.4, 0.6]), "fedbuff": run([0.3, 0.4])}})
  experiment.plot_seeds(cfg, result)
  acc, _ = saved[-1].axes
  assert acc.get_xlabel() == "virtual time (simulated s)"
  assert legend(acc) == ["fedasync (mean ± std over 2 seeds)",
                         "fedbuff (mean ± std over 2 seeds)"]
  assert title(saved[-1]).replace("\n", " ") == (
      "synthetic (natural partition, one generator per client, N = 30), logreg; virtual "
      "clock, concurrency 5; fedasync, fedbuff; seeds 0, 1: mean ± sample std (ddof 1)")


def test_curves_without_a_title_are_titled_by_their_runs(saved):
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  outputs.plot_curves({"a": rows([0.1], [1.0]), "b": rows([0.2], [2.0])}, "c.png")
  assert title(saved[-1]) == "a, b"


def aggregate_row(alg, mu, seeds=2):
  return {"algorithm": alg, "mu": mu, "num_seeds": seeds,
          "average_best_accuracy_mean": 0.5, "average_best_accuracy_std": 0.1,
          "final_accuracy_mean": 0.4, "final_accuracy_std": 0.1}


def test_the_aggregate_figures_y_axes_name_their_metrics_not_the_swept_label(saved):
  from fedjax_async.sweeps import store  # pylint: disable=g-import-not-at-top
  store.plot_aggregate([aggregate_row("fedprox", 0.1), aggregate_row("fedprox", 1.0)],
                       ["mu"], "a.png", title="T")
  axes = saved[-1].axes
  assert [a.get_ylabel() for a in axes] == [
      "final accuracy\n(mean ± std over 2 seeds)",
      "average best accuracy\n(mean ± std over 2 seeds)"]
  assert [a.get_xlabel() for a in axes] == ["mu", "mu"]
  assert legend(axes[0]) == ["fedprox (mean ± std over 2 seeds)"]
  assert title(saved[-1]) == "T"


def test_the_aggregate_figure_without_swept_values_names_algorithms_and_metrics(saved):
  from fedjax_async.sweeps import store  # pylint: disable=g-import-not-at-top
  store.plot_aggregate([aggregate_row("fedavg", None, 1), aggregate_row("fedprox", None, 1)],
                       [], "a.png")
  axes = saved[-1].axes
  assert [a.get_ylabel() for a in axes] == ["final accuracy", "average best accuracy"]
  assert [a.get_xlabel() for a in axes] == ["algorithm", "algorithm"]
  assert [t.get_text() for t in axes[0].get_xticklabels()] == ["fedavg", "fedprox"]
  assert title(saved[-1]) == "per algorithm"


def test_the_label_histogram_names_clients_classes_and_counts(saved):
  from fedjax_async import data  # pylint: disable=g-import-not-at-top
  data.save_histogram_png(np.array([[1, 2, 0], [0, 3, 4]]), "h.png")
  ax = saved[-1].axes[0]
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("class", "client")
  assert ax.get_title() == "examples per client and class: 2 clients, 3 classes, 10 examples"
  assert saved[-1].axes[1].get_ylabel() == "examples"  # the colorbar
  data.save_histogram_png(np.ones((2, 2)), "h.png", "mnist, Dirichlet")
  assert saved[-1].axes[0].get_title() == "mnist, Dirichlet"


def test_the_encryption_grid_names_its_rows(saved):
  from fedjax_async.fededs import privacy  # pylint: disable=g-import-not-at-top
  imgs = np.zeros((2, 4, 4, 1))
  privacy.save_encryption_grid(imgs, imgs, "g.png")
  axes = saved[-1].axes
  assert [axes[0].get_ylabel(), axes[2].get_ylabel()] == ["original", "encrypted (layer on)"]
  assert title(saved[-1]) == "2 images per row: original, encrypted (layer on)"


def test_the_pafed_tables_curves_name_data_model_delta_and_algorithms(saved, tmp_path):
  from test_results_tables import pafed_table  # pylint: disable=g-import-not-at-top
  module = pafed_table()  # (loaded once a process: it defines flags)
  from fedjax_async import config as config_lib  # pylint: disable=g-import-not-at-top
  summary = {"setting": {"delay_fraction": 0.3}, "dataset": "mnist", "model": "cnn"}
  runs = [(summary, [{"round": 1, "test_accuracy": 0.5}])]
  module.plot_curves({("dirichlet", "fedavg"): runs}, ["dirichlet"], ["fedavg"],
                     str(tmp_path), "reduced", config_lib.RunConfig().data)
  ax = saved[-1].axes[0]
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("communication round", "test accuracy")
  assert ax.get_title().startswith("mnist (Dirichlet α = ")
  assert ax.get_title().endswith("cnn; δ = 0.3 (reduced)")
  assert legend(ax) == ["FedAvg"]


def test_the_min_depth_figure_names_its_families_and_ring(saved):
  from benchmarks import min_depth  # pylint: disable=g-import-not-at-top
  row = lambda fam, depth: {"family": fam, "depth": depth, "max_err": 0.1 / depth,
                            "us_per_slot": 2.0 * depth, "method": f"{fam}{depth}",
                            "ring_dim": 2048, "security": "insecure"}
  min_depth.plot([row("cheon", 4), row("cheon", 6), row("chebyshev", 5)], "m.png")
  axes = saved[-1].axes
  assert [a.get_xlabel() for a in axes] == ["multiplicative depth",
                                            "amortised us / comparison"]
  assert legend(axes[0]) == ["cheon", "chebyshev"]
  assert title(saved[-1]) == "encrypted Min on [0,1]^2, N in [2048], security=insecure"


def test_the_benchmark_reports_figures_name_quantity_machine_and_model(saved, tmp_path):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  rows_ = [{"bench": "scaling", "sweep": "k", "model": "logreg", "cpu": "CPU X",
            "clients_per_round": k, "s_per_round": 0.1 * k, "peak_rss": 2**30 * k}
           for k in (10, 100)]
  assert report.plot(rows_, str(tmp_path)) == {"scaling_k.png": 2}
  fig = saved[-1]
  assert [a.get_xlabel() for a in fig.axes] == ["clients per round"] * 2
  assert [a.get_ylabel() for a in fig.axes] == ["seconds per round", "peak memory (GiB)"]
  assert title(fig) == "FedAvg: round time and peak memory vs clients per round K"
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["CPU X logreg"]
