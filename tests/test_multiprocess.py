"""Two local CPU processes as one simulation (JAX's multi-controller runtime, gloo).

Each test launches ``experiments/run.py`` or ``sweep.py`` twice (process 0 and 1, two CPU
devices each, four global devices, ``--client_data=sharded`` by default across processes)
and compares with the same command in one process with four CPU devices: the same GSPMD
program over the same number of devices, so the results agree to float rounding (the
all-reduce across processes may add in another order). The kill-and-resume test kills both
processes (SIGKILL, no chance to save) after their first complete checkpoint and reruns
them with --resume.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

import run_script

SWEEP = os.path.join(run_script.ROOT, "experiments", "sweep.py")
TOL = 1e-6
COMPARED = ("train_loss", "test_loss", "test_accuracy", "model_norm", "online", "delayed")
# PAFed's DUCC on Synthetic(1,1): 8 rounds, a fraction of them delayed, over 20 clients
# (5 per global device: --client_data=sharded needs N a multiple of the device count).
ROUNDS = ["--algorithm=pafed", "--num_clients=20", "--rounds=8", "--rounds_per_call=2",
          "--quiet", "--tensorboard=false"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(script, args, processes=2):
  """The processes of one run (Popen), each with two CPU devices."""
  port = free_port()
  env = dict(run_script.env(), XLA_FLAGS=run_script.xla_flags(
      "--xla_force_host_platform_device_count=2"))
  return [subprocess.Popen(
      [sys.executable, script, *args, f"--coordinator_address=localhost:{port}",
       f"--num_processes={processes}", f"--process_id={i}"],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


def finish(procs, timeout=300):
  outs = [p.communicate(timeout=timeout) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, f"process exited {p.returncode}:\n{out}\n{err[-3000:]}"
  return outs


def one_process(script, args):
  env = dict(run_script.env(), XLA_FLAGS=run_script.xla_flags(
      "--xla_force_host_platform_device_count=4"))
  p = subprocess.run([sys.executable, script, *args], env=env, capture_output=True,
                     text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  return p


def assert_close(rows, reference):
  assert len(rows) == len(reference) > 0
  for r, q in zip(rows, reference):
    for k in COMPARED:
      if q[k] is None:
        assert r[k] is None, (r["round"], k)
      else:
        assert abs(r[k] - q[k]) <= TOL, (r["round"], k, r[k], q[k])


@pytest.mark.xdist_group("multiprocess")
def test_multiprocess_rounds_killed_and_resumed_equal_one_process(tmp_path):
  ref = tmp_path / "one"
  one_process(run_script.RUN, ROUNDS + [f"--output_dir={ref}", "--checkpoint_every=0"])
  out = tmp_path / "two"
  args = ROUNDS + [f"--output_dir={out}", "--checkpoint_every=2"]
  procs = launch(run_script.RUN, args)
  deadline = time.time() + 240
  ckpts = out / "pafed" / "checkpoints"
  while time.time() < deadline and not (
      ckpts.is_dir() and any(re.fullmatch(r"\d+", d) for d in os.listdir(ckpts))):
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    time.sleep(0.02)
  for p in procs:  # both at once, mid-run, without a chance to save
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.communicate()
  kept = sorted(int(d) for d in os.listdir(ckpts) if re.fullmatch(r"\d+", d))
  assert kept and kept[-1] < 8, kept  # killed before the end
  outs = finish(launch(run_script.RUN, args + ["--resume", "--quiet=false"]))
  assert f"resuming from the checkpoint of round {kept[-1]}" in outs[0][0]
  assert outs[1][0] == ""  # process 1 prints nothing; process 0 wrote the files
  assert "process 0 of 2: 2 local / 4 global devices" in outs[0][0]
  assert_close(run_script.read_rows(out / "pafed" / "metrics.jsonl"),
               run_script.read_rows(ref / "pafed" / "metrics.jsonl"))


@pytest.mark.slow  # 30 s on 2 cores; the round engine's test above runs in CI
@pytest.mark.xdist_group("multiprocess")
def test_multiprocess_sweep_splits_its_runs_and_equals_one_process(tmp_path):
  args = ["--algorithm=fedavg", "--num_clients=20", "--rounds=6", "--rounds_per_call=3",
          "--sweep_lr=0.01,0.03,0.1", "--num_seeds=1", "--quiet"]
  one_process(SWEEP, args + [f"--output_dir={tmp_path / 'one'}"])
  finish(launch(SWEEP, args + [f"--output_dir={tmp_path / 'two'}"]))
  for lr in ("0.01", "0.03", "0.1"):
    run = os.path.join("runs", "fedavg", f"lr={lr}_seed=0", "metrics.jsonl")
    assert_close(run_script.read_rows(tmp_path / "two" / run),
                 run_script.read_rows(tmp_path / "one" / run))


def test_process_flags_that_do_not_add_up_are_named_in_one_line():
  from fedjax_async import distributed  # pylint: disable=g-import-not-at-top
  assert distributed.initialize() is False  # no flag, no cluster: one process
  with pytest.raises(ValueError, match=r"^--coordinator_address: needed with"):
    distributed.initialize("", 2, 0)
  with pytest.raises(ValueError, match=r"^--process_id: must be in \[0, --num_processes\)"):
    distributed.initialize("localhost:1", 2, 2)
  with pytest.raises(ValueError, match=r"^--num_processes / --process_id: must be >= 0"):
    distributed.initialize("", -2)
  assert not distributed.joined() and distributed.is_main()
  proc = subprocess.run([sys.executable, run_script.RUN, "--algorithm=fedasync",
                         "--num_processes=2"], env=run_script.env(), capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: --num_processes: FedEDS and the virtual clock run in one process; the round "
      "engine's algorithms and sweeps run across processes (docs/distributed.md)")
