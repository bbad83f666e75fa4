"""What a protocol step returns (``crypto.stages.StepResult``: the model, every stage's
seconds within the step's wall time, the wire's bytes, the recipients' models), on the
INSECURE test preset, and the round estimate's calibrations (``crypto/calibration.json``):
each constant read from the file, with its source; a missing one a one-line error."""

import configparser
import json
import pathlib
import time

import numpy as np
import pytest

pytestmark = pytest.mark.crypto
pytest.importorskip("openfhe", exc_type=ImportError)

from fedjax_async.crypto import calibration  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import secure_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import secure_engine  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import streamed_ducc  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import vectors  # pylint: disable=g-import-not-at-top
from fedjax_async.crypto import wire  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIM = 1500  # two ciphertexts of the test ring's 1024 slots
# DUCC's sub-stages, each inside the step's "ducc" stage (S0's phases, S1's answers).
DUCC_PARTS = {"one_context": ("normalise", "inner_products", "min", "weighting", "division",
                              "projection", "eq17"),
              "streamed": ("receive", "inner_products", "s1_refresh", "normalise", "min",
                           "class_totals", "division", "coefficients", "combine")}


def _make(design):
  if design == "streamed":
    proto = streamed_ducc.make_streamed_protocol(3, DIM, "insecure_test", min_depth=3,
                                                 max_delayed=2)
    return proto, streamed_ducc.streamed_pafed_step
  return (secure_ducc.make_protocol(3, DIM, "insecure_test", min_depth=3),
          secure_ducc.secure_pafed_step)


@pytest.mark.parametrize("design", ["one_context", "streamed"])
def test_each_step_returns_every_stage_within_its_wall_time(design):
  proto, step = _make(design)
  proto.wire = wire.Wire()
  rng = np.random.default_rng(5)
  online = vectors.unit(rng.normal(size=(2, DIM)) + 2.0 * rng.normal(size=DIM))
  delayed = vectors.with_cos(vectors.unit(online.mean(0)), [0.6, -0.5], DIM, rng)
  t0 = time.perf_counter()
  result = step(proto, np.zeros(DIM), online, delayed, (0.7, 0.5, 0.3))
  wall = time.perf_counter() - t0
  assert isinstance(result, tuple) and not hasattr(proto, "last_breakdown")
  assert tuple(result.timings) == secure_engine.STAGES
  stages = {s: result.breakdown[s] for s in secure_engine.STAGES}
  assert stages == result.timings
  assert all(v >= 0 for v in result.breakdown.values()), result.breakdown
  assert 0 < sum(stages.values()) <= wall
  parts = sum(result.breakdown[s] for s in DUCC_PARTS[design])
  assert 0 < parts <= stages["ducc"]
  assert 0 < result.breakdown["wire_s"] <= wall
  assert set(result.wire_bytes) == {"clients->S0", "S0->S1", "S1->S0", "S0->clients"}
  assert all(n > 0 for n in result.wire_bytes.values())
  assert sorted(result.client_models) == [0, 1, 2]
  assert np.max(np.abs(proto.clients[1].decrypt_model(result.client_models[1], DIM)
                       - result.w)) < 1e-5
  if design == "streamed":  # the server's wall time: all but the clients' stages
    assert stages["ducc"] <= result.breakdown["server_wall_s"] <= wall - (
        stages["client_encrypt"] + stages["decrypt"]) + 1e-6


def test_the_calibration_file_holds_each_constant_with_its_source():
  doc = json.loads((ROOT / "fedjax_async" / "crypto" / "calibration.json").read_text())
  assert calibration.PATH == str(ROOT / "fedjax_async" / "crypto" / "calibration.json")
  values = calibration.load()
  assert sorted(values) == sorted(calibration.KEYS)
  for key in calibration.KEYS:
    entry = doc["constants"][key]
    assert entry["value"] == values[key]
    assert entry["unit"] and entry["note"]
    assert entry["source"]["command"].startswith("python benchmarks/")
    assert entry["source"]["host"] and entry["source"]["rows"].startswith("benchmarks/")
  note = doc["constants"]["ROUND_CPU_S_PER_UPLOAD"]["note"]
  assert "estimate 54.0 CPU s against 31.0-35.2 s measured" in note
  # package data: installed with the package
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  assert "calibration.json" in cfg["options.package_data"]["fedjax_async.crypto"]


def _estimates():
  """Estimates that between them use every constant of the CPU-time and memory model."""
  out = []
  for design in ("one_context", "streamed"):
    for workers in (1, 2):
      est = secure_engine.round_estimate(199_210, 10, "secure", 10, design, num_clients=20,
                                         recipients=5, delayed=4, workers=workers)
      out.append((est["cpu_s"], est["memory_bytes"]))
  return out


def _copy(tmp_path, monkeypatch, change):
  """calibration.json with ``change(constants)`` applied, as the file the engine reads."""
  doc = calibration.read()
  change(doc["constants"])
  path = tmp_path / "calibration.json"
  path.write_text(json.dumps(doc))
  monkeypatch.setattr(calibration, "PATH", str(path))
  return path


def test_each_constant_of_the_estimate_comes_from_the_calibration_file(tmp_path,
                                                                       monkeypatch):
  base = _estimates()
  for key in calibration.KEYS:
    with monkeypatch.context() as m:
      _copy(tmp_path, m, lambda c, key=key: c[key].update(value=2 * c[key]["value"] + 1))
      assert _estimates() != base, f"{key}: the estimate does not read it"
  assert _estimates() == base
  # one chunk at N = 2^16 with the measured round's uploads: the measured round's seconds
  _copy(tmp_path, monkeypatch, lambda c: c["ROUND_CPU_S_ONE_CHUNK"].update(value=99.0))
  uploads = calibration.load()["ROUND_UPLOADS"]
  assert secure_engine.round_estimate(7_850, uploads, "secure", 10)["cpu_s"] == 99.0


def test_a_missing_calibration_constant_is_a_one_line_error_naming_file_and_key(
    tmp_path, monkeypatch):
  path = _copy(tmp_path, monkeypatch, lambda c: c.pop("KEY_PAIR_CTS"))
  with pytest.raises(calibration.CalibrationError) as e:
    secure_engine.round_estimate(7_850, 10, "secure", 10)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"{path}: ") and "KEY_PAIR_CTS" in msg, msg
  assert isinstance(e.value, ValueError)  # the runs' one-line "error:" (a bad input)
  path.write_text("{not json")
  with pytest.raises(calibration.CalibrationError, match=f"^{path}: cannot read"):
    calibration.load()


def test_write_calibration_sets_values_and_source_and_keeps_the_rest(tmp_path, monkeypatch):
  path = _copy(tmp_path, monkeypatch, lambda c: None)
  before = calibration.read()
  calibration.write({"ROUND_CPU_S_ONE_CHUNK": 60.5},
                    {"command": "python benchmarks/ducc_round.py", "host": "h", "rows": "r"})
  after = calibration.read(str(path))
  assert after["constants"]["ROUND_CPU_S_ONE_CHUNK"]["value"] == 60.5
  assert after["constants"]["ROUND_CPU_S_ONE_CHUNK"]["source"]["host"] == "h"
  assert after["constants"]["ROUND_CPU_S_ONE_CHUNK"]["note"]
  after["constants"].pop("ROUND_CPU_S_ONE_CHUNK")
  before["constants"].pop("ROUND_CPU_S_ONE_CHUNK")
  assert after == before
  with pytest.raises(calibration.CalibrationError, match="not calibration constants: X"):
    calibration.write({"X": 1.0}, {})
