"""experiments/run.py end to end on Synthetic(1,1): learning, determinism, outputs, flags."""

import glob
import io
import itertools
import json
import os
import re
import shutil

import numpy as np
import pytest

from fedjax_async import outputs
from fedjax_async import config as config_lib
from fedjax_async.core import progress as progress_lib
from fedjax_async.rounds import experiment
from run_script import RUN, read_rows, run, without_wall
ALGS = ("fedavg", "fedprox", "fednova", "fedadmm", "pafed")
ROUNDS = 20
# Tiny but real: Synthetic(1,1), 30 clients, 10 per round, a third of them delayed.
# rho 0.1 and server lr 0.5: with rho 0.01 / eta 1 FedADMM (and PAFed) stay near chance
# for the first ~20 rounds on this data (measured with experiments/sweep.py).
# Seed 8: its largest client has 1,014 training rows (seed 3's had 33,659, whose 3,366
# local steps were most of each round's time; 2 local epochs make up for the smaller
# clients).
# lr 0.02: at 0.05 on this seed the runs are chaotic (the 4-device run's different
# summation order, 1e-7 in round 0, grew to 1e-1 in the loss by round 18); at 0.02 the
# two stay within 5e-7 over all 20 rounds.
TINY = ["--dataset=synthetic", "--num_clients=30", "--participation=0.34",
        f"--rounds={ROUNDS}", "--local_epochs=2", "--batch_size=10", "--lr=0.02",
        "--rho=0.1", "--server_lr=0.5", "--delay_fraction=0.3", "--max_delay=2",
        "--rounds_per_call=10", "--seed=8"]
# The keys every metrics.jsonl row has (documented in docs/experiments.md).
ROW_KEYS = {"round", "online", "delayed", "dropped", "mean_staleness", "max_staleness",
            "train_loss", "client_steps", "nonfinite", "test_accuracy", "test_loss",
            "wall_time", "client_loss_max", "client_loss_median", "delta_norm_max",
            "delta_norm_median", "worst_client", "worst_client_loss",
            "client_nonfinite_share", "dropped_nonfinite"}


@pytest.fixture(scope="module")
def all_algorithms(tmp_path_factory):
  out = tmp_path_factory.mktemp("all")
  res = run(TINY + [f"--algorithm={','.join(ALGS)}", f"--output_dir={out}",
                    "--checkpoint_every=0"], timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  return out, res


@pytest.mark.xdist_group("all_algorithms")  # its module fixture computed once
def test_every_algorithm_learns(all_algorithms):
  out, _ = all_algorithms
  for alg in ALGS:
    with open(out / alg / "summary.json") as f:
      summary = json.load(f)
    # 10 classes: chance is 0.1. Measured: average best 0.62 (PAFed) to 0.77 (FedADMM),
    # final 0.69-0.86; the bounds leave margin.
    assert summary["average_best_accuracy"] > 0.35, (alg, summary["average_best_accuracy"])
    assert summary["final_accuracy"] > 0.5, (alg, summary["final_accuracy"])
    assert summary["algorithm"] == alg and summary["rounds"] == ROUNDS


@pytest.mark.xdist_group("all_algorithms")  # its module fixture computed once
def test_metrics_rows_have_documented_keys(all_algorithms):
  out, _ = all_algorithms
  for alg in ALGS:
    rows = read_rows(out / alg / "metrics.jsonl")
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    for r in rows:
      assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
      # 10 sampled per round (0.34 * 30), round(0.3 * 10) = 3 of them delayed.
      assert r["online"] == 7 and r["nonfinite"] is False
    assert sum(r["delayed"] for r in rows) > 0  # the delay fraction took effect
    with open(out / alg / "summary.json") as f:
      summary = json.load(f)
    assert {"average_best_accuracy", "final_accuracy", "wall_time_s", "config"} <= set(summary)
    assert glob.glob(str(out / alg / "tb" / "events.out.tfevents.*"))


@pytest.mark.xdist_group("all_algorithms")  # its module fixture computed once
def test_comparison_table_lists_every_algorithm(all_algorithms):
  out, res = all_algorithms
  with open(out / "comparison.md") as f:
    md = f.read()
  with open(out / "comparison.csv") as f:
    csv_lines = f.read().strip().splitlines()
  assert len(csv_lines) == 1 + len(ALGS)
  for alg in ALGS:
    assert f"| {alg} |" in md
    assert any(line.startswith(alg + ",") for line in csv_lines)
  assert "| algorithm | final accuracy | last-10 mean accuracy | average best accuracy |" in (
      res.stdout)
  assert f"figure: {out / 'curves.png'}" in res.stdout
  assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_curves_draws_accuracy_where_evaluated_and_every_loss(tmp_path):
  rows = lambda accs: [dict(round=i, test_accuracy=a, train_loss=1.0 / (i + 1))
                       for i, a in enumerate(accs)]
  runs = {"a": rows([0.1, None, 0.3]), "b": rows([None, None, None]),
          "c": rows([0.2, float("nan"), 0.4])}
  # accuracy: a and c (b never evaluated; c's NaN round skipped); loss: all three
  assert outputs.plot_curves(runs, str(tmp_path / "c.png")) == 5
  assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
  # smoothed losses: still one curve per run (the faint raw losses are not counted)
  assert outputs.plot_curves(runs, str(tmp_path / "d.png"), loss_ema=0.5) == 5


@pytest.mark.xdist_group("all_algorithms")  # its module fixture computed once
def test_same_seed_gives_identical_metrics(all_algorithms, tmp_path):
  out, _ = all_algorithms
  # A second, separate process running PAFed alone with the same flags and seed.
  b = run(TINY + ["--algorithm=pafed", "--checkpoint_every=0", "--notensorboard",
                  f"--output_dir={tmp_path}"])
  assert b.returncode == 0, b.stderr[-3000:]
  rows_a = read_rows(out / "pafed" / "metrics.jsonl")
  rows_b = read_rows(tmp_path / "pafed" / "metrics.jsonl")
  assert len(rows_a) == ROUNDS
  assert without_wall(rows_a) == without_wall(rows_b)
  # Not a constant: the rounds differ from each other (the metrics carry information).
  assert len({r["train_loss"] for r in rows_a}) > ROUNDS // 2


@pytest.mark.xdist_group("all_algorithms")  # its module fixture computed once
def test_clients_split_over_four_cpu_devices_give_the_unsharded_run(all_algorithms, tmp_path):
  """--cpu_devices=4 (--devices=0: all): each round's clients trained on 4 host devices
  (K padded 10 -> 12), checkpointed on the way; the rounds equal the one-device run's."""
  out, _ = all_algorithms
  res = run(TINY + ["--algorithm=pafed,fednova", "--cpu_devices=4", "--checkpoint_every=10",
                    "--notensorboard", f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  assert "split over 4 devices" in res.stdout and "CpuDevice(id=3)" in res.stdout
  for alg in ("pafed", "fednova"):
    ref, got = read_rows(out / alg / "metrics.jsonl"), read_rows(tmp_path / alg / "metrics.jsonl")
    assert [set(r) for r in got] == [set(r) for r in ref]
    for a, b in zip(ref, got):
      for k in ("online", "delayed", "dropped", "client_steps", "max_staleness"):
        assert a[k] == b[k], (alg, a["round"], k)
      for k in ("train_loss", "test_accuracy", "test_loss", "mean_staleness"):
        assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (alg, a["round"], k)
    assert glob.glob(str(tmp_path / alg / "checkpoints" / "*"))
  # Resumed on one device from the 4-device run's round-10 checkpoint: --devices may
  # change on --resume, and the continuation equals the 4-device run to float rounding.
  full = read_rows(tmp_path / "pafed" / "metrics.jsonl")
  shutil.rmtree(tmp_path / "pafed" / "checkpoints" / "20")
  res = run(TINY + ["--algorithm=pafed,fednova", "--checkpoint_every=10", "--notensorboard",
                    "--devices=1", "--resume", f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  assert "[pafed] resuming from the checkpoint of round 10" in res.stdout
  resumed = read_rows(tmp_path / "pafed" / "metrics.jsonl")
  assert [r["round"] for r in resumed] == list(range(1, ROUNDS + 1))
  for a, b in zip(full[10:], resumed[10:]):
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4, abs=1e-5)
    assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], rel=1e-4, abs=1e-5)


def test_virtual_clock_groups_split_over_two_cpu_devices_give_the_one_device_run(tmp_path):
  """Groups of 4 in-flight arrivals: 2 members per device with --cpu_devices=2 (--devices
  0: all) against one device; same arrivals, same losses and accuracies."""
  common = ["--algorithm=fedbuff,fedasync", "--num_updates=12", "--eval_every=4",
            "--group_size=4", "--concurrency=6", "--num_clients=20", "--batch_size=10"]
  one = run(common + ["--devices=1", f"--output_dir={tmp_path / 'one'}"])
  two = run(common + ["--cpu_devices=2", f"--output_dir={tmp_path / 'two'}"])
  assert one.returncode == 0, one.stderr[-3000:]
  assert two.returncode == 0, two.stderr[-3000:]
  assert "split over 2 devices" in two.stdout and "split over" not in one.stdout
  for name in ("fedbuff", "fedasync"):
    a = read_rows(tmp_path / "one" / name / "metrics.jsonl")
    b = read_rows(tmp_path / "two" / name / "metrics.jsonl")
    assert len(a) == len(b) > 0
    assert sum(r["test_accuracy"] is not None for r in a) >= 2
    for ra, rb in zip(a, b):
      for k in ("event", "group", "client", "staleness", "client_steps"):
        assert ra[k] == rb[k], (name, k)
      for k in ("train_loss", "test_accuracy", "test_loss"):
        if ra[k] is None:
          assert rb[k] is None
        else:
          assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-5), (name, ra["event"], k)


@pytest.mark.parametrize("args,flag,says", [
    (["--devices=3"], "--devices", "--cpu_devices=3"),  # JAX sees 1 CPU device here
    (["--devices=-1"], "--devices", ">= 0"),
    (["--cpu_devices=-2"], "--cpu_devices", ">= 0"),
])
def test_bad_device_flags_name_the_flag(tmp_path, args, flag, says):
  res = run(["--rounds=2", f"--output_dir={tmp_path}"] + args, timeout=120)
  assert res.returncode != 0
  assert flag in res.stderr and says in res.stderr, res.stderr[-2000:]
  assert not glob.glob(str(tmp_path / "**" / "metrics.jsonl"), recursive=True)


@pytest.mark.parametrize("flag,value", [("participation", "1.5"), ("algorithm", "nope"),
                                        ("rho", "0"), ("delay_fraction", "-0.1"),
                                        ("checkpoint_every", "-1"), ("client_chunk", "-2"),
                                        ("alpha0", "-0.5"), ("alpha2", "-1"),
                                        ("server_lr_switch_round", "2"),
                                        ("server_lr_switch_round", "-3"),
                                        ("local_steps", "-1"),
                                        ("model", "nope"), ("model", "cnn")])
def test_invalid_flag_exits_naming_the_flag(tmp_path, flag, value):
  res = run(["--rounds=2", f"--output_dir={tmp_path}", f"--{flag}={value}"], timeout=120)
  assert res.returncode != 0
  assert f"error: --{flag}" in res.stderr, res.stderr[-2000:]
  assert "Traceback" not in res.stderr, res.stderr[-2000:]  # cnn: raised by models.py
  assert not glob.glob(str(tmp_path / "**" / "metrics.jsonl"), recursive=True)


def test_ckks_min_scale_is_checked_and_only_taken_with_ckks():
  base = config_lib.RunConfig().replace(rounds=2, algorithm="pafed")
  with pytest.raises(ValueError, match="^crypto.ckks_min_scale: only used with "
                     "crypto.secure_aggregation='ckks'$"):
    config_lib.validate(base.replace(ckks_min_scale=4.0))
  ckks = base.replace(secure_aggregation="ckks")
  config_lib.validate(ckks.replace(ckks_min_scale=4.0))
  with pytest.raises(ValueError, match=r"^crypto\.ckks_min_scale: must be in \(0, 4\]"):
    config_lib.validate(ckks.replace(ckks_min_scale=5.0))


def test_a_field_missing_from_a_stored_config_counts_as_its_default():
  """A checkpoint or summary stored before a field existed (here ckks_min_scale) still
  resumes when the run uses the field's default, and is refused when it does not."""
  current = config_lib.config_dict(config_lib.RunConfig().replace(rounds=3))
  saved = {k: v for k, v in current.items() if k != "ckks_min_scale"}
  assert config_lib.config_mismatch(saved, current) == []
  assert config_lib.config_mismatch(saved, dict(current, ckks_min_scale=4.0)) == [
      "ckks_min_scale"]
  assert config_lib.config_mismatch(dict(saved, rounds=2), current) == ["rounds"]
  # Runs stored before --admm_upload existed read Eq. 16 literally: they match only that.
  saved = {k: v for k, v in current.items() if k != "admm_upload"}
  assert config_lib.config_mismatch(saved, current) == ["admm_upload"]
  assert config_lib.config_mismatch(saved, dict(current, admm_upload="last_local")) == []
  # a field added to the delay's part later (train_dropped) is missing the same way
  saved = dict(current, delay={k: v for k, v in current["delay"].items()
                               if k != "train_dropped"})
  assert config_lib.config_mismatch(saved, current) == []
  now = dict(current, delay=dict(current["delay"], train_dropped=True))
  assert config_lib.config_mismatch(saved, now) == ["train_dropped"]
  assert config_lib.mismatch_flags(saved, now) == ["delay.train_dropped=None (now True)"]


def test_alpha_zero_and_a_switch_round_within_the_run_are_valid():
  base = config_lib.RunConfig().replace(rounds=10)
  config_lib.validate(base.replace(alpha0=0.0, alpha1=0.0, alpha2=0.0,
                                   server_lr_switch_round=9))
  config_lib.validate(base.replace(server_lr_switch_round=0))
  with pytest.raises(ValueError,
                     match=r"^output\.overwrite: cannot be combined with output\.resume"):
    config_lib.validate(base.replace(resume=True, overwrite=True))


def test_pafed_warns_of_rounds_with_delayed_updates_and_no_online_one():
  """A round whose arrivals are all delayed leaves PAFed's DUCC without an online mean
  (Alg. 4 line 3): the rounds are found from the timeline and named in one warning."""
  from fedjax_async.core import timeline  # pylint: disable=g-import-not-at-top
  f, t = False, True
  # 4 rounds x 2 slots: round 1 delayed only, round 2 online + delayed, round 3 delayed
  # only with a padding slot, round 0 online only
  tl = timeline.Timeline(
      client=np.zeros((4, 2), np.int32), dispatch=np.zeros((4, 2), np.int32),
      online=np.array([[t, f], [f, f], [t, f], [f, t]]),
      valid=np.array([[t, f], [t, t], [t, t], [t, f]]),
      dropped=np.zeros(4, np.int32), sampled=np.ones(4, np.int32), in_flight_at_end=0)
  np.testing.assert_array_equal(timeline.delayed_only_rounds(tl), [1, 3])
  msg = timeline.delayed_only_warning(tl)
  assert msg.startswith("warning: pafed: 2 of 4 rounds (round 1, 3) receive delayed "
                        "updates but no online one")
  assert "3 delayed updates go unused" in msg
  # one client per round, always delayed: every round with an arrival is delayed-only
  always = timeline.DelayConfig(1.0, "uniform", 2)
  tl = timeline.build(10, 12, 0.1, always, seed=0)
  assert not tl.online[tl.valid].any()
  assert len(timeline.delayed_only_rounds(tl)) == int(tl.valid.any(axis=1).sum()) > 0
  ok = timeline.DelayConfig(0.3, "uniform", 3)
  assert timeline.delayed_only_warning(timeline.build(100, 20, 0.1, ok, seed=0)) is None


def test_a_ring_buffer_shorter_than_the_delays_warns_with_the_count_dropped(tmp_path):
  from fedjax_async.core import timeline  # pylint: disable=g-import-not-at-top
  uniform = timeline.DelayConfig(0.3, "uniform", 3, buffer_size=2)
  tl = timeline.build(30, 40, 0.34, uniform, seed=0)
  dropped, arrived = int(tl.dropped.sum()), int((tl.valid & ~tl.online).sum())
  assert dropped > 0
  msg = timeline.dropped_warning(uniform, tl)
  assert msg.startswith("warning: delay.buffer_size=2 keeps 2 past global models but "
                        "delay.max_delay=3 needs 4: delays of 2..3 rounds are dropped")
  assert f"({dropped} of the {dropped + arrived} delayed updates" in msg
  fixed = timeline.DelayConfig(0.3, "fixed", 2, buffer_size=2)
  assert "every delayed update is dropped" in timeline.dropped_warning(
      fixed, timeline.build(30, 40, 0.34, fixed, seed=0))
  # enough buffer, or no delays: nothing to say
  for ok in (timeline.DelayConfig(0.3, "uniform", 3), timeline.DelayConfig(0.3, "uniform", 3,
                                                                          buffer_size=4),
             timeline.DelayConfig(0.0, "uniform", 3, buffer_size=1)):
    assert timeline.dropped_warning(ok, timeline.build(30, 40, 0.34, ok, seed=0)) is None
  # run.py prints it (once, before the runs)
  res = run(TINY + ["--algorithm=fedavg", "--rounds=6", "--buffer_size=1", "--max_delay=2",
                    "--checkpoint_every=0", "--notensorboard", f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  lines = [l for l in res.stderr.splitlines() if l.startswith("warning: --buffer_size=1")]
  assert len(lines) == 1 and "--max_delay=2" in lines[0], res.stderr[-3000:]


def test_rerun_into_a_run_directory_is_refused_before_any_work_unless_resume_or_overwrite(
    tmp_path):
  args = TINY + ["--algorithm=fedavg,fedprox", "--rounds=4", "--rounds_per_call=2",
                 "--checkpoint_every=2", f"--output_dir={tmp_path}"]
  first = run(args)
  assert first.returncode == 0, first.stderr[-3000:]
  # each run says it is compiling (the first chunk is mostly compilation)
  for name in ("fedavg", "fedprox"):
    assert f"[{name}] compiling the round program (2 rounds per call) ..." in first.stdout
    assert re.search(rf"\[{name}\] compiled in \d+\.\d s", first.stdout)
  before = {p: os.path.getmtime(p) for p in glob.glob(str(tmp_path / "**"), recursive=True)}
  again = run(args)
  assert again.returncode != 0
  assert again.stderr.strip() == (
      f"error: --output_dir: {tmp_path} already holds a run (comparison.md, comparison.csv, "
      "curves.png): pass --resume to continue it, --overwrite to start over, or another "
      "--output_dir"), again.stderr[-3000:]
  assert "loading" not in again.stdout  # refused before any work: nothing was touched
  assert {p: os.path.getmtime(p)
          for p in glob.glob(str(tmp_path / "**"), recursive=True)} == before
  # one algorithm's directory holds a run too (of another layout: its files at the top)
  alone = run(TINY + ["--algorithm=fedavg", "--rounds=4", f"--output_dir={tmp_path / 'fedavg'}"])
  assert alone.returncode != 0 and alone.stderr.strip().endswith(
      f"{tmp_path / 'fedavg'} holds a run of another layout (checkpoints, final_model.npy, "
      "metrics.jsonl, summary.json, tb), which this run would not replace: pass --overwrite "
      "to delete it, or another --output_dir"), alone.stderr[-3000:]
  # --resume continues (every run is complete: its last checkpoint is its end)
  resumed = run(args + ["--resume"])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resuming from the checkpoint of round 4" in resumed.stdout
  # --overwrite deletes the run's own outputs only, and starts over
  (tmp_path / "notes.txt").write_text("mine")
  (tmp_path / "fedavg" / "checkpoints" / "99").mkdir()  # would be "the latest" otherwise
  over = run(args + ["--overwrite"])
  assert over.returncode == 0, over.stderr[-3000:]
  assert "resuming" not in over.stdout
  assert (tmp_path / "notes.txt").read_text() == "mine"
  assert sorted(os.listdir(tmp_path / "fedavg" / "checkpoints")) == ["2", "4"]
  assert [r["round"] for r in read_rows(tmp_path / "fedavg" / "metrics.jsonl")] == [1, 2, 3, 4]


def _run_module():
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("experiments_run", RUN)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_mode_of_picks_the_driver_from_algorithm_and_fededs(tmp_path):
  mode_of = _run_module().mode_of
  assert mode_of(["run.py"]) == "rounds"
  assert mode_of(["run.py", "--algorithm=pafed,fedavg"]) == "rounds"
  assert mode_of(["run.py", "--algorithm=fedasync,fedbuff"]) == "async"
  assert mode_of(["run.py", "--algorithm", "privaasyncfed"]) == "async"
  # a stateless round rule beside a virtual-clock one: the clock runs both, as in simulate
  assert mode_of(["run.py", "--algorithm=fedasync,fedavg"]) == "async"
  assert mode_of(["run.py", "--algorithm=fedavg", "--fededs"]) == "fededs"
  assert mode_of(["run.py", "--algorithm=fedprox", "--fededs_ablation=s1"]) == "fededs"
  flagfile = tmp_path / "x.flags"
  flagfile.write_text("--algorithm=double_compensation\n--num_updates=5\n")
  assert mode_of(["run.py", f"--flagfile={flagfile}"]) == "async"
  with pytest.raises(SystemExit, match="--algorithm"):
    mode_of(["run.py", "--algorithm=fedasync,pafed"])
  # a typo is named, with both families' names (not only the round engine's)
  with pytest.raises(SystemExit) as exit_info:
    mode_of(["run.py", "--algorithm=pafed,fedasyn"])
  message = str(exit_info.value.code)
  assert message.startswith("error: --algorithm: unknown algorithm 'fedasyn'; did you mean "
                            "fedasync or dp_fedasync? (on rounds: fedavg")
  assert "on the virtual clock: fedasync, fedbuff, double_compensation" in message


def test_run_py_runs_the_virtual_clock_family(tmp_path):
  res = run(["--algorithm=fedasync,fedbuff", "--num_updates=20", "--eval_every=10",
             f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  for name in ("fedasync", "fedbuff"):
    summary = json.load(open(tmp_path / name / "summary.json"))
    assert summary["run"] == name and "staleness_histogram" in json.dumps(summary)
  assert "| fedasync |" in res.stdout and "| fedbuff |" in res.stdout
  assert f"figure: {tmp_path / 'curves.png'}" in res.stdout  # against the virtual clock
  assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
  res = run(["--algorithm=fedbuff", "--concurrency=0", f"--output_dir={tmp_path}"])
  assert res.returncode != 0 and "--concurrency" in res.stderr


def test_run_py_plugs_fededs_into_a_base_algorithm(tmp_path):
  res = run(["--algorithm=fedavg", "--fededs", "--quick", "--privacy=false", "--rounds=2",
             "--encryptor_epochs=1", f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  table = open(tmp_path / "table.md").read()
  assert "FedEDS + fedavg" in table and "| fedavg |" in table  # with the base beside it
  # a progress line per round (the quick preset: alpha 0.1, K = 5)
  progress = "[fededs alpha=0.1 K=5 fedavg/fededs] round    2/2 acc"
  assert progress in res.stdout, res.stdout[-3000:]
  # --rounds_per_call=1 (fededs_table's default): round 1's line is printed when round 1
  # came back; its time holds the compilation, so the ETA waits for round 2's
  first = [l for l in res.stdout.splitlines()
           if l.startswith("[fededs alpha=0.1 K=5 fedavg/fededs] round    1/2")]
  assert len(first) == 1 and first[0].endswith("| ETA after the first steady chunk"), (
      res.stdout[-3000:])
  res = run(["--algorithm=pafed", "--fededs", f"--output_dir={tmp_path}"])
  assert res.returncode != 0 and "--algorithm" in res.stderr
  res = run(["--algorithm=fedavg", "--fededs_ablation=s3", f"--output_dir={tmp_path}"])
  assert res.returncode != 0 and "--fededs_ablation" in res.stderr


def test_unreadable_flagfile_names_the_file(tmp_path):
  res = run([f"--flagfile={tmp_path / 'missing.flags'}"])
  assert res.returncode != 0
  assert "--flagfile" in res.stderr and "missing.flags" in res.stderr


def test_progress_gives_rate_and_eta_once_per_chunk_on_its_last_round(monkeypatch):
  # the run starts at 100 s; its first 3-round chunk (with the compilation) is back at
  # 106 s, the second at 107.5 s (and any later reading)
  clock = itertools.chain([100.0, 106.0], itertools.repeat(107.5))
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: next(clock))
  out = io.StringIO()
  progress = experiment.Progress("run", total=10, stream=out)
  row = lambda t: {"round": t, "test_accuracy": 0.5 if t % 2 else None, "train_loss": 1.0,
                   "online": 3, "delayed": 1, "dropped": 0, "mean_staleness": 0.25}
  progress([row(1), row(2), row(3)])  # one jitted chunk of 3 rounds
  progress([row(4), row(5), row(6)])
  lines = out.getvalue().splitlines()
  assert [l.split(" acc")[0] for l in lines] == [f"[run] round    {t}/10" for t in range(1, 7)]
  assert "acc 0.5000" in lines[0] and "acc   -   " in lines[1]
  assert [" | " in l for l in lines] == [False, False, True] * 2
  # the first chunk's time holds the compilation: no rate from it
  assert lines[2].endswith("staleness 0.25 | ETA after the first steady chunk"), lines[2]
  # 3 rounds in 1.5 s: 2.00 rounds/s; 4 rounds left: ETA 2 s
  assert lines[5].endswith("staleness 0.25 | 2.00 rounds/s ETA 2s"), lines[5]


def test_progress_of_several_algorithms_names_which_and_gives_the_eta_of_all(monkeypatch):
  # algorithm 1 of 4 runs from 100 s; its first 3-round chunk comes back at 106.5 s, the
  # second at 108 s: 0.5 s per round, and a start-up of 6.5 - 3 x 0.5 = 5 s
  clock = itertools.chain([100.0, 106.5], itertools.repeat(108.0))
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: next(clock))
  out = io.StringIO()
  overall = experiment.Overall(count=4, rounds=6)
  progress = experiment.Progress("pafed", total=6, stream=out, position=(1, 4),
                                 overall=overall)
  row = lambda t: {"round": t, "test_accuracy": 0.5, "train_loss": 1.0, "online": 3,
                   "delayed": 1, "dropped": 0, "mean_staleness": 0.25}
  progress([row(1), row(2), row(3)])
  progress([row(4), row(5), row(6)])
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("[pafed] algorithm 1/4 round    1/6 acc 0.5000")
  # this run is done; the 3 later runs: 18 rounds x 0.5 s + 3 start-ups x 5 s = 24 s
  assert lines[5].endswith("| 2.00 rounds/s ETA 0s, all 4 algorithms 24s"), lines[5]
  # one algorithm: the lines are as before
  out = io.StringIO()
  experiment.Progress("fedavg", total=6, stream=out, position=(1, 1),
                      overall=experiment.Overall(1, 6))([row(1)])
  assert out.getvalue().startswith("[fedavg] round    1/6 acc")
  assert "all 1" not in out.getvalue()


def test_progress_prints_every_kth_round_the_last_and_one_after_a_silence(monkeypatch):
  # Rounds 1-3 come back at 102 s, 4-6 at 104 s, 7-9 at 120 s (after 16 s of silence).
  clock = itertools.chain([100.0, 102.0, 104.0, 120.0], itertools.repeat(121.0))
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: next(clock))
  out = io.StringIO()
  progress = experiment.Progress("run", total=10, stream=out, every=4)
  row = lambda t: {"round": t, "test_accuracy": 0.5, "train_loss": 1.0, "online": 3,
                   "delayed": 1, "dropped": 0, "mean_staleness": 0.25}
  for chunk in ([1, 2, 3], [4, 5, 6], [7, 8, 9], [10]):
    progress([row(t) for t in chunk])
  printed = [int(l.split("round")[1].split("/")[0]) for l in out.getvalue().splitlines()]
  # 4 and 8 (every 4th), 9 (its chunk came back 16 s after the last line), 10 (the last)
  assert printed == [4, 8, 9, 10], out.getvalue()
  assert experiment.log_interval(0, 100) == 10 and experiment.log_interval(0, 7) == 1
  assert experiment.log_interval(3, 100) == 3


def test_a_quiet_comparison_prints_no_round_lines_and_ends_with_its_table(tmp_path):
  # (Which rounds get a line without --quiet: the Progress tests above.)
  res = run(["--algorithm=fedavg,fedprox", "--num_clients=6", "--rounds=4",
             "--checkpoint_every=0", "--notensorboard", "--quiet",
             f"--output_dir={tmp_path}"])
  assert res.returncode == 0, res.stderr[-3000:]
  lines = res.stdout.strip().splitlines()
  assert not [l for l in lines if " round " in l], lines
  # T = 4 <= 10: the table's note on its last-10 metrics, then the delays it ran with
  assert lines[-1].startswith("delays on: 30% of each round's sampled clients arrive 1-3 "
                              "rounds late") and lines[-2] == "", lines[-8:]
  assert lines[-3].startswith("† T <= 10 rounds") and lines[-4] == "", lines[-8:]
  assert lines[-5].startswith("| fedprox |") and lines[-7].startswith("|---"), lines[-8:]
  assert lines[-9].startswith("figure: ")


def test_figures_are_titled_with_the_data_model_delays_and_algorithms(monkeypatch, tmp_path):
  cfg = config_lib.RunConfig().replace(algorithm="pafed,fedavg", dataset="fashion_mnist",
                                       partition="shards", num_clients=30)
  title = outputs.figure_title(cfg, "fashion_mnist", "cnn", ["pafed", "fedavg"])
  assert title == ("fashion_mnist (shards, 2 per client, N = 30), cnn; δ = 0.3, uniform "
                   "delays (max 3); pafed, fedavg")
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(Figure, "suptitle", lambda self, t, **kw: seen.append(t))
  rows = [{"round": 0, "test_accuracy": 0.5, "train_loss": 1.0}]
  outputs.plot_curves({"pafed": rows}, str(tmp_path / "c.png"), title=title)
  assert seen == [title]
  from fedjax_async import fededs  # pylint: disable=g-import-not-at-top
  imgs = np.zeros((2, 4, 4, 1))
  fededs.save_encryption_grid(imgs, imgs, str(tmp_path / "g.png"), title="FedEDS, client 0")
  assert seen == [title, "FedEDS, client 0"]


def test_progress_tick_from_inside_a_chunk_prints_only_after_a_silence(monkeypatch):
  clock = iter([100.0, 105.0, 112.0, 115.0])
  monkeypatch.setattr(progress_lib.time, "perf_counter", lambda: next(clock))
  out = io.StringIO()
  progress = experiment.Progress("cnn", total=10, stream=out)  # starts at 100 s
  progress.tick(1)  # 105 s: 5 s of silence, no line
  progress.tick(2)  # 112 s: 12 s (no chunk back yet: no ETA)
  progress.tick(3)  # 115 s: 3 s after that line
  assert out.getvalue().splitlines() == [
      "[cnn] compiled chunk from round 1 running: 2 of its rounds done"]
