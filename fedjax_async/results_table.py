"""An experiment's runs as one table: ``<folder>/runs.jsonl``, one JSON line per run folder
(a folder holding ``summary.json`` and ``metrics.jsonl``) with its path under ``folder``,
its settings as columns (``algorithm``, ``seed``, the swept values), its ``summary`` and
its ``rows``; and one line per other JSON file of the run tree (``path``, ``json``).

``pack`` writes it, ``unpack`` writes the run folders back with the same bytes, and the
drivers call ``unpack_missing`` on their output folder first, so that ``--read_only`` and
resumption read a packed experiment as they read its folders::

  python -m fedjax_async.results_table pack experiments/results/pafed_table_reduced
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional

from fedjax_async import console

FILE = "runs.jsonl"
LOGS = "logs.jsonl"  # a folder's text logs (``pack_logs``)
SUMMARY, METRICS = "summary.json", "metrics.jsonl"
# A run's own columns, beside its setting (summary["setting"], FedEDS's result's grid).
COLUMNS = ("run", "algorithm", "seed")
FEDEDS_COLUMNS = ("alpha", "num_clients", "base", "variant")
SKIP = ("checkpoints", "tb")  # folders whose files are not packed


def summary_text(summary: dict) -> str:
  return json.dumps(summary, indent=2)


def metrics_text(rows: List[dict]) -> str:
  return "".join(json.dumps(r) + "\n" for r in rows)


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def columns(summary: dict) -> Dict[str, object]:
  """The run's settings as flat columns."""
  out = {k: summary[k] for k in COLUMNS if k in summary}
  config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
  if "seed" not in out and "seed" in config:
    out["seed"] = config["seed"]
  result = summary.get("result") if isinstance(summary.get("result"), dict) else {}
  out.update({k: result[k] for k in FEDEDS_COLUMNS if k in result})
  setting = summary.get("setting")
  hparams = summary.get("hparams") if isinstance(summary.get("hparams"), dict) else {}
  if setting is None and out.get("run") != out.get("algorithm") and "mix_alpha" in hparams:
    setting = {"mix_alpha": hparams["mix_alpha"]}  # a virtual-clock run stored before
  if isinstance(setting, dict):
    out.update({k: v for k, v in setting.items() if k not in out})
  return out


def run_line(folder: str, rel: str) -> dict:
  """The line of the run folder ``folder/rel``; raw text where re-serialising would not
  give the file's bytes back."""
  d = os.path.join(folder, rel)
  s_text, m_text = _read(os.path.join(d, SUMMARY)), _read(os.path.join(d, METRICS))
  summary = json.loads(s_text)
  rows = [json.loads(line) for line in m_text.splitlines() if line.strip()]
  line = {"path": rel, **columns(summary), "summary": summary, "rows": rows}
  raw = {}
  if summary_text(summary) != s_text:
    raw[SUMMARY] = s_text
  if metrics_text(rows) != m_text:
    raw[METRICS] = m_text
  if raw:
    line["text"] = raw
  return line


def tree(folder: str):
  """(run folders, other JSON files) under ``folder``'s subfolders, relative, sorted."""
  runs, files = [], []
  for d, subdirs, names in os.walk(folder):
    subdirs[:] = sorted(s for s in subdirs if s not in SKIP)
    rel = os.path.relpath(d, folder)
    if rel == ".":
      continue
    if SUMMARY in names and METRICS in names:
      runs.append(rel)
      subdirs[:] = []
      continue
    files += [os.path.join(rel, n) for n in sorted(names) if n.endswith(".json")]
  return sorted(runs), sorted(files)


def pack(folder: str, remove: bool = False) -> str:
  """Writes ``folder/runs.jsonl`` of every run folder and other JSON file under
  ``folder``'s subfolders; checks that ``unpack`` gives every file back byte for byte;
  with ``remove`` deletes the packed files (and the folders left empty)."""
  runs, files = tree(folder)
  if not runs:
    raise ValueError(f"{folder}: no run folder (summary.json and metrics.jsonl) to pack")
  lines = [run_line(folder, r) for r in runs]
  for rel in files:
    text = _read(os.path.join(folder, rel))
    obj = json.loads(text)
    lines.append({"path": rel, "json": obj, **({"text": text} if json.dumps(obj, indent=2)
                                               != text else {})})
  path = os.path.join(folder, FILE)
  with open(path + ".tmp", "w") as f:
    for line in lines:
      f.write(json.dumps(line, allow_nan=True) + "\n")
  os.replace(path + ".tmp", path)
  for rel, text in file_texts(read(folder)).items():
    if _read(os.path.join(folder, rel)) != text:
      raise ValueError(f"{folder}/{FILE}: {rel} would not come back byte for byte")
  if remove:
    for rel in file_texts(read(folder)):
      os.remove(os.path.join(folder, rel))
    for d, _, _ in sorted(os.walk(folder), key=lambda t: -len(t[0])):
      if d != folder and not os.listdir(d):
        os.rmdir(d)
  return path


def read(folder: str, name: str = FILE) -> List[dict]:
  """The lines of ``folder/runs.jsonl`` (``name``; none: [])."""
  path = os.path.join(folder, name)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    texts = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
  out = []
  for i, line in texts:
    try:
      out.append(json.loads(line))
    except ValueError:
      out.append(None)
    if not isinstance(out[-1], dict) or "path" not in out[-1]:
      raise ValueError(f"{path}: line {i} is no packed file (a JSON object with 'path'); "
                       f"move the file away or repack the folder (python -m "
                       f"fedjax_async.results_table pack)")
  return out


def runs(folder: str) -> List[dict]:
  """The run lines of ``folder/runs.jsonl``, in path order."""
  return [line for line in read(folder) if "summary" in line]


def file_texts(lines: List[dict]) -> Dict[str, str]:
  """{relative path: text} of every file the lines hold."""
  out = {}
  for line in lines:
    raw = line.get("text") or {}
    if "summary" in line:
      out[os.path.join(line["path"], SUMMARY)] = raw.get(SUMMARY) or summary_text(
          line["summary"])
      out[os.path.join(line["path"], METRICS)] = raw.get(METRICS) or metrics_text(
          line["rows"])
    elif "json" in line:
      out[line["path"]] = raw or json.dumps(line["json"], indent=2)
    else:  # a text file (a log)
      out[line["path"]] = line["text"]
  return out


def pack_logs(folder: str, suffixes=(".log", ".jsonl"), remove: bool = False) -> str:
  """Writes ``folder/logs.jsonl``: one line (``path``, ``text``) per file of ``folder``'s
  subfolders ending in ``suffixes``; ``unpack`` writes them back. With ``remove`` deletes
  them."""
  paths = sorted(os.path.relpath(os.path.join(d, n), folder)
                 for d, _, names in os.walk(folder) if d != folder
                 for n in names if n.endswith(tuple(suffixes)))
  if not paths:
    raise ValueError(f"{folder}: no file ending in {', '.join(suffixes)} in its subfolders")
  path = os.path.join(folder, LOGS)
  with open(path, "w") as f:
    for rel in paths:
      f.write(json.dumps({"path": rel, "text": _read(os.path.join(folder, rel))}) + "\n")
  if remove:
    for rel in paths:
      os.remove(os.path.join(folder, rel))
  return path


def unpack(folder: str, only_missing: bool = False, under: str = "",
           name: str = FILE) -> int:
  """Writes the files of ``folder/runs.jsonl`` (or ``name``: ``LOGS``; those under
  ``under``, relative; with ``only_missing`` those not there); returns how many."""
  n = 0
  for rel, text in file_texts(read(folder, name)).items():
    if under and not (rel + os.sep).startswith(under.rstrip(os.sep) + os.sep):
      continue
    path = os.path.join(folder, rel)
    if only_missing and os.path.exists(path):
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
    n += 1
  return n


def packed_folder(out_dir: str) -> Optional[str]:
  """The nearest folder at or above ``out_dir`` holding a runs.jsonl, else None."""
  d = os.path.abspath(out_dir)
  while True:
    if os.path.isfile(os.path.join(d, FILE)):
      return d
    parent = os.path.dirname(d)
    if parent == d:
      return None
    d = parent


def unpack_missing(out_dir: Optional[str]) -> int:
  """Writes the packed run files of ``out_dir`` (from the runs.jsonl at or above it) that
  are not there; how many. A driver calls it before reading its stored runs."""
  if not out_dir:
    return 0
  folder = packed_folder(out_dir)
  if folder is None:
    return 0
  under = os.path.relpath(os.path.abspath(out_dir), folder)
  return unpack(folder, only_missing=True, under="" if under == "." else under)


def main(argv: List[str]) -> int:
  if len(argv) != 3 or argv[1] not in ("pack", "pack_logs", "unpack"):
    console.warn("usage: python -m fedjax_async.results_table pack|pack_logs|unpack FOLDER\n"
                 "  pack: FOLDER/runs.jsonl of its run folders, which it deletes\n"
                 "  pack_logs: FOLDER/logs.jsonl of its subfolders' .log and .jsonl files, "
                 "deleted\n"
                 "  unpack: write back the files of FOLDER/runs.jsonl and FOLDER/logs.jsonl")
    return 2
  if argv[1] == "pack":
    console.say(pack(argv[2], remove=True))
  elif argv[1] == "pack_logs":
    console.say(pack_logs(argv[2], remove=True))
  else:
    n = unpack(argv[2]) + unpack(argv[2], name=LOGS)
    console.say(f"{n} files written under {argv[2]}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
