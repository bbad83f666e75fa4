"""The experiment scripts' errors: one "error: ..." line naming the flag or file, no traceback
(sweep.py, pafed_table.py, async_family.py); pafed_table's stored runs against its flags;
async_family's progress lines."""

import json
import re
import os
import subprocess
import sys
from fedjax_async import outputs

import pytest

import run_script

ROOT = run_script.ROOT
SWEEP = os.path.join(ROOT, "experiments", "sweep.py")
TABLE = os.path.join(ROOT, "experiments", "pafed_table.py")
ASYNC = os.path.join(ROOT, "experiments", "async_family.py")


def script(path, args, env=None, timeout=300):
  return subprocess.run([sys.executable, path] + list(args), env=env or run_script.env(),
                        capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(out, message):
  assert out.returncode != 0, out.stdout[-2000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(message), out.stderr[-2000:]
  if message == "error: --model":  # (validated with the flags or when the model is built)
    assert "unknown model 'foo'" in last, last


def missing_file_dir(tmp_path):
  """A folder with 3 of the 4 Fashion-MNIST IDX files (tiny, hand-made)."""
  from test_data import write_tiny_idx_dir  # pylint: disable=g-import-not-at-top
  write_tiny_idx_dir(tmp_path)
  os.remove(tmp_path / "t10k-labels-idx1-ubyte")
  return tmp_path


SWEEP_ARGS = ["--algorithm=fedavg", "--num_clients=5", "--rounds=2", "--checkpoint_every=0"]


@pytest.mark.parametrize("args,message", [
    (["--dataset=nosuch"], "error: --dataset: unknown dataset 'nosuch'"),
    (["--model=foo"], "error: --model"),
    (["--partition=foo"], "error: --partition: unknown partition 'foo'"),
    (["--data_source=foo"], "error: --data_source: unknown data source 'foo'"),
    (["--dataset=fashion_mnist", "--data_dir=/nonexistent_dir"],
     "error: --data_dir=/nonexistent_dir: no such directory"),
    (["--num_clients=100000"], "error: --num_clients=100000: the padded client data"),
    (["--tensorboard"], "error: --tensorboard: not supported by sweeps"),
    (["--checkpoint_every=-1"], "error: --checkpoint_every: must be >= 0"),
    # the same run twice: one folder, counted as two seeds (std 0) in aggregate.md
    (["--sweep_lr=0.1,0.05,0.10"], "error: --sweep_lr: lists 0.1 more than once"),
])
@pytest.mark.messages
def test_sweep_errors(tmp_path, args, message):
  out = script(SWEEP, SWEEP_ARGS + [f"--output_dir={tmp_path}"] + args)
  assert_one_line_error(out, message)


@pytest.mark.messages
def test_sweep_into_a_sweep_directory_is_refused_unless_resume_or_overwrite(tmp_path):
  """A second sweep into an --output_dir holding one is refused before any work (as
  experiments/run.py refuses a run directory); --overwrite deletes the sweep's own
  outputs, and nothing else, then runs."""
  (tmp_path / "runs" / "fedavg" / "old_run").mkdir(parents=True)
  (tmp_path / "sweep.json").write_text("{}")
  (tmp_path / "notes.txt").write_text("mine")
  out = script(SWEEP, SWEEP_ARGS + [f"--output_dir={tmp_path}"])
  assert_one_line_error(out, f"error: --output_dir: {tmp_path} already holds a run (runs, "
                        "sweep.json): pass --resume to continue it, --overwrite to start "
                        "over, or another --output_dir")
  out = script(SWEEP, SWEEP_ARGS + [f"--output_dir={tmp_path}", "--resume", "--overwrite"])
  assert_one_line_error(out, "error: --overwrite: cannot be combined with --resume")
  out = script(SWEEP, SWEEP_ARGS + [f"--output_dir={tmp_path}", "--overwrite"])
  assert out.returncode == 0, out.stderr[-3000:]
  assert not (tmp_path / "runs" / "fedavg" / "old_run").exists()
  assert (tmp_path / "notes.txt").read_text() == "mine"
  assert json.loads((tmp_path / "sweep.json").read_text())["runs"]
  assert sorted(os.listdir(tmp_path / "runs" / "fedavg")) == ["seed=0"]


@pytest.mark.messages
def test_sweep_missing_idx_file_is_named(tmp_path):
  (tmp_path / "idx").mkdir()
  d = missing_file_dir(tmp_path / "idx")
  out = script(SWEEP, SWEEP_ARGS + ["--dataset=fashion_mnist", f"--data_dir={d}",
                                    f"--output_dir={tmp_path / 'out'}"])
  assert_one_line_error(out, f"error: --data_dir={d}: holds 3 of the 4 IDX files but not "
                        "t10k-labels-idx1-ubyte[.gz]")


ASYNC_ARGS = ["--num_clients=6", "--concurrency=2", "--num_updates=6", "--eval_every=3",
              "--groups_per_call=3"]


@pytest.mark.parametrize("args,message", [
    (["--dataset=nosuch"], "error: --dataset: unknown dataset 'nosuch'"),
    (["--partition=foo"], "error: --partition: unknown partition 'foo'"),
    (["--model=foo"], "error: --model"),
    (["--dataset=fashion_mnist", "--data_dir=/nonexistent_dir"],
     "error: --data_dir=/nonexistent_dir: no such directory"),
    (["--local_steps=-1"], "error: --local_steps: must be >= 0 (0: E epochs), got -1"),
    # the virtual clock's library errors name AsyncRunConfig's fields; the driver, flags
    (["--compute_time=bogus"], "error: --compute_time: cannot parse 'bogus'"),
    (["--algorithm=dp_fedasync", "--dp_epsilon=1", "--dp_delta=2"],
     "error: --dp_delta: must be in (0, 1), got 2.0"),
])
@pytest.mark.messages
def test_async_family_errors(tmp_path, args, message):
  out = script(ASYNC, ASYNC_ARGS + [f"--output_dir={tmp_path}"] + args)
  assert_one_line_error(out, message)


@pytest.mark.messages
def test_async_family_truncated_gzip_is_named(tmp_path):
  from test_data import write_tiny_idx_dir  # pylint: disable=g-import-not-at-top
  write_tiny_idx_dir(tmp_path, gz=True)
  bad = tmp_path / "train-images-idx3-ubyte.gz"
  bad.write_bytes(bad.read_bytes()[:40])
  out = script(ASYNC, ASYNC_ARGS + ["--dataset=fashion_mnist", f"--data_dir={tmp_path}",
                                    f"--output_dir={tmp_path / 'out'}"])
  assert_one_line_error(out, f"error: {bad}: not a readable gzip file")


def test_async_family_progress_has_eta_and_no_backend_info_lines(tmp_path):
  env = run_script.env()
  env.pop("JAX_PLATFORMS")  # JAX probes its backends (and logs the missing TPU at INFO)
  out = script(ASYNC, ASYNC_ARGS + [f"--output_dir={tmp_path}"], env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Unable to initialize backend" not in out.stderr + out.stdout
  progress = [l for l in out.stdout.splitlines() if " version " in l]
  # the first call holds the compilation: the rate and ETA come from the calls after it
  assert progress[0].endswith("| ETA after the first steady call"), out.stdout
  assert len(progress) > 1 and all(" arrivals/s ETA " in l for l in progress[1:]), out.stdout
  assert progress[-1].endswith("ETA 0s")


def test_async_family_local_steps_one_step_per_task_in_the_accounting(tmp_path):
  """--local_steps=1 (PrivaAsyncFed Table II): every kept arrival is one local step, so
  the privacy accountant composes as many steps over the clients as there were updates
  (without it, each task is E ceil(n_i / B) steps)."""
  args = ASYNC_ARGS + ["--algorithm=privaasyncfed", "--dp_epsilon=5", "--momentum=0",
                       "--batch_size=8"]
  counts = {}
  for steps in (1, 0):
    out_dir = tmp_path / f"steps{steps}"
    out = script(ASYNC, args + [f"--local_steps={steps}", f"--output_dir={out_dir}"])
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((out_dir / "privaasyncfed" / "summary.json").read_text())
    assert summary["local_work"] == {"local_epochs": 2, "local_steps": steps,
                                     "batch_size": 8}
    counts[steps] = summary["privacy"]["steps_per_client"]
  assert sum(counts[1]) == 6  # --num_updates=6, nothing dropped
  assert sum(counts[0]) > 6  # (the clock differs too: a task's duration follows its work)


@pytest.mark.messages
def test_pafed_table_read_only_on_an_empty_folder_is_an_error(tmp_path):
  out = script(TABLE, ["--config=reduced", "--read_only", f"--output_dir={tmp_path}"])
  assert_one_line_error(out, f"error: --output_dir={tmp_path}: no runs found")
  assert not (tmp_path / "table.md").exists()


@pytest.mark.parametrize("args,message", [
    (["--dataset=nosuch"], "error: --dataset: unknown dataset 'nosuch'"),
    (["--model=foo"], "error: --model"),
    (["--dataset=fashion_mnist", "--data_dir=/nonexistent_dir"],
     "error: --data_dir=/nonexistent_dir: no such directory"),
    (["--tensorboard"], "error: --tensorboard: not supported by sweeps"),
    (["--partitions=,"], "error: --partitions: expected a comma list of"),  # "no runs found"
    (["--max_runs_per_computation=-1"],  # was a StopIteration traceback
     "error: --max_runs_per_computation: must be >= 0"),
    (["--deltas=0,0.3,0", "--partitions=shards"], "error: --deltas: lists 0 more than once"),
])
@pytest.mark.messages
def test_pafed_table_errors(tmp_path, args, message):
  out = script(TABLE, ["--config=reduced", "--dataset=synthetic", "--num_clients=6",
                       "--rounds=2", "--algorithm=fedavg", "--partitions=iid",
                       f"--output_dir={tmp_path}"] + args)
  assert_one_line_error(out, message)


@pytest.mark.slow  # 25-45 s (five driver runs); sweep.run_grid's re-run is tested in CI
def test_pafed_table_reruns_runs_stored_with_other_flags(tmp_path):
  """A second driver run with other flags re-runs the stored runs (naming the flags);
  --read_only refuses runs made with other flags instead of tabulating them."""
  args = ["--config=reduced", "--dataset=synthetic", "--model=logreg", "--num_clients=6",
          "--participation=0.5", "--local_epochs=1", "--batch_size=10", "--eval_every=1",
          "--algorithm=fedavg", "--partitions=shards", "--deltas=0", "--num_seeds=1",
          f"--output_dir={tmp_path}"]
  first = script(TABLE, args + ["--rounds=2"])
  assert first.returncode == 0, first.stderr[-3000:]
  same = script(TABLE, args + ["--rounds=2"])  # same flags: read back, not run
  assert same.returncode == 0 and "runs in" not in same.stdout, same.stdout[-2000:]
  stale = script(TABLE, args + ["--rounds=3", "--read_only"])
  assert_one_line_error(stale, f"error: --read_only: 1 stored run(s) under "
                        f"{tmp_path}/shards/runs/fedavg were made with other flags: "
                        "--rounds=2 (now 3)")
  rerun = script(TABLE, args + ["--rounds=3"])
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "re-running 1 stored run(s) made with other flags (--rounds=2 (now 3))" in rerun.stdout
  assert "T=3" in (tmp_path / "table.md").read_text()
  import json  # pylint: disable=g-import-not-at-top
  summary = json.load(open(tmp_path / "shards/runs/fedavg/delay_fraction=0_seed=0/summary.json"))
  assert summary["rounds"] == 3
  again = script(TABLE, args + ["--rounds=3", "--read_only"])
  assert again.returncode == 0, again.stderr[-3000:]


def test_pafed_table_leaves_diverged_runs_out_of_its_means(tmp_path):
  # lr = 1e30 makes PAFed's run diverge (FedAvg's stays finite on this data): its cell
  # reads "all diverged (round r)" and table.csv counts it, instead of a mean of a broken
  # run; FedAvg's one seed is its value alone (no "± 0.000").
  out = script(TABLE, ["--config=reduced", "--dataset=synthetic", "--model=logreg",
                       "--num_clients=6", "--participation=0.5", "--local_epochs=1",
                       "--batch_size=10", "--eval_every=1", "--algorithm=fedavg,pafed",
                       "--partitions=shards", "--deltas=0", "--num_seeds=1", "--rounds=3",
                       "--lr=1e30", f"--output_dir={tmp_path}"])
  assert out.returncode == 0, out.stderr[-3000:]
  md = (tmp_path / "table.md").read_text()
  for title in ("Final accuracy", "Last-10 mean accuracy"):  # one column per algorithm
    row = next(r for r in md.split(title)[1].splitlines() if r.startswith("| non-IID"))
    assert re.fullmatch(r"0\.\d{3}†?", row.split("|")[2].strip()), row  # † short run
    assert re.fullmatch(r"all diverged \(round [123]\)", row.split("|")[3].strip()), row
  row = next(r for r in md.split("Average best accuracy")[1].splitlines()
             if r.startswith("| non-IID"))  # ours | paper | Δ per algorithm
  assert row.split("|")[5].strip().startswith("all diverged (round "), row
  import csv  # pylint: disable=g-import-not-at-top
  (cells,) = list(csv.DictReader(open(tmp_path / "table.csv")))
  assert cells["pafed_diverged"] == "1" and cells["pafed_seeds"] == "0"
  assert cells["fedavg_diverged"] == "0" and cells["fedavg_seeds"] == "1"


@pytest.mark.parametrize("args,message", [
    # one output folder per name: the second run was refused after the first had run
    (["--algorithm=fedavg,fedprox,fedavg"], "error: --algorithm: lists fedavg more than once"),
    (["--seed=-1"], "error: --seed: must be >= 0, got -1"),  # numpy's, naming nothing
    (["--shards_per_client=0"], "error: --shards_per_client: must be >= 1, got 0"),
    (["--precision=fp16"], "error: --precision=fp16: value should be one of "
     "<float32|tf32|bf16>"),
])
@pytest.mark.messages
def test_run_py_errors(tmp_path, args, message):
  out = run_script.run(["--num_clients=6", "--rounds=2", f"--output_dir={tmp_path}"] + args,
                       timeout=300)
  assert_one_line_error(out, message)
  assert not (tmp_path / "fedavg").exists()


_BOTH_FAMILIES = ("(on rounds: fedavg, fedprox, fednova, fedadmm, pafed, scaffold, feddyn, "
                  "dp_fedavg; on the virtual clock: fedasync, fedbuff, double_compensation, "
                  "privaasyncfed, dp_fedasync)")


@pytest.mark.parametrize("algorithm,message", [
    ("fedasync,pafed", "fedasync runs on the virtual clock, pafed on the round engine only: "
     "run them separately"),
    ("pafed,fedasyn", "unknown algorithm 'fedasyn'; did you mean fedasync or dp_fedasync? "
     + _BOTH_FAMILIES),
], ids=["mixed", "unknown"])
@pytest.mark.messages
def test_simulate_and_run_py_refuse_an_algorithm_list_in_the_same_words(algorithm, message):
  """One function picks the engine (``algorithms.engine_of``): ``simulate`` raises its
  ConfigError naming ``algorithm``, experiments/run.py prints it as one line naming
  ``--algorithm``, exit status 1. Both in a fresh process: the registry holds the built-in
  algorithms only (other tests of this worker register their own)."""
  code = ("import sys, fedjax_async as fa\nfrom fedjax_async import config\n"
          "try:\n  fa.simulate(algorithm=sys.argv[1], quiet=True)\n"
          "except config.ConfigError as e:\n  print(e)\n")
  api = subprocess.run([sys.executable, "-c", code, algorithm], env=run_script.env(),
                       capture_output=True, text=True, timeout=300)
  assert api.stdout.strip() == f"algorithm: {message}", api.stderr[-3000:]
  out = run_script.run([f"--algorithm={algorithm}"], timeout=300)
  assert (out.returncode, out.stderr.strip()) == (1, f"error: --algorithm: {message}")


FEDEDS = os.path.join(ROOT, "experiments", "fededs_table.py")


@pytest.mark.parametrize("args,message", [
    (["--rounds=0"], "error: --rounds: must be >= 1, got 0"),  # was the whole help text
    (["--data_dir=/nonexistent_dir"], "error: /nonexistent_dir/train-images-idx3-ubyte"),
    (["extra"], "error: unexpected argument(s) 'extra': flags are written --name=value"),
])
@pytest.mark.messages
def test_fededs_table_errors(tmp_path, args, message):
  out = script(FEDEDS, ["--quick", f"--output_dir={tmp_path}"] + args)
  assert_one_line_error(out, message)
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]


def start_interruptible(path, args):
  """``path`` with ``args`` in the background, Python's Ctrl-C handler installed (a
  child of a shell's background job would ignore SIGINT)."""
  default_sigint = ("import runpy, signal, sys; "
                    "signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  return subprocess.Popen([sys.executable, "-c", default_sigint, path] + list(args),
                          env=run_script.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def interrupt_on(proc, marker, sig):
  """Sends ``sig`` once a stdout line holds ``marker``; (stdout, stderr) at the end."""
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if marker in line:
      proc.send_signal(sig)
      break
  out, err = proc.communicate(timeout=120)
  assert marker in "".join(seen), "".join(seen)[-2000:] + err[-2000:]
  return "".join(seen) + out, err


@pytest.mark.parametrize("path,args,marker,sig,says", [
    (SWEEP, SWEEP_ARGS[:2] + ["--rounds=400", "--rounds_per_call=1", "--checkpoint_every=5"],
     "[fedavg x1] round 1/", "SIGINT",
     "interrupted (SIGINT): the runs of every finished computation are stored under "
     "{out}/runs and the others checkpointed every --checkpoint_every=5 rounds under "
     "{out}/checkpoints: rerun the same command with --resume to continue (finished runs "
     "are read back)"),
    (ASYNC, ASYNC_ARGS[:2] + ["--num_updates=3000", "--eval_every=1000",
                              "--groups_per_call=1", "--checkpoint_every=0"], " version ",
     "SIGTERM",
     "interrupted (SIGTERM): the runs under {out} are checkpointed every "
     "--checkpoint_every=0 call(s) of --groups_per_call groups: rerun the same command "
     "with --resume to continue them"),
], ids=["sweep", "async_family"])
@pytest.mark.messages
def test_interrupted_drivers_say_so_in_one_line_without_a_traceback(tmp_path, path, args,
                                                                     marker, sig, says):
  """Ctrl-C / SIGTERM in sweep.py and async_family.py (they had no handler: a
  KeyboardInterrupt traceback, or a silent death by SIGTERM)."""
  import signal  # pylint: disable=g-import-not-at-top
  signum = getattr(signal, sig)
  proc = start_interruptible(path, args + [f"--output_dir={tmp_path}"])
  _, err = interrupt_on(proc, marker, signum)
  assert proc.returncode == 128 + signum, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  assert err.strip().splitlines()[-1] == says.format(out=tmp_path), err[-3000:]


def test_async_family_resumes_an_interrupted_run_to_the_uninterrupted_result(tmp_path):
  """SIGTERM during a virtual-clock run, then the same command with --resume: the run
  continues from its latest checkpoint (one per call of --groups_per_call groups) and its
  metrics equal an uninterrupted run's; a finished run is read back, not run again; a
  flag that changes the results is refused, naming it (--resume with --overwrite:
  test_sweep_into_a_sweep_directory_is_refused_unless_resume_or_overwrite)."""
  import signal  # pylint: disable=g-import-not-at-top
  # (10 groups per call: with 1, a checkpoint per group, 300 in all, took 110 of 115 s)
  args = ["--num_clients=6", "--concurrency=2", "--num_updates=200", "--eval_every=50",
          "--groups_per_call=10", "--algorithm=fedasync,fedbuff", "--buffer_k=2"]
  out = tmp_path / "run"
  proc = start_interruptible(ASYNC, args + [f"--output_dir={out}"])
  _, err = interrupt_on(proc, "[fedasync] version ", signal.SIGTERM)
  assert proc.returncode == 143, err[-3000:]
  assert not (out / "fedasync" / "summary.json").exists()
  # the same command without --resume: refused before any work (it deleted the checkpoints)
  refused = script(ASYNC, args + [f"--output_dir={out}"])
  assert_one_line_error(refused, f"error: --output_dir: {out} already holds a run "
                        "(fedasync/metrics.jsonl, fedasync/checkpoints): pass --resume to "
                        "continue it, --overwrite to start over")
  done = script(ASYNC, args + [f"--output_dir={out}", "--resume"])
  assert done.returncode == 0, done.stderr[-3000:]
  assert "[fedasync] resuming from the checkpoint of group " in done.stdout, done.stdout[-3000:]
  ref = script(ASYNC, args + [f"--output_dir={tmp_path / 'ref'}", "--checkpoint_every=0"])
  assert ref.returncode == 0, ref.stderr[-3000:]
  strip = lambda path: [{k: v for k, v in json.loads(l).items() if k != "wall_time"}
                        for l in open(path)]
  for run in ("fedasync", "fedbuff"):
    assert strip(out / run / "metrics.jsonl") == strip(tmp_path / "ref" / run /
                                                      "metrics.jsonl"), run
  again = script(ASYNC, args + [f"--output_dir={out}", "--resume"])
  assert "[fedbuff] read back from" in again.stdout, again.stdout[-3000:]
  other = script(ASYNC, args + [f"--output_dir={out}", "--resume", "--lr=0.05"])
  assert_one_line_error(other, f"error: --resume: the checkpoint under "
                        f"{out / 'fedasync' / 'checkpoints'} was made with other flags: "
                        "--lr=0.1 (now 0.05)")


@pytest.mark.slow  # ~100 s on 2 cores
def test_fededs_table_resumes_an_interrupted_grid_to_the_uninterrupted_result(tmp_path):
  """SIGTERM during FedEDS's second run of a setting, then the same command with --resume:
  the finished base run and Alg. 1's encrypted sets are read back (not computed again), the
  interrupted run continues from its checkpoint, and rows.jsonl equals an uninterrupted
  run's. A folder holding a run is refused without --resume / --overwrite, and --resume
  with a flag that changes the results names it."""
  import signal  # pylint: disable=g-import-not-at-top
  args = ["--quick", "--privacy=false", "--rounds=3", "--encryptor_epochs=1",
          "--variants=base,fededs", "--checkpoint_every=1", "--rounds_per_call=1"]
  out = tmp_path / "run"
  proc = start_interruptible(FEDEDS, args + [f"--output_dir={out}"])
  _, err = interrupt_on(proc, "[fededs alpha=0.1 K=5 fedavg/fededs] round    1/3",
                        signal.SIGTERM)
  assert proc.returncode == 143, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      f"interrupted (SIGTERM): the FedEDS runs under {out}/runs are checkpointed every "
      "--checkpoint_every=1 rounds: rerun the same command with --resume to continue them "
      "(finished runs and Alg. 1's encrypted sets are read back)"), err[-3000:]
  assert not (out / "runs" / "alpha0.1_K5" / "fedavg_fededs" / "summary.json").exists()
  refused = script(FEDEDS, args + [f"--output_dir={out}"])
  assert_one_line_error(refused, f"error: --output_dir: {out} already holds a FedEDS run "
                        "(flags.json): pass --resume to continue it, --overwrite to start "
                        "over")
  other = script(FEDEDS, args + [f"--output_dir={out}", "--resume", "--lr=0.02"])
  assert_one_line_error(other, f"error: --resume: the runs under {out} were made with other "
                        "flags: --lr=0.01 (now 0.02)")
  done = script(FEDEDS, args + [f"--output_dir={out}", "--resume"])
  assert done.returncode == 0, done.stderr[-3000:]
  for said in ("[fededs alpha=0.1 K=5 fedavg/base] read back from",
               "[fededs] alpha=0.1 K=5: Alg. 1's encrypted sets read back from",
               "[fededs alpha=0.1 K=5 fedavg/fededs] resuming from the checkpoint of round 1"):
    assert said in done.stdout, (said, done.stdout[-3000:])
  assert "Alg. 1 in" not in done.stdout  # not trained again
  ref = script(FEDEDS, args + [f"--output_dir={tmp_path / 'ref'}", "--checkpoint_every=0"])
  assert ref.returncode == 0, ref.stderr[-3000:]
  strip = lambda path: [{k: v for k, v in json.loads(l).items() if k != "wall_time"}
                        for l in open(path)]
  resumed, uninterrupted = strip(out / "rows.jsonl"), strip(tmp_path / "ref" / "rows.jsonl")
  assert [(r["variant"], r["round"]) for r in resumed] == [
      ("base", 1), ("base", 2), ("base", 3), ("fededs", 1), ("fededs", 2), ("fededs", 3)]
  assert resumed == uninterrupted
  assert (out / "table.md").read_text() == (tmp_path / "ref" / "table.md").read_text()
  again = script(FEDEDS, args + [f"--output_dir={out}", "--overwrite"])  # starts over
  assert again.returncode == 0 and "read back" not in again.stdout, again.stderr[-3000:]
  assert "Alg. 1 in" in again.stdout
  # a run's latest checkpoint that cannot be read: one line naming it and the one before
  run_dir = out / "runs" / "alpha0.1_K5" / "fedavg_fededs"
  os.remove(run_dir / "summary.json")
  for root, _, files in os.walk(run_dir / "checkpoints" / "3" / "state"):
    for f in files:
      open(os.path.join(root, f), "wb").close()
  damaged = script(FEDEDS, args + [f"--output_dir={out}", "--resume"])
  assert_one_line_error(damaged, f"error: --resume: the checkpoint of round 3 "
                        f"({run_dir / 'checkpoints' / '3'}) cannot be read")
  assert "delete that folder to resume from " in damaged.stderr


RUN = os.path.join(ROOT, "experiments", "run.py")


@pytest.mark.parametrize("path", [RUN, SWEEP, TABLE, ASYNC, FEDEDS])
@pytest.mark.messages
def test_unparsable_and_unknown_flags_are_one_line_errors(path):
  """absl's "FATAL Flags parsing error ... Pass --helpshort" becomes one error line naming
  the flag (cli.parse_flags)."""
  flag = "--num_seeds" if path == TABLE else "--rounds" if path in (RUN, FEDEDS) else (
      "--num_clients")
  out = script(path, [f"{flag}=abc"])
  assert_one_line_error(out, f"error: {flag}=abc: invalid literal for int()")
  assert "FATAL" not in out.stderr and "helpshort" not in out.stderr
  out = script(path, ["--no_such_flag=1"])
  assert_one_line_error(out, "error: --no_such_flag: unknown flag (--helpfull lists them)")
  out = script(path, ["rounds=3"])  # a word that is not a flag: was ignored, or usage text
  assert_one_line_error(out, "error: unexpected argument(s) 'rounds=3': flags are written "
                        "--name=value (see --help)")


@pytest.mark.messages
def test_a_misspelt_flag_gets_a_suggestion_and_the_other_engines_flags_are_explained():
  out = script(RUN, ["--roundz=3"])
  assert_one_line_error(out, "error: --roundz: unknown flag; did you mean --rounds? "
                        "(--helpfull lists them)")
  out = script(RUN, ["--algorithm=fedasync", "--rounds=3"])
  assert_one_line_error(out, "error: --rounds: the virtual-clock algorithms count server "
                        "updates, not rounds: use --num_updates=N")
  out = script(RUN, ["--num_updates=3"])
  assert_one_line_error(out, "error: --num_updates: a flag of the virtual-clock algorithms")


def test_helpfull_lists_the_flags_of_every_engine():
  out = script(RUN, ["--helpfull"])
  assert out.returncode == 0, out.stderr[-2000:]
  sections = out.stdout.split("==== ")[1:]
  assert [s.split(":", 1)[0] for s in sections] == ["the round engine", "the virtual clock",
                                                    "FedEDS"]
  for section, flag in zip(sections, ("--rounds:", "--num_arrivals:", "--alphas:")):
    assert flag in section, (flag, section[:300])


@pytest.mark.parametrize("path", [RUN, ASYNC])
@pytest.mark.messages
def test_an_output_dir_that_cannot_be_written_is_one_line_before_any_work(tmp_path, path):
  (tmp_path / "a_file").write_text("x")
  target = tmp_path / "a_file" / "out"
  out = script(path, ["--rounds=2" if path == RUN else "--num_updates=2",
                      f"--output_dir={target}"])
  assert_one_line_error(out, f"error: --output_dir={target}: cannot write there (Not a "
                        "directory")
  assert "loading" not in out.stdout  # refused before the data was read


@pytest.mark.messages
def test_an_output_dir_on_a_read_only_disk_is_named_with_the_cause(tmp_path):
  """A read-only tmpfs, mounted here (root only): the check every driver runs first."""
  mnt = tmp_path / "ro"
  mnt.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                           capture_output=True, text=True, check=False)
  if mounted.returncode:
    pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
  try:
    with pytest.raises(ValueError, match=rf"^output\.output_dir={mnt}/out: cannot write there "
                       rf"\(Read-only file system: {mnt}/out\); give a writable "
                       r"output\.output_dir$"):
      outputs.check_writable(str(mnt / "out"))
  finally:
    subprocess.run(["umount", str(mnt)], check=False)


def test_num_arrivals_gives_fedbuff_and_fedasync_the_same_client_work(tmp_path):
  out = script(ASYNC, ["--num_clients=6", "--concurrency=2", "--num_arrivals=8",
                       "--eval_every=4", "--groups_per_call=2", "--buffer_k=2",
                       "--algorithm=fedasync,fedbuff", f"--output_dir={tmp_path}"])
  assert out.returncode == 0, out.stderr[-3000:]
  for run, updates in (("fedasync", 8), ("fedbuff", 4)):
    s = json.load(open(tmp_path / run / "summary.json"))
    assert (s["arrivals"], s["server_updates"]) == (8, updates), run
  table = open(tmp_path / "comparison.md").read()
  assert "| arrivals | server updates |" in table and "Note:" not in table
  bad = script(ASYNC, ["--num_arrivals=7", "--buffer_k=2", "--algorithm=fedbuff",
                       f"--output_dir={tmp_path / 'bad'}"])
  assert_one_line_error(bad, "error: --num_arrivals: must be a multiple of --buffer_k=2")
  both = script(ASYNC, ["--num_arrivals=8", "--num_updates=4", f"--output_dir={tmp_path}"])
  assert_one_line_error(both, "error: --num_arrivals: replaces --num_updates")


def test_a_comparison_with_unequal_arrivals_says_so():
  from fedjax_async.asynchronous import report  # pylint: disable=g-import-not-at-top
  runs = [{"run": "fedasync", "arrivals": 60}, {"run": "fedbuff", "arrivals": 300}]
  note = report.arrivals_note(runs)
  assert note.startswith("Note: the runs took different numbers of client arrivals "
                         "(fedasync 60, fedbuff 300)") and "--num_arrivals" in note
  assert report.arrivals_note(runs[:1] * 2) == ""


# A bug planted under the drivers (tests/test_cli_errors.py only): the data loaders of both
# engines raise numpy's ValueError, which no check of the project's raises.
PLANT = '''import numpy as np

from fedjax_async.asynchronous import experiment as clock
from fedjax_async.rounds import experiment as rounds


def bug(*args, **kwargs):
  return np.reshape(np.zeros(3), (2,))


rounds.load_data = clock.load = bug
'''
RUN_PLANTED = ("import runpy, sys; import planted; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
INTERNAL = (r"internal error: ValueError: cannot reshape array of size 3 into shape \(2,\) "
            r"\(at numpy/\S+\.py:\d+ in \w+; rerun with --traceback or "
            r"FEDJAX_ASYNC_TRACEBACK=1 for the whole traceback\)")


def planted_run(tmp_path, path, args, **env):
  """``path`` with ``args``, the data loaders replaced by ``PLANT``'s bug."""
  (tmp_path / "planted.py").write_text(PLANT)
  e = dict(run_script.env(), PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
  e.pop("FEDJAX_ASYNC_TRACEBACK", None)
  e.update(env)
  return subprocess.run([sys.executable, "-c", RUN_PLANTED, path, *args], env=e,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.messages
def test_an_internal_error_names_its_last_frame_and_the_switch_for_its_traceback(tmp_path):
  """A bug (an exception no check of the project's raised) is no ``error:`` line that
  reads as a wrong flag: ``internal error:``, its type and the innermost frame, one line;
  --traceback or FEDJAX_ASYNC_TRACEBACK=1 prints the traceback before it. A configuration
  error stays one ``error:`` line."""
  args = ["--algorithm=fedavg", "--rounds=2", "--num_clients=5"]
  for path in (RUN, ASYNC):
    out = planted_run(tmp_path, path, args if path == RUN else ["--num_updates=2"])
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert re.fullmatch(INTERNAL, out.stderr.strip().splitlines()[-1]), out.stderr[-3000:]
  for extra, env in (["--traceback"], {}), ([], {"FEDJAX_ASYNC_TRACEBACK": "1"}):
    out = planted_run(tmp_path, RUN, args + extra, **env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback (most recent call last)" in out.stderr, out.stderr[-3000:]
    assert 'planted.py", line 8, in bug' in out.stderr, out.stderr[-3000:]
    assert re.fullmatch(INTERNAL, out.stderr.strip().splitlines()[-1]), out.stderr[-3000:]
  out = planted_run(tmp_path, RUN, args + ["--rounds=0"])
  assert_one_line_error(out, "error: --rounds: must be >= 1, got 0")
  assert out.returncode == 1


def test_which_exceptions_are_configuration_errors(tmp_path, monkeypatch):
  """cli.errors' rule: the project's own exception classes, a ValueError a ``raise`` of
  the project's checks raised, an OSError of the system: ``error:``; anything else (a
  ValueError from numpy, a KeyError): ``internal error:`` naming the innermost frame."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  from fedjax_async.cli import errors  # pylint: disable=g-import-not-at-top
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top

  def raised(fn):
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      return e
    raise AssertionError("nothing raised")

  user = [raised(lambda: config.validate(config.RunConfig().replace(rounds=0))),
          raised(lambda: sweep.parse_values("sweep_lr", "x")),
          raised(lambda: open(tmp_path / "no_such_file"))]
  assert [type(e).__name__ for e in user] == ["ConfigError", "ValueError",
                                              "FileNotFoundError"]
  for e in user:
    assert errors.message(e).startswith("error: "), errors.message(e)
  assert errors.message(user[1]) == "error: --sweep_lr: expected comma-separated numbers, got 'x'"
  bugs = [raised(lambda: np.reshape(np.zeros(3), (2,))), raised(lambda: {}["k"])]
  assert re.fullmatch(INTERNAL, errors.message(bugs[0])), errors.message(bugs[0])
  assert re.fullmatch(r"internal error: KeyError: 'k' \(at tests/test_cli_errors\.py:\d+ in "
                      r"<lambda>; rerun with --traceback .*\)", errors.message(bugs[1]))
  monkeypatch.delenv("FEDJAX_ASYNC_TRACEBACK", raising=False)
  assert not errors.wants_traceback()
  monkeypatch.setenv("FEDJAX_ASYNC_TRACEBACK", "1")
  assert errors.wants_traceback()
