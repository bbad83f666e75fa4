"""No module of the project's script folders is named like an importable dependency.

``python benchmarks/peers.py`` puts ``benchmarks/`` first on ``sys.path`` (and
``PYTHONPATH=.`` the checkout's root), before site-packages and the standard library, so a
file ``benchmarks/multiprocess.py`` is what ``import multiprocess`` finds in that process:
pfl-research imports the ``multiprocess`` distribution, and its peer child failed on the
project's file. The top-level names of the folders whose scripts are run (every ``.py``
file and package directory directly in them) must not be a top-level import name of:

* the distributions installed with this Python (the project's requirements, its test tools;
  names from their ``top_level.txt`` and ``RECORD``, ``scripts/top_level_names.py``), and
  the standard library's modules;
* the peers' venv (benchmarks/requirements-peers.txt: pfl, Flower, torch, Ray and their
  dependencies): the committed list ``benchmarks/requirements-peers-top-level.txt``, made
  from a real install (its header says when and with which versions), since CI has no such
  venv; and ``.venv-peers`` itself where it exists.
"""

import functools
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folders whose scripts are run (each becomes sys.path[0]), and the checkout's root
# (PYTHONPATH=.).
FOLDERS = (".", "benchmarks", "experiments", "fedjax_async", "scripts", "examples")
PEERS_LIST = os.path.join("benchmarks", "requirements-peers-top-level.txt")
PEERS_PYTHON = os.path.join(ROOT, ".venv-peers", "bin", "python")
HELPER = os.path.join(ROOT, "scripts", "top_level_names.py")


def _helper():
  spec = importlib.util.spec_from_file_location("top_level_names", HELPER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def project_names(root=ROOT, folders=FOLDERS):
  """{import name: path from ``root``} of the modules (``NAME.py``) and packages (folders
  holding ``.py`` files) directly in each of ``folders``."""
  out = {}
  for folder in folders:
    base = os.path.join(root, folder)
    if not os.path.isdir(base):
      continue
    for entry in sorted(os.listdir(base)):
      path = os.path.join(base, entry)
      if os.path.isfile(path) and entry.endswith(".py"):
        name = entry[:-3]
      elif (os.path.isdir(path) and entry.isidentifier()
            and any(f.endswith(".py") for f in os.listdir(path))):
        name = entry
      else:
        continue
      if name.isidentifier():
        out.setdefault(name, os.path.relpath(path, root))
  return out


def read_names(text):
  """{name: [distributions]} of ``scripts/top_level_names.py``'s output (``#`` lines are
  comments)."""
  out = {}
  for line in text.splitlines():
    if line.strip() and not line.startswith("#"):
      name, _, dists = line.strip().partition(" ")
      out[name] = dists.split(",") if dists else []
  return out


def clashes(project, sources):
  """One line per project module whose name one of ``sources`` ({what: {name: dists}})
  provides, naming the file and the distribution."""
  out = []
  for name, path in sorted(project.items()):
    for what, names in sources.items():
      if name in names:
        out.append(f"{path}: `import {name}` would find it instead of "
                   f"{', '.join(names[name]) or name}'s {name} ({what}); rename it")
  return out


@functools.lru_cache(maxsize=None)
def own_names():
  return _helper().installed_names()


@functools.lru_cache(maxsize=None)
def live_peers_names():
  """The names ``.venv-peers`` installs (run there, isolated), or None without it."""
  if not os.path.exists(PEERS_PYTHON):
    return None
  proc = subprocess.run([PEERS_PYTHON, "-I", HELPER], capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return read_names(proc.stdout)


def sources():
  out = {
      f"installed with {sys.executable}": own_names(),
      "the standard library": {n: ["Python"] for n in sys.stdlib_module_names},
  }
  with open(os.path.join(ROOT, PEERS_LIST)) as f:
    out[f"the peers' venv, {PEERS_LIST}"] = read_names(f.read())
  if live_peers_names() is not None:
    out["the peers' venv, .venv-peers"] = live_peers_names()
  return out


def test_no_module_of_the_script_folders_shadows_an_installed_name():
  project = project_names()
  # the listing sees the folders' modules and packages (a wrong root would pass vacuously)
  assert {"peers", "run_all", "run", "fedjax_async", "benchmarks", "api", "golden"} <= set(
      project)
  errors = clashes(project, sources())
  assert not errors, "\n".join(errors)


def test_the_peers_list_holds_the_peers_and_their_dependencies():
  with open(os.path.join(ROOT, PEERS_LIST)) as f:
    text = f.read()
  names = read_names(text)
  # pfl's `import multiprocess` is the name that clashed; torch, flwr, ray are the peers
  assert {"pfl", "flwr", "torch", "ray", "multiprocess", "numpy"} <= set(names)
  assert names["multiprocess"] == ["multiprocess"] and names["tree"] == ["dm-tree"]
  assert "scripts/top_level_names.py --list_file" in text  # how to make it again


def test_a_module_named_like_a_dependency_is_found_naming_file_and_distribution(tmp_path):
  """The check itself, on a tree with the clash that broke the pfl row planted."""
  for folder in ("benchmarks", "experiments", "fedjax_async"):
    (tmp_path / folder).mkdir()
  (tmp_path / "benchmarks" / "multiprocess.py").write_text("")
  (tmp_path / "benchmarks" / "peers.py").write_text("")
  (tmp_path / "experiments" / "yaml").mkdir()  # a package folder
  (tmp_path / "experiments" / "yaml" / "__init__.py").write_text("")
  (tmp_path / "experiments" / "results").mkdir()  # data, no .py: not a package
  (tmp_path / "experiments" / "results" / "x.jsonl").write_text("")
  (tmp_path / "fedjax_async" / "json.py").write_text("")  # the standard library's
  project = project_names(str(tmp_path), ("benchmarks", "experiments", "fedjax_async"))
  assert project == {"multiprocess": "benchmarks/multiprocess.py", "peers": "benchmarks/peers.py",
                     "yaml": "experiments/yaml", "json": "fedjax_async/json.py"}
  errors = clashes(project, sources())
  assert [e.split(":")[0] for e in errors if "benchmarks/requirements-peers" in e] == [
      "benchmarks/multiprocess.py", "experiments/yaml"]
  assert ("benchmarks/multiprocess.py: `import multiprocess` would find it instead of "
          "multiprocess's multiprocess (the peers' venv, "
          "benchmarks/requirements-peers-top-level.txt); rename it") in errors
  assert any(e.startswith("fedjax_async/json.py:") and "the standard library" in e
             for e in errors)
  assert not any(e.startswith("benchmarks/peers.py") for e in errors)


def test_installed_names_come_from_record_as_well_as_top_level_txt():
  helper = _helper()
  names = own_names()
  # numpy ships no top_level.txt in its wheel (meson-python): RECORD gives the name
  assert "numpy" in names and "pytest" in names and "_pytest" in names
  assert not any(n.endswith(("dist_info", "libs")) or n == "__pycache__" for n in names)
  assert "fedjax_async" not in names  # the project's own (editable) install is left out
  assert helper._name("numpy.libs", True) is None
  assert helper._name("_cffi_backend.cpython-310-x86_64-linux-gnu.so", False) == (
      "_cffi_backend")
  assert helper._name("six.py", False) == "six"
  assert helper._name("distutils-precedence.pth", False) is None


@pytest.mark.skipif(not os.path.exists(PEERS_PYTHON),
                    reason="no .venv-peers: the peers' names are checked against "
                           f"{PEERS_LIST} alone")
def test_the_committed_peers_list_covers_the_live_peers_venv():
  with open(os.path.join(ROOT, PEERS_LIST)) as f:
    committed = read_names(f.read())
  missing = sorted(set(live_peers_names()) - set(committed))
  assert not missing, (f"{PEERS_LIST} lacks names the peers' venv installs: {missing}; "
                       "make it again: .venv-peers/bin/python -I scripts/top_level_names.py "
                       f"--list_file > {PEERS_LIST}")
