"""The command line as a newcomer meets it: a short --help with the main flags, a
--helpfull of the project's flags only (grouped by part, no absl / orbax flags),
did-you-mean for mistyped --dataset / --model / --algorithm values, an ETA from the steady
chunks only (not the compiling one), and progress lines in round order."""

import io
import os
import re
import subprocess
import sys

from absl import flags
import pytest

from fedjax_async import cli
from fedjax_async import config
from fedjax_async.asynchronous import config as async_config
from fedjax_async.asynchronous import report
from fedjax_async.fededs import config as fededs_config
from fedjax_async.rounds import experiment

import run_script

ROOT = run_script.ROOT
RUN = run_script.RUN
SCRIPTS = {name: os.path.join(ROOT, "experiments", f"{name}.py")
           for name in ("run", "sweep", "pafed_table", "async_family", "fededs_table")}
PROCESS_FLAGS = ["coordinator_address", "num_processes", "process_id", "distributed",
                 "cpu_devices"]
LIBRARY_FLAGS = ["--logtostderr", "--only_check_args", "--verbosity", "--alsologtostderr",
                 "--pdb_post_mortem", "--run_with_profiling", "--undefok"]


def script(path, args):
  env = dict(run_script.env(), COLUMNS="100")  # the help's width
  return subprocess.run([sys.executable, path] + list(args), env=env, capture_output=True,
                        text=True, timeout=300)


def mentioned(text):
  """Flag names at the start of a help line (``  --name:`` / ``  --[no]name:``), in order,
  and those named in an ``also, as above:`` line."""
  full = re.findall(r"^  --(?:\[no\])?([a-z0-9_]+):", text, re.M)
  also = re.search(r"^also, as above: (.*?)(?:\n\n|\Z)", text, re.M | re.S)
  return full, re.findall(r"--([a-z0-9_]+)", also.group(1)) if also else []


def test_help_shows_the_main_flags_with_their_defaults_in_a_short_page():
  out = script(RUN, ["--help"])
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert len(lines) <= 40, out.stdout
  main = ["algorithm", "dataset", "model", "rounds", "num_clients", "delay_fraction", "seed",
          "local_epochs", "output_dir", "flagfile"]
  shown, _ = mentioned(out.stdout)
  assert shown == main, shown
  defaults = config.flag_specs(config.RunConfig)
  for name in main[:-1]:  # each with its default (flagfile has none)
    line = next(l for l in lines if l.startswith(f"  --{name}:"))
    text = " ".join(lines[lines.index(line):lines.index(line) + 3])
    default = defaults[name].default  # None: each engine's, which the help names
    assert (f"(default: {default})" if default is not None else "(default: the round "
            "engine's") in text, (name, text)
  assert "(default: 100)" in out.stdout and "(default: runs/latest)" in out.stdout
  assert lines[-1].startswith("--helpfull shows all flags")
  assert not any(f in out.stdout for f in LIBRARY_FLAGS)
  # -h and the other engines' --help: the same page, with that driver's main flags
  assert script(RUN, ["-h"]).stdout == out.stdout
  clock = script(RUN, ["--algorithm=fedasync", "--help"])
  assert "  --num_updates:" in clock.stdout and "  --rounds:" not in clock.stdout


def _engine_flags(cls, extra=()):
  """The flags of ``cls``'s fields (``algorithm.hp`` has none: its entries are flags of
  the algorithms registered), and ``extra``."""
  return {n for n, spec in config.flag_specs(cls).items() if spec.kind != "tuple"} | set(extra)


def test_helpfull_of_run_py_lists_every_engines_flags_once_grouped_by_part():
  out = script(RUN, ["--helpfull"])
  assert out.returncode == 0, out.stderr[-2000:]
  text = out.stdout
  # one or two lines a flag (the three engines' 130-odd flags, each defined once)
  assert len(text.splitlines()) <= 275, len(text.splitlines())
  assert not any(f in text for f in LIBRARY_FLAGS), [f for f in LIBRARY_FLAGS if f in text]
  assert "orbax" not in text and "absl" not in text
  sections = text.split("\n==== ")[1:]
  assert [s.split(":", 1)[0] for s in sections] == ["the round engine", "the virtual clock",
                                                    "FedEDS"]
  fededs_own = ["quick", "algorithm", "fededs", "fededs_ablation", "fededs_compare_base"]
  imports = ["import_modules", "traceback"]  # run.py's, in every section
  expected = [_engine_flags(config.RunConfig, PROCESS_FLAGS + imports),
              _engine_flags(async_config.AsyncRunConfig, imports),
              _engine_flags(fededs_config.FedEDSRunConfig, fededs_own + imports)]
  for section, want in zip(sections, expected):
    body = section.split("\ngeneral:")[0]
    full, also = mentioned(body)
    assert sorted(full + also) == sorted(want), set(full + also) ^ want  # each once
  for heading in ("data:", "model:", "local training:", "algorithm and its hyper-parameters:",
                  "delays (the round engine's timeline):", "encryption (CKKS):",
                  "run (rounds, seeds, devices):", "outputs and console:",
                  "virtual clock (client times, concurrency, staleness):",
                  "differential privacy:", "FedEDS Alg. 1 (encryptor):", "general:"):
    assert f"\n{heading}\n" in text, heading
  # a flag of both engines has one default; FedEDS's grid names those that differ
  assert "default here" not in sections[1] and "--rounds (default here: 30)" in sections[2]
  assert "  --flagfile:" in text and "  --rounds: T, communication rounds. (default: 100)" in text


@pytest.mark.parametrize("name,own", [
    ("sweep", ["num_seeds", "max_runs_per_computation"]),
    ("pafed_table", []),
    ("async_family", []),
    ("fededs_table", ["quick"]),
])
def test_helpfull_of_each_driver_is_its_project_flags_once(name, own):
  out = script(SCRIPTS[name], ["--helpfull"])
  assert out.returncode == 0, out.stderr[-2000:]
  assert len(out.stdout.splitlines()) <= 300
  assert not any(f in out.stdout for f in LIBRARY_FLAGS)
  full, _ = mentioned(out.stdout)
  want = {"sweep": _engine_flags(config.RunConfig, PROCESS_FLAGS + ["import_modules"]),
          "pafed_table": _engine_flags(config.RunConfig, PROCESS_FLAGS),
          "async_family": _engine_flags(async_config.AsyncRunConfig, ["import_modules"]),
          "fededs_table": _engine_flags(fededs_config.FedEDSRunConfig)}[name] | set(own)
  want |= {"flagfile", "help", "helpfull"}
  assert len(full) == len(set(full)), [f for f in full if full.count(f) > 1]
  assert want <= set(full), want - set(full)
  assert "\ndata:\n" in out.stdout and "\ngeneral:\n" in out.stdout


@pytest.mark.parametrize("path,args,message", [
    (RUN, ["--dataset=fmnist"], "error: --dataset: unknown dataset 'fmnist'; did you mean "
     "fashion_mnist"),
    (RUN, ["--dataset=fashion-mnist"], "error: --dataset: unknown dataset 'fashion-mnist'; "
     "did you mean fashion_mnist?"),
    (RUN, ["--model=cnnn"], "error: --model: unknown model 'cnnn'; did you mean cnn?"),
    (RUN, ["--model=cnn_fedadm"], "error: --model: unknown model 'cnn_fedadm'; did you mean "
     "cnn_fedadmm?"),
    (RUN, ["--algorithm=pafed,fedavgg"], "error: --algorithm: unknown algorithm 'fedavgg'; "
     "did you mean fedavg or dp_fedavg?"),
    (RUN, ["--algorithm=fedprx"], "error: --algorithm: unknown algorithm 'fedprx'; did you "
     "mean fedprox? (on rounds: fedavg"),
    (RUN, ["--algorithm=fedavx", "--fededs"], "error: --algorithm: FedEDS plugs into fedavg, "
     "fedprox or fednova, got 'fedavx'; did you mean fedavg?"),
    (SCRIPTS["async_family"], ["--algorithm=fedasync,fedbuf"], "error: --algorithm: unknown "
     "algorithm 'fedbuf'; did you mean fedbuff?"),
    (SCRIPTS["sweep"], ["--dataset=cifar-10"], "error: --dataset: unknown dataset "
     "'cifar-10'; did you mean cifar10"),
])
def test_a_mistyped_value_is_one_line_naming_the_flag_and_the_close_name(path, args, message):
  out = script(path, args)
  assert out.returncode == 1, out.stdout[-2000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), out.stderr[-2000:]


def test_did_you_mean_and_names_that_are_not_typos(monkeypatch):
  from fedjax_async import data  # pylint: disable=g-import-not-at-top
  assert cli.did_you_mean("fmnist", data.DATASETS).startswith("; did you mean fashion_mnist")
  assert cli.did_you_mean("zzz", data.DATASETS) == ""
  fv = flags.FlagValues()
  for name in ("dataset", "model", "algorithm"):
    flags.DEFINE_string(name, None, "", flag_values=fv)
    monkeypatch.setitem(cli.help.GROUPS, name, "data")
  fv(["prog", "--dataset=mnist", "--model=auto", "--algorithm=fedavg,fedasync"])
  cli.check_names(fv)  # known names
  fv["dataset"].parse("zzz_far_from_any")  # close to none: left to the config's own check
  cli.check_names(fv)
  pytest.importorskip("tensorflow_datasets")
  fv["dataset"].parse("emnist")  # a tensorflow-datasets name, though close to mnist
  cli.check_names(fv)
  fv["dataset"].parse("mnsit")
  with pytest.raises(ValueError, match=r"^--dataset: unknown dataset 'mnsit'; did you mean "
                     "mnist"):
    cli.check_names(fv)


def row(t):
  return {"round": t, "test_accuracy": 0.5, "train_loss": 1.0, "online": 3, "delayed": 1,
          "dropped": 0, "mean_staleness": 0.25}


def test_eta_uses_only_the_chunks_after_the_compiling_one():
  # 20 rounds in chunks of 4. The first chunk, compilation included, is back 60 s after
  # the start; the next two take 2 s and 3 s: 5 s for 8 rounds, 0.625 s per round.
  times = iter([1000.0, 1060.0, 1062.0, 1065.0])
  out = io.StringIO()
  progress = experiment.Progress("run", total=20, stream=out, every=4,
                                 clock=lambda: next(times))
  progress([row(t) for t in range(1, 5)])
  progress([row(t) for t in range(5, 9)])
  progress([row(t) for t in range(9, 13)])
  lines = out.getvalue().splitlines()
  assert lines[0].endswith("| ETA after the first steady chunk"), lines[0]
  # after round 8: 4 rounds in 2 s, 12 rounds left -> 6 s
  assert lines[1].endswith("| 2.00 rounds/s ETA 6s"), lines[1]
  # after round 12: (3 + 2) s / 8 rounds = 0.625 s per round, 8 rounds left -> 5 s
  assert lines[2].endswith(f"| 1.60 rounds/s ETA {8 * 5 / 8:.0f}s"), lines[2]


def test_eta_of_all_algorithms_adds_each_later_runs_start_up_once():
  # algorithm 1 of 3, 6 rounds each, chunks of 3: the first chunk is back after 6.5 s,
  # the second 1.5 s later (0.5 s per round, so the first chunk's start-up was
  # 6.5 - 3 x 0.5 = 5 s). Later: 2 runs x (6 rounds x 0.5 s + 5 s) = 16 s.
  times = iter([100.0, 106.5, 108.0])
  out = io.StringIO()
  overall = experiment.Overall(count=3, rounds=6)
  progress = experiment.Progress("pafed", total=6, stream=out, position=(1, 3),
                                 overall=overall, clock=lambda: next(times))
  progress([row(1), row(2), row(3)])
  progress([row(4), row(5), row(6)])
  lines = out.getvalue().splitlines()
  assert lines[2].endswith("| ETA after the first steady chunk"), lines[2]
  assert lines[-1].endswith("| 2.00 rounds/s ETA 0s, all 3 algorithms 16s"), lines[-1]


def test_virtual_clock_eta_uses_only_the_calls_after_the_first(capsys):
  # 100 server updates, 10 per call: the first call (compiling) is back at 30 s, the
  # next 2 s later
  times = iter([30.0, 32.0])
  progress = report.ArrivalProgress("fedasync", 100, [], clock=lambda: next(times))
  rows = lambda v0: [{"arrival_version": v, "test_accuracy": None, "train_loss": 1.0,
                      "staleness": 1.0} for v in range(v0, v0 + 10)]
  progress(rows(0))
  progress(rows(10))
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].endswith("| ETA after the first steady call"), lines[0]
  # 10 versions in 2 s, 80 left -> 16 s (the first call's 30 s would have said 120 s)
  assert lines[1].endswith("| 5.0 arrivals/s ETA 16s"), lines[1]


def first_round(line):
  return int(re.search(r"round\s+(\d+)", line).group(1))


def test_a_tick_from_inside_a_chunk_keeps_the_lines_in_round_order():
  times = iter([100.0, 105.0, 112.0, 113.0])
  out = io.StringIO()
  progress = experiment.Progress("cnn", total=2, stream=out, clock=lambda: next(times))
  progress.tick(1)  # 5 s after the start: no line
  progress.tick(2)  # 12 s: a line, before round 1's own line (the chunk is not back yet)
  progress([row(1), row(2)])
  lines = out.getvalue().splitlines()
  assert len(lines) == 3 and "running" in lines[0], lines
  assert [first_round(l) for l in lines] == [1, 1, 2], lines


def test_progress_lines_of_a_run_come_in_round_order(capsys, monkeypatch):
  """A real run whose compiled chunks tick every round (no silence needed; chunks of fixed
  lengths, as over several processes, where the program has the tick): every line that
  names a round names one at or after the previous line's."""
  import fedjax_async as fa  # pylint: disable=g-import-not-at-top
  from fedjax_async import loop  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(experiment.Progress, "MAX_SILENCE", 0.0)
  monkeypatch.setattr(loop, "chunks_timed", lambda: False)
  fa.simulate(algorithm="fedavg", num_clients=5, rounds=4, rounds_per_call=2,
              checkpoint_every=0, tensorboard=False)
  out = capsys.readouterr().out
  lines = [l for l in out.splitlines() if l.startswith("[fedavg]") and "round" in l
           and "compiling" not in l]
  assert any("running" in l for l in lines), out  # the ticks ran
  rounds = [first_round(l) for l in lines]
  assert rounds == sorted(rounds), lines
  assert [first_round(l) for l in lines if " acc " in l] == [1, 2, 3, 4], lines
