"""Checkpoints: round trip, schedule, kill -9 + --resume == uninterrupted, divergence."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async import checkpoint as ckpt_lib
from fedjax_async import engine
from fedjax_async.algorithms import get

from run_script import RUN, env, read_rows, run, without_wall
ROUNDS = 40
ARGS = ["--algorithm=pafed", "--dataset=synthetic", "--num_clients=30",
        "--participation=0.34", f"--rounds={ROUNDS}", "--local_epochs=1", "--batch_size=10",
        "--lr=0.05", "--delay_fraction=0.3", "--max_delay=2", "--rounds_per_call=2",
        "--checkpoint_every=4", "--keep_checkpoints=2", "--seed=5"]


def test_round_trip_restores_every_array_and_the_rows(tmp_path):
  alg = get("pafed")
  state = engine.init_state(alg, jnp.arange(6.0), num_clients=4, ring_size=3, seed=9)
  state = state._replace(round=jnp.int32(7), w=state.w * 2.5,
                         client_state={k: v + i for i, (k, v) in
                                       enumerate(state.client_state.items())})
  rows = [{"round": 0, "test_accuracy": None, "online": 3}, {"round": 1, "train_loss": 0.5}]
  c = ckpt_lib.Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  c.save(7, state, rows, {"lr": 0.1})
  template = engine.init_state(alg, jnp.zeros(6), num_clients=4, ring_size=3, seed=0)
  got = c.restore(template)
  assert got.round == 7 and got.rows == rows and got.config == {"lr": 0.1}
  assert int(got.state.round) == 7
  np.testing.assert_array_equal(got.state.w, np.arange(6.0) * 2.5)
  for k, v in state.client_state.items():
    np.testing.assert_array_equal(got.state.client_state[k], np.asarray(v))
  np.testing.assert_array_equal(got.state.key, np.asarray(state.key))
  assert got.state.key.dtype == np.uint32
  c.close()


def test_max_to_keep_and_latest(tmp_path):
  c = ckpt_lib.Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  for r in (4, 8, 12):
    c.save(r, {"w": np.full(3, r, np.float32)}, [], {})
  assert c.all_rounds() == [8, 12] and c.latest_round() == 12
  np.testing.assert_array_equal(c.restore({"w": np.zeros(3, np.float32)}).state["w"],
                                [12, 12, 12])
  with pytest.raises(ValueError, match="shape"):
    c.restore({"w": np.zeros(4, np.float32)})
  c.close()


@pytest.mark.parametrize("prev,new,every,total,expected", [
    (0, 2, 4, 40, False), (2, 4, 4, 40, True), (4, 6, 4, 40, False), (3, 6, 4, 40, True),
    (38, 40, 7, 40, True), (0, 10, 0, 40, False), (0, 40, 0, 40, False)])
def test_should_save(prev, new, every, total, expected):
  assert ckpt_lib.should_save(prev, new, every, total) is expected


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run (checkpoints every 4 rounds, chunks of 2)."""
  ref_dir = tmp_path_factory.mktemp("ref")
  ref = run(ARGS + [f"--output_dir={ref_dir}"])
  assert ref.returncode == 0, ref.stderr[-3000:]
  return ref_dir


@pytest.mark.xdist_group("checkpoint_reference")  # its module fixture computed once
def test_killed_run_resumes_to_the_uninterrupted_result(reference, tmp_path):
  ref_dir, cut_dir = reference, tmp_path / "cut"

  # Start the same run, SIGKILL it once it is well past a checkpoint but not finished.
  metrics = cut_dir / "metrics.jsonl"
  proc = subprocess.Popen([sys.executable, RUN] + ARGS + [f"--output_dir={cut_dir}"],
                          env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 240
  seen = 0
  while time.time() < deadline:
    if os.path.exists(metrics):
      with open(metrics) as f:  # complete rows only: the run may be writing the next one
        seen = f.read().count("\n")
      if seen >= 14:
        break
    time.sleep(0.01)
  alive = proc.poll() is None
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=30)
  assert alive, f"the run finished before it could be killed ({seen} rows)"
  assert seen < ROUNDS
  ck = ckpt_lib.Checkpointer(str(cut_dir / "checkpoints"))
  killed_at = ck.latest_round()
  ck.close()
  assert killed_at is not None and 4 <= killed_at < ROUNDS

  res = run(ARGS + [f"--output_dir={cut_dir}", "--resume"])
  assert res.returncode == 0, res.stderr[-3000:]
  m = re.search(r"resuming from the checkpoint of round (\d+)", res.stdout)
  assert m and int(m.group(1)) == killed_at

  assert without_wall(read_rows(metrics)) == without_wall(read_rows(ref_dir / "metrics.jsonl"))
  final = {}
  for d in (ref_dir, cut_dir):
    c = ckpt_lib.Checkpointer(str(d / "checkpoints"))
    final[d] = c.restore_raw(ROUNDS)
    c.close()
  a, b = final[ref_dir], final[cut_dir]
  assert a.round == b.round == ROUNDS
  assert sorted(a.state) == sorted(b.state) and len(a.state) >= 6
  for k in a.state:
    np.testing.assert_array_equal(a.state[k], b.state[k])
  with open(ref_dir / "summary.json") as f1, open(cut_dir / "summary.json") as f2:
    s1, s2 = json.load(f1), json.load(f2)
  assert s1["average_best_accuracy"] == s2["average_best_accuracy"]
  assert s1["final_accuracy"] == s2["final_accuracy"]


@pytest.mark.xdist_group("checkpoint_reference")  # its module fixture computed once
def test_resume_refuses_a_different_configuration(reference, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
  res = run(ARGS + [f"--output_dir={tmp_path}", "--resume", "--lr=0.07"])
  assert res.returncode != 0
  assert "--lr" in res.stderr and "--resume" in res.stderr


def test_divergence_names_round_and_algorithm_and_keeps_good_checkpoint(tmp_path):
  # From round 6 on the server step is 1e38: the model overflows in round 6.
  args = ARGS[:4] + ["--rounds=12", "--algorithm=fedavg", "--server_lr2=1e38",
                     "--server_lr_switch_round=6"] + ARGS[5:]
  args = [a for a in args if not a.startswith("--algorithm=pafed")]
  res = run(args + [f"--output_dir={tmp_path}"])
  assert res.returncode != 0
  assert "fedavg" in res.stderr and re.search(r"round 6\b", res.stderr), res.stderr[-2000:]
  c = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  assert c.latest_round() == 4  # the last good one (chunks of 2, every 4 rounds)
  good = c.restore_raw()
  assert all(np.isfinite(v).all() for v in good.state.values()
             if np.issubdtype(v.dtype, np.floating))
  assert len(good.rows) == 4
  c.close()
  assert len(read_rows(tmp_path / "metrics.jsonl")) == 6  # rounds 0..5 were fine
