#!/usr/bin/env python
"""The API reference: HTML from the docstrings of every public module, by pdoc.

  .venv/bin/python scripts/api_reference.py            # into docs/api_reference/
  .venv/bin/python scripts/api_reference.py --out DIR

Public: every module of ``fedjax_async`` whose name has no leading underscore; the top
page documents the package's exports (``simulate``, ``Result``, ``RunConfig``, ...), which
``fedjax_async/__init__.py`` imports on first use. Any warning while pdoc reads the
docstrings and signatures (an annotation it cannot resolve, a bad docstring link) is
printed and the exit status is 1, with no pages kept half-written. About 10 s.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pathlib
import pkgutil
import shutil
import sys
import tempfile
import typing
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "api_reference"


def public_modules(package: str = "fedjax_async") -> list[str]:
  """The package and its submodules, none with a name part starting with ``_``."""
  pkg = importlib.import_module(package)
  names = [package]
  for info in pkgutil.walk_packages(pkg.__path__, package + "."):
    if not any(part.startswith("_") for part in info.name.split(".")):
      names.append(info.name)
  return names


def _resolve_lazy_exports(package) -> None:
  """Puts the lazily imported names of ``__all__`` into the module's ``__dict__``, where
  pdoc looks for them."""
  for name in getattr(package, "__all__", []):
    if name not in vars(package):
      setattr(package, name, getattr(package, name))


def _resolve(fn, namespace_of) -> None:
  """Evaluates the string annotations of ``fn`` (``from __future__ import annotations``;
  a NamedTuple's are ``ForwardRef``s),
  each in the namespace ``namespace_of(name)``; one that does not evaluate stays a string
  (pdoc then warns)."""
  annotations = getattr(fn, "__annotations__", None)
  for name, value in list((annotations or {}).items()):
    if isinstance(value, typing.ForwardRef):  # NamedTuple's
      value = value.__forward_arg__
    if isinstance(value, str):
      try:
        annotations[name] = eval(value, dict(namespace_of(name)))  # pylint: disable=eval-used
      except Exception:  # pylint: disable=broad-except
        pass


def _resolve_annotations(module) -> None:
  """Resolves, before pdoc reads them, the annotations that pdoc would look up in the
  wrong namespace: a NamedTuple's ``__new__`` (compiled in a namespace of its own), a
  dataclass's ``__init__`` whose fields a base class declares in another module, and a
  library's function kept as a class attribute (a flax initializer, whose ``__module__``
  is the public module that re-exports it, not the one whose names it uses)."""
  for _, cls in inspect.getmembers(module, inspect.isclass):
    if cls.__module__ != module.__name__:
      continue

    def namespace_of(name, cls=cls):
      owner = next((c for c in cls.__mro__ if name in vars(c).get("__annotations__", {})),
                   cls)
      return vars(sys.modules[owner.__module__])

    for attr in ("__new__", "__init__"):
      fn = vars(cls).get(attr)
      fn = getattr(fn, "__func__", fn)
      if inspect.isfunction(fn):
        _resolve(fn, namespace_of)
    for value in vars(cls).values():
      home = inspect.getmodule(value) if inspect.isfunction(value) else None
      if home is not None and vars(home) is not value.__globals__:
        _resolve(value, lambda _, fn=value: fn.__globals__)


def build(out: pathlib.Path) -> list[str]:
  """Writes the pages into ``out`` (replaced); returns the warnings (none: success)."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  try:
    from pdoc import doc, render  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise SystemExit("api_reference: pdoc is not installed: scripts/bootstrap.sh, or "
                     ".venv/bin/pip install -e '.[test]'") from None

  names = public_modules()
  modules = []
  for name in names:  # imported before pdoc runs: their own warnings aside
    try:
      modules.append(importlib.import_module(name))
    except ImportError as e:
      raise SystemExit(
          f"api_reference: cannot import {name} ({str(e).splitlines()[0]}): every public "
          "module must import; run it with .venv's Python 3.10, which has OpenFHE (BUILD.md)"
      ) from None
  _resolve_lazy_exports(modules[0])
  for m in modules:
    _resolve_annotations(m)
  render.configure(docformat="google", show_source=False,
                   footer_text=f"fedjax_async {modules[0].__version__}")
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="api_reference."))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    docs = {n: doc.Module(m) for n, m in zip(names, modules)}
    for module in docs.values():
      page = tmp / f"{module.fullname.replace('.', '/')}.html"
      page.parent.mkdir(parents=True, exist_ok=True)
      page.write_text(render.html_module(module, docs))
    (tmp / "index.html").write_text(render.html_index(docs))
    (tmp / "search.js").write_text(render.search_index(docs))
  found = sorted({str(w.message) for w in caught})
  if found:
    shutil.rmtree(tmp)
    return found
  if out.exists():
    shutil.rmtree(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  shutil.move(str(tmp), str(out))
  return []


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                      help="folder for the HTML pages (replaced); default docs/api_reference")
  args = parser.parse_args(argv)
  found = build(args.out)
  for w in found:
    print(f"api_reference: warning: {w}", file=sys.stderr)
  if found:
    print(f"api_reference: {len(found)} warnings; fix the docstrings or annotations they "
          f"name (nothing written to {args.out})", file=sys.stderr)
    return 1
  print(f"api_reference: {args.out / 'index.html'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
