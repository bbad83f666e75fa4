"""docs/api.md's Python blocks run, in order, as one script (a reader pastes them into one
session): a renamed function, a removed field or a wrong keyword in the docs fails here."""

import os
import re
import subprocess
import sys

import pytest

import run_script

API_MD = os.path.join(run_script.ROOT, "docs", "api.md")


def python_blocks(text: str):
  return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run_blocks(text: str, cwd):
  script = "\n".join(python_blocks(text))
  return subprocess.run([sys.executable, "-c", script], env=run_script.env(), cwd=cwd,
                        capture_output=True, text=True, timeout=900)


def test_every_python_block_of_the_api_doc_runs(tmp_path):
  text = open(API_MD).read()
  assert len(python_blocks(text)) >= 5
  out = run_blocks(text, tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert os.listdir(tmp_path) == []  # the docs' runs write nothing unless asked


def test_a_misspelt_keyword_in_a_block_fails():
  text = "```python\nimport fedjax_async as fa\nfa.simulate(algorithm='fedavg', roundz=1)\n```\n"
  out = run_blocks(text, None)
  assert out.returncode != 0 and "roundz: not a RunConfig field" in out.stderr


API_REFERENCE = os.path.join(run_script.ROOT, "scripts", "api_reference.py")


def _pdoc_missing():
  try:
    import pdoc  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return str(e)
  return None


@pytest.mark.skipif(_pdoc_missing() is not None,
                    reason="pdoc is not installed (the extra 'test' of setup.cfg has it; "
                           "scripts/bootstrap.sh installs it)")
def test_the_api_reference_builds_without_a_warning(tmp_path):
  out = tmp_path / "ref"
  proc = subprocess.run([sys.executable, API_REFERENCE, f"--out={out}"], env=run_script.env(),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "warning" not in proc.stderr.lower(), proc.stderr[-3000:]
  top = (out / "fedjax_async.html").read_text()
  for name in ("simulate", "Result", "RunConfig", "AsyncRunConfig", "algorithms"):
    assert f'id="{name}"' in top or f'href="fedjax_async/{name}.html"' in top, name
  assert 'id="register"' in (out / "fedjax_async" / "algorithms.html").read_text()
  assert "fedjax_async.html" in (out / "index.html").read_text()


@pytest.mark.skipif(_pdoc_missing() is not None, reason="pdoc is not installed")
def test_the_api_reference_names_a_module_that_does_not_import(tmp_path):
  """Where openfhe does not load (Python 3.12 on Debian 12), one line names the module and
  the Python to use, and nothing is written."""
  (tmp_path / "openfhe").mkdir()
  (tmp_path / "openfhe" / "__init__.py").write_text('raise ImportError("no openfhe here")\n')
  env = run_script.env()
  env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
  out = tmp_path / "ref"
  proc = subprocess.run([sys.executable, API_REFERENCE, f"--out={out}"], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "api_reference: cannot import fedjax_async.crypto (no openfhe here): "), proc.stderr
  assert "Traceback" not in proc.stderr and not out.exists()


README_BUDGET = 6656      # 6.5 KB
DOCS_BUDGET = 122880      # 120 KB: README.md, BUILD.md and docs/*.md (not the generated reference)


def hand_written_docs(root=run_script.ROOT):
  docs = os.path.join(root, "docs")
  return ([os.path.join(root, "README.md"), os.path.join(root, "BUILD.md")]
          + sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md")))


def hand_written_bytes(path):
  """The file's size less its generated blocks (``<!-- generated: ... -->`` to ``<!-- end
  generated -->``: docs/api.md's hyper-parameter table, made from the declarations)."""
  with open(path, "rb") as f:
    text = f.read()
  generated = re.findall(rb"<!-- generated: .*?<!-- end generated -->", text, re.S)
  return len(text) - sum(len(g) for g in generated)


def test_the_hand_written_docs_fit_their_size_budget():
  sizes = {os.path.relpath(p, run_script.ROOT): hand_written_bytes(p)
           for p in hand_written_docs()}
  assert {"README.md", "BUILD.md", "docs/api.md", "docs/design.md"} <= set(sizes)
  assert sizes["README.md"] <= README_BUDGET, (
      f"README.md is {sizes['README.md']} bytes, over {README_BUDGET}: move detail to docs/")
  total = sum(sizes.values())
  assert total <= DOCS_BUDGET, (
      f"README.md, BUILD.md and docs/*.md are {total} bytes, over {DOCS_BUDGET}: "
      f"{sorted(sizes.items(), key=lambda kv: -kv[1])}")
