"""The benchmarks' baselines compute what the engine computes.

``benchmarks/throughput.py`` reports engine / loop ratios; they mean something only if
the per-client jit loop and fedjax's per-step pattern run the same arithmetic as the
vmapped engine. Each runner here trains the same rounds from the same initial model, so
the final global models must agree (up to float reassociation under vmap).
"""

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import common
from benchmarks import flagcheck
from fedjax_async import algorithms

pytestmark = pytest.mark.benchmarks  # -m benchmarks: the benchmark scripts' tests


def _fedavg_by_hand(wl):
  """FedAvg on ``wl`` written out: full-batch gradient steps on the softmax cross-entropy
  (jax.grad of a loss written here, not ``client.train``), plain SGD (common.HP has
  momentum 0), then w += server_lr * sum_k n_k delta_k / sum_k n_k."""
  x, y, counts = (np.asarray(a) for a in (wl.data.x, wl.data.y, wl.data.counts))

  def loss(w, xb, yb):
    logp = jax.nn.log_softmax(wl.apply_flat(w, xb))
    return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

  grad = jax.jit(jax.grad(loss))
  lr, eta = common.HP["lr"], common.HP["server_lr"]
  w = np.asarray(wl.w0, np.float64)
  for t in range(wl.rounds):
    deltas, ns = [], []
    for c in wl.timeline.client[t][wl.timeline.valid[t]]:
      wc = w.copy()
      for _ in range(wl.epochs):  # batch = all examples: one step per epoch
        wc = wc - lr * np.asarray(grad(jnp.asarray(wc, jnp.float32), x[c], y[c]), np.float64)
      deltas.append(wc - w)
      ns.append(float(counts[c]))
    w = w + eta * np.average(deltas, axis=0, weights=ns)
  return w


def test_engine_and_both_loops_reach_fedavg_written_by_hand():
  # 5 clients, 3 per round, 25 examples at batch 25 (full batch: the minibatch order
  # cannot matter), 2 epochs, 3 rounds.
  wl = common.Workload("logreg", 3, num_clients=5, examples=25, batch=25, epochs=2,
                       rounds=3, algorithm="fedavg")
  assert common.HP["momentum"] == 0.0
  want = _fedavg_by_hand(wl)
  assert not np.allclose(want, np.asarray(wl.w0), atol=1e-3)  # it trained
  prep, run, _ = common.engine_runner(wl)
  prep()
  state, metrics = run()
  assert int(np.sum(metrics["client_steps"])) == 3 * 3 * 2
  np.testing.assert_allclose(np.asarray(state.w), want, rtol=1e-4, atol=1e-5)
  for make in (common.loop_runner, common.fedjax_loop_runner):
    lprep, lrun = make(wl)
    lprep()
    np.testing.assert_allclose(np.asarray(lrun()), want, rtol=1e-4, atol=1e-5,
                               err_msg=make.__name__)


def test_engine_and_both_loops_carry_pafeds_duals_alike():
  # PAFed's per-client duals through the rounds: the engine and the two loops agree (they
  # share client.train; tests/test_engine.py checks PAFed against a plain loop).
  wl = common.Workload("logreg", 3, num_clients=5, examples=25, batch=10, rounds=3,
                       algorithm="pafed")
  prep, run, _ = common.engine_runner(wl)
  prep()
  state, _ = run()
  for make in (common.loop_runner, common.fedjax_loop_runner):
    lprep, lrun = make(wl)
    lprep()
    np.testing.assert_allclose(np.asarray(lrun()), np.asarray(state.w), rtol=1e-4,
                               atol=1e-5, err_msg=make.__name__)


def test_client_chunk_flag_means_what_the_engine_does_by_default():
  # -1: the engine's own choice, as the experiments make it (tests run on CPU): one
  # client at a time for the 1.66M-parameter CNN, one vmap for 610-parameter logreg
  assert common.client_chunk(-1, 1_663_370) == 1
  assert common.client_chunk(-1, 610) is None
  assert common.client_chunk(0, 1_663_370) is None  # all K in one vmap
  assert common.client_chunk(4, 610) == 4


def _parse(define, argv):
  fv = flags.FlagValues()
  define(fv)
  fv(["prog"] + argv)
  return fv


def test_int_list_flag_parses_and_rejects_naming_the_flag():
  define = lambda fv: flagcheck.int_list("clients", ["10"], "K.", flag_values=fv)
  assert _parse(define, ["--clients=5,200"]).clients == ["5", "200"]
  assert _parse(define, []).clients == ["10"]
  for bad in ("--clients=ten", "--clients=0", "--clients=3,-1", "--clients="):
    with pytest.raises(flags.IllegalFlagValueError, match="--clients: expected"):
      _parse(define, [bad])
  zero_ok = lambda fv: flagcheck.int_list("gaps", ["2"], "k.", minimum=0, flag_values=fv)
  assert _parse(zero_ok, ["--gaps=0,4"]).gaps == ["0", "4"]


def test_choice_list_flag_rejects_unknown_items_naming_the_flag():
  define = lambda fv: flagcheck.choice_list("models", ["logreg"], ["logreg", "cnn"], "M.",
                                            flag_values=fv)
  assert _parse(define, ["--models=cnn,logreg"]).models == ["cnn", "logreg"]
  with pytest.raises(flags.IllegalFlagValueError, match="--models: each item must be one of"):
    _parse(define, ["--models=cnn,resnet"])


@pytest.mark.parametrize("argv,message", [
    (["--systems=engine,pfll"], "--systems: unknown pfll"),
    (["--reps=0"], "--reps: must be >= 1"),
    (["--client_chunk=-2"], "--client_chunk: must be -1"),
    (["--systems="], "--systems: expected a non-empty comma-separated list"),
    (["--systems=engine,"], "--systems: expected a non-empty comma-separated list"),
])
def test_peers_rejects_bad_flags_naming_the_flag(argv, message, capsys):
  from benchmarks import peers  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as exit_info:
    peers.main_driver(argv)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_take_turns_interleaves_keeps_the_best_and_drops_what_cannot_run():
  calls = []
  values = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

  def turn(name):
    def f():
      calls.append(name)
      return next(values[name])
    return f

  def broken():
    calls.append("c")
    return None

  seen = []
  best = common.take_turns({"a": turn("a"), "c": broken, "b": turn("b")}, reps=3,
                           progress=lambda rep, name, v: seen.append((rep, name, v)))
  # one turn each per repetition, in order; "c" could not run, so it had one turn only
  assert calls == ["a", "c", "b", "a", "b", "a", "b"]
  assert best == {"a": 1.0, "b": 4.0}
  assert seen == [(0, "a", 3.0), (0, "b", 5.0), (1, "a", 1.0), (1, "b", 4.0),
                  (2, "a", 2.0), (2, "b", 6.0)]


def test_peers_take_turns_and_report_a_peer_that_cannot_run(monkeypatch, tmp_path, capsys):
  from benchmarks import peers  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
  pfl_times = iter([3.0, 2.0])
  calls = []

  def fake_run_peer(name, args):
    calls.append(name)
    if name == "flower":
      return None, "exit 1: ray failed"
    return {"s_per_round": next(pfl_times), "torch": "x"}, None

  monkeypatch.setattr(peers, "run_peer", fake_run_peer)
  # a small matmul for the peak and no model compilation for the FLOP count: fast
  small_matmul = common.matmul_runner
  monkeypatch.setattr(common, "matmul_runner", lambda n=2048: small_matmul(256))
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(models, "train_step_flops", lambda *a: 1e6)
  peers.main_driver(["--systems=pfl,flower", "--reps=2", "--tag=test"])
  out = capsys.readouterr().out
  assert calls == ["pfl", "flower", "pfl"]  # Flower failed in its first turn: no second
  assert "flower: NOT RUN: exit 1: ray failed" in out
  assert "turn 2/2: pfl 2 s/round" in out
  import json  # pylint: disable=g-import-not-at-top
  rows = {r["system"]: r for r in map(json.loads, open(tmp_path / "peers.jsonl"))}
  assert rows["pfl"]["s_per_round"] == 2.0  # best of its two turns
  assert json.loads(rows["pfl"]["turns_s_per_round"]) == [3.0, 2.0]
  assert np.isnan(rows["flower"]["s_per_round"])
  assert "ray failed" in rows["flower"]["note"]
  assert rows["pfl"]["peak_gflops"] == max(rows["pfl"]["peak_start_gflops"],
                                           rows["pfl"]["peak_interleaved_gflops"])


def test_client_sizes_mix_flag_parses_and_rejects_naming_the_flag():
  from absl import app  # pylint: disable=g-import-not-at-top
  from benchmarks import client_sizes  # pylint: disable=g-import-not-at-top
  assert client_sizes.parse_mix("200x3", 1000) == [200, 200, 200]
  assert client_sizes.parse_mix("20/30/1000", 1000) == [20, 30, 1000]
  for bad in ("200x", "a/b", "0x3", "2000x2", "x3"):
    with pytest.raises(app.UsageError, match="--mixes"):
      client_sizes.parse_mix(bad, 1000)


# ------------------------------------------------------------- the suite's plumbing


def test_scaling_efficiency_is_ideal_time_over_measured_time():
  # strong: 1 device 1.0 s; 2 devices ideally 0.5 s, measured 0.8 s -> 0.625
  assert common.scaling_efficiency("strong", 1, 1.0, 2, 0.8) == pytest.approx(0.625)
  # against a first device count of 2 (0.5 s), 4 devices ideally 0.25 s, measured 0.5
  assert common.scaling_efficiency("strong", 2, 0.5, 4, 0.5) == pytest.approx(0.5)
  # weak: K grows with D, ideal time stays 0.5 s; measured 0.625 s -> 0.8
  assert common.scaling_efficiency("weak", 2, 0.5, 4, 0.625) == pytest.approx(0.8)


def test_child_processes_keep_the_parents_platform(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  assert "JAX_PLATFORMS" not in common.child_env()  # JAX's default: the GPU if any
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  env = common.child_env(XLA_FLAGS="--x")
  assert env["JAX_PLATFORMS"] == "cuda" and env["XLA_FLAGS"] == "--x"
  assert env["PYTHONPATH"] == common.ROOT


def test_machine_records_where_when_and_how_to_run_the_row_again():
  m = common.machine()
  assert m["device_kind"] == "cpu" and m["backend"] == "cpu"
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["time"])
  script = os.path.relpath(os.path.abspath(sys.argv[0]), common.ROOT)
  assert m["command"] == shlex.join([script] + sys.argv[1:])
  assert re.fullmatch(r"([0-9a-f]{40}(\+dirty)?)?", m["git"])
  import jaxlib  # pylint: disable=g-import-not-at-top
  assert m["jaxlib"] == jaxlib.__version__ and m["numpy"] == np.__version__
  assert m["python"] == ".".join(map(str, sys.version_info[:3]))


def test_peer_seconds_per_round_refuses_a_run_too_short_to_time():
  from benchmarks import peers  # pylint: disable=g-import-not-at-top
  # set-up + 1 round 2.0 s, set-up + 1 + 4 rounds 3.0 s: 0.25 s per round
  assert peers.seconds_per_round(2.0, 3.0, 4) == pytest.approx(0.25)
  with pytest.raises(ValueError, match="too short to time; use more --rounds"):
    peers.seconds_per_round(2.0, 1.9, 1)


def _check_args(script, *argv):
  return subprocess.run([sys.executable, os.path.join(common.ROOT, "benchmarks", script),
                         *argv, "--only_check_args"], env=common.child_env(),
                        capture_output=True, text=True)


def test_scaling_verify_flag_is_checked_naming_the_flag():
  assert _check_args("scaling.py", "--verify=logreg:1000:10").returncode == 0
  for bad in ("logreg:1000", "mlp:10:2", "logreg:0:10", "logreg:ten:10"):
    proc = _check_args("scaling.py", f"--verify={bad}")
    assert proc.returncode == 1 and "--verify: expected model:N:K" in proc.stderr, bad


def _row(bench, tag, time, **kw):
  return dict(bench=bench, tag=tag, time=time, cpu="Test CPU [avx2]", backend="cpu",
              devices=1, **kw)


def test_report_keeps_the_newest_row_of_each_configuration_and_formats_the_figures(tmp_path):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  rows = [
      _row("fraction_of_peak", "a", "2026-01-02T00:00:00Z", model="cnn", clients_per_round=10,
           local_steps=6, client_chunk=1, gflops=100.0, peak_gflops=400.0,
           fraction_of_peak=0.25, fraction_of_peak_analytic=0.29, speedup_vs_loop=1.5,
           rounds=2, engine_s=0.5),
      # an older row of the same configuration, later in the file: not shown
      _row("fraction_of_peak", "a", "2026-01-01T00:00:00Z", model="cnn", clients_per_round=10,
           local_steps=6, client_chunk=1, gflops=50.0, peak_gflops=400.0,
           fraction_of_peak=0.125, speedup_vs_loop=0.9),
      _row("fraction_of_peak", "a", "2026-01-01T00:00:00Z", model="cnn",
           clients_per_round=1000, local_steps=6, client_chunk=1, gflops=120.0,
           peak_gflops=400.0, fraction_of_peak=0.3, speedup_vs_loop=float("nan")),
      _row("fraction_of_peak", "other", "2026-01-03T00:00:00Z", model="cnn",
           clients_per_round=10, local_steps=6, client_chunk=1, gflops=1.0, peak_gflops=1.0,
           fraction_of_peak=1.0, speedup_vs_loop=1.0),
      dict(_row("throughput", "a", "2026-01-02T00:00:00Z", model="logreg",
                clients_per_round=200, local_steps=6, engine_steps_per_s=288043.7,
                speedup_vs_loop=7.3458,
                speedup_vs_fedjax_loop=40.2), backend="gpu", devices=2,
           device_kind="NVIDIA H100 80GB HBM3"),
  ]
  for r in rows:
    with open(tmp_path / f"{r['bench']}.jsonl", "a") as f:
      f.write(json.dumps(r) + "\n")
  text = report.render(report.load(str(tmp_path)), tag="a")
  # 10 clients x 2 rounds in 0.5 s: 40 clients/s
  assert ("| Test CPU [avx2] | a | cnn | 10 | 6 | 1 | 40 | 100 | 400 | 25.0 % | 29.0 % | 1.50x |"
          in text)
  assert "12.5 %" not in text and "| other |" not in text
  # a row from before the model count: its column is a dash
  assert ("| Test CPU [avx2] | a | cnn | 1,000 | 6 | 1 | - | 120 | 400 | 30.0 % | - | - |"
          in text)
  # 288,043.7 client-steps/s at 6 local steps: 48,007 clients/s
  assert ("| NVIDIA H100 80GB HBM3 x2 (gpu) | a | logreg | 200 | 1 | 288,044 | 48,007 | 7.35x "
          "| 40.20x | - |" in text)
  assert "peers" not in text  # no rows, no table
  only_gpu = report.render(report.load(str(tmp_path)), tags=["a"], machine="h100")
  assert "Test CPU" not in only_gpu and "288,044" in only_gpu


def test_report_plots_one_line_per_machine_tag_and_model(tmp_path):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  rows = [_row("scaling", t, "2026-01-01T00:00:00Z", sweep="n", model="logreg",
               clients_per_round=100, num_clients=n, s_per_round=0.003, peak_rss=n * 2e4)
          for t in ("a", "b") for n in (1000, 10000, 100000)]
  rows.append(_row("scaling", "a", "2026-01-01T00:00:00Z", sweep="n", model="logreg",
                   clients_per_round=100, num_clients=10, failed="exit 1"))  # not drawn
  rows.append(_row("throughput", "a", "2026-01-01T00:00:00Z", model="logreg",
                   clients_per_round=10, speedup_vs_loop=4.0))  # one-device panel only
  written = report.plot(rows, str(tmp_path))
  # scaling_n: tags a and b, in each of its two panels; throughput: one line in one panel
  assert written == {"scaling_n.png": 4, "throughput.png": 1}
  for name in written:
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # 25-31 s on 2 cores
def test_scaling_k_fit_runs_the_k_sweep_both_ways_and_fits_each(tmp_path):
  # Logistic regression in chunks of 2 (so its round streams): each K once with the
  # uploads summed chunk by chunk (sweep "k") and once kept as [K, d] ("k_kept"), then one
  # least-squares fit per way over K with the largest K in the budget.
  env = common.child_env(JAX_PLATFORMS="cpu", FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "scaling.py"),
       "--sweep=k_fit", "--models=logreg", "--k_logreg=4,8", "--client_chunk=2",
       "--rounds=1", "--examples=20", "--budget_gib=4", "--tag=kfit"], env=env,
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(l) for l in open(tmp_path / "scaling.jsonl")]
  runs = [(r["sweep"], r["clients_per_round"], r["stream_uploads"]) for r in rows
          if r["sweep"] != "k_fit"]
  assert runs == [("k", 4, True), ("k", 8, True), ("k_kept", 4, False),
                  ("k_kept", 8, False)]
  fits = [r for r in rows if r["sweep"] == "k_fit"]
  assert [f["stream_uploads"] for f in fits] == [True, False]
  for f in fits:
    pts = [(r["clients_per_round"], r["peak_rss"]) for r in rows
           if r["sweep"] != "k_fit" and r["stream_uploads"] == f["stream_uploads"]]
    slope = (pts[1][1] - pts[0][1]) / (pts[1][0] - pts[0][0])  # two points: the line
    assert f["bytes_per_slot"] == pytest.approx(slope, rel=1e-6, abs=1e-3)
    assert f["upload_bytes"] == 610 * 4 and f["ks"] == [4, 8]
    if slope > 0:
      # (within 1: the row's least-squares slope and this two-point one agree to ~1e-9,
      # which can move the floor by one, e.g. 1943073 against 1943074)
      assert abs(f["max_k_in_budget"] - int((4 * 2**30 - f["intercept_bytes"]) / slope)) <= 1
  assert "logreg, uploads summed chunk by chunk:" in proc.stdout
  assert "logreg, uploads kept as [K, d]:" in proc.stdout


def test_report_shows_the_k_fit_and_draws_both_ways_of_holding_uploads(tmp_path):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  rows = [_row("scaling", "a", "2026-01-01T00:00:00Z", sweep=sweep, model="cnn",
               clients_per_round=k, num_clients=k, s_per_round=0.1 * k,
               peak_rss=3e8 + k * per, stream_uploads=sweep == "k")
          for sweep, per in (("k", 1.3e5), ("k_kept", 6.7e6)) for k in (10, 100)]
  rows += [_row("scaling", "a", "2026-01-01T00:00:01Z", sweep="k_fit", model="cnn",
                stream_uploads=True, bytes_per_slot=1.3e5, upload_bytes=6653480,
                intercept_bytes=3e8, max_k_in_budget=195_920, budget_gib=24.0),
           _row("scaling", "a", "2026-01-01T00:00:01Z", sweep="k_fit", model="cnn",
                stream_uploads=False, bytes_per_slot=6.7e6, upload_bytes=6653480,
                intercept_bytes=3e8, max_k_in_budget=3_801, budget_gib=24.0)]
  text = report.render(rows)
  assert "| cnn | k | 100 | 100 | summed | 10 | 299 | RSS |" in text
  assert "| cnn | k_kept | 100 | 100 | [K, d] | 10 | 925 | RSS |" in text
  assert "| cnn | summed | 0.124 | 6.35 | 286 | 195,920 | 24 |" in text
  assert "| cnn | [K, d] | 6.39 | 6.35 | 286 | 3,801 | 24 |" in text
  # scaling_k: one line per way of holding the uploads, in each of its two panels
  assert report.plot(rows, str(tmp_path)) == {"scaling_k.png": 4}


def test_report_says_why_a_peer_did_not_run():
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  rows = [_row("peers", "a", "2026-01-01T00:00:00Z", system="pfl", clients_per_round=50,
               s_per_round=0.8, engine_speedup=1.25, note='{"torch": "2"}'),
          _row("peers", "a", "2026-01-01T00:00:00Z", system="flower", clients_per_round=50,
               s_per_round=float("nan"), note="exit 1: ray | failed")]
  text = report.render(rows)
  # the reason stands in the s/round cell: no nameless trailing column
  assert ("| machine | tag | system | K | s/round | GFLOP/s | fraction of peak | "
          "engine speed-up over it |\n|---|---|---|---|---|---|---|---|\n") in text
  assert "| pfl | 50 | 0.8 | - | - | 1.25x |\n" in text
  assert "| flower | 50 | NOT RUN: exit 1: ray / failed | - | - | - |\n" in text


def test_report_names_the_file_and_line_of_a_bad_row(tmp_path):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  (tmp_path / "peers.jsonl").write_text('{"system": "pfl"}\n{not json\n')
  with pytest.raises(ValueError, match=r"peers.jsonl:2: not a JSON line"):
    report.load(str(tmp_path))


def test_run_all_quick_times_the_peers_over_enough_rounds():
  # --quick gave the peers 2 rounds of ~10 ms: pfl's set-up noise swallowed them and the
  # smoke run reported pfl "NOT RUN: ... too short to time; use more --rounds"
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  quick = run_all.plan(run_all.Platform("cpu", 1, "cpu", 2), True, "py")
  peers = next(s for s in quick if s.name == "peers")
  rounds = [int(a.split("=")[1]) for a in peers.args if a.startswith("--rounds=")]
  assert rounds and rounds[0] >= 20


def test_run_all_checks_every_steps_flags_before_running_any(tmp_path):
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  env = dict(common.child_env(), FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  for platform in (run_all.Platform("cpu", 1, "cpu", 2),
                   run_all.Platform("gpu", 8, "NVIDIA H100", 16)):
    for quick in (False, True):
      plan = run_all.plan(platform, quick, "py")
      assert run_all.check_flags(plan, "t", env) == [], (platform, quick)
  bad = [run_all.Step("throughput", "throughput.py", ["--clients=10,x"]),
         run_all.Step("peers", "peers.py", ["--reps=0"])]
  errors = run_all.check_flags(bad, "t", env)
  assert len(errors) == 2
  assert errors[0].startswith("throughput:") and "--clients" in errors[0]
  assert errors[1].startswith("peers:") and "--reps: must be >= 1" in errors[1]
  assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.slow  # 50-100 s on 2 cores
def test_run_all_quick_runs_every_step_and_reports_its_rows(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "run_all.py"), "--quick",
       "--skip=peers", f"--results_dir={tmp_path}", "--tag=smoke"],
      env=common.child_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for step in ("fraction_of_peak", "throughput", "scaling", "multidevice", "multiprocess"):
    assert f"| {step} | ok |" in proc.stdout
    assert (tmp_path / "logs" / "smoke" / f"{step}.log").exists()
    assert all(json.loads(l)["tag"] == "smoke"
               for l in open(tmp_path / f"{step}.jsonl"))
  report_md = (tmp_path / "logs" / "smoke" / "report.md").read_text()
  for title in ("fraction of the matmul peak", "Engine vs per-client loops",
                "Time and peak memory", "largest N", "sharded over devices",
                "sharded over processes"):
    assert title in report_md
  assert "| smoke | strong | logreg | 2 | yes | 4 |" in report_md
  for png in ("fraction_of_peak.png", "throughput.png", "scaling_n.png", "scaling_k.png"):
    assert (tmp_path / "logs" / "smoke" / png).exists()
  # --allocator=auto: tcmalloc preloaded where it is installed, and every row says which
  expected = "tcmalloc" if common.find_tcmalloc() else "system"
  assert {json.loads(l)["allocator"] for step in ("fraction_of_peak", "throughput")
          for l in open(tmp_path / f"{step}.jsonl")} == {expected}


def test_run_all_allocator_preloads_tcmalloc_or_names_the_flag(monkeypatch):
  from absl import app  # pylint: disable=g-import-not-at-top
  from benchmarks import run_all  # pylint: disable=g-import-not-at-top
  env = {"LD_PRELOAD": "libother.so", "PATH": "/bin"}
  assert run_all.allocator_env("system", env) is env
  monkeypatch.setattr(common, "find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
  for choice in ("auto", "tcmalloc"):
    assert run_all.allocator_env(choice, env) == {
        "LD_PRELOAD": "libother.so libtcmalloc_minimal.so.4", "PATH": "/bin"}
  assert run_all.allocator_env("auto", {})["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
  monkeypatch.setattr(common, "find_tcmalloc", lambda: None)
  assert run_all.allocator_env("auto", env) is env  # not installed: the system's
  with pytest.raises(app.UsageError, match="--allocator=tcmalloc: .*libtcmalloc-minimal4"):
    run_all.allocator_env("tcmalloc", env)


def test_rows_name_the_allocator_the_process_runs_with():
  code = "from benchmarks import common; print(common.machine()['allocator'])"
  run = lambda **env: subprocess.run(
      [sys.executable, "-c", code], env=common.child_env(JAX_PLATFORMS="cpu", **env),
      capture_output=True, text=True, timeout=120).stdout.strip()
  assert run(LD_PRELOAD="") == "system"
  lib = common.find_tcmalloc()
  if lib is None:
    pytest.skip("tcmalloc is not installed (Debian package libtcmalloc-minimal4)")
  assert run(LD_PRELOAD=lib) == "tcmalloc"


@pytest.mark.slow  # 50-100 s on 2 cores
def test_multidevice_on_the_machines_own_devices(tmp_path):
  # a machine with two devices of its own (here: two host devices made by XLA_FLAGS in the
  # parent's environment, which --platform=default passes on untouched); D = 4 > 2 is
  # reported as not run, with the reason
  env = common.child_env(JAX_PLATFORMS="cpu", FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path),
                         XLA_FLAGS="--xla_force_host_platform_device_count=2")
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "multidevice.py"),
       "--platform=default", "--devices=1,2,4", "--k_strong=4", "--k_per_device=2",
       "--rounds=1", "--reps=1", "--tag=own"], env=env, capture_output=True, text=True,
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "strong D=4: NOT RUN (rc 1): error: --devices: D = 4, but JAX sees 2" in proc.stdout
  rows = [json.loads(l) for l in open(tmp_path / "multidevice.jsonl")]
  assert [(r["scaling"], r["devices"]) for r in rows] == [
      ("strong", 1), ("strong", 2), ("weak", 1), ("weak", 2)]
  assert all(not r["forced_host_devices"] and r["max_abs_diff_vs_unsharded"] < 1e-6
             for r in rows)
  for r in rows:  # efficiencies against D = 1 of the same kind
    base = next(b for b in rows if b["scaling"] == r["scaling"] and b["devices"] == 1)
    ideal = base["s_per_round"] / r["devices"] if r["scaling"] == "strong" else base[
        "s_per_round"]
    assert r["efficiency"] == pytest.approx(ideal / r["s_per_round"])


@pytest.mark.parametrize("script,flag", [
    ("cnn_profile.py", "--clients=0"), ("conv_in_scan.py", "--reps=0"),
    ("conv_formulation.py", "--batch=0"), ("sweep_vs_sequential.py", "--runs=0"),
    ("ducc_round.py", "--online=0"), ("scaling.py", "--rounds=0"),
    ("multidevice.py", "--k_strong=0"),
])
def test_benchmark_counts_below_one_are_refused_naming_the_flag(script, flag):
  # a count of zero would otherwise run and write rows of nothing
  proc = _check_args(script, flag)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [f"error: {flag}: 0 is not a positive integer"]


@pytest.mark.parametrize("argv,message", [
    (["--results_dir=/nonexistent_dir"], "--results_dir: /nonexistent_dir is not a folder"),
    (["--output=/nonexistent_dir/r.md"],
     "--output: cannot write /nonexistent_dir/r.md: folder /nonexistent_dir does not exist"),
])
def test_report_cli_names_the_bad_path(argv, message):
  proc = subprocess.run([sys.executable, os.path.join(common.ROOT, "benchmarks", "report.py"),
                         *argv], env=common.child_env(), capture_output=True, text=True)
  assert proc.returncode == 1 and message in proc.stderr
  assert "Traceback" not in proc.stderr


def test_report_cli_says_which_tags_exist_when_the_filter_matches_nothing(tmp_path):
  # it printed "(no rows)" and exited 0
  (tmp_path / "throughput.jsonl").write_text("\n".join(json.dumps(r) for r in [
      _row("throughput", "epyc", "2026-01-02T00:00:00Z", model="logreg"),
      _row("throughput", "h100", "2026-01-03T00:00:00Z", model="logreg")]) + "\n")
  run = lambda *a: subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "report.py"),
       f"--results_dir={tmp_path}", *a], env=common.child_env(), capture_output=True,
      text=True)
  proc = run("--tag=h200")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert (f"--tag / --machine: no rows under {tmp_path} match (tags there: epyc, h100; "
          "machines: Test CPU [avx2])") in proc.stderr
  assert run("--tag=h100").returncode == 0


def test_run_all_warns_up_front_of_a_missing_peers_python(tmp_path):
  # it said so only when the peers step ran, after the others
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "run_all.py"), "--dry_run",
       "--quick", "--only=peers", "--peers_python=/nonexistent/python",
       f"--results_dir={tmp_path}"], env=common.child_env(), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert ("warning: --peers_python=/nonexistent/python does not exist: the peers step will "
          "report pfl and Flower as not run") in proc.stderr


def test_server_stream_times_both_ways_and_writes_one_row_per_algorithm(tmp_path):
  env = common.child_env(JAX_PLATFORMS="cpu", FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path))
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "server_stream.py"),
       "--model=logreg", "--clients=6", "--client_chunk=2", "--rounds=2", "--reps=1",
       "--examples=20", "--tag=t"], env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(l) for l in open(tmp_path / "server_stream.jsonl")]
  assert [(r["algorithm"], r["clients_per_round"]) for r in rows] == [("pafed", 6),
                                                                      ("fedavg", 6)]
  for r in rows:
    assert r["delayed"] > 0 and r["params"] == 610
    assert r["streamed_over_block"] == pytest.approx(r["streamed_s"] / r["block_s"])
  assert rows[0]["server_streamed_ms"] > 0 and rows[0]["server_block_ms"] > 0
  assert "server_streamed_ms" not in rows[1]  # the server-only timing is PAFed's
  # the machine at the top level, as in the other benchmarks' rows, so the CSV has it too
  # (it was nested under "machine", which the CSV leaves out)
  assert all(r["cpu"] and r["jax"] and r["time"] for r in rows)
  header = open(tmp_path / "server_stream.csv").readline().strip().split(",")
  assert {"cpu", "allocator", "jax", "time", "git", "command"} <= set(header)
  bad = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "server_stream.py"),
       "--clients=1"], env=env, capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "--clients: need K >= 2" in bad.stderr


# ------------------------------------------------- flags checked up front, results folder


@pytest.mark.parametrize("script,argv,message", [
    ("min_depth.py", ["--composite=x:y"], "--composite: expected a non-empty comma-separated "
     "list of g:f iteration counts"),
    ("min_depth.py", ["--composite=2"], "--composite: expected"),
    ("min_depth.py", ["--composite=0:0"], "--composite: expected"),
    ("min_depth.py", ["--ring_dim=3000"], "--ring_dim: expected 0 (unset) or a power of two"),
    ("min_depth.py", ["--cheb_degrees=59,3000"], "--cheb_degrees: each degree must be at "
     "most 2031"),
    ("ducc_round.py", ["--ring_dim=3000"], "--ring_dim: expected 0 (unset) or a power of two"),
    ("ducc_round.py", ["--kt_recipients=9", "--num_clients=4"],
     "--kt_recipients: must be <= --num_clients"),
    ("ducc_round.py", ["--write_calibration", "--security=insecure"],
     "--write_calibration: the estimate's calibrations are 128-bit CPU seconds"),
    ("server_stream.py", ["--algorithms=fedfoo"],
     "--algorithms: each item must be one of " + ", ".join(algorithms.names("rounds"))),
    ("server_stream.py", ["--algorithms=fedasync"], "--algorithms: each item must be one of"),
    # --model is checked with the flags, not in main (which printed the usage text)
    ("server_stream.py", ["--model=resnet"], "--model=resnet: value should be one of"),
    ("sweep_vs_sequential.py", ["--algorithm=foo"], "--algorithm: expected one of fedavg"),
    ("scaling.py", ["--verify=cnn:2:4"], "--verify: expected model:N:K with N >= K"),
    ("scaling.py", ["--k_fixed_logreg=20", "--n_logreg=10,100"],
     "--n_logreg: each N must be >= --k_fixed_logreg=20"),
    ("scaling.py", ["--models=cnn", "--k_fixed_cnn=50", "--n_cnn=20,100"],
     "--n_cnn: each N must be >= --k_fixed_cnn=50"),
    ("fraction_of_peak.py", ["--examples=5", "--batch=10"], "--examples: must be >= --batch"),
    # empty lists: refused rather than writing an empty table
    ("client_sizes.py", ["--mixes="], "--mixes: expected a non-empty comma-separated list"),
    ("client_sizes.py", ["--mixes=2000x2", "--max_examples=1000"],
     "--mixes: sizes must be in [1, --max_examples=1000]"),
    ("conv_in_scan.py", ["--impls="], "--impls: each item must be one of"),
    ("conv_formulation.py", ["--impls="], "--impls: each item must be one of"),
    ("server_stream.py", ["--clients="], "--clients: expected a non-empty"),
    ("server_stream.py", ["--algorithms="], "--algorithms: each item must be one of"),
    ("min_depth.py", ["--composite="], "--composite: expected a non-empty"),
])
def test_bad_flag_values_are_refused_up_front_naming_the_flag(script, argv, message):
  proc = _check_args(script, *argv)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  # one line (cli.parse_flags), not absl's "FATAL Flags parsing error" block
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --") and message in last and "FATAL" not in proc.stderr


@pytest.mark.parametrize("script,argv", [
    ("min_depth.py", ["--composite=0:3,3:2", "--ring_dim=65536"]),
    ("ducc_round.py", ["--kt_recipients=4", "--num_clients=4", "--ring_dim=32768"]),
    ("server_stream.py", ["--algorithms=fedprox,fednova,fedadmm"]),
    ("scaling.py", ["--verify=cnn:4:4"]),
    ("scaling.py", ["--sweep=k", "--k_fixed_logreg=20", "--n_logreg=10"]),  # no N sweep
    ("fraction_of_peak.py", ["--client_chunk=-1", "--examples=10", "--batch=10"]),
    ("cnn_profile.py", ["--tag=t"]),
])
def test_good_flag_values_pass_the_checks(script, argv):
  proc = _check_args(script, *argv)
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("script", ["throughput.py", "cnn_profile.py", "min_depth.py",
                                    "run_all.py", "report.py"])
def test_a_stray_argument_is_refused_naming_it(script):
  # a word that is not a flag was ignored and the defaults ran (minutes to hours);
  # run_all.py and report.py refused it after printing their whole usage text
  proc = _check_args(script, "clients=4")
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "error: unexpected argument(s) 'clients=4'" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_sweep_vs_sequential_help_lists_the_run_flags():
  # --help listed --runs and --repeats only; --algorithm, --rounds ... needed --helpfull
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "sweep_vs_sequential.py"),
       "--help"], env=common.child_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=300)
  for flag in ("--algorithm:", "--rounds:", "--participation:", "--runs:"):
    assert flag in proc.stdout, flag


def _python(code, cwd=None, **env):
  return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                        text=True, timeout=300,
                        env=dict(common.child_env(JAX_PLATFORMS="cpu"), **env))


def test_sweep_vs_sequential_names_a_bad_run_flag_in_one_line():
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "sweep_vs_sequential.py"),
       "--participation=2"], env=common.child_env(JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert "error: --participation: must be in (0, 1], got 2.0" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_run_all_takes_its_results_dir_from_the_environment(tmp_path):
  run = lambda *argv: subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "run_all.py"), "--dry_run",
       "--only=multidevice", *argv],
      env=common.child_env(JAX_PLATFORMS="cpu", FEDJAX_ASYNC_BENCH_RESULTS=str(tmp_path / "e")),
      capture_output=True, text=True, timeout=300)
  proc = run()
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"rows to {tmp_path / 'e'};" in proc.stdout
  proc = run(f"--results_dir={tmp_path / 'f'}")  # the flag still wins
  assert f"rows to {tmp_path / 'f'};" in proc.stdout
  assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_classification_error_writes_under_the_results_dir_not_the_cwd(tmp_path):
  cwd, results = tmp_path / "cwd", tmp_path / "results"
  cwd.mkdir()
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "classification_error.py"),
       "--preset=insecure_test", "--depths=1"], cwd=cwd,
      env=common.child_env(JAX_PLATFORMS="cpu", FEDJAX_ASYNC_BENCH_RESULTS=str(results)),
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (results / "classification_error.csv").read_text()
  assert text.startswith("d,depth,")
  row = next(csv.DictReader(io.StringIO(text)))
  assert "--preset=insecure_test --depths=1" in row["command"] and row["openfhe"]
  assert list(cwd.iterdir()) == []
  # without the variable: this checkout's benchmarks/results, wherever the run starts
  env = common.child_env()
  env.pop("FEDJAX_ASYNC_BENCH_RESULTS", None)
  out = subprocess.run(
      [sys.executable, "-c", "from absl import flags; "
       "from benchmarks import classification_error; flags.FLAGS(['x']); "
       "print(flags.FLAGS.out_csv)"], cwd=cwd, env=env, capture_output=True, text=True,
      timeout=300)
  assert out.stdout.strip() == os.path.join(common.ROOT, "benchmarks", "results",
                                            "classification_error.csv"), out.stderr[-2000:]


def test_peers_says_a_peer_did_not_run_instead_of_a_nan_speed_up(monkeypatch, tmp_path,
                                                                 capsys):
  from benchmarks import peers  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
  monkeypatch.setattr(peers, "run_peer", lambda name, args: (
      (None, "exit 1: ray failed") if name == "flower" else ({"s_per_round": 2.0}, None)))
  small_matmul = common.matmul_runner
  monkeypatch.setattr(common, "matmul_runner", lambda n=2048: small_matmul(256))
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(models, "train_step_flops", lambda *a: 1e6)
  argv = ["--systems=pfl,flower", "--reps=1", "--tag=test"]
  # the rows' machine names the command: the script's, not pytest's (this test's name)
  monkeypatch.setattr(sys, "argv", [os.path.join(common.ROOT, "benchmarks", "peers.py")] + argv)
  peers.main_driver(argv)
  out = capsys.readouterr().out
  assert "nan" not in out
  assert "[peers] flower  did not run: exit 1: ray failed" in out
  assert "[peers] pfl     2 s/round" in out  # no engine ran: no speed-up over it


def test_ducc_round_times_every_stage_of_the_protocol(tmp_path):
  # Insecure toy parameters (ring 2^11): the CSV has a column per stage of
  # secure_pafed_step's breakdown, the normalisation exchange (Sec. V-A) among them.
  out = tmp_path / "dr.csv"
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "ducc_round.py"),
       "--security=insecure", "--dims=1024,2048", "--ring_dim=2048", "--min_depth=3",
       "--online=2", "--delayed=2", "--num_clients=3", "--target_dim=0",
       f"--out_csv={out}"], env=common.child_env(), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import csv  # pylint: disable=g-import-not-at-top
  rows = list(csv.DictReader(open(out)))
  assert [r["chunks"] for r in rows] == ["1", "2"]
  stages = ["client_encrypt", "normalise", "inner_products", "min", "weighting", "division",
            "projection", "eq17", "key_transform", "decrypt"]
  assert list(rows[0])[2:2 + len(stages)] == stages
  for r in rows:
    assert all(float(r[s]) > 0 for s in stages)
  # the test ring calibrates nothing (the estimate's constants are 128-bit ones)
  assert ("calibration: none from this run (fedjax_async/crypto/calibration.json holds "
          in proc.stdout)
  # each row says where and how it ran (the crypto benchmarks recorded nothing of it)
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  for r in rows:
    assert r["openfhe"] == importlib.metadata.version("openfhe")
    assert r["command"].startswith("benchmarks/ducc_round.py --security=insecure")
    assert r["cpu"] and r["time"] and re.fullmatch(r"([0-9a-f]{40}(\+dirty)?)?", r["git"])


def test_ducc_round_streamed_writes_the_measured_row_with_the_issue_keys(tmp_path):
  """--design=streamed, insecure toy ring: one JSON row per size with the keys the round's
  table reads (measured whole, so ``measured`` true), the cost model's prediction beside
  the measured stages, and an error against the plaintext DUCC at CKKS noise."""
  out = tmp_path / "dr.jsonl"
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", "ducc_round.py"),
       "--design=streamed", "--security=insecure", "--dims=3000", "--ring_dim=2048",
       "--min_depth=3", "--online=2", "--delayed=2", "--num_clients=3", "--target_dim=0",
       "--kt_recipients=2", f"--out_jsonl={out}"], env=common.child_env(),
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (row,) = [json.loads(l) for l in open(out)]
  for key in ("dim", "online", "delayed", "preset", "measured", "peak_rss_gib", "server_s",
              "client_encrypt_s", "key_transform_s"):
    assert key in row, key
  assert (row["dim"], row["chunks"], row["online"], row["delayed"]) == (3000, 3, 2, 2)
  assert row["measured"] is True and row["preset"] == "insecure_test"
  assert row["design"] == "streamed" and row["kt_recipients"] == 2
  assert 0 < row["key_transform_s"] < row["server_s"] and row["peak_rss_gib"] > 0
  assert row["max_abs_err"] < 1e-5
  assert set(row["primitives_ms"]) == {"encrypt", "decrypt", "product", "relinearise",
                                       "slot_sum"}
  assert row["predicted_key_transform_s"] > 0


@pytest.mark.parametrize("script,args", [
    ("ducc_round.py", ["--dims=1024", "--target_dim=0"]),
    ("min_depth.py", ["--security=128"]),
])
def test_a_ring_too_small_for_128_bit_security_names_the_flag(script, args):
  proc = subprocess.run(
      [sys.executable, os.path.join(common.ROOT, "benchmarks", script), "--ring_dim=4096"]
      + args, env=common.child_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert "--ring_dim=4096: ring dimension 4096 is too small" in proc.stderr
  assert "Traceback" not in proc.stderr
