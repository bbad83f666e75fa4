"""Issue 59, findings 7 and 8 replayed as written: FedEDS from Python (``data=``, what it
writes, ``replace(**QUICK, rounds=2)``), the engine picked by ``algorithm=``, ``quiet=`` on
every engine, inputs that ``data=`` overrides refused, delays said, ``to_pandas``."""

import os
import tempfile

import flax.linen as nn
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async.fededs import config as fededs_config


def _docs_data(num_clients=20):
  """docs/api.md's own data: 600 examples of 8 features, 3 classes."""
  rng = np.random.default_rng(0)
  x, w_true = rng.normal(size=(600, 8)).astype(np.float32), rng.normal(size=(8, 3))
  y, test_x = np.argmax(x @ w_true, 1), rng.normal(size=(200, 8)).astype(np.float32)
  return fa.data.from_arrays(x, y, (test_x, np.argmax(test_x @ w_true, 1)),
                             num_clients=num_clients)


class _Linear(nn.Module):
  @nn.compact
  def __call__(self, h, train: bool = False):
    return nn.Dense(3)(h)


def _one_line_error(excinfo, path: str):
  message = str(excinfo.value)
  assert "\n" not in message and message.startswith(path + ": "), message
  return message


def _fededs_leftovers():
  """The FedEDS folders in the temporary directory (the test's own: ``tempfile.tempdir``
  patched, so that another process's FedEDS run cannot appear in it)."""
  return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("fededs_")}


def test_finding_7_fededs_from_python_takes_data_and_writes_only_where_asked(
    tmp_path, tmp_path_factory, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # the old default output_dir was out/fededs, relative
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("own_tmp")))
  my_data = _docs_data()
  # replayed as written: the docs' 8-feature data cannot feed Alg. 1's UNet; one line
  # naming data= and what does run
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(fa.FedEDSRunConfig(), data=my_data, rounds=2)
  message = _one_line_error(e, "data")
  assert "needs image examples [H, W, C]" in message and "got [8]" in message
  assert "variants=base,equal,s1, privacy=False, utility_epochs=0" in message
  # replayed as written: QUICK's presets under the fields given beside them
  cfg = fa.FedEDSRunConfig().replace(**fededs_config.QUICK, rounds=2)
  assert cfg.training.rounds == 2
  assert all(cfg.get(k) == v for k, v in fededs_config.QUICK_FIELDS.items() if k != "rounds")
  assert fa.FedEDSRunConfig().replace(rounds=2).model.name == "cnn"  # no preset without it
  # docs: output_dir None from Python (nothing kept), out/fededs on the CLI
  assert fa.FedEDSRunConfig().output.output_dir is None
  assert config_lib.flag_specs(fa.FedEDSRunConfig)["output_dir"].default == "out/fededs"
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(fa.FedEDSRunConfig(), resume=True)
  _one_line_error(e, "output.resume")
  # the message's settings run on your clients, in a temporary folder removed after
  small = dict(quick=True, data=my_data, rounds=2, variants="base", privacy=False,
               utility_epochs=0, quiet=True)
  result = fa.simulate(fa.FedEDSRunConfig(), **small)
  assert os.listdir(tmp_path) == [] and _fededs_leftovers() == set()
  assert list(result.runs) == ["arrays K=20 fedavg/base"]
  rows = result.runs["arrays K=20 fedavg/base"].rows
  assert [r["round"] for r in rows] == [1, 2]
  assert result.runs["arrays K=20 fedavg/base"].summary["total_client_steps"] == sum(
      r["client_steps"] for r in rows) > 0
  assert result.config.output.output_dir is None
  out = capsys.readouterr().out
  assert "round    1/2" not in out  # quiet: no per-round lines
  assert "| given (arrays) | 20 | fedavg |" in result.table()
  # with output_dir: the tables, rows and each run's files, where asked
  kept = fa.simulate(fa.FedEDSRunConfig(), output_dir="kept", **small)
  assert sorted(os.listdir(tmp_path / "kept")) == ["flags.json", "rows.jsonl", "runs",
                                                  "table.csv", "table.md"]
  assert os.path.exists(tmp_path / "kept/runs/arrays_K20/fedavg_base/metrics.jsonl")
  assert [r["round"] for r in kept.runs["arrays K=20 fedavg/base"].rows] == [1, 2]
  # a Fashion-MNIST field beside data= is refused by name
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(fa.FedEDSRunConfig(), train_subset=100, **small)
  _one_line_error(e, "data.train_subset")


def test_finding_8_algorithm_fedasync_picks_the_virtual_clock_and_quiet_works_there(capsys):
  data = _docs_data()
  # replayed as written
  result = fa.simulate(algorithm="fedasync", data=data, model=_Linear(), num_updates=4)
  assert isinstance(result.config, fa.AsyncRunConfig)
  assert list(result.runs) == ["fedasync"]
  assert len(result.runs["fedasync"].rows) == 4  # one row per arrival, num_updates of them
  out = capsys.readouterr().out
  assert "fedasync: on the virtual clock (fa.AsyncRunConfig()'s defaults" in out
  assert "[fedasync] version 4/4" in out
  # quiet= on the virtual clock: nothing printed
  quiet = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", data=data, model=_Linear(),
                      num_updates=4, quiet=True)
  assert capsys.readouterr() == ("", "")
  np.testing.assert_array_equal(quiet.runs["fedasync"].state.w,
                                result.runs["fedasync"].state.w)  # the same run
  # what does not fit the virtual clock: one line naming it
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(algorithm="fedasync,pafed", data=data, model=_Linear())
  assert _one_line_error(e, "algorithm").endswith(
      "fedasync runs on the virtual clock, pafed on the round engine only: run them "
      "separately")
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(algorithm="fedasync", data=data, model=_Linear(), rounds=2)
  assert _one_line_error(e, "rounds").endswith("did you mean num_updates?")
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(fa.RunConfig(), algorithm="fedasync", data=data, model=_Linear())
  assert "fedasync runs on the virtual clock" in _one_line_error(e, "algorithm.names")


def test_finding_8_data_refuses_the_inputs_it_overrides():
  data = _docs_data()
  # replayed as written: 20 clients given, 50 asked for
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(data=data, num_clients=50)
  message = _one_line_error(e, "data.num_clients")
  assert "data= brings its own data (20 clients)" in message
  for engine, field in ((None, "partition"), (fa.AsyncRunConfig(), "dirichlet_alpha")):
    with pytest.raises(config_lib.ConfigError) as e:
      fa.simulate(engine, algorithm="fedavg", data=data, model=_Linear(), **{field: 0.5})
    _one_line_error(e, f"data.{field}")


def test_finding_8_delays_are_said_on_the_console_and_under_the_table(capsys):
  data = _docs_data()
  delayed = fa.simulate(algorithm="fedavg", data=data, model=_Linear(), rounds=3)
  out = capsys.readouterr().out
  note = ("delays on: 30% of each round's sampled clients arrive 1-3 rounds late "
          "(delay_fraction=0: none)")
  assert note in out and delayed.table().endswith(note + ".")
  # the note is true: this run's rounds had late arrivals; without delays none, no note
  assert sum(r["delayed"] for r in delayed.runs["fedavg"].rows) > 0
  plain = fa.simulate(algorithm="fedavg", data=data, model=_Linear(), rounds=3,
                      delay_fraction=0.0, quiet=True)
  out = capsys.readouterr().out
  assert sum(r["delayed"] for r in plain.runs["fedavg"].rows) == 0
  assert "delays on" not in out and "delays on" not in plain.table()
  assert "round    1/3" not in out  # quiet on the round engine
  # to_pandas: pandas installed (setup.cfg's extras "test" and "pandas")
  frame = delayed.to_pandas()
  assert len(frame) == len(delayed.to_records()) == 3
  assert list(frame["round"]) == [1, 2, 3]
