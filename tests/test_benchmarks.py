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
