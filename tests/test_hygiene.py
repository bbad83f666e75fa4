"""The tracked files read the same in any checkout: no absolute path of the machine they
were made on (``MACHINE_PATHS``: paths are written from the repository's root, e.g.
``.venv/bin/python experiments/run.py``), and no script edits ``sys.path`` (the package is
installed, editable, in the virtual environment; a script's sibling modules are on the
path as its folder, or loaded from their file)."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Split so that this file does not hold them itself.
MACHINE_PATHS = ("/work" + "/main", "/ro" + "ot/", "/ho" + "me/")
SYS_PATH_EDIT = re.compile(r"\bsys\.path\.(?:insert|append)\s*\(")


def tracked_files(root=ROOT):
  """The paths of the files git tracks under ``root`` (absolute; those not on disk left
  out), or None when ``root`` is not a git checkout (or git is missing)."""
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                         check=False, timeout=60)
  except (FileNotFoundError, subprocess.TimeoutExpired):
    return None
  if out.returncode:
    return None
  paths = [os.path.join(root, p) for p in out.stdout.decode().split("\0") if p]
  return [p for p in paths if os.path.isfile(p)]


def _lines(path):
  """The lines of a text file, or [] for a binary one (a NUL byte, or not UTF-8)."""
  with open(path, "rb") as f:
    data = f.read()
  if b"\0" in data:
    return []
  try:
    return data.decode("utf-8").splitlines()
  except UnicodeDecodeError:
    return []


def machine_paths(paths):
  """``path:line: text`` of every line of the text files ``paths`` that holds one of
  ``MACHINE_PATHS``."""
  found = []
  for path in paths:
    for n, line in enumerate(_lines(path), 1):
      if any(m in line for m in MACHINE_PATHS):
        found.append(f"{path}:{n}: {line.strip()[:200]}")
  return found


def sys_path_edits(paths):
  """``path:line: text`` of every line of the ``.py`` files among ``paths`` that calls
  ``sys.path.insert`` or ``sys.path.append`` (in code or in a string of code)."""
  found = []
  for path in paths:
    if path.endswith(".py"):
      for n, line in enumerate(_lines(path), 1):
        if SYS_PATH_EDIT.search(line):
          found.append(f"{path}:{n}: {line.strip()[:200]}")
  return found


def _tracked():
  paths = tracked_files()
  if paths is None:
    pytest.skip("not a git checkout (or no git): the tracked files are unknown")
  return paths


def test_no_tracked_text_file_holds_an_absolute_path_of_the_build_machine():
  found = machine_paths(_tracked())
  assert not found, ("absolute paths of the build machine (write them from the "
                     "repository's root):\n" + "\n".join(found))


def test_no_tracked_python_file_edits_sys_path():
  found = sys_path_edits(_tracked())
  assert not found, ("sys.path edits (import the installed package; load a sibling by its "
                     "file, importlib.util.spec_from_file_location):\n" + "\n".join(found))


def test_the_scans_report_a_planted_path_and_sys_path_edit(tmp_path):
  clean = tmp_path / "clean.md"
  clean.write_text("Run `.venv/bin/python experiments/run.py`.\n")
  log = tmp_path / "run.log"
  log.write_text("$ .venv/bin/python x.py\n[x] rows go to " + MACHINE_PATHS[0]
                 + "/benchmarks/results/x.jsonl\n")
  binary = tmp_path / "blob.npz"
  binary.write_bytes(b"\0" + MACHINE_PATHS[1].encode())  # not text: not read
  home = tmp_path / "BUILD.md"
  home.write_text("ok\n\nFEDJAX_PYTHON=" + MACHINE_PATHS[2] + "me/py scripts/bootstrap.sh\n")
  assert machine_paths([str(clean), str(log), str(binary), str(home)]) == [
      f"{log}:2: [x] rows go to {MACHINE_PATHS[0]}/benchmarks/results/x.jsonl",
      f"{home}:3: FEDJAX_PYTHON={MACHINE_PATHS[2]}me/py scripts/bootstrap.sh"]

  edit = "sys.path." + "insert(0, here)"
  script = tmp_path / "script.py"
  script.write_text(f"import sys\n\nif True:\n  {edit}\n")
  in_code = tmp_path / "child.py"
  code = "CODE = \"import sys; sys.path." + "append('/x')\""
  in_code.write_text(code + "\n")
  prose = tmp_path / "notes.md"  # not a .py file
  prose.write_text(edit + "\n")
  fine = tmp_path / "fine.py"
  fine.write_text("import sys\nprint(sys.path[0])\n")
  assert sys_path_edits([str(p) for p in (script, in_code, prose, fine)]) == [
      f"{script}:4: {edit}", f"{in_code}:1: {code}"]
