"""The package's layers, read from its source: every import (those inside functions
included) goes down a layer or stays within one, never up, and no modules import each
other in a circle. The layers, bottom up:

  base     no engine knowledge: configuration machinery, metrics, data, the algorithms,
           the clock schedules, the CKKS protocol and its server
  core     what every engine shares (``core/``): local training, the timeline, device
           data and evaluation, divergence, data/model building, progress; models,
           checkpoints, sharding
  parts    configurations, outputs, the host loop, a run's lifecycle
  engines  the jitted programs: rounds (and its host-server rounds), the virtual clock,
           FedEDS
  runs     orchestration: a run's files, resumption, sweeps, tables
  api      ``simulate``
  cli      flags and commands (and ``python -m`` entry points)

Modules are filed where they live: a package outside the engines' (``core``, ``data``,
``crypto``, ``algorithms``, ``sweeps``, ``cli``) is one layer, whole; an engine package
(``rounds``, ``asynchronous``, ``fededs``) holds its own layers, from its schedule and
configuration up to its experiment, and no module below the engines reaches into one.
An engine package does not import another engine's modules, except the ones built on the
round engine (FedEDS, the sweeps).
"""

import ast
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "fedjax_async")
PKG = "fedjax_async"

LAYERS = {
    "base": ["console", "flatkeys", "figures", "interrupts", "distributed", "compilation", "metrics",
             "results_table", "privacy", "layers", "data", "crypto", "algorithms",
             "asynchronous.virtual_clock", "fededs.schedule", "fededs.privacy"],
    "core": ["core", "models", "text_models", "sharding", "checkpoint"],
    "parts": ["config", "asynchronous.config", "fededs.config", "outputs", "results", "loop",
              "cost", "lifecycle"],
    "engines": ["rounds", "asynchronous", "fededs"],
    "runs": ["rounds.experiment", "asynchronous.experiment", "asynchronous.report",
             "fededs.experiment", "fededs.report", "fededs.store", "sweeps"],
    "api": ["api"],
    "cli": ["cli", "__main__"],
}
# Packages filed whole (one layer each), and the engine packages, each holding its layers.
WHOLE = ("core", "data", "crypto", "algorithms", "sweeps", "cli")
ENGINE_PACKAGES = ("rounds", "asynchronous", "fededs")
ORDER = list(LAYERS)
# Engine packages whose modules may import the round engine's (built on it).
ON_ROUNDS = ("fededs", "sweeps")


def modules():
  out = {}
  for d, _, files in os.walk(ROOT):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
        name = PKG if rel == "__init__" else PKG + "." + rel.removesuffix(".__init__")
        out[name] = os.path.join(d, f)
  return out


MODULES = modules()


def layer_of(module: str) -> str:
  """The layer of the longest prefix of ``module`` named in LAYERS."""
  rel = module[len(PKG) + 1:] if module != PKG else ""
  if rel.endswith("__main__") or rel == "":
    return "cli"
  best, found = -1, None
  for layer, prefixes in LAYERS.items():
    for p in prefixes:
      if (rel == p or rel.startswith(p + ".")) and len(p) > best:
        best, found = len(p), layer
  assert found is not None, f"{module}: in no layer of tests/test_architecture.py"
  return found


def imports(module: str):
  """The package modules ``module`` imports (anywhere in its source)."""
  path = MODULES[module]
  tree = ast.parse(open(path).read())
  is_pkg = path.endswith("__init__.py")
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        parts = module.split(".")
        base = parts[:len(parts) - node.level + (1 if is_pkg else 0)]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
    else:
      continue
    for n in names:
      while n and n not in MODULES:
        n = n.rpartition(".")[0]
      if n and n != module and n.startswith(PKG):
        out.add(n)
  return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
  for m in MODULES:
    layer_of(m)


def test_no_import_goes_up_a_layer():
  up = []
  for m, targets in GRAPH.items():
    for t in targets:
      if t == PKG:  # the package's lazy exports
        continue
      if ORDER.index(layer_of(t)) > ORDER.index(layer_of(m)):
        up.append(f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})")
  assert not up, "\n".join(sorted(up))


def test_engines_do_not_import_each_other():
  engines = ENGINE_PACKAGES + ("sweeps",)
  bad = []
  for m, targets in GRAPH.items():
    own = m.split(".")[1] if m.count(".") else ""
    for t in targets:
      other = t.split(".")[1] if t.count(".") else ""
      if own in engines and other in engines and own != other:
        if other == "rounds" and own in ON_ROUNDS:
          continue
        bad.append(f"{m} imports {t}")
  assert not bad, "\n".join(sorted(bad))


def test_modules_are_filed_where_they_live():
  """A package outside the engines is filed whole (no module of it in another layer);
  every ``__main__`` is a package's command line, so only ``cli`` holds one."""
  split = [p for ps in LAYERS.values() for p in ps
           if "." in p and p.split(".")[0] in WHOLE]
  assert not split, f"filed apart from their package: {split}"
  mains = [m for m in MODULES if m.endswith("__main__") and m != PKG + ".__main__"]
  assert not mains, f"command lines outside fedjax_async.cli: {mains}"


def test_nothing_below_the_engines_reaches_into_an_engine_package():
  """An engine package's modules are imported by its own, by other engines built on it,
  and from the runs up: a lower layer's import of one (config or sharding importing the
  round engine's timeline) means the module lives in the wrong package."""
  bad = []
  for m, targets in GRAPH.items():
    own = m.split(".")[1] if m.count(".") else ""
    for t in targets:
      other = t.split(".")[1] if t.count(".") else ""
      if (other in ENGINE_PACKAGES and own != other
          and ORDER.index(layer_of(m)) < ORDER.index("engines")):
        bad.append(f"{m} ({layer_of(m)}) imports {t}")
  assert not bad, "\n".join(sorted(bad))


def test_no_import_circle():
  index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in GRAPH[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        circles.append(sorted(comp))

  for v in GRAPH:
    if v not in index:
      visit(v)
  assert not circles, circles


def test_the_walk_sees_an_import_inside_a_function(tmp_path, monkeypatch):
  path = tmp_path / "planted.py"
  path.write_text("def f():\n  from fedjax_async import api\n")
  monkeypatch.setitem(MODULES, "fedjax_async.planted", str(path))
  assert imports("fedjax_async.planted") == {"fedjax_async.api"}


def test_the_checks_catch_a_planted_upward_import_and_circle(monkeypatch):
  monkeypatch.setitem(GRAPH, "fedjax_async.metrics",
                      GRAPH["fedjax_async.metrics"] | {"fedjax_async.api"})
  with pytest.raises(AssertionError, match="fedjax_async.metrics .base. imports "
                     "fedjax_async.api"):
    test_no_import_goes_up_a_layer()
  with pytest.raises(AssertionError):  # api imports metrics (via others): a circle
    test_no_import_circle()


def test_the_filing_checks_catch_planted_misplacements(monkeypatch):
  """The round engine's timeline imported by config; a core module filed as parts; a
  ``python -m`` entry point in the data package."""
  monkeypatch.setitem(GRAPH, "fedjax_async.config",
                      GRAPH["fedjax_async.config"] | {"fedjax_async.rounds.engine"})
  with pytest.raises(AssertionError, match="fedjax_async.config .parts. imports "
                     "fedjax_async.rounds.engine"):
    test_nothing_below_the_engines_reaches_into_an_engine_package()
  monkeypatch.setitem(LAYERS, "parts", LAYERS["parts"] + ["core.building"])
  with pytest.raises(AssertionError, match=r"filed apart from their package: \['core.building'"):
    test_modules_are_filed_where_they_live()
  monkeypatch.setitem(LAYERS, "parts", [p for p in LAYERS["parts"] if p != "core.building"])
  monkeypatch.setitem(MODULES, "fedjax_async.data.__main__", MODULES["fedjax_async.data"])
  with pytest.raises(AssertionError, match="command lines outside fedjax_async.cli"):
    test_modules_are_filed_where_they_live()


def _own_import_key(node):
  if isinstance(node, ast.ImportFrom):
    return (node.module or "").lower(), node.names[0].name.lower()
  return node.names[0].name.lower(), ""


def unsorted_own_imports(path: str):
  """The first out-of-order statement (line) of each run of the project's own top-level
  imports in ``path``, by module then first name (case-insensitive)."""
  out, run = [], []
  for node in ast.parse(open(path).read()).body + [None]:
    mod = (node.module or "") if isinstance(node, ast.ImportFrom) else (
        node.names[0].name if isinstance(node, ast.Import) else "")
    if node is not None and mod.startswith(PKG):
      run.append(node)
      continue
    keys = [_own_import_key(n) for n in run]
    out += [run[i].lineno for i in range(1, len(run)) if keys[i] < keys[i - 1]][:1]
    run = []
  return out


def test_the_projects_own_imports_are_sorted():
  bad = [f"{path}:{line}" for m, path in MODULES.items()
         for line in unsorted_own_imports(path)]
  assert not bad, "out of order: " + ", ".join(sorted(bad))


def test_the_order_check_sees_a_planted_swap(tmp_path):
  path = tmp_path / "planted.py"
  path.write_text("import os\n\nfrom fedjax_async import loop\nfrom fedjax_async import api\n")
  assert unsorted_own_imports(str(path)) == [4]
  path.write_text("from fedjax_async import api\nfrom fedjax_async.core import client\n")
  assert unsorted_own_imports(str(path)) == []


# Dependencies a module may import inside a function (loaded only by the features that use
# them): everything else, the project's own modules first, is imported at the top.
OPTIONAL = ("openfhe", "ray", "tensorflow_datasets", "matplotlib", "tensorboardX", "pandas",
            "psutil", "msgpack", "fedjax_async.crypto",
            # loaded by DP runs and checkpoints only (0.75 s and 0.4 s of every command's start)
            "dp_accounting", "orbax")


def lazy_imports(path: str):
  """(line, imported module) of each import inside a function of ``path``."""
  out = []
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for inner in ast.walk(node):
        if isinstance(inner, ast.Import):
          out += [(inner.lineno, a.name) for a in inner.names]
        elif isinstance(inner, ast.ImportFrom):
          out.append((inner.lineno, inner.module or ""))
  return sorted(set(out))


def test_only_optional_dependencies_are_imported_inside_functions():
  bad, count = [], 0
  for m, path in MODULES.items():
    for line, name in lazy_imports(path):
      count += 1
      if not any(name == o or name.startswith(o + ".") for o in OPTIONAL):
        bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {name} in a function")
  assert not bad, "\n".join(bad)
  assert count <= 20, f"{count} imports inside functions (at most 20)"


def test_the_lazy_import_check_sees_a_planted_one(tmp_path, monkeypatch):
  path = tmp_path / "planted.py"
  path.write_text("import os\n\ndef f():\n  from fedjax_async import api\n  import pandas\n")
  assert lazy_imports(str(path)) == [(4, "fedjax_async"), (5, "pandas")]
  monkeypatch.setitem(MODULES, "fedjax_async.planted", str(path))
  with pytest.raises(AssertionError, match="planted.py:4 imports fedjax_async in a function"):
    test_only_optional_dependencies_are_imported_inside_functions()


def body_lines(node) -> int:
  """The lines of a function's body without its docstring: from the first statement after
  the docstring to the function's last line (0 for a body that is only a docstring)."""
  body = node.body
  if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)):
    body = body[1:]
  if not body:
    return 0
  first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
  return node.end_lineno - first + 1


def long_functions(path: str, limit: int = 80):
  """(name, lines) of each function of ``path`` whose body, its docstring excluded, is
  longer than ``limit`` lines."""
  return [(n.name, body_lines(n)) for n in ast.walk(ast.parse(open(path).read()))
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(n) > limit]


def test_no_function_body_is_longer_than_80_lines_its_docstring_excluded():
  long = [f"{os.path.relpath(p, ROOT)}: {name} ({lines} lines of body, its docstring "
          "excluded)" for p in MODULES.values() for name, lines in long_functions(p)]
  assert not long, "\n".join(long)


def test_the_length_check_sees_a_planted_long_function(tmp_path):
  """An 81-line body is caught; a short body under a long docstring is not."""
  path = tmp_path / "planted.py"
  path.write_text("def f():\n" + "  x = 1\n" * 81 + "\ndef g():\n  return 1\n"
                  + "\ndef h():\n  \"\"\"A long docstring.\n" + "  more words\n" * 100
                  + "  \"\"\"\n  return 1\n")
  assert long_functions(str(path)) == [("f", 81)]
  path.write_text("def f():\n" + "  x = 1\n" * 80)
  assert long_functions(str(path)) == []


def parameters(node):
  """The parameters of a function (``self``/``cls`` not counted; ``*args``, ``**kw`` not)."""
  a = node.args
  names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
  return names[1:] if names and names[0] in ("self", "cls") else names


def parameter_docs(path: str, more_than: int = 4):
  """(line, name, documented, unnamed) of each public function of ``path`` (methods and
  nested ones included) with more than ``more_than`` parameters: whether its docstring has
  an ``Args:`` section, and the parameters that section does not name."""
  out = []
  for n in ast.walk(ast.parse(open(path).read())):
    if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")
        and len(parameters(n)) > more_than):
      doc = ast.get_docstring(n) or ""
      args = doc.partition("Args:")[2]
      unnamed = [p for p in parameters(n) if not re.search(rf"\b{re.escape(p)}\b", args)]
      out.append((n.lineno, n.name, "Args:" in doc, unnamed))
  return sorted(out)


def test_public_functions_with_more_than_four_parameters_document_them():
  """At least 90 % of the public functions with more than four parameters have an
  ``Args:`` section, and each such section names every parameter."""
  rows = [(os.path.relpath(p, ROOT), *row) for p in MODULES.values()
          for row in parameter_docs(p)]
  documented = [r for r in rows if r[3]]
  assert len(documented) >= 0.9 * len(rows), (
      f"{len(documented)} of {len(rows)} public functions with more than four parameters "
      "have Args: (at least 90 %); without: "
      + ", ".join(f"{f}:{line} {name}" for f, line, name, doc, _ in rows if not doc))
  unnamed = [f"{f}:{line} {name}: Args: does not name {', '.join(u)}"
             for f, line, name, doc, u in documented if u]
  assert not unnamed, "\n".join(unnamed)


def test_the_parameter_check_sees_a_planted_undocumented_function(tmp_path, monkeypatch):
  """A function without Args: lowers the share; a parameter its Args: leaves out is named."""
  path = tmp_path / "planted.py"
  path.write_text('def f(a, b, c, d, e):\n  """Sums.\n\n  Args:\n    a, b: the first two.\n'
                  '    c: the third.\n    d: the fourth.\n  """\n\n'
                  'def g(a, b, c, d, e):\n  """Sums, undocumented."""\n\n'
                  'class K:\n  def m(self, a, b, c, d):\n    pass\n\n'
                  'def _h(a, b, c, d, e):\n  pass\n')
  assert parameter_docs(str(path)) == [(1, "f", True, ["e"]), (10, "g", False, list("abcde"))]
  monkeypatch.setitem(globals(), "MODULES", {"fedjax_async.planted": str(path)})
  with pytest.raises(AssertionError, match=r"1 of 2 public .* without: \S*planted.py:10 g"):
    test_public_functions_with_more_than_four_parameters_document_them()
  path.write_text(path.read_text().replace('"""Sums, undocumented."""',
                                           '"""Sums.\n\n  Args:\n    a, b, c, d, e: terms.\n  """'))
  with pytest.raises(AssertionError, match="planted.py:1 f: Args: does not name e"):
    test_public_functions_with_more_than_four_parameters_document_them()
