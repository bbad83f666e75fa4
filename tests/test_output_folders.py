"""Output folders: a previous run of another layout is refused or, with ``overwrite``,
removed whole; a folder in use by another run is refused at once while that run finishes
cleanly; ``fa.load`` reads a CLI run back as the ``Result`` a Python run returns."""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import outputs
import run_script

SMALL = dict(num_clients=6, rounds=3, quiet=True)


def test_a_run_of_another_layout_is_refused_and_overwrite_removes_it(tmp_path):
  out = str(tmp_path / "out")
  comparison = ["comparison.csv", "comparison.md", "curves.png"]
  fa.simulate(algorithm="fedavg,fedprox", output_dir=out, **SMALL)
  assert sorted(os.listdir(out)) == comparison + ["fedavg", "fedprox"]
  with pytest.raises(ValueError) as e:  # one algorithm into the two-algorithm folder
    fa.simulate(algorithm="fedavg", output_dir=out, **SMALL)
  assert str(e.value) == (
      f"output.output_dir: {out} holds a run of another layout (fedprox), which this run "
      "would not replace: pass output.overwrite to delete it, or another output.output_dir")
  with pytest.raises(ValueError, match="another layout"):  # nor continued as one
    fa.simulate(algorithm="fedavg", output_dir=out, resume=True, **SMALL)
  fa.simulate(algorithm="fedavg", output_dir=out, overwrite=True, **SMALL)
  # one algorithm: the same layout as several, its comparison of one row
  assert sorted(os.listdir(out)) == comparison + ["fedavg"]
  assert sorted(os.listdir(os.path.join(out, "fedavg"))) == sorted(
      ["checkpoints", "final_model.npy", "metrics.jsonl", "summary.json", "tb"])
  table = open(os.path.join(out, "comparison.md")).read()
  assert "| fedavg " in table and "fedprox" not in table
  fa.simulate(algorithm="fedavg,fedprox", output_dir=out, overwrite=True, **SMALL)
  assert sorted(os.listdir(out)) == comparison + ["fedavg", "fedprox"]
  mine = tmp_path / "out" / "notes.txt"  # a file no run wrote is never touched
  mine.write_text("mine")
  fa.simulate(algorithm="fedavg", output_dir=out, overwrite=True, **SMALL)
  assert mine.read_text() == "mine"


def test_a_runs_files_at_the_folders_top_are_another_layout(tmp_path):
  """One run's files written straight into the folder (``rounds.experiment.run`` given
  ``out_dir``): refused by a run of the common layout, removed by overwrite."""
  from fedjax_async.rounds import experiment
  out = str(tmp_path / "out")
  cfg = fa.RunConfig().replace(**SMALL)
  experiment.run(cfg, "fedavg", out_dir=out)
  assert {"metrics.jsonl", "summary.json"} <= set(os.listdir(out))
  with pytest.raises(ValueError, match=r"another layout \(checkpoints, final_model.npy, "
                     r"metrics.jsonl, summary.json, tb\)"):
    fa.simulate(algorithm="fedavg", output_dir=out, **SMALL)
  fa.simulate(algorithm="fedavg", output_dir=out, overwrite=True, **SMALL)
  assert sorted(os.listdir(out)) == ["comparison.csv", "comparison.md", "curves.png",
                                     "fedavg"]


HOLDER = textwrap.dedent("""
  import os, sys, time
  import fedjax_async as fa
  out, started, go = sys.argv[1:4]

  class Wait(fa.Callback):
    def after_chunk(self, loop, state, rows):
      if not os.path.exists(started):
        open(started, "w").close()
        t0 = time.time()
        while not os.path.exists(go) and time.time() - t0 < 300:
          time.sleep(0.05)

  fa.simulate(algorithm="fedavg", num_clients=6, rounds=4, rounds_per_call=1,
              output_dir=out, quiet=True, callbacks=[Wait()])
""")


def test_a_second_run_into_a_folder_in_use_is_refused_while_the_first_finishes(tmp_path):
  out, started, go = (str(tmp_path / n) for n in ("out", "started", "go"))
  first = subprocess.Popen([sys.executable, "-c", HOLDER, out, started, go],
                           env=run_script.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  try:
    t0 = time.time()
    while not os.path.exists(started):  # the first run is between two chunks
      assert first.poll() is None, first.communicate()[1][-3000:]
      assert time.time() - t0 < 300
      time.sleep(0.1)
    second = run_script.run(["--algorithm=fedavg", "--num_clients=6", "--rounds=2",
                             f"--output_dir={out}", "--overwrite"])
    assert second.returncode == 1, second.stderr[-3000:]
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: --output_dir: {out} is in use by another run (pid "
                           f"{first.pid} on "), line
    assert line.endswith("wait for it to end, or give another --output_dir"), line
  finally:
    open(go, "w").close()
    _, err = first.communicate(timeout=600)
  assert first.returncode == 0, err[-3000:]
  with open(os.path.join(out, "fedavg", "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f]  # every line whole, the first run's four rounds
  assert [r["round"] for r in rows] == [1, 2, 3, 4]
  assert not os.path.exists(os.path.join(out, outputs.LOCK))  # released at its end
  fa.simulate(algorithm="fedavg", output_dir=out, overwrite=True, **SMALL)  # free again


def test_load_reads_a_cli_run_back_as_the_python_run(tmp_path):
  out = str(tmp_path / "cli")
  res = run_script.run(["--algorithm=fedavg,fedprox", "--num_clients=6", "--rounds=3",
                        f"--output_dir={out}", "--quiet"])
  assert res.returncode == 0, res.stderr[-3000:]
  loaded = fa.load(out)
  here = fa.simulate(algorithm="fedavg,fedprox", **SMALL)
  assert list(loaded.runs) == ["fedavg", "fedprox"]
  for name in ("fedavg", "fedprox"):
    with open(os.path.join(out, name, "summary.json")) as f:
      assert loaded.runs[name].summary == json.load(f)
    np.testing.assert_allclose(loaded.runs[name].state.w, here.runs[name].state.w,
                               rtol=1e-6, atol=1e-7)
    keep = lambda rows: [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]
    assert keep(loaded.runs[name].rows) == keep(here.runs[name].rows)
  assert loaded.table().splitlines()[0] == here.table().splitlines()[0]
  assert loaded.figure == os.path.join(out, "curves.png")
  assert list(fa.load(os.path.join(out, "fedavg")).runs) == ["fedavg"]  # one run's folder
  with pytest.raises(FileNotFoundError, match=f"{tmp_path}: no finished run there"):
    fa.load(str(tmp_path))


CLOCK = dict(num_clients=6, concurrency=2, num_updates=4, eval_every=2, groups_per_call=2,
             group_size=1, quiet=True)


def test_the_virtual_clock_writes_the_same_layout_and_refuses_another(tmp_path):
  out = str(tmp_path / "clock")
  fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync,fedbuff", output_dir=out, **CLOCK)
  assert sorted(os.listdir(out)) == ["comparison.md", "curves.png", "fedasync", "fedbuff"]
  with pytest.raises(ValueError) as e:  # one run into the folder of two
    fa.simulate(fa.AsyncRunConfig(), algorithm="fedbuff", output_dir=out, **CLOCK)
  assert str(e.value) == (
      f"output.output_dir: {out} holds a run of another layout (fedasync), which this run "
      "would not replace: pass output.overwrite to delete it, or another output.output_dir")
  fa.simulate(fa.AsyncRunConfig(), algorithm="fedbuff", output_dir=out, overwrite=True,
              **CLOCK)
  assert sorted(os.listdir(out)) == ["comparison.md", "curves.png", "fedbuff"]
  assert sorted(os.listdir(os.path.join(out, "fedbuff"))) == [
      "checkpoints", "final_model.npy", "metrics.jsonl", "summary.json"]
  assert "| fedbuff |" in open(os.path.join(out, "comparison.md")).read()
  loaded = fa.load(out)
  assert list(loaded.runs) == ["fedbuff"] and loaded.runs["fedbuff"].rows
