"""A hyper-parameter the chosen algorithms do not read, set by the user (a flag given to
experiments/run.py or async_family.py, a keyword of ``simulate``), is named once on the
console (``api.unread_note``: the algorithms' traced programs, as the sweep's
``used_names``); one that some algorithm reads, or that every algorithm reads (lr), is
not."""

import pytest

import fedjax_async as fa
from fedjax_async import api
from fedjax_async import config
from fedjax_async.asynchronous import config as async_config
from fedjax_async.rounds import experiment

from test_cli_errors import ASYNC, RUN, planted_run

FEDAVG_NOTE = ("note: fedavg does not read mu, rho (algorithm.mu, algorithm.rho): they "
               "change nothing")


def note(algorithm, **fields):
  return api.unread_note(config.RunConfig().replace(algorithm=algorithm, **fields),
                         list(fields))


def test_the_round_engine_names_what_its_algorithms_do_not_read():
  assert note("fedavg", mu=0.1, rho=0.5, lr=0.05) == FEDAVG_NOTE
  assert note("fedprox", mu=0.1) is None
  assert note("fedadmm", rho=0.5) is None
  assert note("fedavg", lr=0.05, momentum=0.9, delay_fraction=0.5) is None
  assert note("fedavg,fedprox", mu=0.1) == ("note: fedavg does not read mu (algorithm.mu): "
                                            "it changes nothing in its runs")


def test_the_virtual_clock_names_what_its_algorithms_do_not_read():
  cfg = async_config.AsyncRunConfig().replace(algorithm="fedbuff", mix_alpha="0.4", lr=0.05)
  assert api.unread_note(cfg, ["mix_alpha", "lr"]) == (
      "note: fedbuff does not read mix_alpha (algorithm.mix_alpha): it changes nothing")
  assert api.unread_note(cfg.replace(algorithm="fedasync"), ["mix_alpha", "lr"]) is None


def test_simulate_names_its_unread_keywords_once(monkeypatch, capsys):
  def stop(cfg):
    raise RuntimeError("stopped after the note")
  monkeypatch.setattr(experiment, "load_data", stop)
  with pytest.raises(RuntimeError, match="stopped after the note"):
    fa.simulate(algorithm="fedavg", mu=0.1, rho=0.5, lr=0.05, rounds=2, num_clients=5)
  out = capsys.readouterr().out
  assert out.count("note:") == 1 and f"{FEDAVG_NOTE}\n" in out, out


@pytest.mark.messages
def test_the_drivers_name_a_given_flag_the_algorithms_do_not_read_once(tmp_path):
  """The flags given (absl's ``present``), with their names; the planted data loader of
  tests/test_cli_errors.py stops each run right after the note."""
  out = planted_run(tmp_path, RUN, ["--algorithm=fedavg", "--mu=0.1", "--rho=0.5",
                                    "--lr=0.05", "--rounds=2", "--num_clients=5"])
  assert out.stdout.count("note:") == 1, out.stdout
  assert ("note: fedavg does not read mu, rho (--mu, --rho): they change nothing\n"
          in out.stdout), out.stdout
  out = planted_run(tmp_path, ASYNC, ["--algorithm=fedbuff", "--mix_alpha=0.4",
                                      "--num_updates=2"])
  assert out.stdout.count("note:") == 1, out.stdout
  assert ("note: fedbuff does not read mix_alpha (--mix_alpha): it changes nothing\n"
          in out.stdout), out.stdout
