"""The library's one console (``fedjax_async.console``): ``quiet=True`` prints nothing on
any engine, read at the file-descriptor level (what a terminal would show, the in-chunk
progress lines from XLA's callback thread and stderr included); the library's modules
outside the command line report through it, not ``print``."""

import ast
import os

import jax
import pytest

import fedjax_async as fa
from fedjax_async import console
from fedjax_async.fededs import config as fededs_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("api")  # the api tests' compiled round run, shared

ROUNDS = dict(algorithm="fedavg", rounds=2)
CLOCK = dict(algorithm="fedbuff", num_clients=6, concurrency=2, num_updates=6, buffer_k=2,
             eval_every=2, groups_per_call=3, group_size=1)


def test_quiet_prints_nothing_on_any_engine(capfd, tmp_path):
  jax.devices()  # the backend's own once-a-process lines, before the capture
  capfd.readouterr()
  fa.simulate(**ROUNDS, quiet=True, output_dir=str(tmp_path / "rounds"))  # + files, cost
  fa.simulate(**ROUNDS, quiet=True, seeds=[0, 1])  # the sweep engine
  fa.simulate(fa.AsyncRunConfig(), quiet=True, **CLOCK)
  fa.simulate(fededs_config.FedEDSRunConfig().replace(
      **{**fededs_config.QUICK, "variants": "base", "rounds": 2, "train_subset": 200,
         "test_subset": 100, "privacy": False, "utility_epochs": 0, "quiet": True}))
  out, err = capfd.readouterr()
  assert (out, err) == ("", ""), (out[-2000:], err[-2000:])
  # the same round run, not quiet, says what it does (so the capture above can see it)
  fa.simulate(**ROUNDS, output_dir=str(tmp_path / "loud"))
  out, err = capfd.readouterr()
  assert "loading synthetic" in out and "final accuracy" in out and "[fedavg]" in err, (
      out[-2000:], err[-2000:])


def test_silenced_keeps_only_what_quiet_keeps(capsys):
  with console.silenced():
    console.say("progress", console.PROGRESS)
    console.say("result", console.RESULT)
    console.warn("warning")
  assert capsys.readouterr() == ("", "")
  console.quiet_keeps(console.RESULT)  # the command line's --quiet
  try:
    with console.silenced():
      console.say("progress", console.PROGRESS)
      console.say("info")
      console.say("result", console.RESULT)
      console.warn("warning")
    with console.silenced(False):
      console.say("progress", console.PROGRESS)
  finally:
    console.quiet_keeps(console.SILENT)
  assert capsys.readouterr() == ("result\nprogress\n", "warning\n")


def _print_calls(path):
  tree = ast.parse(open(path, encoding="utf-8").read())
  return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
          and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_the_library_reports_through_the_console_not_print():
  """No ``print`` call in fedjax_async/ outside cli/ (the command line's own lines)."""
  found = {}
  for folder, _, files in os.walk(os.path.join(ROOT, "fedjax_async")):
    if os.path.basename(folder) == "cli":
      continue
    for f in files:
      if f.endswith(".py") and f != "console.py":
        lines = _print_calls(os.path.join(folder, f))
        if lines:
          found[os.path.relpath(os.path.join(folder, f), ROOT)] = lines
  assert not found, found
