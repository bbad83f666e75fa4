"""The Table V job across device leases (``benchmarks/table_v.py``): its order of runs, its
computations sized by a cost model from the timings so far, and a CPU dry run at toy size
that plans computations, writes one row per run, skips them on the next call and folds a
lease's rows into the committed ones."""

import json
import os
import subprocess
import sys
import types

import pytest

from benchmarks import table_v
import run_script

pytestmark = pytest.mark.benchmarks  # benchmarks/table_v.py

SCRIPT = os.path.join(run_script.ROOT, "benchmarks", "table_v.py")
PAPER = "experiments/flags/pafed_table_paper.flags"


def _run(name, group, delta=0.0, seed=0):
  cfg = types.SimpleNamespace(local=types.SimpleNamespace(precision="float32"))
  return table_v.Run("paper", "shards", group, delta, seed, seed, cfg, {}, name, "c")


def test_a_call_takes_the_longest_prefix_whose_computations_fit_one_per_group():
  a1, a2, b1, a3, b2 = (_run("a1", "A"), _run("a2", "A", 0.7), _run("b1", "B"),
                        _run("a3", "A", 0.3), _run("b2", "B", 0.7))
  pending = [a1, a2, b1, a3, b2]
  model = table_v.CostModel(overhead_s=10.0, per_run_s=5.0)
  # by hand, x1.25: A's three runs 1.25 * (10 + 15) = 31.25 s, B's one 18.75 s: 50 s;
  # all five, 31.25 + 1.25 * (10 + 10) = 56.25 s
  assert table_v.plan(pending, 55.0, model, 20) == [[a1, a2, a3], [b1]]
  assert table_v.plan(pending, 56.25, model, 20) == [[a1, a2, a3], [b1, b2]]
  # at most 2 a computation: a1..b1 as [a1, a2] [b1], 25 + 18.75 = 43.75 s; with a3 too,
  # [a1, a2] [a3] [b1], 62.5 s
  assert table_v.plan(pending, 56.25, model, 2) == [[a1, a2], [b1]]
  assert table_v.plan(pending, 40.0, model, 2) == [[a1, a2]]
  assert table_v.plan(pending, 55.0, model, 20, max_runs=2) == [[a1, a2]]
  assert table_v.plan(pending, 10.0, model, 20) == []  # not even one run fits
  assert table_v.plan(pending, 1.0, None, 20) == [[a1]]  # no timing yet: one run, timed
  assert table_v.plan([], 100.0, model, 20) == []


def test_the_cost_model_is_fitted_to_the_computations_timed():
  m = table_v.fit([(1, 12.0), (3, 18.0)])  # 9 s + 3 s per run
  assert (round(m.overhead_s, 6), round(m.per_run_s, 6)) == (9.0, 3.0)
  m = table_v.fit([(2, 10.0), (2, 14.0)])  # one size: no overhead, the slowest per run
  assert (m.overhead_s, m.per_run_s) == (0.0, 7.0)
  m = table_v.fit([(1, 20.0), (4, 8.0)])  # more runs took less time: no fit, the slowest
  assert (m.overhead_s, m.per_run_s) == (0.0, 20.0)
  assert table_v.fit([]) is None


def _job(*args, timeout=300):
  return subprocess.run([sys.executable, SCRIPT, *args], env=run_script.env(),
                        capture_output=True, text=True, timeout=timeout, cwd=run_script.ROOT)


def test_the_runs_go_first_seed_non_iid_0_and_07_then_other_rows_then_seeds_paper_first(
    tmp_path):
  # both flag files, the paper's configuration; no rows yet (the committed rows would be
  # skipped)
  proc = _job("--plan_only", f"--rows={tmp_path / 'rows.jsonl'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l.split(": ", 1)[1] for l in proc.stdout.splitlines() if l.startswith("  tier")]
  tiers = [int(l.split()[1].rstrip(":")) for l in proc.stdout.splitlines()
           if l.startswith("  tier")]
  assert len(lines) == 2 * 4 * 5 * 5  # 2 flag files x 4 algorithms x 5 rows x 5 seeds
  assert tiers == sorted(tiers)
  algs = ("fedadmm", "fedavg", "fedprox", "pafed")
  assert lines[:16] == [f"{f} shards {a} δ={d} seed 0" for f in ("pafed_table_paper",
                                                                 "pafed_table_authors")
                        for a in algs for d in ("0", "0.7")]
  second = lines[16:40]
  assert {l.split()[0] for l in second[:12]} == {"pafed_table_paper"}
  assert sorted(tuple(l.split()[1:4]) for l in second[:12]) == sorted(
      (p, a, f"δ={d}") for a in algs for p, d in (("iid", "0"), ("shards", "0.3"),
                                                  ("shards", "0.5")))
  assert all(l.endswith("seed 0") for l in lines[:40])
  assert all(l.endswith(f"seed {1 + i // 40}") for i, l in enumerate(lines[40:]))


TOY = ["--flagfiles=" + PAPER, "--dataset=synthetic", "--model=logreg", "--rounds=2",
       "--num_clients=10", "--local_epochs=1", "--num_seeds=2", "--algorithm=fedavg",
       "--partitions=shards", "--deltas=0,0.7"]


def test_dry_run_plans_computations_writes_rows_and_skips_them_on_the_next_call(tmp_path):
  rows, lease = tmp_path / "rows.jsonl", tmp_path / "lease" / "rows.jsonl"
  first = _job(*TOY, f"--rows={rows}", "--max_runs=2")
  assert first.returncode == 0, first.stderr[-3000:]
  made = run_script.read_rows(rows)
  assert [(r["algorithm"], r["delta"], r["seed"], r["computation_runs"]) for r in made] == [
      ("fedavg", 0.0, 0, 1), ("fedavg", 0.7, 0, 1)]  # the first one alone: the first timing
  assert first.stdout.count("first timing") == 1
  for r in made:
    assert r["flagfile"] == "pafed_table_paper" and r["precision"] == "float32"
    assert r["device_kind"] == "cpu" and r["rounds"] == 2 and r["wall_s"] > 0
    # the curve of each round's test accuracy, and the paper's metric from it: the mean
    # over the (last 10, here both) rounds of the best accuracy so far
    a0, a1 = r["test_accuracy"]
    assert abs(r["average_best_accuracy"] - (a0 + max(a0, a1)) / 2) < 1e-5
    assert abs(r["final_accuracy"] - a1) < 1e-5
  # a lease: reads the committed rows, runs the rest as one computation (timed by the rows)
  second = _job(*TOY, f"--rows={rows}", f"--new_rows={lease}")
  assert second.returncode == 0, second.stderr[-3000:]
  assert "first timing" not in second.stdout and "2 done" in second.stdout
  leased = run_script.read_rows(lease)
  assert [(r["delta"], r["seed"], r["computation_runs"]) for r in leased] == [
      (0.0, 1, 2), (0.7, 1, 2)]
  assert len(run_script.read_rows(rows)) == 2  # the committed file untouched
  # its rows folded in: nothing left to run, the table from all four
  third = _job(*TOY, f"--rows={rows}", f"--add_rows={lease}")
  assert third.returncode == 0, third.stderr[-3000:]
  assert "2 new row(s) appended" in third.stdout and "4 done" in third.stdout
  assert "0 to run" in third.stdout
  assert len(run_script.read_rows(rows)) == 4
  again = _job(*TOY, f"--rows={rows}", f"--add_rows={lease}")
  assert "0 new row(s) appended" in again.stdout and len(run_script.read_rows(rows)) == 4
  table = (tmp_path / "table_v.md").read_text()
  assert "## pafed_table_paper (precision float32): 4 of 4 runs" in table
  assert "| non-IID δ=0 |" in table and "| 0.835 |" in table  # the paper's FedAvg, δ = 0
  assert "Device: cpu" in table


@pytest.mark.parametrize("args,message", [
    (["--time_budget_min=0"], "--time_budget_min: must be > 0"),
    (["--flagfiles=/nonexistent.flags"], "--flagfiles: expected existing flag files"),
])
def test_bad_flags_are_one_line_errors_naming_the_flag(args, message):
  proc = _job(*args, "--only_check_args")
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --") and message in last, proc.stderr[-2000:]
