"""``--help`` and ``--helpfull`` of the project's scripts (``parse_flags`` prints them):
``--help`` the few flags a newcomer needs, each with its default and one-line help;
``--helpfull`` the project's flags only (absl's and orbax's left out), grouped by part of
the run."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from typing import Dict, List, Optional, Sequence

from absl import flags

# Flag name -> the part of the run it sets (a config part such as ``data``, or
# ``processes``, ``sweep``); a project flag not listed here is the script's own.
GROUPS: Dict[str, str] = {}
# The flags --help / --helpfull list when a script defines more than one engine's (None:
# every project flag): experiments/run.py sets those of the engine --algorithm names.
ONLY: Optional[set] = None

TITLES = {
    "script": "this script", "grid": "FedEDS grid", "data": "data", "model": "model",
    "local": "local training", "training": "training (rounds, local SGD)",
    "algorithm": "algorithm and its hyper-parameters", "alg1": "FedEDS Alg. 1 (encryptor)",
    "delay": "delays (the round engine's timeline)",
    "clock": "virtual clock (client times, concurrency, staleness)",
    "privacy": "differential privacy", "crypto": "encryption (CKKS)",
    "run": "run (rounds, seeds, devices)", "processes": "processes and devices",
    "output": "outputs and console", "sweep": "sweep", "table": "table",
    "general": "general"}

# The flags ``--help`` lists, those of them the script defines (a driver sets its own).
ESSENTIAL: List[str] = ["algorithm", "dataset", "model", "rounds", "num_clients",
                        "delay_fraction", "seed", "local_epochs", "output_dir", "flagfile"]

# --flagfile, --help and --helpfull are absl's; listed as the group "general".
GENERAL = (("flagfile", None, "Read flags from a file, one --name=value a line (e.g. "
            "experiments/flags/*.flags)."),
           ("help", None, "The main flags, each with its default."),
           ("helpfull", None, "Every flag of this script, grouped by part."))

# ``FEDJAX_ASYNC_HELP_SECTION=json``: --helpfull prints the flags as JSON (experiments/run.py
# gathers the three engines' flags from its child processes that way).
JSON_ENV = "FEDJAX_ASYNC_HELP_SECTION"

_LIBRARIES = ("absl", "orbax", "jax", "jaxlib", "flax", "tensorflow", "etils", "tensorstore")


def requested(args: Sequence[str]) -> Optional[str]:
  """``"full"`` for --helpfull, ``"short"`` for --help / -h / --helpshort, else None."""
  for a in args:
    if a in ("--helpfull", "-helpfull"):
      return "full"
    if a in ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort"):
      return "short"
  return None


def _is_library(module_name: str) -> bool:
  path = getattr(sys.modules.get(module_name), "__file__", None) or ""
  return (module_name.split(".")[0] in _LIBRARIES or "site-packages" in path
          or "dist-packages" in path)


def _default(flag) -> Optional[str]:
  d = flag.default
  if d is None:
    return None
  if isinstance(d, bool):
    return "true" if d else "false"
  return "''" if d == "" else str(d)


def project_flags(fv: flags.FlagValues = flags.FLAGS) -> List[dict]:
  """The script's own flags, in the order they were defined: ``name``, ``group``,
  ``default`` (text, None for none), ``help``, ``bool``."""
  out = []
  for name, flag in fv._flags().items():  # pylint: disable=protected-access
    if name != flag.name or _is_library(fv.find_module_defining_flag(name, "") or ""):
      continue
    if ONLY is not None and name not in ONLY:
      continue
    out.append({"name": name, "group": GROUPS.get(name, "script"), "default": _default(flag),
                "help": " ".join(str(flag.help).split()),
                "bool": isinstance(flag, flags.BooleanFlag)})
  return out


def flag_line(f: dict, width: int, short: bool = False) -> str:
  """``  --name: help (default: x)``, wrapped; ``short``: the help's first sentence."""
  text = f["help"]
  if short:  # up to the first full stop before a capital letter
    text = re.split(r"(?<=\.)\s+(?=[A-Z])", text)[0]
  name = f"--[no]{f['name']}" if f.get("bool") else f"--{f['name']}"
  default = "" if f["default"] is None else f" (default: {f['default']})"
  return textwrap.fill(f"  {name}: {text}{default}", width=width, subsequent_indent="      ",
                       break_on_hyphens=False)


def width() -> int:
  return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


def general() -> List[dict]:
  return [{"name": n, "group": "general", "default": d, "help": h, "bool": False}
          for n, d, h in GENERAL]


def grouped(items: List[dict], w: int) -> List[str]:
  """The flags under a heading per group, the groups in the order they first appear."""
  order = list(dict.fromkeys(f["group"] for f in items))
  lines = []
  for group in order:
    lines += ["", f"{TITLES.get(group, group)}:"]
    lines += [flag_line(f, w) for f in items if f["group"] == group]
  return lines


def sections_help(sections: Sequence[tuple], doc: Optional[str] = None) -> str:
  """--helpfull of a script that serves several drivers (experiments/run.py):
  ``sections`` is ``[(title, project_flags of that driver)]``. Each section lists in full
  the flags that no earlier section listed with the same help, and names the others in one
  line, with their defaults where they differ."""
  w = width()
  lines = (doc or "").strip().splitlines()[:1]
  seen: Dict[str, dict] = {}
  for title, items in sections:
    same = {f["name"] for f in items
            if f["name"] in seen and f["help"] == seen[f["name"]]["help"]}
    lines += ["", f"==== {title} ===="]
    lines += grouped([f for f in items if f["name"] not in same], w)
    shared = [f"--{f['name']}" + ("" if f["default"] == seen[f["name"]]["default"]
                                  else f" (default here: {f['default']})")
              for f in items if f["name"] in same]
    if shared:
      lines += ["", textwrap.fill("also, as above: " + ", ".join(shared), width=w,
                                  subsequent_indent="  ", break_on_hyphens=False)]
    seen.update({f["name"]: f for f in items if f["name"] not in seen})
  return "\n".join(lines + grouped(general(), w))


def _summary(doc: Optional[str]) -> List[str]:
  """The docstring's first paragraph and its first block of indented lines (examples)."""
  paragraphs = (doc or "").strip().split("\n\n")
  lines = paragraphs[0].splitlines() if paragraphs[0] else []
  examples = next((p for p in paragraphs[1:] if p.startswith("  ")), "")
  return lines + ([""] + examples.splitlines() if examples else [])


def short_help(fv: flags.FlagValues = flags.FLAGS, doc: Optional[str] = None) -> str:
  """The script's summary, the ``ESSENTIAL`` flags it defines, then the main module's own
  key flags (its ``DEFINE``s and ``adopt_module_key_flags``)."""
  w = width()
  known = {f["name"]: f for f in project_flags(fv) + general()}
  own = [f.name for f in fv.get_key_flags_for_module(sys.argv[0])]
  names = [n for n in dict.fromkeys(ESSENTIAL + own + ["flagfile"])
           if n in known and n != "flagfile"] + ["flagfile"]
  lines = _summary(doc) + ["", "Main flags:"]
  lines += [flag_line(known[n], w, short=True) for n in names]
  lines += ["", "--helpfull shows all flags, grouped by part of the run."]
  return "\n".join(lines)


def full_help(fv: flags.FlagValues = flags.FLAGS, doc: Optional[str] = None) -> str:
  """The script's summary line and every project flag under its group's heading."""
  lines = (doc or "").strip().splitlines()[:1]
  return "\n".join(lines + grouped(project_flags(fv) + general(), width()))


def print_help(kind: str, fv: flags.FlagValues = flags.FLAGS):
  """``--help`` / ``--helpfull`` (as JSON under ``FEDJAX_ASYNC_HELP_SECTION=json``)."""
  doc = getattr(sys.modules.get("__main__"), "__doc__", None)
  if kind == "full" and os.environ.get(JSON_ENV) == "json":
    text = json.dumps(project_flags(fv))
  else:
    text = full_help(fv, doc) if kind == "full" else short_help(fv, doc)
  emit(text)


def emit(text: str):
  """Prints ``text``; a reader that stops early (``--helpfull | head``) is no error."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
