"""Issue 59, finding 4: seeds and settings are columns of every record and summary on every
engine, and ``table()`` gives a configuration's seeds as mean ± std (n), the sample std
(ddof 1). Each test replays one part of the finding as written; the expected numbers are
recomputed here with numpy from the per-seed records."""

import dataclasses
import re

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async.fededs import config as fededs_config
from fedjax_async.fededs import report as fededs_report
from fedjax_async.sweeps import sweep

# Two rounds of the default data with few clients: cheap runs of the finding's calls.
SMALL = dict(num_clients=10, rounds=2, quiet=True)


def table_rows(table: str, first: str):
  """The cells of the table lines that start with ``| first |``."""
  return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
          if line.startswith(f"| {first} |")]


def cell(values, fmt=".4f") -> str:
  """numpy's mean ± sample std (ddof 1) (n) of several seeds' values."""
  v = np.asarray(values, float)
  return f"{v.mean():{fmt}} ± {v.std(ddof=1):{fmt}} ({v.size})"


def last_accuracy(records, **where):
  """Each seed's last evaluated test accuracy among ``records`` matching ``where``."""
  out = {}
  for r in records:
    if all(r.get(k) == v for k, v in where.items()) and r["test_accuracy"] is not None:
      out[r["seed"]] = r["test_accuracy"]
  return [out[s] for s in sorted(out)]


def test_seeds_and_a_swept_lr_are_columns_and_the_table_is_mean_std_per_lr():
  """The issue's Done-when: ``to_records()`` of simulate(algorithm="fedavg", seeds=[0, 1],
  sweep={"lr": [0.05, 0.1]}) has ``seed`` and ``lr`` keys; ``table()`` shows mean ± std
  over the two seeds per lr."""
  result = fa.simulate(algorithm="fedavg", seeds=[0, 1], sweep={"lr": [0.05, 0.1]}, **SMALL)
  records = result.to_records()
  assert {(r["algorithm"], r["lr"], r["seed"]) for r in records} == {
      ("fedavg", lr, s) for lr in (0.05, 0.1) for s in (0, 1)}
  for name, run in result.runs.items():  # each record is its own run's row
    lr, seed = run.summary["setting"]["lr"], run.summary["seed"]
    assert name == f"fedavg/lr={lr:g}_seed={seed}"
    assert [r["test_accuracy"] for r in records if r["run"] == name] == [
        r["test_accuracy"] for r in run.rows]
    assert all(r["lr"] == lr and r["seed"] == seed for r in records if r["run"] == name)
  summaries = result.summary_records()
  assert sorted((s["lr"], s["seed"]) for s in summaries) == [(0.05, 0), (0.05, 1), (0.1, 0),
                                                            (0.1, 1)]
  table = result.table()
  assert table.splitlines()[0].startswith("| algorithm | lr | final accuracy |")
  rows = table_rows(table, "fedavg")
  assert [r[1] for r in rows] == ["0.05", "0.1"]  # one line per lr, not per run
  for row, lr in zip(rows, (0.05, 0.1)):
    accs = last_accuracy(records, lr=lr)
    assert len(accs) == 2 and row[2] == cell(accs), (row, accs)
  assert "sample std (ddof 1)" in table


def test_the_virtual_clocks_summaries_tell_seeds_and_settings_apart():
  """On the virtual clock, ``to_pandas(summaries=True)`` of two seeds gives each run its
  own ``run``, a ``seed`` column and the swept ``mix_alpha``; the table's mean ± std (n)
  is numpy's over the seeds."""
  pd = pytest.importorskip("pandas")
  clock = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", num_updates=4,
                      num_clients=6, seeds=[0, 1], mix_alpha="0.2,0.6")
  df = clock.to_pandas(summaries=True)
  assert isinstance(df, pd.DataFrame) and df["run"].is_unique and len(df) == 4
  assert sorted(zip(df["seed"], df["mix_alpha"])) == [(0, 0.2), (0, 0.6), (1, 0.2),
                                                      (1, 0.6)]
  assert set(df["algorithm"]) == {"fedasync"}
  records = clock.to_records()
  assert {(r["seed"], r["mix_alpha"]) for r in records} == set(zip(df["seed"],
                                                                    df["mix_alpha"]))
  table = clock.table()
  for name, a in (("fedasync_a0.2", 0.2), ("fedasync_a0.6", 0.6)):
    (row,) = table_rows(table, name)
    finals = last_accuracy(records, mix_alpha=a)
    assert len(finals) == 2 and row[1] == cell(finals), (row, finals)
  assert "sample std (ddof 1)" in table


def test_sweep_settings_are_in_numeric_order():
  """A ``mu`` sweep given as [1, 0.1, 0]: runs, records and the table in the order
  0, 0.1, 1 (not 0.1 before 0, as the names sort as strings)."""
  result = fa.simulate(algorithm="fedprox", sweep={"mu": [1, 0.1, 0]}, **SMALL)
  assert list(result.runs) == [f"fedprox/mu={m}_seed=0" for m in ("0", "0.1", "1")]
  mus = [r["mu"] for r in result.to_records()]
  assert mus == sorted(mus) and sorted(set(mus)) == [0, 0.1, 1]
  assert [r[1] for r in table_rows(result.table(), "fedprox")] == ["0", "0.1", "1"]


def test_a_mu_sweep_over_fedavg_and_fedprox_runs_fedavg_once(capsys):
  """FedAvg reads no ``mu``: a ``mu`` sweep over ``fedavg,fedprox`` runs it once per seed,
  not once per value, says so once, and leaves its ``mu`` empty; FedProx's runs carry
  theirs. FedProx at mu = 0 is FedAvg, so its row there equals FedAvg's."""
  result = fa.simulate(algorithm="fedavg,fedprox", sweep={"mu": [0, 0.5]},
                       **dict(SMALL, quiet=False))
  out = capsys.readouterr().out
  assert out.count("fedavg does not use mu") == 1, out
  assert list(result.runs) == ["fedavg/seed=0", "fedprox/mu=0_seed=0", "fedprox/mu=0.5_seed=0"]
  records = result.to_records()
  assert all("mu" not in r for r in records if r["algorithm"] == "fedavg")
  assert {r["mu"] for r in records if r["algorithm"] == "fedprox"} == {0, 0.5}
  table = result.table()
  (fedavg,) = table_rows(table, "fedavg")
  prox = table_rows(table, "fedprox")
  assert fedavg[1] == "–" and [r[1] for r in prox] == ["0", "0.5"]
  assert fedavg[2:5] == prox[0][2:5]


def test_which_swept_names_an_algorithm_uses_is_read_from_its_functions():
  """Not a list of names: the hyper-parameters an algorithm's traced functions read, its
  own declared ones, and the engine's fields (lr, delay fraction) for all. An algorithm of
  the user's that reads ``mu`` is swept over it like FedProx."""
  cfg = config_lib.RunConfig()
  names = ["lr", "mu", "rho", "alpha", "delay_fraction", "beta"]
  assert sweep.used_names(cfg, "fedavg", names) == ["lr", "delay_fraction"]
  assert sweep.used_names(cfg, "fedprox", names) == ["lr", "mu", "delay_fraction"]
  assert sweep.used_names(cfg, "fedadmm", names) == ["lr", "rho", "delay_fraction"]
  assert sweep.used_names(cfg, "pafed", names) == ["lr", "rho", "alpha", "delay_fraction"]

  def penalty(w, w_start, client_state, hp):
    del client_state
    return 0.25 * hp["mu"] * ((w - w_start) ** 2).sum()

  fa.algorithms.register(dataclasses.replace(
      fa.algorithms.get("fedavg"), name="records_prox", local_penalty=penalty,
      hparams=(fa.algorithms.base.HParam("beta", 1.0),)), replace=True)
  assert sweep.used_names(cfg, "records_prox", names) == ["lr", "mu", "delay_fraction", "beta"]
  with pytest.raises(config_lib.ConfigError, match=r"sweep\['betta'\].*no algorithm"):
    fa.simulate(algorithm="fedavg", sweep={"betta": [1, 2]}, **SMALL)


def test_fededs_records_carry_algorithm_seed_and_setting_and_its_table_groups_seeds(
    tmp_path):
  """FedEDS: every record holds ``algorithm``, ``seed`` and the grid's alpha and K; two
  seeds' runs of one configuration tabulate as mean ± std (2) of their final accuracies."""
  summaries, records = [], []
  for seed in (0, 1):
    res = fa.simulate(fededs_config.FedEDSRunConfig().replace(
        **{**fededs_config.QUICK, "variants": "base", "rounds": 1, "train_subset": 200,
           "test_subset": 100, "privacy": False, "utility_epochs": 0, "seed": seed,
           "output_dir": str(tmp_path / f"seed{seed}")}))
    records += res.to_records()
    summaries += res.summaries()
  assert {(r["algorithm"], r["seed"], r["alpha"], r["num_clients"]) for r in records} == {
      ("fedavg/base", s, 0.1, 5) for s in (0, 1)}
  table = fededs_report.table(summaries, 0.6)
  (row,) = [r for r in table_rows(table, "0.1")]
  finals = [100 * a for a in last_accuracy(records)]
  assert len(finals) == 2 and row[3] == cell(finals, ".2f"), (row, finals)
  assert re.search(r"sample std \(ddof 1\)", table)


def test_the_command_line_sweep_also_runs_fedavg_once_over_mu(tmp_path, capsys):
  """experiments/sweep.py's grid (``sweep.run_grid``) by the same rule: FedAvg's one run
  (``runs/fedavg/seed=0``), "–" in its ``mu`` cell of aggregate.md, a dashed level in the
  figure; FedProx's values in numeric order."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import experiment  # pylint: disable=g-import-not-at-top
  base = config_lib.RunConfig().replace(
      algorithm="fedavg,fedprox", num_clients=10, rounds=1, output_dir=str(tmp_path),
      checkpoint_every=0, tensorboard=False, quiet=True)
  cfgs = sweep.grid(base, {"mu": [0.5, 0.0]})
  md = sweep.run_grid(base, cfgs, ["mu"], experiment.load_data(base), jax.devices()[:1], 1)
  assert capsys.readouterr().out.count("[fedavg] does not use mu") == 1
  assert sorted(p.name for p in (tmp_path / "runs" / "fedavg").iterdir()) == ["seed=0"]
  assert [r[1] for r in table_rows(md, "fedavg")] == ["–"]
  assert [r[1] for r in table_rows(md, "fedprox")] == ["0", "0.5"]
  assert (tmp_path / "aggregate.png").read_bytes()[:4] == b"\x89PNG"
