"""Vmapped sweeps against separate runs, padding of timelines, grids, sharding, aggregation."""

import functools
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from fedjax_async import loop
from fedjax_async import outputs
from fedjax_async import config as config_lib
from fedjax_async import algorithms
from fedjax_async.core import client as client_lib
from fedjax_async import checkpoint as ckpt_lib
from fedjax_async.rounds import engine
from fedjax_async.rounds import experiment
from fedjax_async.sweeps import sweep
from fedjax_async.sweeps import store as sweep_store
from fedjax_async.core import timeline as timeline_lib
import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, M, D, C = 12, 20, 5, 3


def tiny_data(seed=0):
  """A small linearly separable federated data set (FederatedData's fields)."""
  rng = np.random.default_rng(seed)
  w_true = rng.normal(size=(D, C))
  x = rng.normal(size=(N, M, D)).astype(np.float32)
  y = np.argmax(x @ w_true, -1).astype(np.int32)
  counts = rng.integers(8, M + 1, N).astype(np.int32)
  tx = rng.normal(size=(60, D)).astype(np.float32)
  ty = np.argmax(tx @ w_true, -1).astype(np.int32)
  return types.SimpleNamespace(x=x, y=y, counts=counts, test_x=tx, test_y=ty,
                               num_classes=C, name="tiny", num_clients=N, max_examples=M)


BASE = config_lib.RunConfig().replace(
    algorithm="pafed", dataset="synthetic", num_clients=N, participation=0.34,
    delay=timeline_lib.DelayConfig(0.3, "uniform", 2), rounds=6, local_epochs=1,
    batch_size=5, rounds_per_call=3, eval_every=2, checkpoint_every=0, tensorboard=False)


_RUNNERS = {}


@functools.lru_cache(maxsize=None)
def separate_run(cfg, name):
  """One run on ``tiny_data()`` through the plain engine (the reference); one jitted runner
  per algorithm. Cached: the two tests below that compare with the same runs share them
  (one xdist group, so one worker)."""
  fed = tiny_data()
  _, w0, apply_flat = experiment.build_model(cfg, fed)
  alg = algorithms.get(name)
  ecfg = engine.EngineConfig(client_lib.LocalConfig(cfg.local.batch_size,
                                                    cfg.local.local_epochs, M,
                                                    grad_clip=cfg.local.client_grad_clip),
                             cfg.delay.ring_size)
  if (name, ecfg) not in _RUNNERS:
    _RUNNERS[(name, ecfg)] = engine.make_runner(apply_flat, alg, ecfg)
  tl = timeline_lib.build(N, cfg.run.rounds, cfg.run.participation, cfg.delay, cfg.run.seed)
  state = engine.init_state(alg, w0, N, ecfg.ring_size, cfg.run.seed)
  return engine.run_rounds(_RUNNERS[(name, ecfg)], state, tl,
                         cfg.hparams(), engine.DeviceData.from_federated(fed),
                         eval_every=cfg.run.eval_every, rounds_per_call=cfg.run.rounds_per_call)


@pytest.mark.xdist_group("sweep_reference")  # shares separate_run's cached runs
def test_vmapped_sweep_equals_separate_runs():
  name = "pafed"  # server with DUCC, ADMM client state: the most state to get right
  fed = tiny_data()
  sweeps = {"lr": [0.05, 0.2], "delay_fraction": [0.0, 0.5]}
  cfgs = sweep.grid(BASE, sweeps, num_seeds=1)  # 4 runs, different K per timeline
  ks = {timeline_lib.build(N, c.run.rounds, c.run.participation, c.delay,
                           c.run.seed).client.shape[1]
        for c in cfgs}
  assert len(ks) > 1  # padding to the largest K is exercised
  prep = sweep.prepare(cfgs, name, fed)
  res = sweep.simulate_sweep(prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                             num_rounds=BASE.run.rounds, eval_every=BASE.run.eval_every,
                             rounds_per_call=BASE.run.rounds_per_call)
  for i, c in enumerate(cfgs):
    state, rows = separate_run(c, name)
    np.testing.assert_allclose(res.states.w[i], np.asarray(state.w), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(res.states.ring[i], np.asarray(state.ring), rtol=2e-5,
                               atol=2e-6)
    for k in state.client_state:
      np.testing.assert_allclose(res.states.client_state[k][i],
                                 np.asarray(state.client_state[k]), rtol=2e-5, atol=2e-6)
    assert int(res.states.round[i]) == BASE.run.rounds
    assert [r["online"] for r in res.rows[i]] == [r["online"] for r in rows]
    assert [r["delayed"] for r in res.rows[i]] == [r["delayed"] for r in rows]
    for a, b in zip(res.rows[i], rows):
      assert (a["test_accuracy"] is None) == (b["test_accuracy"] is None)
      if a["test_accuracy"] is not None:
        assert abs(a["test_accuracy"] - b["test_accuracy"]) < 1e-6
  # The runs really differ (different lr/delta/seed give different models).
  assert np.ptp(res.states.w[:, 0]) > 1e-4


@pytest.mark.xdist_group("sweep_reference")  # shares separate_run's cached runs
def test_a_sweep_clips_its_clients_gradients_as_a_single_run_does():
  """local.client_grad_clip in a sweep: each run equals the plain engine's run with that
  clip (LocalConfig(grad_clip=...)), not the unclipped one."""
  clipped = BASE.replace(algorithm="fedavg", client_grad_clip=0.05, delay_fraction=0.0)
  cfgs = sweep.grid(clipped, {"lr": [0.05, 0.2]}, num_seeds=1)
  prep = sweep.prepare(cfgs, "fedavg", tiny_data())
  res = sweep.simulate_sweep(prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                             num_rounds=BASE.run.rounds, eval_every=BASE.run.eval_every,
                             rounds_per_call=BASE.run.rounds_per_call)
  for i, c in enumerate(cfgs):
    state, _ = separate_run(c, "fedavg")
    free, _ = separate_run(c.replace(client_grad_clip=0.0), "fedavg")
    np.testing.assert_allclose(res.states.w[i], np.asarray(state.w), rtol=2e-5, atol=2e-6)
    assert np.max(np.abs(np.asarray(state.w) - np.asarray(free.w))) > 1e-3


def test_pad_slots_marks_padding_invalid():
  tl = timeline_lib.build(N, 5, 0.25, timeline_lib.DelayConfig(0.5, "fixed", 1), 3)
  k0 = tl.client.shape[1]
  padded = sweep.pad_slots(tl.slice(0, 5), k0 + 3, N)
  assert padded["client"].shape == (5, k0 + 3)
  assert not padded["valid"][:, k0:].any() and not padded["online"][:, k0:].any()
  assert (padded["client"][:, k0:] == N).all()
  assert (padded["dispatch"][:, k0:] == np.arange(5)[:, None]).all()
  np.testing.assert_array_equal(padded["client"][:, :k0], tl.client)
  np.testing.assert_array_equal(padded["dropped"], tl.dropped)


def test_grid_is_cartesian_product_with_seeds():
  cfgs = sweep.grid(BASE, {"lr": [0.1, 0.2, 0.3], "rho": [0.5, 1.0]}, num_seeds=2)
  assert len(cfgs) == 12
  triples = {(c.local.lr, c.algorithm.rho, c.run.seed) for c in cfgs}
  assert triples == {(lr, rho, s) for lr in (0.1, 0.2, 0.3) for rho in (0.5, 1.0)
                     for s in (0, 1)}
  hp = sweep.stack_hparams(cfgs)
  assert hp["lr"].shape == (12,) and float(hp["rho"][-1]) == 1.0


def test_grid_errors_name_the_flag():
  with pytest.raises(ValueError, match="--sweep_lr"):
    sweep.parse_values("sweep_lr", "0.1,abc")
  with pytest.raises(ValueError, match=r"^--sweep_rho: 0 is not a valid rho \(algorithm\.rho"):
    sweep.grid(BASE, {"rho": [0.0]})
  with pytest.raises(ValueError, match=r"\(delay\.fraction: must be in"):
    sweep.grid(BASE, {"delay_fraction": [1.5]})
  # the swept flag is named first, with the value that was refused
  with pytest.raises(ValueError, match=r"^--sweep_delay_fraction: 1.5 is not a valid "
                     r"delay_fraction \(delay\.fraction: must be in \[0, 1\]"):
    sweep.grid(BASE, {"lr": [0.1], "delay_fraction": [0.5, 1.5]})
  with pytest.raises(ValueError, match=r"^--deltas: 2 is not a valid delay_fraction"):
    sweep.check_values(BASE, "delay_fraction", [0.0, 2.0], "deltas")
  sweep.check_values(BASE, "delay_fraction", [0.0, 0.7], "deltas")  # valid: no error
  with pytest.raises(ValueError, match="--num_seeds"):
    sweep.grid(BASE, {}, num_seeds=0)


def test_aggregate_mean_and_std_over_seeds():
  summaries = [
      {"algorithm": "a", "setting": {"lr": 0.1}, "average_best_accuracy": 0.5,
       "final_accuracy": 0.4, "config": {"seed": 0}, "diverged_round": None},
      {"algorithm": "a", "setting": {"lr": 0.1}, "average_best_accuracy": 0.7,
       "final_accuracy": 0.6, "config": {"seed": 1}, "diverged_round": 3},
      {"algorithm": "a", "setting": {"lr": 0.2}, "average_best_accuracy": 0.9,
       "final_accuracy": 0.8, "config": {"seed": 0}, "diverged_round": None},
  ]
  agg = sweep_store.aggregate(summaries, ["lr"])
  first = next(r for r in agg if r["lr"] == 0.1)
  assert first["num_seeds"] == 2 and first["diverged"] == 1
  assert first["average_best_accuracy_mean"] == pytest.approx(0.5)  # seed 1 diverged
  assert first["average_best_accuracy_std"] == pytest.approx(0.0)
  assert first["final_accuracy_mean"] == pytest.approx(0.4)
  agg = sweep_store.aggregate([summaries[0], dict(summaries[1], diverged_round=None)], ["lr"])
  assert agg[0]["average_best_accuracy_mean"] == pytest.approx(0.6)  # no diverged run
  # the sample std (ddof 1), as every table of seeds
  assert agg[0]["average_best_accuracy_std"] == pytest.approx(np.std([0.5, 0.7], ddof=1))


def test_diverged_runs_are_left_out_of_the_means(tmp_path):
  """A diverged run's accuracy (0.025: chance after the loss went non-finite) does not pull
  the mean down; a setting whose runs all diverged says so instead of a number."""
  run = lambda lr, seed, acc, bad: {
      "algorithm": "fedadmm", "setting": {"lr": lr}, "average_best_accuracy": acc,
      "final_accuracy": acc, "last10_mean_accuracy": acc, "config": {"seed": seed},
      "diverged_round": bad}
  summaries = [run(0.1, 0, 0.8, None), run(0.1, 1, 0.025, 4), run(50.0, 0, 0.025, 4),
               run(50.0, 1, 0.025, 3)]
  agg = sweep_store.aggregate(summaries, ["lr"])
  assert agg[0]["average_best_accuracy_mean"] == pytest.approx(0.8)
  assert agg[0]["final_accuracy_mean"] == pytest.approx(0.8) and agg[0]["diverged"] == 1
  assert np.isnan(agg[1]["average_best_accuracy_mean"]) and agg[1]["diverged"] == 2
  md = sweep_store.write_aggregate(agg, ["lr"], str(tmp_path))
  lines = md.splitlines()
  assert "| fedadmm | 0.1 | 2 | 0.8000 ± 0.0000 | 0.8000 ± 0.0000 | 0.8000 ± 0.0000 | 1 |" in (
      lines)
  assert "| fedadmm | 50 | 2 | all diverged | all diverged | all diverged | 2 |" in lines
  assert "diverged runs, counted in `diverged`, are left out" in md
  csv_text = (tmp_path / "aggregate.csv").read_text()
  assert "fedadmm,50.0,2,nan,nan,nan,nan,nan,nan,2" in csv_text


def test_plot_aggregate_draws_one_line_per_algorithm_and_other_setting(tmp_path):
  row = lambda alg, lr, rho: {"algorithm": alg, "lr": lr, "rho": rho, "num_seeds": 2,
                              "average_best_accuracy_mean": 0.5,
                              "average_best_accuracy_std": 0.1,
                              "final_accuracy_mean": 0.4, "final_accuracy_std": 0.1}
  rows = [row(a, lr, rho) for a in ("pafed", "fedavg") for lr in (0.01, 0.1)
          for rho in (0.1, 1.0)]
  # x = lr; lines: 2 algorithms x 2 values of rho
  assert sweep_store.plot_aggregate(rows, ["lr", "rho"], str(tmp_path / "a.png")) == 4
  assert sweep_store.plot_aggregate(rows[:2], ["lr"], str(tmp_path / "b.png")) == 1
  # seeds only: one bar per algorithm
  bars = [{k: v for k, v in r.items() if k not in ("lr", "rho")} for r in rows[::4]]
  assert sweep_store.plot_aggregate(bars, [], str(tmp_path / "c.png")) == 2
  for name in ("a.png", "b.png", "c.png"):
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_diverging_run_does_not_stop_the_others():
  fed = tiny_data()
  cfgs = sweep.grid(BASE.replace(algorithm="fedavg"),
                    {"server_lr": [1.0, 1e38]}, 1)
  prep = sweep.prepare(cfgs, "fedavg", fed)
  res = sweep.simulate_sweep(prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                             num_rounds=BASE.run.rounds, eval_every=1, rounds_per_call=3)
  assert res.diverged_round[0] is None
  assert res.diverged_round[1] is not None
  assert np.isfinite(res.states.w[0]).all()
  assert res.rows[0][-1]["test_accuracy"] is not None
  assert res.rows[1][-1]["test_accuracy"] is None


SHARDED = textwrap.dedent("""
    import os, sys, json
    import jax, numpy as np
    from test_sweep import tiny_data, BASE
    from fedjax_async.sweeps import sweep
    assert len(jax.devices()) == 4, jax.devices()
    cfgs = sweep.grid(BASE, {{"lr": [0.05, 0.2], "delay_fraction": [0.0, 0.5]}})[:3]
    mesh = sweep.run_mesh()
    prep = sweep.prepare(cfgs, "pafed", tiny_data())
    res = sweep.simulate_sweep(prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                               num_rounds=BASE.run.rounds, eval_every=BASE.run.eval_every,
                               rounds_per_call=BASE.run.rounds_per_call, mesh=mesh)
    print(json.dumps({{"w": np.asarray(res.states.w).tolist(), "mesh": int(mesh.devices.size),
                      "runs": len(res.rows)}}))
""")


@pytest.mark.xdist_group("sweep_reference")  # shares separate_run's cached runs
def test_sharded_over_four_host_devices():
  """3 runs padded to 4 and split over a 4-device mesh match separate runs."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",  # tests/ first: this file's tiny_data
             PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT]),
             XLA_FLAGS=run_script.xla_flags("--xla_force_host_platform_device_count=4"))
  code = SHARDED.format()
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=240)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["runs"] == 3 and result["mesh"] == 4
  cfgs = sweep.grid(BASE, {"lr": [0.05, 0.2], "delay_fraction": [0.0, 0.5]})[:3]
  for i, c in enumerate(cfgs):
    state, _ = separate_run(c, "pafed")
    np.testing.assert_allclose(result["w"][i], np.asarray(state.w), rtol=2e-5, atol=2e-6)


def test_aggregate_table_has_one_cell_per_header_column(tmp_path):
  row = {"algorithm": "fedavg", "lr": 0.1, "num_seeds": 2,
         "average_best_accuracy_mean": 0.5, "average_best_accuracy_std": 0.01,
         "final_accuracy_mean": 0.4, "final_accuracy_std": 0.02,
         "last10_mean_accuracy_mean": 0.45, "last10_mean_accuracy_std": 0.02, "diverged": 0}
  for names in ((), ("lr",)):
    md = sweep_store.write_aggregate([row], names, str(tmp_path))
    counts = {line.count("|") for line in md.splitlines() if line.startswith("|")}
    assert counts == {len(names) + 7}, md


@pytest.mark.parametrize("extra,devices", [(["--cpu_devices=2"], 2),
                                           (["--cpu_devices=2", "--devices=1"], 1)])
def test_sweep_script_splits_runs_over_the_requested_cpu_devices(tmp_path, extra, devices):
  """experiments/sweep.py --cpu_devices=2 makes 2 host devices and splits its runs over
  them (--devices=0: all), or over --devices of them."""
  env = run_script.env()
  args = ["--algorithm=fedavg", "--dataset=synthetic", "--num_clients=10", "--rounds=3",
          "--local_epochs=1", "--batch_size=10", "--num_seeds=2", "--checkpoint_every=0",
          f"--output_dir={tmp_path}"] + extra
  out = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "sweep.py")] + args,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"on {devices} device(s)" in out.stdout, out.stdout[-2000:]
  runs = json.load(open(tmp_path / "sweep.json"))["runs"]
  assert len(runs) == 2 and all(r["final_accuracy"] > 0 for r in runs)
  assert f"figure: {tmp_path / 'aggregate.png'}" in out.stdout  # seeds only: one bar
  assert (tmp_path / "aggregate.png").read_bytes()[:4] == b"\x89PNG"


def test_config_differences_name_the_flags():
  cfg = BASE.replace(rounds=8, lr=0.05,
                            delay=timeline_lib.DelayConfig(0.5, "uniform", 2))
  saved = json.loads(json.dumps(config_lib.run_config_for(BASE, "fedavg")))
  diffs = sweep_store.config_differences(saved, config_lib.run_config_for(cfg, "fedavg"))
  assert diffs == ["--delay_fraction=0.3 (now 0.5)", "--lr=0.1 (now 0.05)",
                   "--rounds=6 (now 8)"]
  # settings that do not change the results are not differences
  same = BASE.replace(rounds_per_call=2, output_dir="elsewhere",
                             tensorboard=True, client_chunk=4)
  assert sweep_store.config_differences(saved, config_lib.run_config_for(same, "fedavg")) == []


class StopAfter(loop.Callback):
  """Records (rounds done, each run's row count) after every chunk of a sweep; stops the
  computation after ``rounds`` rounds (None: never)."""

  def __init__(self, rounds):
    self.rounds, self.calls = rounds, []

  def after_chunk(self, host, state, rows):
    self.calls.append((host.end, [len(r) for r in rows]))
    if host.end == self.rounds:
      host.stop()


def test_interrupted_sweep_computation_resumes_from_its_checkpoint(tmp_path, capsys):
  """A computation stopped after round 3 (checkpoints every 2 rounds) saves a checkpoint
  of round 3 as it stops and continues with --resume from there to the rows and models
  of an uninterrupted one; its checkpoint is removed once its runs are written; a
  checkpoint made with other flags is discarded, naming them, and the computation starts
  over."""
  fed = tiny_data()
  base = BASE.replace(algorithm="pafed", rounds=6, rounds_per_call=1,
                             checkpoint_every=2)
  cfgs = sweep.grid(base, {"lr": [0.05, 0.2]}, num_seeds=1)
  ref = sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "ref"), quiet=True)
  seen = StopAfter(None)
  sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "seen"), quiet=True,
                  callbacks=[seen])
  assert seen.calls == [(r, [r, r]) for r in range(1, 7)]  # rounds done, rows of each run
  out = tmp_path / "cut"
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(out), quiet=True, callbacks=[StopAfter(3)])
  ckpt_root = out / "checkpoints" / "pafed"
  [key] = os.listdir(ckpt_root)
  c = ckpt_lib.Checkpointer(str(ckpt_root / key))
  assert c.all_rounds() == [2, 3]  # round 2 (a multiple of 2), round 3 as it stopped
  assert [len(rows) for rows in c.restore_meta()["rows"]] == [3, 3]
  c.close()
  assert not (out / "runs").exists()  # no run finished
  rest = StopAfter(None)
  resumed = sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(out), resume=True,
                            callbacks=[rest])
  assert "[pafed x2] resuming from the checkpoint of round 3" in capsys.readouterr().out
  assert rest.calls == seen.calls[3:]
  for a, b in zip(resumed, ref):
    assert a["setting"] == b["setting"]
    assert a["final_accuracy"] == pytest.approx(b["final_accuracy"], abs=1e-6)
  for c_ in cfgs:
    name = sweep.run_name(c_, ["lr"])
    rows = outputs.read_metrics(str(out / "runs" / "pafed" / name))
    ref_rows = outputs.read_metrics(str(tmp_path / "ref" / "runs" / "pafed" / name))
    assert [r["round"] for r in rows] == list(range(1, 7))
    for a, b in zip(rows, ref_rows):
      assert (a["online"], a["delayed"]) == (b["online"], b["delayed"])
      assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
  assert not (out / "checkpoints").exists()  # removed once the runs were written
  # a checkpoint of the same runs made with other flags: discarded, named, run again
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "stale"), quiet=True,
                    callbacks=[StopAfter(3)])
  capsys.readouterr()
  longer = [c_.replace(mu=0.5) for c_ in cfgs]
  sweep.run_sweep(longer, "pafed", fed, ["lr"], str(tmp_path / "stale"), resume=True)
  text = capsys.readouterr().out
  assert "[pafed x2] discarding the checkpoint under" in text and "(--mu=0.01 (now 0.5))" in text
  assert "resuming" not in text
  # a checkpoint whose state cannot be read (meta intact): discarded, named, run again
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "damaged"), quiet=True,
                    callbacks=[StopAfter(3)])
  [key] = os.listdir(tmp_path / "damaged" / "checkpoints" / "pafed")
  for root, _, files in os.walk(tmp_path / "damaged" / "checkpoints" / "pafed" / key / "3"
                                / "state"):
    for f in files:
      open(os.path.join(root, f), "wb").close()  # truncated to nothing
  capsys.readouterr()
  out = sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "damaged"), resume=True)
  text = capsys.readouterr().out
  assert "[pafed x2] discarding the checkpoint under" in text and "unreadable" in text
  assert [s_["final_accuracy"] for s_ in out] == pytest.approx(
      [s_["final_accuracy"] for s_ in ref], abs=1e-6)
  # a checkpoint of another grouping of the runs (one run per computation now) is not
  # used, and said to be left
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "regrouped"), quiet=True,
                    callbacks=[StopAfter(3)])
  capsys.readouterr()
  sweep.run_sweep(cfgs, "pafed", fed, ["lr"], str(tmp_path / "regrouped"), resume=True,
                  max_runs_per_computation=1)
  text = capsys.readouterr().out
  assert "resuming" not in text
  assert ("[pafed] 1 checkpoint(s) of computations this command does not run are left under "
          f"{tmp_path / 'regrouped' / 'checkpoints' / 'pafed'}") in text
  # checkpoint_every=0: none, not even when stopped (the Table V driver resumes sweeps)
  off = [c_.replace(checkpoint_every=0) for c_ in cfgs]
  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(off, "pafed", fed, ["lr"], str(tmp_path / "off"), quiet=True,
                    resume=True, callbacks=[StopAfter(3)])
  assert [p for p in (tmp_path / "off").rglob("*") if p.is_file()] == []


def test_run_sweep_resume_reads_back_matching_runs_and_reruns_stale_ones(
    tmp_path, monkeypatch, capsys):
  """Each computation's runs are on disk when it ends; --resume reads back those with the
  same configuration and runs the others (naming the flags that differ)."""
  fed = tiny_data()
  base = BASE.replace(algorithm="fedavg", rounds=3)
  cfgs = sweep.grid(base, {"lr": [0.05, 0.2]}, num_seeds=1)
  first = sweep.run_sweep(cfgs, "fedavg", fed, ["lr"], str(tmp_path),
                          max_runs_per_computation=1, quiet=True)
  run_dir = tmp_path / "runs" / "fedavg" / "lr=0.05_seed=0"
  assert (run_dir / "summary.json").is_file() and (run_dir / "metrics.jsonl").is_file()
  prepared = []
  real_prepare = sweep.prepare
  monkeypatch.setattr(sweep, "prepare",
                      lambda group, *a: prepared.append(len(group)) or real_prepare(group, *a))
  again = sweep.run_sweep(cfgs, "fedavg", fed, ["lr"], str(tmp_path), resume=True)
  assert prepared == [] and again == first  # nothing run: both read back
  assert "2 of 2 runs read back" in capsys.readouterr().out
  # one more value of lr: only that run is computed
  more = sweep.grid(base, {"lr": [0.05, 0.2, 0.1]}, num_seeds=1)
  out = sweep.run_sweep(more, "fedavg", fed, ["lr"], str(tmp_path), resume=True)
  assert prepared == [1] and out[:2] == first and out[2]["setting"] == {"lr": 0.1}
  # other --rounds: the stored runs are stale and run again
  longer = [c.replace(rounds=4) for c in cfgs]
  out = sweep.run_sweep(longer, "fedavg", fed, ["lr"], str(tmp_path), resume=True)
  assert prepared == [1, 2] and all(s["rounds"] == 4 for s in out)
  text = capsys.readouterr().out
  assert "re-running 2 stored run(s) made with other flags (--rounds=3 (now 4))" in text
