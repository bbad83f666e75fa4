"""Issue 66, findings 2 and 4: seeds drawn as bands and meaning one thing on every engine.

* ``Result.plot`` (``simulate(seeds=[...])``, the virtual clock's seeds) and
  ``experiments/run.py --seeds`` draw one colour per configuration: the mean over its seeds
  with a ±1 std band (numpy's, ddof 1), a legend naming the seeds, axis labels and a title
  saying what ran. The figures are read back as matplotlib objects (``Figure.savefig``
  captured), not as pixels.
* The data and partition come from one data seed (``data_seed``, default the base seed) on
  both engines, training randomness from the seed; records and summaries carry both, and
  a run stored before ``data_seed`` existed still matches its configuration.
"""

import json
import re

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async.asynchronous import experiment as async_experiment
from fedjax_async.rounds import experiment
from fedjax_async.sweeps import sweep

import run_script

SMALL = dict(num_clients=10, rounds=2, quiet=True)  # the default tiny data, two rounds


@pytest.fixture
def saved_figures(monkeypatch):
  """The Figures the code under test saves, in order (nothing is written)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figures = []
  monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
  return figures


def bands(ax):
  """The Axes' filled bands (``fill_between``'s PolyCollections)."""
  from matplotlib.collections import PolyCollection  # pylint: disable=g-import-not-at-top
  return [c for c in ax.collections if isinstance(c, PolyCollection)]


def legend(ax):
  return [t.get_text() for t in ax.get_legend().get_texts()]


def accuracy_by_round(records, algorithm):
  """{seed: [test accuracy of round 1, 2, ...]} of ``algorithm``'s records."""
  out = {}
  for r in records:
    if r["algorithm"] == algorithm:
      out.setdefault(r["seed"], []).append(r["test_accuracy"])
  return out


def test_simulate_with_seeds_plots_a_band_per_configuration(saved_figures, tmp_path):
  """The issue's Done-when: ``simulate(seeds=[0, 1, 2]).plot()`` draws a band per
  configuration (not a line per seed), its mean and std numpy's over the seeds' records,
  the legend naming the seeds, the axes their quantities, the title the data and runs."""
  result = fa.simulate(algorithm="fedavg,fedprox", seeds=[0, 1, 2], **SMALL)
  assert result.plot(str(tmp_path / "c.png")) == str(tmp_path / "c.png")
  fig = saved_figures[-1]
  acc, loss = fig.axes
  for ax in (acc, loss):
    assert len(ax.lines) == 2 and len(bands(ax)) == 2  # two configurations, not six runs
    assert legend(ax) == ["fedavg (mean ± std over 3 seeds)",
                          "fedprox (mean ± std over 3 seeds)"]
    assert ax.get_xlabel() == "round"
    assert len({line.get_color() for line in ax.lines}) == 2
  assert (acc.get_ylabel(), loss.get_ylabel()) == ("test accuracy", "train loss")
  records = result.to_records()
  for line, name in zip(acc.lines, ("fedavg", "fedprox")):
    by_seed = accuracy_by_round(records, name)
    assert sorted(by_seed) == [0, 1, 2]
    values = np.array([by_seed[s] for s in sorted(by_seed)], float)
    np.testing.assert_allclose(line.get_xdata(), [1, 2])
    np.testing.assert_allclose(line.get_ydata(), values.mean(axis=0))
    (poly,) = [b for b in bands(acc) if np.allclose(b.get_facecolor()[0][:3],
                                                    _rgb(line.get_color()))]
    high = values.mean(axis=0) + values.std(axis=0, ddof=1)
    np.testing.assert_allclose(poly.get_paths()[0].vertices[:, 1].max(), high.max())
  title = fig.get_suptitle().replace("\n", " ")
  assert "synthetic" in title and "logreg" in title and "fedavg, fedprox" in title, title
  assert "seeds 0, 1, 2: mean ± sample std (ddof 1)" in title, title


def _rgb(color):
  from matplotlib import colors  # pylint: disable=g-import-not-at-top
  return colors.to_rgb(color)


def test_a_sweep_with_seeds_groups_by_setting_and_the_clock_by_run(saved_figures, tmp_path):
  """Runs are grouped by everything but the seed: a swept ``lr`` gives a band per value;
  on the virtual clock a band per run against simulated time."""
  swept = fa.simulate(algorithm="fedavg", seeds=[0, 1], sweep={"lr": [0.05, 0.1]}, **SMALL)
  swept.plot(str(tmp_path / "s.png"))
  ax = saved_figures[-1].axes[0]
  assert legend(ax) == ["fedavg/lr=0.05 (mean ± std over 2 seeds)",
                        "fedavg/lr=0.1 (mean ± std over 2 seeds)"] and len(bands(ax)) == 2
  clock = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync,fedbuff", num_updates=4,
                      num_clients=6, seeds=[0, 1], eval_every=1, quiet=True)
  clock.plot(str(tmp_path / "v.png"))
  fig = saved_figures[-1]
  ax = fig.axes[0]
  assert legend(ax) == ["fedasync (mean ± std over 2 seeds)",
                        "fedbuff (mean ± std over 2 seeds)"] and len(bands(ax)) == 2
  assert ax.get_xlabel().startswith("virtual time")
  title = fig.get_suptitle().replace("\n", " ")
  assert "virtual clock" in title and "seeds 0, 1" in title, title


def test_run_py_seeds_writes_each_seed_the_comparison_and_the_band_figure(tmp_path):
  """``experiments/run.py --seeds=0,1``: each seed's runs under ``seed<s>/`` (the same data
  seed), the comparison as mean ± std (n) over them and curves.png."""
  out = tmp_path / "out"
  proc = run_script.run(["--algorithm=fedavg,fedprox", "--seeds=0,1", "--rounds=2",
                         "--num_clients=10", "--quiet", f"--output_dir={out}"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  for seed in (0, 1):
    for alg in ("fedavg", "fedprox"):
      with open(out / f"seed{seed}" / alg / "summary.json") as f:
        summary = json.load(f)
      assert (summary["seed"], summary["data_seed"]) == (seed, 0)
  md = (out / "comparison.md").read_text()
  assert re.search(r"\| fedavg \| \d\.\d{4} ± \d\.\d{4} \(2\) \|", md), md
  assert md in proc.stdout and (out / "curves.png").is_file()
  assert f"figure: {out / 'curves.png'}" in proc.stdout


def test_the_clis_seeds_draw_one_band_per_algorithm(saved_figures, tmp_path):
  """What run.py --seeds runs (``simulate`` of its RunConfig): the figure in output_dir is
  one band per algorithm, titled with the seeds."""
  cfg = config_lib.RunConfig().replace(algorithm="fedavg,fedprox", seeds="0,1",
                                       output_dir=str(tmp_path), **SMALL)
  result = fa.simulate(cfg)
  assert sorted(result.by_seed) == [0, 1] and result.figure == str(tmp_path / "curves.png")
  fig = saved_figures[-1]  # (each seed's own curves.png before it)
  ax = fig.axes[0]
  assert legend(ax) == ["fedavg (mean ± std over 2 seeds)",
                        "fedprox (mean ± std over 2 seeds)"] and len(bands(ax)) == 2
  assert "seeds 0, 1" in fig.get_suptitle().replace("\n", " ")
  assert {r["data_seed"] for r in result.to_records()} == {0}


def test_the_clock_draws_every_seeds_data_from_one_data_seed(capsys):
  """Finding 4 replayed: the virtual clock with seeds 0 and 1 loads the same data (the same
  number of examples) and differs in its clock and initial model; ``data_seed`` changes
  the data. Every summary and record carries ``seed`` and ``data_seed``."""
  run = lambda **f: fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", num_updates=4,
                                num_clients=6, **f)
  result = run(seeds=[0, 1])
  examples = re.findall(r"data: 6 clients, (\d+) examples", capsys.readouterr().out)
  assert len(examples) == 2 and examples[0] == examples[1], examples
  first, second = (result.by_seed[s]["fedasync"] for s in (0, 1))
  assert not np.array_equal(first.model[1], second.model[1])  # initial models
  assert ([r["virtual_time"] for r in first.rows] !=
          [r["virtual_time"] for r in second.rows])  # clocks
  assert [(s["seed"], s["data_seed"]) for s in result.summary_records()] == [(0, 0), (1, 0)]
  assert {(r["seed"], r["data_seed"]) for r in result.to_records()} == {(0, 0), (1, 0)}
  other = run(seed=0, data_seed=1)
  (count,) = re.findall(r"data: 6 clients, (\d+) examples", capsys.readouterr().out)
  assert count != examples[0] and other.summary_records()[0]["data_seed"] == 1


def test_the_round_engine_takes_its_data_from_the_data_seed_and_records_it():
  """The round engine's data follow ``data_seed`` (default the seed), its records and
  summaries carry both seeds; every seed of ``seeds=[...]`` shares the base's data seed."""
  data = lambda **f: experiment.load_data(config_lib.RunConfig().replace(num_clients=10, **f))
  counts = lambda fed: fed.counts.tolist()
  assert counts(data(seed=0, data_seed=3)) == counts(data(seed=3)) != counts(data(seed=0))
  result = fa.simulate(algorithm="fedavg", seeds=[0, 1], data_seed=3, **SMALL)
  assert {(r["seed"], r["data_seed"]) for r in result.to_records()} == {(0, 3), (1, 3)}
  assert [(s["seed"], s["data_seed"]) for s in result.summary_records()] == [(0, 3), (1, 3)]
  single = fa.simulate(algorithm="fedavg", seed=2, **SMALL)
  assert [(s["seed"], s["data_seed"]) for s in single.summary_records()] == [(2, 2)]


def test_a_run_stored_before_data_seed_matches_its_configuration():
  """A stored configuration without ``data_seed`` drew its data from the base seed on the
  round engine (the default: compared as the current one) and from its own seed on the
  virtual clock; a different data seed stored is a difference."""
  base = config_lib.RunConfig().replace(seed=2)
  now = config_lib.config_dict(config_lib.with_seed(base, 3))  # a sweep's second seed
  old = {k: v for k, v in now.items() if k not in ("data_seed", "seeds")}
  assert now["data_seed"] == 2 and config_lib.config_mismatch(old, now) == []
  assert config_lib.config_mismatch(dict(now, data_seed=3), now) == ["data_seed"]
  single = config_lib.config_dict(base.replace(seed=4))  # None: the seed's
  assert config_lib.config_mismatch(dict(single, data_seed=4), single) == []
  assert async_experiment.renamed({"seed": 3, "rho": 0.5}) == {"seed": 3, "dc_rho": 0.5,
                                                               "data_seed": 3}


def test_a_sweeps_grid_takes_listed_seeds_all_on_the_base_data_seed():
  """experiments/sweep.py's grid: ``--seeds`` lists the seeds (else ``--seed`` onwards,
  ``--num_seeds`` of them); every run's data seed is the base's."""
  base = config_lib.RunConfig().replace(algorithm="fedavg", seed=2)
  listed = sweep.grid(base, {"lr": [0.1]}, seeds=[3, 5])
  assert [(c.run.seed, c.data.data_seed) for c in listed] == [(3, 2), (5, 2)]
  counted = sweep.grid(base, {}, num_seeds=2)
  assert [(c.run.seed, c.data.data_seed) for c in counted] == [(2, 2), (3, 2)]
