"""The benchmarks' baselines compute what the engine computes.

``benchmarks/throughput.py`` reports engine / loop ratios; they mean something only if
the per-client jit loop and fedjax's per-step pattern run the same arithmetic as the
vmapped engine. Each runner here trains the same rounds from the same initial model, so
the final global models must agree (up to float reassociation under vmap).
"""

from absl import flags
import numpy as np
import pytest

from benchmarks import common
from benchmarks import flagcheck


@pytest.mark.parametrize("algorithm", ["fedavg", "pafed"])
def test_engine_and_both_loops_reach_the_same_global_model(algorithm):
  # 5 clients, 3 per round, 25 examples each at batch 10: 3 steps with a partial last
  # batch; PAFed carries per-client dual variables through the rounds.
  wl = common.Workload("logreg", 3, num_clients=5, examples=25, batch=10, rounds=3,
                       algorithm=algorithm)
  prep, run, _ = common.engine_runner(wl)
  prep()
  state, metrics = run()
  assert int(np.sum(metrics["client_steps"])) == 3 * 3 * 3
  w_engine = np.asarray(state.w)
  assert not np.allclose(w_engine, np.asarray(wl.w0), atol=1e-3)  # it trained
  for make in (common.loop_runner, common.fedjax_loop_runner):
    lprep, lrun = make(wl)
    lprep()
    np.testing.assert_allclose(np.asarray(lrun()), w_engine, rtol=1e-4, atol=1e-5,
                               err_msg=make.__name__)



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
