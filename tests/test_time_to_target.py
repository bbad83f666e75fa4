"""Time to target and a simulated-time budget: ``run.target_accuracy`` (the virtual clock:
virtual time, server updates and arrivals at the first evaluation with test accuracy >= a;
the round engine: rounds) and ``clock.time_budget`` (every run stops at simulated second
T; the accuracy at T). The expectations are computed here from a run's own rows."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async.asynchronous import report
from fedjax_async.asynchronous import virtual_clock as vc

import run_script

# a tiny clock (6 clients, 2 in flight, one arrival a group) and its comparison
CLOCK = dict(algorithm="fedasync,fedbuff", num_clients=6, concurrency=2, num_updates=20,
             buffer_k=2, eval_every=2, group_size=1, quiet=True)
FLOAT_KEYS = ("train_loss", "delta_norm", "test_accuracy", "test_loss", "virtual_time")


def first_at_or_above(rows, target):
  """The first row whose test accuracy is >= target, else None (written out here)."""
  for r in rows:
    if r["test_accuracy"] is not None and r["test_accuracy"] >= target:
      return r
  return None


def last_evaluated_by(rows, budget):
  accs = [r["test_accuracy"] for r in rows
          if r["test_accuracy"] is not None and r["virtual_time"] <= budget]
  return accs[-1]


# ------------------------------------------------------------------ the schedule cut at T


@pytest.mark.parametrize("buffer_k", [1, 3])
def test_a_time_budget_keeps_the_arrivals_up_to_t_of_the_schedule_without_it(buffer_k):
  counts = np.array([12, 7, 10, 12, 5, 9, 3, 8])
  full = vc.ClockConfig(concurrency=3, num_updates=40, buffer_k=buffer_k,
                        compute=vc.Distribution("lognormal", 0.01, 0.5),
                        comm=vc.Distribution("constant", 0.05))
  whole = vc.draw_schedule(full, counts, seed=3)
  budget = float(whole.time[17] + whole.time[18]) / 2  # between the 18th and 19th arrival
  cut = vc.draw_schedule(dataclasses.replace(full, time_budget=budget), counts, seed=3)
  assert len(cut.client) == 18 and cut.stopped_at_budget and not whole.stopped_at_budget
  for field in ("client", "dispatch_version", "dispatch_index", "arrival_version", "time",
                "dropped", "applies"):
    np.testing.assert_array_equal(getattr(cut, field), getattr(whole, field)[:18])
  assert cut.num_updates == int(whole.applies[:18].sum())
  assert cut.summary()["server_updates"] == cut.num_updates
  assert cut.in_flight_at_end == 3  # the clients still training at T
  # a budget past the run's end changes nothing; one before the first arrival is refused
  late = vc.draw_schedule(dataclasses.replace(full, time_budget=1e9), counts, seed=3)
  np.testing.assert_array_equal(late.time, whole.time)
  assert not late.stopped_at_budget and late.num_updates == 40
  with pytest.raises(ValueError, match=r"^clock.time_budget: 1e-06 s ends before the first "
                     r"arrival \(at "):
    vc.draw_schedule(dataclasses.replace(full, time_budget=1e-6), counts, seed=3)


# ------------------------------------------------------------------ summaries, by hand


def rows_of(accs, times):
  """Rows of a FedAsync run without drops: arrival i is event i at version i."""
  return [{"event": i, "arrival_version": i, "virtual_time": t, "test_accuracy": a}
          for i, (a, t) in enumerate(zip(accs, times))]


def test_the_target_is_met_at_the_first_evaluation_at_or_above_it():
  rows = rows_of([None, 0.3, None, 0.5, 0.7, 0.5], [0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
  s = report.target_summary(rows, 6, 0.5)
  # row 3 equals the target: reached there (>=), not at row 4 (>)
  assert s == {"target_accuracy": 0.5, "time_to_target_s": 2.0, "updates_to_target": 4,
               "arrivals_to_target": 4}
  assert report.target_summary(rows, 6, 0.71)["time_to_target_s"] is None
  assert report.target_summary(rows, 6, 0.71)["updates_to_target"] is None
  last = report.target_summary(rows, 6, 0.6)  # at the last-but-one row
  assert last["time_to_target_s"] == 2.5 and last["updates_to_target"] == 5
  # at the last row, the run's own server updates; the arrivals count the dropped ones
  dropped = [dict(r, event=r["event"] + 2) for r in rows]
  end = report.target_summary(dropped[:5], 5, 0.7)
  assert end["updates_to_target"] == 5 and end["arrivals_to_target"] == 7
  # FedBuff (K = 2): the updates made by the time of a row, from the next row's version
  buffered = [dict(r, arrival_version=i // 2) for i, r in enumerate(rows)]
  assert report.target_summary(buffered, 3, 0.5)["updates_to_target"] == 2
  # the accuracy at T: the last evaluation at or before T
  assert report.target_summary(rows, 6, 0, 2.4)["accuracy_at_budget"] == 0.5
  assert report.target_summary(rows, 6, 0, 2.5)["accuracy_at_budget"] == 0.7
  assert report.target_summary(rows, 6, 0, 0.9)["accuracy_at_budget"] is None
  assert report.target_summary(rows, 6, 0, 0) == {}
  assert metrics_lib.first_reaching(rows, 0.5) == 3


def summary(run, final, **extra):
  return {"run": run, "final_accuracy": final, "best_accuracy": final, "arrivals": 10,
          "server_updates": 10, "mean_staleness": 1.0, "updates_per_virtual_second": 2.0,
          "wall_time_s": 1.0, **extra}


def test_the_clock_tables_show_the_target_and_budget_columns():
  reached = dict(target_accuracy=0.6, time_to_target_s=3.25, updates_to_target=7,
                 arrivals_to_target=8, time_budget_s=4.0, accuracy_at_budget=0.65,
                 stopped_at_budget=True)
  missed = dict(reached, time_to_target_s=None, updates_to_target=None,
                arrivals_to_target=None, accuracy_at_budget=0.55, stopped_at_budget=False)
  table = report.clock_table([summary("fedasync", 0.65, **reached),
                              summary("fedbuff", 0.55, **missed)])
  lines = table.splitlines()
  assert lines[0] == ("| run | final acc | best acc | time to 0.6 (virtual s) | updates to "
                      "0.6 | arrivals to 0.6 | acc at 4 virtual s | arrivals | server "
                      "updates | mean staleness | upd/virtual s | eps spent | wall s |")
  assert lines[1].count("---") == 13
  assert lines[2].startswith("| fedasync | 0.6500 | 0.6500 | 3.25 | 7 | 8 | 0.6500 | 10 |")
  assert lines[3].startswith("| fedbuff | 0.5500 | 0.5500 | not reached | not reached | "
                             "not reached | 0.5500 | 10 |")
  assert "fedbuff ended before it, at num_updates" in table
  diverged = report.clock_table([summary("fedasync", 0.65, **reached)], {"x": "group 3: nan"})
  assert diverged.splitlines()[2].count(" – |") == 11
  # without the options: the table as before
  assert "time to" not in report.clock_table([summary("fedasync", 0.6)])
  # over seeds: the mean ± sample std over those that reached it, the others counted
  by_seed = {0: [summary("fedasync", 0.65, **reached)],
             1: [summary("fedasync", 0.6, **dict(reached, time_to_target_s=4.25,
                                                  updates_to_target=9,
                                                  accuracy_at_budget=0.6))],
             2: [summary("fedasync", 0.55, **missed)]}
  row = [l for l in report.seed_table(by_seed).splitlines() if l.startswith("| fedasync")][0]
  cells = [c.strip() for c in row.split("|")[1:-1]]
  times, updates = np.array([3.25, 4.25]), np.array([7, 9])
  accs = np.array([0.65, 0.6, 0.55])
  assert cells[3] == f"{times.mean():.2f} ± {times.std(ddof=1):.2f} (2), 1 not reached"
  assert cells[4] == f"{updates.mean():.1f} ± {updates.std(ddof=1):.1f} (2), 1 not reached"
  assert cells[6] == f"{accs.mean():.4f} ± {accs.std(ddof=1):.4f} (3)"
  only = {0: [summary("fedasync", 0.55, **missed)], 1: [summary("fedasync", 0.5, **missed)]}
  assert "| not reached | not reached | not reached |" in report.seed_table(only)
  assert outputs.reach_cell([None, 12, None], integer=True) == "12, 2 not reached"


# ------------------------------------------------------------------ runs


def test_a_budgeted_clock_run_is_the_run_without_it_cut_at_t_and_reports_from_its_rows(
    tmp_path):
  whole = fa.simulate(fa.AsyncRunConfig(), **CLOCK)
  fa_rows = whole.runs["fedasync"].rows
  budget = (fa_rows[9]["virtual_time"] + fa_rows[10]["virtual_time"]) / 2
  target = max(r["test_accuracy"] for r in fa_rows[:10] if r["test_accuracy"] is not None)
  out = tmp_path / "budget"
  result = fa.simulate(fa.AsyncRunConfig(), **CLOCK, time_budget=budget,
                       target_accuracy=target, seeds="0,1", output_dir=str(out))
  for name, run in result.by_seed[0].items():
    rows, s = run.rows, run.summary
    kept = [r for r in whole.runs[name].rows if r["virtual_time"] <= budget]
    assert len(rows) == len(kept) and rows and s["stopped_at_budget"]
    for got, want in zip(rows[:-1], kept):  # the same arrivals, the same training
      for k, v in want.items():
        if k in FLOAT_KEYS and v is not None:
          np.testing.assert_allclose(got[k], v, rtol=1e-5, err_msg=k)
        elif k != "wall_time":
          assert got[k] == v, k
    assert rows[-1]["test_accuracy"] is not None  # the model at T is evaluated
    assert s["accuracy_at_budget"] == last_evaluated_by(rows, budget) == rows[-1][
        "test_accuracy"] == s["final_accuracy"]
    assert s["time_budget_s"] == budget and s["target_accuracy"] == target
    hit = first_at_or_above(rows, target)
    if name == "fedasync":  # its accuracies up to T are those of the run without T
      assert hit is not None
    if hit is None:
      assert s["time_to_target_s"] is s["updates_to_target"] is s["arrivals_to_target"] is None
    else:
      assert s["time_to_target_s"] == hit["virtual_time"]
      assert s["arrivals_to_target"] == hit["event"] + 1  # no drops: its arrivals
      if name == "fedasync":  # every arrival a server update
        assert s["updates_to_target"] == hit["arrival_version"] + 1
      else:  # an update every buffer_k kept arrivals
        assert s["updates_to_target"] == (rows.index(hit) + 1) // CLOCK["buffer_k"]
  table = (out / "comparison.md").read_text()
  assert f"| time to {target:g} (virtual s) |" in table
  assert f"| acc at {budget:g} virtual s |" in table
  assert "mean ± std over the seeds that reached it" in table
  for name in ("fedasync", "fedbuff"):
    runs = [result.by_seed[sd][name].summary for sd in (0, 1)]
    row = [l for l in table.splitlines() if l.startswith(f"| {name} |")][0]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    accs = np.array([r["accuracy_at_budget"] for r in runs])
    assert cells[6] == f"{accs.mean():.4f} ± {accs.std(ddof=1):.4f} (2)"
    times = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    if len(times) == 2:
      assert cells[3] == f"{np.mean(times):.2f} ± {np.std(times, ddof=1):.2f} (2)"
    elif len(times) == 1:
      assert cells[3] == f"{times[0]:.2f}, 1 not reached"
    else:
      assert cells[3] == "not reached"
  # another target reads the finished runs back (the target changes no row), re-targeted
  assert all(r["test_accuracy"] is None or r["test_accuracy"] < 1
             for run in result.by_seed[0].values() for r in run.rows)
  again = fa.simulate(fa.AsyncRunConfig(), **CLOCK, time_budget=budget, target_accuracy=1.0,
                      seeds="0,1", output_dir=str(out), resume=True)
  for sd in (0, 1):
    for name, run in again.by_seed[sd].items():
      assert run.state is None and run.rows == result.by_seed[sd][name].rows  # read back
      assert run.summary["time_to_target_s"] is None and run.summary["target_accuracy"] == 1
      stored = json.loads((out / f"seed{sd}" / name / "summary.json").read_text())
      assert stored["target_accuracy"] == 1 and stored["updates_to_target"] is None
  assert "| not reached | not reached | not reached |" in again.table()


def test_the_cli_takes_both_flags_and_the_round_engine_counts_rounds_to_target(tmp_path):
  out = subprocess.run(
      [sys.executable, run_script.RUN, "--algorithm=fedasync,fedbuff", "--num_clients=6",
       "--concurrency=2", "--num_updates=6", "--buffer_k=2", "--eval_every=2",
       "--time_budget=1e9", "--target_accuracy=0.01", f"--output_dir={tmp_path / 'clock'}"],
      env=run_script.env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  table = (tmp_path / "clock" / "comparison.md").read_text()
  assert "| time to 0.01 (virtual s) |" in table and "| acc at 1e+09 virtual s |" in table
  assert "fedasync, fedbuff ended before it, at num_updates" in table  # they came first
  assert "before clock.time_budget" not in out.stderr and "before --time_budget" in out.stderr
  s = json.loads((tmp_path / "clock" / "fedasync" / "summary.json").read_text())
  assert s["updates_to_target"] == 2 and not s["stopped_at_budget"]  # the first evaluation
  # the round engine: the rounds to the target, in its summaries and table
  rounds = fa.simulate(algorithm="fedavg,fedprox", rounds=3, num_clients=6, participation=0.5,
                       target_accuracy=0.01)
  for run in rounds.runs.values():
    assert run.summary["rounds_to_target"] == first_at_or_above(run.rows, 0.01)["round"] == 1
  assert "| rounds to 0.01 |" in rounds.table() and "| 1 |" in rounds.table()
  # seeds (one vmapped computation): each seed's summary, the table over them
  never = fa.simulate(algorithm="fedavg", rounds=2, num_clients=6, participation=0.5,
                      seeds=[0, 1], target_accuracy=1.0)
  assert [s["rounds_to_target"] for s in never.summaries()] == [None, None]
  assert "| not reached |" in never.table()
  with pytest.raises(ValueError, match="run.target_accuracy: must be in"):
    fa.simulate(algorithm="fedavg", rounds=1, target_accuracy=1.5)
  with pytest.raises(ValueError, match="clock.time_budget: must be >= 0"):
    fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", time_budget=-1.0)
