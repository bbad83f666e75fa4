"""The committed result tables rebuilt from the stored runs: each experiment folder under
experiments/results keeps its runs as one table (``runs.jsonl``, ``fedjax_async.results_table``)
and every table made from them (``table.md``, ``comparison.md``, ``aggregate.md``,
``shared.md``, ``table_v.md``) equals what its driver's own functions make of those rows;
packing gives every run file back byte for byte, and the drivers read a packed folder."""

import importlib.util
import json
import os
import shutil
import sys

import pytest

from fedjax_async import config as config_lib
from fedjax_async import outputs
from fedjax_async import results_table
from fedjax_async.asynchronous import experiment as async_experiment
from fedjax_async.asynchronous import report as async_report
from fedjax_async.asynchronous.config import AsyncRunConfig
from fedjax_async.fededs import report as fededs_report
from fedjax_async.sweeps import store as sweep_store
from fedjax_async.sweeps import sweep
import run_script

RESULTS = os.path.join(run_script.ROOT, "experiments", "results")


def folders(marker):
  return sorted(d for d in os.listdir(RESULTS) if os.path.exists(os.path.join(RESULTS, d,
                                                                             marker)))


def text(path):
  with open(path) as f:
    return f.read()


def pafed_table():
  """experiments/pafed_table.py as a module, loaded once per process (it defines flags)."""
  for name in ("pafed_table_module", "pafed_table"):
    if name in sys.modules:  # (under both names: benchmarks/table_v.py reads pafed_table)
      sys.modules["pafed_table_module"] = sys.modules["pafed_table"] = sys.modules[name]
      return sys.modules[name]
  spec = importlib.util.spec_from_file_location(
      "pafed_table_module", os.path.join(run_script.ROOT, "experiments", "pafed_table.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules["pafed_table_module"] = sys.modules["pafed_table"] = module
  spec.loader.exec_module(module)
  return module


# ------------------------------------------------------------------ PAFed's Table V


def pafed_markdown(src: str, out_dir: str) -> str:
  """table.md of the packed folder ``src`` as ``pafed_table.py --read_only`` makes it, the
  runs read from a copy of its runs.jsonl alone in ``out_dir`` (the settings of
  table.json: the preset's name and the run flags)."""
  pt = pafed_table()
  os.makedirs(out_dir, exist_ok=True)
  shutil.copy(os.path.join(src, results_table.FILE), out_dir)
  with open(os.path.join(src, "table.json")) as f:
    saved = json.load(f)
  lines = results_table.runs(out_dir)
  base = config_lib.RunConfig.from_flat(dict(saved["run_config"], output_dir=out_dir))
  partitions = [p for p in ("iid", "shards", "dirichlet")
                if any(line["path"].startswith(p + "/") for line in lines)]
  deltas_of = {p: sorted({line["delay_fraction"] for line in lines
                          if line["path"].startswith(p + "/")}) for p in partitions}
  opts = pt.TableOptions(config=saved["config"], num_seeds=saved["num_seeds"], read_only=True,
                         test_subset=lines[0]["summary"]["config"].get("test_subset", 0))
  algs = base.algorithm.name_list()
  results = pt.run_table_grid(base, opts, partitions, deltas_of, algs)
  assert sorted(results) == sorted((p, a) for p in partitions for a in algs)
  return pt.markdown_table(pt.table_rows(results, partitions, algs), algs,
                           pt.header_for(base, opts)) + "\n"


@pytest.mark.parametrize("name", folders("table.json"))
def test_pafed_table_read_only_rebuilds_the_committed_table_from_runs_jsonl(name, tmp_path):
  src = os.path.join(RESULTS, name)
  assert pafed_markdown(src, str(tmp_path / name)) == text(os.path.join(src, "table.md"))
  assert os.path.isfile(tmp_path / name / "shards" / "runs" / "pafed" /
                        "delay_fraction=0.7_seed=1" / "summary.json")  # unpacked to read


def test_a_changed_stored_number_changes_the_rebuilt_table(tmp_path):
  src = tmp_path / "planted"
  src.mkdir()
  shutil.copy(os.path.join(RESULTS, "pafed_table_reduced", "table.json"), src)
  lines = results_table.read(os.path.join(RESULTS, "pafed_table_reduced"))
  for line in lines:  # one accuracy of one run
    if line["path"] == "shards/runs/fedavg/delay_fraction=0.7_seed=1":
      line["rows"][-1]["test_accuracy"] -= 0.05
  with open(src / results_table.FILE, "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
  committed = text(os.path.join(RESULTS, "pafed_table_reduced", "table.md"))
  assert pafed_markdown(str(src), str(tmp_path / "out")) != committed


# ------------------------------------------------------------------ sweeps, virtual clock


@pytest.mark.parametrize("name", folders("aggregate.md"))
def test_a_sweeps_aggregate_is_rebuilt_from_runs_jsonl(name, tmp_path):
  src = os.path.join(RESULTS, name)
  with open(os.path.join(src, "sweep.json")) as f:
    names = json.load(f)["names"]
  summaries = [line["summary"] for line in results_table.runs(src)]
  rows = sweep_store.aggregate(summaries, names)
  assert sweep_store.write_aggregate(rows, names, str(tmp_path)) + "\n" == text(
      os.path.join(src, "aggregate.md"))
  assert text(tmp_path / "aggregate.csv") == text(os.path.join(src, "aggregate.csv"))


def comparison(lines) -> str:
  """comparison.md of one invocation's runs, as ``async_experiment.run_virtual_clock``
  makes it: each seed's runs in the order of ``run_list``, mean ± std over several
  seeds."""
  config = lines[0]["summary"]["config"]
  cfg = AsyncRunConfig().replace(algorithm=config["algorithm"], mix_alpha=config["mix_alpha"])
  order = [r for r, _, _ in async_experiment.run_list(cfg, config["algorithm"].split(","))]
  by_seed = {}
  for line in sorted(lines, key=lambda l: (l["seed"], order.index(l["run"]))):
    by_seed.setdefault(line["seed"], []).append(line["summary"])
  if len(by_seed) > 1:
    return async_report.seed_table(by_seed) + "\n"
  return async_report.clock_table(next(iter(by_seed.values()))) + "\n"


def comparisons():
  out = []
  for name in folders(results_table.FILE):
    lines = results_table.runs(os.path.join(RESULTS, name))
    if "arrivals" not in lines[0]["summary"]:  # not the virtual clock's
      continue
    groups = {}
    for line in lines:  # the invocation's folder: above seed<s>/ and <run>/
      parts = line["path"].split("/")
      groups.setdefault("/".join(p for p in parts[:-1] if not p.startswith("seed")),
                        []).append(line)
    out += [(name, sub, group) for sub, group in sorted(groups.items())]
  return out


COMPARISONS = comparisons()


@pytest.mark.parametrize("name,sub,lines", COMPARISONS,
                         ids=[f"{n}/{s}" for n, s, _ in COMPARISONS])
def test_each_virtual_clock_comparison_is_rebuilt_from_runs_jsonl(name, sub, lines):
  assert comparison(lines) == text(os.path.join(RESULTS, name, sub, "comparison.md"))


def test_every_comparison_is_checked_and_a_changed_number_is_seen():
  found = {os.path.relpath(os.path.join(d, "comparison.md"), RESULTS)
           for d, _, names in os.walk(RESULTS) if "comparison.md" in names}
  assert found == {os.path.join(n, s, "comparison.md") for n, s, _ in COMPARISONS}
  assert len(found) == 15
  name, sub, lines = COMPARISONS[0]
  planted = json.loads(json.dumps(lines))
  planted[0]["summary"]["final_accuracy"] += 0.01
  assert comparison(planted) != text(os.path.join(RESULTS, name, sub, "comparison.md"))


# ------------------------------------------------------------------ FedEDS


def fededs_results(src):
  """The grid's results in its order (alpha, K, base, variant as flags.json lists them):
  each run's stored result, or where the runs are not stored, recomputed from rows.jsonl
  (``fededs_report.run_result``)."""
  with open(os.path.join(src, "flags.json")) as f:
    saved = json.load(f)
  keys = ("alpha", "num_clients", "base", "variant")
  runs = results_table.runs(src)
  if runs:
    results = [line["summary"]["result"] for line in runs]
  else:
    rows = {}
    for r in map(json.loads, text(os.path.join(src, "rows.jsonl")).splitlines()):
      rows.setdefault(tuple(r[k] for k in keys), []).append(r)
    results = [{**dict(zip(keys, k)), **fededs_report.run_result(v, saved["target_accuracy"])}
               for k, v in rows.items()]
  grid = [str(saved[k]).split(",") for k in ("alphas", "num_clients", "bases", "variants")]
  return sorted(results, key=lambda r: tuple(
      g.index(f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]))
      for g, k in zip(grid, keys))), saved["target_accuracy"]


@pytest.mark.parametrize("name", folders("flags.json"))
def test_fededs_tables_are_rebuilt_from_the_stored_runs(name, tmp_path):
  src = os.path.join(RESULTS, name)
  results, target = fededs_results(src)
  fededs_report.write_tables(results, str(tmp_path), target, echo=False)
  for table in ("table.md", "table.csv"):  # (table.csv: where the runs, with their
    if os.path.exists(os.path.join(src, table)):  # wall seconds, are stored)
      assert text(tmp_path / table) == text(os.path.join(src, table)), table
  if results_table.runs(src):  # the shared sets' table from the packed shared.json
    shutil.copy(os.path.join(src, results_table.FILE), tmp_path)
    results_table.unpack(str(tmp_path))
    fededs_report.write_shared(str(tmp_path))
    assert text(tmp_path / "shared.md") == text(os.path.join(src, "shared.md"))


@pytest.mark.benchmarks  # benchmarks/table_v.py
def test_table_v_is_rebuilt_from_its_rows():
  from benchmarks import table_v  # pylint: disable=g-import-not-at-top
  pafed_table()  # (the module table_v imports, loaded once)
  rows = table_v.read_rows(table_v.ROWS)
  runs = table_v.all_runs(list(table_v.FLAGFILES), {})
  assert table_v.table_markdown(rows, runs) == text(
      os.path.join(RESULTS, "pafed_table_paper", "table_v.md"))


# ------------------------------------------------------------------ packing


def write_tiny(folder):
  """Two runs of a sweep (a NaN, an Infinity, nested folders), a JSON file beside them
  and a table at the top."""
  for seed in (0, 1):
    rows = [{"round": 1, "test_accuracy": 0.5 + seed, "train_loss": float("nan")},
            {"round": 2, "test_accuracy": None, "train_loss": float("inf")}]
    sweep_store.write_run(os.path.join(folder, "runs", "pafed", f"lr=0.1_seed={seed}"), rows,
                          {"algorithm": "pafed", "setting": {"lr": 0.1}, "final_accuracy": 0.5,
                           "config": {"seed": seed, "lr": 0.1}})
  with open(os.path.join(folder, "runs", "shared.json"), "w") as f:
    json.dump({"loss": [1.5, 0.25]}, f, indent=2)
  with open(os.path.join(folder, "table.md"), "w") as f:
    f.write("| a |\n")


def snapshot(folder):
  out = {}
  for d, _, names in os.walk(folder):
    for n in names:
      with open(os.path.join(d, n), "rb") as f:
        out[os.path.relpath(os.path.join(d, n), folder)] = f.read()
  return out


def test_pack_then_unpack_gives_every_run_file_back_byte_for_byte(tmp_path):
  write_tiny(str(tmp_path))
  before = snapshot(str(tmp_path))
  results_table.pack(str(tmp_path), remove=True)
  assert sorted(snapshot(str(tmp_path))) == [results_table.FILE, "table.md"]
  lines = results_table.runs(str(tmp_path))
  assert [(l["path"], l["algorithm"], l["seed"], l["lr"]) for l in lines] == [
      ("runs/pafed/lr=0.1_seed=0", "pafed", 0, 0.1), ("runs/pafed/lr=0.1_seed=1", "pafed", 1, 0.1)]
  assert lines[1]["rows"][0]["test_accuracy"] == 1.5
  assert results_table.unpack(str(tmp_path)) == 5
  after = snapshot(str(tmp_path))
  del after[results_table.FILE]
  assert after == before
  # a driver's folder below the packed one: only its own runs come back, the missing ones
  os.remove(tmp_path / "runs" / "pafed" / "lr=0.1_seed=1" / "metrics.jsonl")
  assert results_table.unpack_missing(str(tmp_path / "runs" / "pafed" / "lr=0.1_seed=1")) == 1
  assert results_table.unpack_missing(str(tmp_path / "runs" / "pafed")) == 0
  again = snapshot(str(tmp_path))
  del again[results_table.FILE]
  assert again == before


def test_a_changed_byte_is_caught_by_the_round_trip_check(tmp_path, monkeypatch):
  write_tiny(str(tmp_path))
  monkeypatch.setattr(results_table, "metrics_text",
                      lambda rows: "".join(json.dumps(r) + " \n" for r in rows))
  monkeypatch.setattr(results_table, "run_line", lambda folder, rel: dict(
      {k: v for k, v in RUN_LINE(folder, rel).items() if k != "text"}))
  with pytest.raises(ValueError, match="would not come back byte for byte"):
    results_table.pack(str(tmp_path))


RUN_LINE = results_table.run_line


def test_the_drivers_read_a_packed_folder(tmp_path):
  """outputs.prepare_output_dir (sweeps, the virtual clock, experiments/run.py) writes a
  packed folder's runs back before it looks for them: with output.resume they are read
  back; without, the folder is refused as holding a run, as the unpacked one is; with
  output.overwrite they are deleted, runs.jsonl too."""
  write_tiny(str(tmp_path))
  results_table.pack(str(tmp_path), remove=True)
  with pytest.raises(ValueError, match="already holds a run"):
    outputs.prepare_output_dir(str(tmp_path), False, False, sweep.SWEEP_OUTPUTS)
  outputs.prepare_output_dir(str(tmp_path), True, False, sweep.SWEEP_OUTPUTS)
  stored = sweep_store.read_stored_run(str(tmp_path / "runs" / "pafed" / "lr=0.1_seed=0"),
                                       {"seed": 0, "lr": 0.1})
  assert stored[0]["final_accuracy"] == 0.5 and stored[2] == []
  outputs.prepare_output_dir(str(tmp_path), False, True, sweep.SWEEP_OUTPUTS)
  assert sorted(os.listdir(tmp_path)) == ["table.md"]  # the runs, packed and not, deleted


def test_a_runs_jsonl_that_is_no_packed_table_is_named_in_one_line(tmp_path):
  (tmp_path / results_table.FILE).write_text('{"x": 1}\n')
  with pytest.raises(ValueError, match=rf"^{tmp_path}/runs.jsonl: line 1 is no packed file"):
    results_table.unpack_missing(str(tmp_path / "run"))


def test_pafed_remedies_table_is_its_runs_and_counts_the_diverged_one():
  """experiments/results/pafed_remedies_cpu/table.md: every finished run's final and
  last-10 accuracy from runs.jsonl, the diverged run a row with the round its log names."""
  folder = os.path.join(RESULTS, "pafed_remedies_cpu")
  stored = {r["path"]: r["summary"] for r in results_table.runs(folder)}
  lines = open(os.path.join(folder, "table.md")).read().splitlines()[2:]
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  assert len(cells) == 9 and len(stored) == 8
  for remedy, seed, final, last10, diverged, _ in cells:
    run = f"{remedy}_s{seed}"
    if run in stored:
      assert (final, last10, diverged) == (f"{stored[run]['final_accuracy']:.3f}",
                                           f"{stored[run]['last10_mean_accuracy']:.3f}", "no")
    else:
      log = open(os.path.join(folder, run + ".log")).read()
      assert (final, last10) == ("—", "—")
      assert f"error: diverged: algorithm pafed: {diverged}:" in log
