"""Checkpoints: round trip, schedule, kill -9 + --resume == uninterrupted, divergence,
SIGTERM / SIGINT, TensorBoard steps across a resumption."""

import errno
import glob
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_async import outputs
from fedjax_async import interrupts
from fedjax_async import config as config_lib
from fedjax_async import checkpoint as ckpt_lib
from fedjax_async.rounds import engine
from fedjax_async.rounds import experiment
from fedjax_async.algorithms import get

from run_script import RUN, env, read_rows, run, without_wall
ROUNDS = 40
ARGS = ["--algorithm=pafed", "--dataset=synthetic", "--num_clients=30",
        "--participation=0.34", f"--rounds={ROUNDS}", "--local_epochs=1", "--batch_size=10",
        "--lr=0.05", "--delay_fraction=0.3", "--max_delay=2", "--rounds_per_call=2",
        "--checkpoint_every=4", "--keep_checkpoints=2", "--seed=5"]


def tb_scalars(tb_dir, tag):
  """[(step, value)] of ``tag`` as TensorBoard reads ``tb_dir``: event files in name order,
  a session restart (SessionLog START) at step s discarding the steps >= s read before.
  (tensorboard itself is not installed: the records are parsed here.)"""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  seen = []
  for path in sorted(glob.glob(os.path.join(str(tb_dir), "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    i = 0
    while i + 12 <= len(data):  # TFRecord: length u64, crc u32, data, crc u32
      (n,) = struct.unpack("<Q", data[i:i + 8])
      if i + 16 + n > len(data):
        break  # a record cut short
      ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 16 + n
      if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START:
        seen = [(s, v) for s, v in seen if s < ev.step]
      seen += [(ev.step, v.simple_value) for v in ev.summary.value if v.tag == tag]
  return seen


def row(t):
  return {"round": t, "train_loss": 1.0 / (t + 1), "test_accuracy": None, "nonfinite": False}


def test_tensorboard_rounds_are_on_disk_when_written_and_a_resume_rewrites_them(tmp_path):
  tb = outputs.TensorBoard(str(tmp_path), True)
  tb.write([row(t) for t in range(6)])
  # Read while the writer is still open (a run killed now, after its checkpoint): every
  # step is there (tensorboardX's SummaryWriter left the last ones in its queue).
  assert [s for s, _ in tb_scalars(tmp_path / "tb", "train_loss")] == list(range(6))
  tb.write([row(t) for t in range(6, 9)])  # rounds after the checkpoint of round 6
  tb.close()
  # Resumed from the checkpoint of round 4 (say the file had lost rounds 4 and 5): the
  # restored rows 0..3 are written again after a session restart at step 0, then the rest.
  tb = outputs.TensorBoard(str(tmp_path), True, purge_step=0)
  tb.write([row(t) for t in range(4)])
  tb.write([row(t) for t in range(4, 10)])
  tb.close()
  got = tb_scalars(tmp_path / "tb", "train_loss")
  assert [s for s, _ in got] == list(range(10))
  np.testing.assert_allclose([v for _, v in got], [1.0 / (t + 1) for t in range(10)],
                             rtol=1e-6)
  assert len(glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))) == 2


def test_round_trip_restores_every_array_and_the_rows(tmp_path):
  alg = get("pafed")
  state = engine.init_state(alg, jnp.arange(6.0), num_clients=4, ring_size=3, seed=9)
  state = state._replace(round=jnp.int32(7), w=state.w * 2.5,
                         client_state={k: v + i for i, (k, v) in
                                       enumerate(state.client_state.items())})
  rows = [{"round": 1, "test_accuracy": None, "online": 3}, {"round": 2, "train_loss": 0.5}]
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


def test_a_full_disk_during_a_save_is_one_line_and_leaves_no_partial_checkpoint(tmp_path):
  c = ckpt_lib.Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  c.save(4, {"w": np.full(3, 4, np.float32)}, [], {})

  def full_disk(step, **kwargs):  # what orbax leaves when the disk fills mid-write
    os.makedirs(tmp_path / "ck" / f"{step}.orbax-checkpoint-tmp-1764115200")
    raise OSError(errno.ENOSPC, "No space left on device")

  c.manager.save = full_disk
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    c.save(8, {"w": np.full(3, 8, np.float32)}, [], {})
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(f"cannot write the checkpoint of round 8 under {tmp_path / 'ck'}: "
                        "the disk is full (No space left on device); the checkpoint of "
                        "round 4 is kept")
  assert sorted(os.listdir(tmp_path / "ck")) == ["4"]
  np.testing.assert_array_equal(c.restore({"w": np.zeros(3, np.float32)}).state["w"], [4] * 3)


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
def test_resume_with_more_rounds_extends_a_finished_run(reference, tmp_path):
  """A finished 20-round run, resumed with --rounds=40, continues from its last checkpoint
  to the 40-round run's result (its timeline's first 20 rounds are the same draws)."""
  short = [a if not a.startswith("--rounds=") else "--rounds=20" for a in ARGS]
  first = run(short + [f"--output_dir={tmp_path}"])
  assert first.returncode == 0, first.stderr[-3000:]
  res = run(ARGS + [f"--output_dir={tmp_path}", "--resume"])
  assert res.returncode == 0, res.stderr[-3000:]
  assert "resuming from the checkpoint of round 20" in res.stdout
  assert "extending its 20 rounds to 40" in res.stdout
  got = read_rows(tmp_path / "pafed" / "metrics.jsonl")
  want = read_rows(reference / "pafed" / "metrics.jsonl")
  assert [r["round"] for r in got] == list(range(1, ROUNDS + 1))
  for a, b in zip(got, want):
    for k in ("train_loss", "test_accuracy", "online", "delayed"):
      assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["round"], k)
  fewer = run([a if not a.startswith("--rounds=") else "--rounds=10" for a in ARGS]
              + [f"--output_dir={tmp_path}", "--resume"])
  assert fewer.returncode != 0 and "--rounds=40 (now 10)" in fewer.stderr


@pytest.mark.xdist_group("checkpoint_reference")  # its module fixture computed once
def test_killed_run_resumes_to_the_uninterrupted_result(reference, tmp_path):
  ref_dir, cut_dir = reference, tmp_path / "cut"

  # Start the same run, SIGKILL it once it is well past a checkpoint but not finished.
  metrics = cut_dir / "pafed" / "metrics.jsonl"
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
  ck = ckpt_lib.Checkpointer(str(cut_dir / "pafed" / "checkpoints"))
  killed_at = ck.latest_round()
  ck.close()
  assert killed_at is not None and 4 <= killed_at < ROUNDS

  res = run(ARGS + [f"--output_dir={cut_dir}", "--resume"])
  assert res.returncode == 0, res.stderr[-3000:]
  m = re.search(r"resuming from the checkpoint of round (\d+)", res.stdout)
  assert m and int(m.group(1)) == killed_at

  assert without_wall(read_rows(metrics)) == without_wall(
      read_rows(ref_dir / "pafed" / "metrics.jsonl"))
  # TensorBoard has every round once, as metrics.jsonl (the killed process may have lost
  # some of its last events; the resumed one rewrote the checkpoint's rounds)
  for tag in ("train_loss", "test_accuracy"):
    got = tb_scalars(cut_dir / "pafed" / "tb", tag)
    want = [(r["round"], r[tag]) for r in read_rows(metrics) if r[tag] is not None]
    assert [s for s, _ in got] == [s for s, _ in want], tag
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)
  final = {}
  for d in (ref_dir, cut_dir):
    c = ckpt_lib.Checkpointer(str(d / "pafed" / "checkpoints"))
    final[d] = c.restore_raw(ROUNDS)
    c.close()
  a, b = final[ref_dir], final[cut_dir]
  assert a.round == b.round == ROUNDS
  # round, w, ring, PAFed's duals, the key (and no server state)
  assert sorted(a.state) == sorted(b.state) and len(a.state) >= 5
  for k in a.state:
    np.testing.assert_array_equal(a.state[k], b.state[k])
  with open(ref_dir / "pafed" / "summary.json") as f1, \
       open(cut_dir / "pafed" / "summary.json") as f2:
    s1, s2 = json.load(f1), json.load(f2)
  assert s1["average_best_accuracy"] == s2["average_best_accuracy"]
  assert s1["final_accuracy"] == s2["final_accuracy"]


@pytest.mark.xdist_group("checkpoint_reference")  # its module fixture computed once
def test_resume_refuses_a_different_configuration(reference, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(reference / "pafed" / "checkpoints", tmp_path / "pafed" / "checkpoints")
  res = run(ARGS + [f"--output_dir={tmp_path}", "--resume", "--lr=0.07"])
  assert res.returncode != 0
  assert "--lr" in res.stderr and "--resume" in res.stderr


def test_divergence_names_round_and_algorithm_and_keeps_good_checkpoint(tmp_path):
  # From engine round 6 (the console's round 7) on the server step is 1e38: the model
  # overflows there, in the middle of the chunk of rounds 6-7.
  args = ARGS[:4] + ["--rounds=12", "--algorithm=fedavg", "--server_lr2=1e38",
                     "--server_lr_switch_round=6"] + ARGS[5:]
  args = [a for a in args if not a.startswith("--algorithm=pafed")]
  res = run(args + [f"--output_dir={tmp_path}"])
  assert res.returncode != 0
  # the cost line before the work, then one error line
  err = [l for l in res.stderr.strip().splitlines() if " cost: " not in l]
  assert len(err) == 1 and err[0].startswith("error: diverged: algorithm fedavg: "), err
  assert "round 7:" in err[0] and "metrics.jsonl holds rounds 1-6" in err[0], err[0]
  assert "last finite checkpoint: round 6" in err[0], err[0]
  c = ckpt_lib.Checkpointer(str(tmp_path / "fedavg" / "checkpoints"))
  # The last finite state, after round 6, is kept, though checkpoints come every 4 rounds.
  assert c.all_rounds() == [4, 6]
  good = c.restore_raw()
  assert all(np.isfinite(v).all() for v in good.state.values()
             if np.issubdtype(v.dtype, np.floating))
  assert len(good.rows) == 6
  c.close()
  rows = read_rows(tmp_path / "fedavg" / "metrics.jsonl")
  assert [r["round"] for r in rows] == list(range(1, 7))  # rounds 1..6 were fine
  # --resume continues from that checkpoint (and diverges again, in the same round).
  res = run(args + [f"--output_dir={tmp_path}", "--resume"])
  assert "resuming from the checkpoint of round 6" in res.stdout, res.stdout[-2000:]
  assert "round 7:" in res.stderr


def _start(args):
  """run.py with ``args`` in the background, Python's Ctrl-C handler installed (a shell's
  background job ignores SIGINT, and a child inherits that: it would not be interrupted)."""
  default_sigint = ("import runpy, signal, sys; "
                    "signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  return subprocess.Popen([sys.executable, "-c", default_sigint, RUN] + args, env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(metrics, at_least, proc, timeout=240):
  deadline, seen = time.time() + timeout, 0
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics):
      with open(metrics) as f:
        seen = f.read().count("\n")
      if seen >= at_least:
        break
    time.sleep(0.01)
  return seen


def test_sigterm_names_the_checkpoint_to_resume_from_and_exits_143(tmp_path):
  # No periodic checkpoint before the end: the one named is the state held at the signal.
  proc = _start(ARGS + ["--checkpoint_every=1000", f"--output_dir={tmp_path}"])
  seen = _wait_for_rows(tmp_path / "pafed" / "metrics.jsonl", 10, proc)
  assert proc.poll() is None, f"the run finished before it could be stopped ({seen} rows)"
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 143, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  m = re.fullmatch(r"\[pafed\] interrupted at round (\d+)/40; the last checkpoint is round "
                   r"(\d+) in (\S+): rerun the same command with --resume to continue",
                   err.strip().splitlines()[-1])
  assert m, err[-3000:]
  at, last, where = int(m.group(1)), int(m.group(2)), m.group(3)
  # The run stopped at the end of the chunk the signal arrived in and saved that state:
  # nothing computed was lost.
  assert where == str(tmp_path / "pafed" / "checkpoints") and 10 <= last == at - 1 < ROUNDS
  assert "stopping at the end of this chunk of rounds to save it" in err
  ck = ckpt_lib.Checkpointer(where)
  assert ck.latest_round() == last
  ck.close()
  # TensorBoard holds every round of the checkpoint (written before it, and synced)
  steps = [s for s, _ in tb_scalars(tmp_path / "pafed" / "tb", "train_loss")]
  assert steps[:last] == list(range(1, last + 1))  # TensorBoard steps: rounds from 1


def test_a_signal_within_deferred_is_raised_when_the_block_ends():
  from fedjax_async import interrupts  # pylint: disable=g-import-not-at-top
  after = []
  with interrupts.handle_interrupts():
    with pytest.raises(interrupts.Interrupted) as e:
      with interrupts.deferred():
        with interrupts.deferred():  # nested: the outer block's end raises
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(0.05)  # the handler runs here (main thread): it only records
          after.append("inner block finished")
        after.append("outer block finished")
    assert e.value.signum == signal.SIGTERM and e.value.exit_code == 143
    assert after == ["inner block finished", "outer block finished"]
    with pytest.raises(interrupts.Interrupted):  # outside deferred(): raised at once
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(1)
  interrupts.check_interrupted()  # out of handle_interrupts: the signals are forgotten


def test_sigterm_during_a_checkpoint_save_waits_for_it_and_names_it(tmp_path, monkeypatch):
  """A signal that arrives while orbax writes the checkpoint of round 4 (sent from inside
  the save here, to hit that moment every time): the save completes, and the message names
  round 4 as the checkpoint to resume from. Raised in the middle of the save, it left round
  4 unwritten and orbax's threads printing tracebacks at exit."""
  real_save = ckpt_lib.Checkpointer.save

  def save(self, round_index, *args, **kw):
    if round_index == 4:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.05)
    return real_save(self, round_index, *args, **kw)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save)
  cfg = config_lib.RunConfig().replace(algorithm="fedavg", num_clients=6, participation=0.5,
                                       rounds=8,
                             local_epochs=1, batch_size=10, rounds_per_call=2,
                             checkpoint_every=2, tensorboard=False,
                             output_dir=str(tmp_path))
  with interrupts.handle_interrupts():
    with pytest.raises(interrupts.Interrupted) as e:
      experiment.run(cfg, "fedavg", out_dir=str(tmp_path), quiet=True)
  assert e.value.signum == signal.SIGTERM
  assert str(e.value) == (f"[fedavg] interrupted at round 5/8; the last checkpoint is round "
                          f"4 in {tmp_path / 'checkpoints'}: rerun the same command with "
                          "output.resume to continue")
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  assert ck.latest_round() == 4 and len(ck.restore_meta()["rows"]) == 4
  ck.close()


def test_sigint_exits_130_with_one_line_and_no_traceback(tmp_path):
  proc = _start(ARGS + ["--checkpoint_every=0", f"--output_dir={tmp_path}"])  # Ctrl-C
  seen = _wait_for_rows(tmp_path / "pafed" / "metrics.jsonl", 2, proc)
  assert proc.poll() is None, f"the run finished before it could be stopped ({seen} rows)"
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  assert re.fullmatch(r"\[pafed\] interrupted at round \d+/40; no checkpoint "
                      r"\(--checkpoint_every=0\): rerun the same command with --resume to "
                      r"start it again", err.strip().splitlines()[-1]), err[-3000:]
  assert len(err.strip().splitlines()) == 2 and " cost: " in err  # the cost line first


TINY = ["--algorithm=fedavg", "--dataset=synthetic", "--num_clients=6", "--rounds=4",
        "--rounds_per_call=2", "--checkpoint_every=2", "--notensorboard"]


def _break_meta(step_dir):
  (step_dir / "meta" / "metadata").write_text('{"round": 4, "ro')  # truncated JSON


def _drop_state(step_dir):
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(step_dir / "state")


@pytest.mark.parametrize("damage", [_break_meta, _drop_state])
def test_resume_from_an_unreadable_checkpoint_names_it_and_the_one_before(tmp_path, damage):
  """A truncated or incomplete latest checkpoint: one line naming its folder and the
  earlier checkpoint to fall back on (was a KeyError traceback or a bare JSON message);
  deleting that folder resumes to the uninterrupted run's rows."""
  first = run(TINY + [f"--output_dir={tmp_path}"], timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  want = without_wall(read_rows(tmp_path / "fedavg" / "metrics.jsonl"))
  damage(tmp_path / "fedavg" / "checkpoints" / "4")
  res = run(TINY + [f"--output_dir={tmp_path}", "--resume"], timeout=300)
  assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
  last = res.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: --resume: the checkpoint of round 4 "
                         f"({tmp_path}/fedavg/checkpoints/4) cannot be read: "), last
  assert last.endswith("delete that folder to resume from the checkpoint of round 2, or "
                       "pass --overwrite to start over"), last
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(tmp_path / "fedavg" / "checkpoints" / "4")
  res = run(TINY + [f"--output_dir={tmp_path}", "--resume"], timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "resuming from the checkpoint of round 2" in res.stdout
  assert without_wall(read_rows(tmp_path / "fedavg" / "metrics.jsonl")) == want


def test_resume_with_another_algorithm_names_the_flag_not_a_state_mismatch(tmp_path):
  """A folder of FedAvg's run resumed as PAFed's: the flag named, before any state is
  read (PAFed's state has other arrays than FedAvg's)."""
  first = run(TINY + [f"--output_dir={tmp_path}"], timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  res = run(TINY + [f"--output_dir={tmp_path}", "--resume", "--algorithm=pafed"],
            timeout=300)
  assert res.returncode == 1, res.stderr[-3000:]
  assert res.stderr.strip().splitlines()[-1] == (
      f"error: --resume: the runs under {tmp_path} were made with other flags: "
      "--algorithm='fedavg' (now 'pafed'); resume with those, or pass --overwrite to start "
      "over"), res.stderr[-3000:]
