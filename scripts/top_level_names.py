"""The top-level import names that the installed distributions of this Python provide.

One line a name, sorted, each with the distributions that install it (``NAME DIST[,DIST]``):
what ``import NAME`` could find in this interpreter's
site-packages. A module or package of the project's own with one of these names, in a folder
that is put first on ``sys.path`` (a script's folder: ``python benchmarks/peers.py`` puts
``benchmarks/`` there), would be imported instead of the distribution's
(``tests/test_name_clash.py``). Standalone: it imports nothing of the project, so that
another venv's Python can run it (``-I``: without this folder on its path):

  .venv-peers/bin/python -I scripts/top_level_names.py              # the peers' names
  .venv-peers/bin/python -I scripts/top_level_names.py --list_file  # the committed list

Names come from each distribution's ``top_level.txt`` where it has one, and from its
``RECORD`` (the files it installed: ``NAME.py``, ``NAME.cpython-*.so``, ``NAME/...``)
always, since ``top_level.txt`` is optional (wheels built without setuptools have none) and
can leave out a name. The project's own distribution (``fedjax_async``, an editable install)
is left out. ``--list_file`` prints the file ``benchmarks/requirements-peers-top-level.txt``
(a header naming the interpreter and the peers' versions, then the names).
"""

import importlib.metadata
import platform
import sys
import time

OWN = {"fedjax_async", "fedjax-async"}
PEERS = ("torch", "pfl", "flwr", "ray")


def _name(first, is_dir):
  """The import name of a top-level entry of site-packages, or None (metadata, data,
  scripts, vendored libraries: ``numpy.libs``, ``*.pth``)."""
  if first == "__pycache__" or first.endswith((".dist-info", ".egg-info", ".data")):
    return None
  if not is_dir:
    stem, _, ext = first.partition(".")
    if not ext or ext.split(".")[-1] not in ("py", "pyc", "so", "pyd"):
      return None
    first = stem
  return first if first.isidentifier() else None


def distribution_names(dist):
  """The top-level import names of one distribution."""
  names = set()
  for line in (dist.read_text("top_level.txt") or "").splitlines():
    line = line.strip().replace("\\", "/").split("/")[0]
    if line.isidentifier():
      names.add(line)
  for f in dist.files or ():
    parts = f.parts
    if not parts or parts[0] == "..":
      continue
    name = _name(parts[0], len(parts) > 1)
    if name:
      names.add(name)
  return names


def installed_names():
  """{top-level name: sorted distribution names} of every distribution this Python sees."""
  out = {}
  for dist in importlib.metadata.distributions():
    dist_name = dist.metadata["Name"] or "?"
    if dist_name.lower().replace("_", "-") in {n.replace("_", "-") for n in OWN}:
      continue
    for name in distribution_names(dist):
      out.setdefault(name, set()).add(dist_name)
  return {k: sorted(v) for k, v in sorted(out.items())}


def main(argv):
  names = installed_names()
  if "--list_file" in argv:
    versions = []
    for d in PEERS:
      try:
        versions.append(f"{d} {importlib.metadata.version(d)}")
      except importlib.metadata.PackageNotFoundError:
        versions.append(f"{d} (not installed)")
    print("# Top-level import names of the distributions installed in the peers' venv")
    print("# (benchmarks/requirements-peers.txt), for tests/test_name_clash.py where that venv")
    print("# is absent (CI). Made by:  .venv-peers/bin/python -I scripts/top_level_names.py "
          "--list_file")
    print(f"# on {time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, "
          + ", ".join(versions) + f", {len(names)} names.")
  for name, dists in names.items():
    print(name, ",".join(dists))


if __name__ == "__main__":
  main(sys.argv[1:])
