"""The encrypted round's cost calibrations (``calibration.json``, package data): each
constant with its unit, the benchmark command that measured it, the host and a note.
``secure_engine.round_estimate`` reads its CPU-time and memory model from them;
``benchmarks/ducc_round.py --write_calibration`` refreshes the CPU-time ones."""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration.json")
# The constants ``secure_engine.round_estimate`` uses (docs/crypto.md, "Memory estimate").
KEYS = ("ROUND_CPU_S_ONE_CHUNK", "ROUND_CPU_S_PER_CHUNK", "ROUND_UPLOADS",
        "ROUND_CPU_S_PER_UPLOAD", "STREAMED_CPU_S_FIXED", "STREAMED_CPU_S_PER_UPLOAD_CHUNK",
        "PROCESS_BYTES", "CONTEXT_BYTES", "SWITCH_KEY_CTS", "KEY_PAIR_CTS",
        "ONE_CONTEXT_FIXED_CTS", "ONE_CONTEXT_CHUNK_CTS", "STREAMED_CHUNK_CTS",
        "STREAMED_SCALAR_CTS", "WORKER_PROCESS_BYTES")


class CalibrationError(ValueError):
  """A calibration file that cannot be read, or one without a constant of ``KEYS``."""


def read(path: Optional[str] = None) -> dict:
  """The file's JSON document ({"about": ..., "constants": {name: {"value", ...}}});
  ``path`` None: ``PATH`` (read at each call)."""
  path = PATH if path is None else path
  try:
    with open(path) as f:
      doc = json.load(f)
  except (OSError, ValueError) as e:
    raise CalibrationError(f"{path}: cannot read the CKKS cost calibration: {e}") from None
  if not isinstance(doc, dict) or not isinstance(doc.get("constants"), dict):
    raise CalibrationError(f"{path}: no \"constants\" object of CKKS cost calibrations")
  return doc


def load(path: Optional[str] = None) -> Dict[str, float]:
  """{name: value} for every constant of ``KEYS`` (``path`` None: ``PATH``); a one-line
  ``CalibrationError`` naming the file and the first key missing (or without a numeric
  ``value``)."""
  path = PATH if path is None else path
  constants = read(path)["constants"]
  out = {}
  for key in KEYS:
    entry = constants.get(key)
    value = entry.get("value") if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise CalibrationError(f"{path}: no calibration constant {key} (an object with a "
                             "number \"value\" under \"constants\")")
    out[key] = value
  return out


def write(values: Dict[str, float], source: Dict[str, str], path: Optional[str] = None):
  """Sets each of ``values``' constants in the file (``path`` None: ``PATH``), with
  ``source`` (command, host, rows) as its source; the other constants and notes are
  kept."""
  path = PATH if path is None else path
  doc = read(path)
  unknown = sorted(set(values) - set(KEYS))
  if unknown:
    raise CalibrationError(f"{path}: not calibration constants: {', '.join(unknown)}")
  for key, value in values.items():
    entry = doc["constants"].setdefault(key, {})
    entry["value"] = value
    entry["source"] = dict(source)
  with open(path, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
