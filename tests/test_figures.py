"""Every command behind a figure in the docs still runs; the figures a run writes say what
they show (titles from the configuration as built, mean ± std bands over seeds, the smoothed
loss over the faint raw one).

The commands are read from the tables of README.md's "Measured figures" and
docs/performance.md's "Figures" (the column whose header says "command"; a script without a
folder is under the folder the header names, ``benchmarks/...``; a code span starting
``...`` or ``--`` is the cell's previous command with those flags added):

* every command, exactly as written, passes its script's flag checks
  (``--only_check_args``): a misspelt or removed flag, a bad value or a renamed script fails;
* the first command of each script runs end to end at a tiny size: its flags, then the
  overrides of ``TINY`` (later flags win), in a results folder of the test's own.

The peers' command (pfl-research and Flower in their own venv) runs with the stub peers of
``tests/stub_peers`` (a venv made here): the peer children's entry points, command line and
RESULT lines run without pfl, Flower or torch; where ``.venv-peers`` exists it also runs
with the real peers. ``FEDJAX_ASYNC_FIGURE_DOCS`` (comma-separated markdown files named
README.md or performance.md) reads other copies of the docs, e.g. one with a command changed.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import types

import numpy as np
import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = {"README.md": "Measured figures", "performance.md": "Figures"}
DOCS = [p for p in os.environ.get("FEDJAX_ASYNC_FIGURE_DOCS", "").split(",") if p] or [
    os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "performance.md")]
PEERS_PYTHON = os.path.join(ROOT, ".venv-peers", "bin", "python")
STUB_PEERS = os.path.join(ROOT, "tests", "stub_peers")

# Tiny sizes, appended to a script's first command ("{tmp}": the test's folder); a script
# of a figure needs one here. Models stay as the command has them.
TINY = {
    "throughput.py": ["--clients=2", "--examples=10", "--rounds=1", "--reps=1"],
    "fraction_of_peak.py": ["--clients=2", "--examples=10", "--rounds=1", "--reps=1"],
    "scaling.py": ["--k_logreg=2", "--k_cnn=2", "--n_logreg=2", "--n_cnn=2",
                   "--k_fixed_logreg=2", "--k_fixed_cnn=2", "--examples=10", "--rounds=1",
                   "--reps=1"],
    "multidevice.py": ["--devices=2", "--k_strong=2", "--k_per_device=1", "--examples=10",
                       "--rounds=1", "--reps=1"],
    "server_stream.py": ["--clients=2", "--examples=10", "--rounds=2", "--reps=1"],
    "sweep_vs_sequential.py": ["--runs=2", "--rounds=1"],
    "paper_shapes.py": ["--model=logreg", "--runs=2", "--clients=2", "--num_clients=4",
                        "--examples=20", "--batch=10", "--epochs=1", "--reps=1",
                        "--precisions=float32", "--impls=vjp", "--bandwidth_mib=16"],
    # (--peers_python: the stub peers' venv, or .venv-peers)
    "peers.py": ["--clients=2", "--examples=10", "--rounds=2", "--engine_rounds=1",
                 "--reps=1", "--systems=engine,pfl,flower", "--peer_timeout=300"],
    # insecure toy rings (2^11): the protocol runs whole in a second
    "ducc_round.py": ["--security=insecure", "--ring_dim=2048", "--min_depth=3", "--dims=3000",
                      "--online=2", "--delayed=2", "--num_clients=3", "--kt_recipients=2",
                      "--out_jsonl={tmp}/ducc_round.jsonl"],
    # the virtual clock's case only (two runs of a few seconds)
    "cost_check.py": ["--cases=clock", "--out_jsonl={tmp}/cost_check.jsonl"],
    "min_depth.py": ["--security=insecure", "--ring_dim=2048", "--depths=4", "--seed_depths=4",
                     "--cheb_degrees=59", "--composite=1:2", "--gaps_log2=2",
                     "--out_csv={tmp}/min_depth.csv"],
}
# What a tiny run leaves in its folder (rows as they are measured), where it writes any.
OUTPUT = {"throughput.py": "throughput.jsonl", "fraction_of_peak.py": "fraction_of_peak.jsonl",
          "scaling.py": "scaling.jsonl", "multidevice.py": "multidevice.jsonl",
          "server_stream.py": "server_stream.jsonl", "peers.py": "peers.jsonl",
          "ducc_round.py": "ducc_round.jsonl", "min_depth.py": "min_depth.csv",
          "paper_shapes.py": "paper_shapes.jsonl", "cost_check.py": "cost_check.jsonl"}


class Command:
  """A command of a figure: its script (a path from the checkout's root) and flags, and
  where the docs say it (``file:line``)."""

  def __init__(self, where, script, flags):
    self.where, self.script, self.flags = where, script, list(flags)

  @property
  def name(self):
    return os.path.basename(self.script)

  def __str__(self):
    return " ".join([self.script] + self.flags)


def _spans(text):
  return re.findall(r"`([^`]+)`", text)


def _cells(line):
  return [c.strip() for c in line.strip().strip("|").split("|")]


def parse(path, section=None):
  """(commands, rows without one) of the tables in ``path``'s section ``section`` (by
  default the one ``SECTIONS`` names for the file). A row without a command is
  ``(where, cell)``."""
  section = section or SECTIONS[os.path.basename(path)]
  with open(path) as f:
    lines = f.read().splitlines()
  try:
    start = lines.index(f"## {section}")
  except ValueError:
    raise AssertionError(f"{path}: no section '## {section}'") from None
  commands, bare = [], []
  base = col = None
  for i in range(start + 1, len(lines)):
    line = lines[i]
    if line.startswith("#"):
      break
    if not line.startswith("|"):
      base = col = None  # a table ends
      continue
    cells = _cells(line)
    if col is None:  # the header row: the command column, and its folder ("benchmarks/...")
      col = next((j for j, c in enumerate(cells) if c.lower().startswith("command")), -1)
      folders = [s[:-4] for s in _spans(cells[col]) if s.endswith("/...")] if col >= 0 else []
      base = folders[0].split()[-1] if folders else ""
      continue
    if col < 0 or set(line) <= set("|-: "):
      continue
    shown = os.path.relpath(path, ROOT)
    where = f"{path if shown.startswith('..') else shown}:{i + 1}"
    cell = cells[col]
    found = []
    for span in _spans(cell):
      words = shlex.split(span)
      while words and (re.match(r"\w+=", words[0]) or re.search(r"python[\d.]*$", words[0])):
        words = words[1:]  # PYTHONPATH=. .venv/bin/python ...
      if words and words[0].endswith(".py"):
        script = words[0] if "/" in words[0] else os.path.join(base, words[0])
        found.append(Command(where, script, words[1:]))
      elif words and words[0] in ("...", "…") or words and words[0].startswith("--"):
        if not found:
          raise AssertionError(f"{where}: `{span}` adds flags to no command before it")
        prev = found[-1]
        found.append(Command(where, prev.script,
                             prev.flags + [w for w in words if w not in ("...", "…")]))
    commands += found
    if not found:
      bare.append((where, cell))
  return commands, bare


def figure_commands():
  out = []
  for path in DOCS:
    out += parse(path)[0]
  return out


def first_per_script(commands):
  seen = {}
  for c in commands:
    seen.setdefault(c.script, c)
  return list(seen.values())


def _env(tmp=None, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **extra)
  if tmp is not None:
    env["FEDJAX_ASYNC_BENCH_RESULTS"] = str(tmp)
  return env


def check_args(commands):
  """One line per command that its script refuses (or that names no script)."""
  errors = []
  for c in commands:
    path = os.path.join(ROOT, c.script)
    if not os.path.isfile(path):
      errors.append(f"{c.where}: {c.script}: no such script (`{c}`)")
      continue
    proc = subprocess.run([sys.executable, path] + c.flags + ["--only_check_args"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode:
      last = (proc.stderr.strip().splitlines() or ["?"])[-1]
      errors.append(f"{c.where}: `{c}`: {last}")
  return errors


COMMANDS = figure_commands()
CRYPTO = set(conftest.CRYPTO_SCRIPTS)


def test_the_figure_tables_give_a_command_for_every_figure():
  for path in DOCS:
    commands, bare = parse(path)
    assert commands, f"{path}: no commands found in its figure tables"
    if os.path.basename(path) == "README.md":  # every README figure has its command
      assert not bare, bare
    else:  # a row without one says where it is (the row above's, or another doc)
      assert all("same command" in cell or ".md" in cell for _, cell in bare), bare
  scripts = {c.name for c in COMMANDS}
  if not os.environ.get("FEDJAX_ASYNC_FIGURE_DOCS"):
    assert {"throughput.py", "fraction_of_peak.py", "scaling.py", "peers.py",
            "ducc_round.py", "multidevice.py", "min_depth.py"} <= scripts
  missing = sorted(scripts - set(TINY))
  assert not missing, f"no tiny size for {missing}: add it to TINY in {__file__}"


@pytest.mark.benchmarks
def test_every_figure_command_passes_its_flag_checks():
  commands = {}
  for c in COMMANDS:  # each command once, where the docs first give it
    commands.setdefault((c.script, tuple(c.flags)), c)
  commands = list(commands.values())
  if conftest.openfhe_error():  # the crypto scripts load OpenFHE with their flags
    commands = [c for c in commands if c.name not in CRYPTO]
  errors = check_args(commands)
  assert not errors, "\n".join(errors)


@pytest.mark.benchmarks
def test_a_misspelt_flag_or_a_renamed_script_in_a_figure_command_is_named(tmp_path):
  """The check itself, on a copy of a table with each planted: a misspelt absl flag, a
  script that is not there, an argparse flag cut short (argparse would take a prefix for
  the flag: peers.py does not), a bad value in a cell's second command."""
  doc = tmp_path / "README.md"
  doc.write_text("# x\n\n## Measured figures\n\n| what | figure | command |\n|---|---|---|\n"
                 "| a | 1x | `benchmarks/throughput.py --modles=logreg --reps=3` |\n"
                 "| b | 2x | `benchmarks/multiprocess.py --reps=2` |\n"
                 "| c | 3x | `benchmarks/peers.py --engine_round=2` |\n"
                 "| d | 4x | `benchmarks/peers.py --reps=2` (K = 1: `--clients=0`) |\n"
                 "| e | 5x | `PYTHONPATH=. .venv/bin/python benchmarks/peers.py --reps=1` |\n\n"
                 "## Next\n")
  commands, bare = parse(str(doc))
  assert [str(c) for c in commands] == [
      "benchmarks/throughput.py --modles=logreg --reps=3", "benchmarks/multiprocess.py --reps=2",
      "benchmarks/peers.py --engine_round=2", "benchmarks/peers.py --reps=2",
      "benchmarks/peers.py --reps=2 --clients=0", "benchmarks/peers.py --reps=1"]
  assert not bare
  errors = check_args(commands)
  assert len(errors) == 4, errors
  assert errors[0].startswith(f"{doc}:7: `benchmarks/throughput.py --modles=logreg --reps=3`: "
                              "error: --modles: unknown flag"), errors[0]
  assert errors[1] == (f"{doc}:8: benchmarks/multiprocess.py: no such script "
                       "(`benchmarks/multiprocess.py --reps=2`)")
  assert errors[2] == (f"{doc}:9: `benchmarks/peers.py --engine_round=2`: peers.py: error: "
                       "unrecognized arguments: --engine_round=2")
  assert errors[3].startswith(f"{doc}:10: `benchmarks/peers.py --reps=2 --clients=0`: ") and (
      "--clients: must be >= 1" in errors[3])


def _stub_peers_python(tmp_path):
  """A venv whose site-packages lists the stub peers (then numpy's folder): the peers'
  Python where pfl, Flower and torch are not installed."""
  venv = tmp_path / "stub_peers_venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=120)
  import numpy  # pylint: disable=g-import-not-at-top
  site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
  (site / "stub_peers.pth").write_text(
      f"{STUB_PEERS}\n{os.path.dirname(os.path.dirname(numpy.__file__))}\n")
  return str(venv / "bin" / "python")


def _rows(path):
  with open(path) as f:
    return [json.loads(l) for l in f if l.strip()]


@pytest.mark.parametrize("command", [
    pytest.param(c, id=c.name, marks=[pytest.mark.crypto] if c.name in CRYPTO else [])
    for c in first_per_script(COMMANDS)])
@pytest.mark.benchmarks
def test_figure_command_runs_at_a_tiny_size(command, tmp_path):
  tiny = [a.replace("{tmp}", str(tmp_path)) for a in TINY[command.name]]
  if command.name == "peers.py":
    # pfl, Flower and torch as stubs (tests/stub_peers); the real ones: the test below
    tiny.append(f"--peers_python={_stub_peers_python(tmp_path)}")
  argv = [sys.executable, os.path.join(ROOT, command.script)] + command.flags + tiny
  proc = subprocess.run(argv, env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, f"{command.where}: {' '.join(argv[1:])}\n" + (
      proc.stdout[-2000:] + proc.stderr[-3000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  if command.name in OUTPUT:
    assert (tmp_path / OUTPUT[command.name]).exists(), proc.stdout[-2000:]
  else:
    assert proc.stdout.strip(), proc.stderr[-2000:]
  if command.name == "peers.py":
    for peer in ("pfl", "flower"):
      assert re.search(rf"\[peers\] {peer}\s+\S+ s/round .*engine is \S+x (faster|slower)",
                       proc.stdout), proc.stdout[-3000:]
    assert "did not run" not in proc.stdout and "NOT RUN" not in proc.stdout
    rows = {r["system"]: r for r in _rows(tmp_path / "peers.jsonl")}
    assert set(rows) == {"engine", "pfl", "flower"}
    for peer in ("pfl", "flower"):
      note = json.loads(rows[peer]["note"])
      assert note["version"] == "0+stub" and note["torch"] == "0+stub", note
      assert rows[peer]["s_per_round"] > 0
      assert rows[peer]["engine_speedup"] == pytest.approx(
          rows[peer]["s_per_round"] / rows["engine"]["s_per_round"])


@pytest.mark.skipif(not os.path.exists(PEERS_PYTHON),
                    reason="no .venv-peers: pfl-research and Flower are not installed here "
                           "(benchmarks/requirements-peers.txt); the peers' child entry points "
                           "ran with the stub peers (test_figure_command_runs_at_a_tiny_size"
                           "[peers.py])")
@pytest.mark.benchmarks
def test_the_peers_figure_command_runs_with_the_real_peers(tmp_path):
  (command,) = [c for c in first_per_script(COMMANDS) if c.name == "peers.py"]
  argv = ([sys.executable, os.path.join(ROOT, command.script)] + command.flags
          + TINY["peers.py"] + ["--systems=pfl,flower", f"--peers_python={PEERS_PYTHON}"])
  proc = subprocess.run(argv, env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  rows = {r["system"]: r for r in _rows(tmp_path / "peers.jsonl")}
  for peer in ("pfl", "flower"):
    assert re.search(rf"\[peers\] {peer}\s+\S+ s/round", proc.stdout), proc.stdout[-3000:]
    note = json.loads(rows[peer]["note"])
    assert rows[peer]["s_per_round"] > 0 and "stub" not in note["version"], note


# ------------------------------------------------------------------ the figures' content
# Figures are inspected as matplotlib objects (Figure.savefig captured), not as pixels.


@pytest.fixture
def saved_figures(monkeypatch):
  """The Figures the code under test saves, in order (nothing is written)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figures = []
  monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
  return figures


def _config(**fields):
  from fedjax_async import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.RunConfig().replace(**fields)


def test_a_swept_delta_is_titled_as_swept_with_its_values_never_its_base_value():
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  cfg = _config(delay_fraction=0.45)
  title = outputs.figure_title(cfg, "synthetic_1_1", "logreg", ["pafed"],
                               swept={"delay_fraction": [0.7, 0.0, 0.3], "lr": [0.1, 0.01]})
  assert "δ swept: 0, 0.3, 0.7" in title, title
  assert "0.45" not in title and "δ =" not in title, title
  assert "swept: lr 0.01, 0.1" in title, title
  # not swept: the configured value
  assert "δ = 0.45" in outputs.figure_title(cfg, "synthetic_1_1", "logreg", ["pafed"])


@pytest.mark.parametrize("dataset,model", [("synthetic", "logreg"),
                                           ("fashion_mnist", "cnn"), ("cifar10", "cifar10_cnn")])
def test_titles_name_the_model_built_never_auto(dataset, model):
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  from fedjax_async.asynchronous import config as aconfig  # pylint: disable=g-import-not-at-top
  from fedjax_async.asynchronous import report  # pylint: disable=g-import-not-at-top
  cfg = _config(dataset=dataset, model="auto")
  titles = [outputs.figure_title(cfg, dataset, "auto", ["fedavg"]),
            report.curves_title(aconfig.AsyncRunConfig().replace(dataset=dataset),
                                dataset, "auto", ["fedasync"], [0, 1])]
  for title in titles:
    assert "auto" not in title and f", {model};" in title, title


def test_synthetic_data_is_titled_by_its_natural_partition_image_data_by_data_partition():
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  for name in ("synthetic_1_1", "synthetic_iid"):
    title = outputs.figure_title(_config(dataset=name.split("_1")[0], partition="shards"),
                                 name, "logreg", ["fedavg"])
    assert "shards" not in title and title.startswith(f"{name} ("), title
    assert ("IID" if name.endswith("iid") else "natural partition") in title, title
  image = lambda **f: outputs.figure_title(_config(dataset="fashion_mnist", **f),
                                           "fashion_mnist", "cnn", ["fedavg"])
  assert image(partition="shards", shards_per_client=3).startswith(
      "fashion_mnist (shards, 3 per client, N = 30), cnn;")
  assert image(partition="dirichlet", dirichlet_alpha=0.1).startswith(
      "fashion_mnist (Dirichlet α = 0.1, N = 30)")
  assert image(partition="iid").startswith("fashion_mnist (IID, N = 30)")


def test_the_fededs_figure_names_its_partition_and_model():
  from fedjax_async.fededs import report  # pylint: disable=g-import-not-at-top
  title = report.encryption_grid_title("mlp", {"alpha": 0.1, "num_clients": 20})
  assert "Dirichlet α = 0.1, K = 20" in title and "model mlp" in title, title


def test_the_seed_band_is_numpys_mean_and_std_over_the_seeds():
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  ys = [[1.0, 2.0, 3.0], [3.0, 2.0, 5.0], [2.0, 5.0, 1.0]]
  x, mean, std, interpolated = outputs.seed_band([([1, 2, 3], y) for y in ys])
  assert not interpolated and list(x) == [1, 2, 3]
  np.testing.assert_allclose(mean, [2.0, 3.0, 3.0])
  np.testing.assert_allclose(std, [np.sqrt(2 / 3), np.sqrt(2), np.sqrt(8 / 3)])
  np.testing.assert_allclose(outputs.seed_band([([1, 2, 3], y) for y in ys], ddof=1)[2],
                             [1.0, np.sqrt(3), 2.0])
  # other xs: each curve at every x inside the range all of them cover, linearly
  x, mean, std, interpolated = outputs.seed_band([([0, 1, 2, 3], [0, 2, 4, 6]),
                                                  ([1, 1.5, 2], [1, 2, 1])])
  assert interpolated and list(x) == [1, 1.5, 2]
  np.testing.assert_allclose(mean, [(2 + 1) / 2, (3 + 2) / 2, (4 + 1) / 2])
  np.testing.assert_allclose(std, [0.5, 0.5, 1.5])
  assert outputs.seed_band([([0, 1], [0, 0]), ([2, 3], [0, 0])]) is None


def _band(ax):
  """The (x, low, high) points of the Axes' one fill_between band."""
  from matplotlib.collections import PolyCollection  # pylint: disable=g-import-not-at-top
  (poly,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
  return {tuple(np.round(v, 9)) for path in poly.get_paths() for v in path.vertices}


def _expected_band(x, mean, std):
  return ({(round(a, 9), round(m - s, 9)) for a, m, s in zip(x, mean, std)} |
          {(round(a, 9), round(m + s, 9)) for a, m, s in zip(x, mean, std)})


def test_several_seeds_are_drawn_as_their_mean_and_a_std_band(saved_figures, tmp_path):
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  acc = [[0.2, 0.5, 0.6], [0.4, 0.5, 0.9], [0.3, 0.8, 0.6]]
  seeds = [[{"round": i, "test_accuracy": a, "train_loss": 1.0} for i, a in enumerate(s)]
           for s in acc]
  single = [{"round": i, "test_accuracy": 0.1, "train_loss": 1.0} for i in range(3)]
  assert outputs.plot_curves({"fedavg": seeds, "pafed": single}, str(tmp_path / "c.png"),
                             loss_ema=0.0) == 4
  ax = saved_figures[-1].axes[0]
  mean, std = np.mean(acc, axis=0), np.std(acc, axis=0)
  assert _band(ax) == _expected_band([1, 2, 3], mean, std)
  (line,) = [l for l in ax.lines if l.get_label().startswith("fedavg")]
  np.testing.assert_allclose(line.get_ydata(), mean)
  assert line.get_label() == "fedavg (mean ± std over 3 seeds)"
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [
      "fedavg (mean ± std over 3 seeds)", "pafed"]  # one seed: its line, no band


def test_the_loss_is_smoothed_with_the_raw_loss_faint_behind_it(saved_figures, tmp_path):
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  np.testing.assert_allclose(outputs.ema([1, 3, 2, 6], 0.5), [1, 2, 2, 4])
  np.testing.assert_allclose(outputs.ema([1, 3, 2, 6], 0.75), [1, 1.5, 1.625, 2.71875])
  rows = [{"round": i, "test_accuracy": None, "train_loss": v}
          for i, v in enumerate([1, 3, 2, 6])]
  outputs.plot_curves({"fedavg": rows}, str(tmp_path / "c.png"), loss_ema=0.5)
  ax = saved_figures[-1].axes[1]
  raw, smooth = ax.lines
  np.testing.assert_allclose(raw.get_ydata(), [1, 3, 2, 6])
  np.testing.assert_allclose(smooth.get_ydata(), [1, 2, 2, 4])
  assert raw.get_alpha() is not None and raw.get_alpha() <= 0.3
  assert smooth.get_alpha() in (None, 1.0) and raw.get_color() == smooth.get_color()
  assert "EMA (weight 0.5)" in ax.get_ylabel() and "raw" in ax.get_ylabel()
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fedavg"]


def test_the_smoothing_weight_grows_with_the_points_and_is_named():
  from fedjax_async import outputs  # pylint: disable=g-import-not-at-top
  assert outputs.ema_weight(20) == 0.0  # a few rounds: drawn as they are
  assert outputs.ema_weight(100) == 0.8 and outputs.ema_weight(1000) == 0.98
  assert 0 < outputs.ema_weight(10 ** 7) < 1


def test_the_sweep_figure_shades_mean_and_std_over_its_seeds(saved_figures, tmp_path):
  from fedjax_async.sweeps import store  # pylint: disable=g-import-not-at-top
  rows = [{"algorithm": "fedavg", "delay_fraction": d, "num_seeds": 3, "diverged": dv,
           "final_accuracy_mean": m, "final_accuracy_std": s,
           "average_best_accuracy_mean": m + 0.1, "average_best_accuracy_std": s}
          for d, m, s, dv in ((0.0, 0.8, 0.05, 0), (0.3, 0.7, 0.1, 1), (0.7, 0.5, 0.2, 0))]
  store.plot_aggregate(rows, ["delay_fraction"], str(tmp_path / "a.png"))
  ax = saved_figures[-1].axes[0]
  assert _band(ax) == _expected_band([0, 0.3, 0.7], [0.8, 0.7, 0.5], [0.05, 0.1, 0.2])
  assert not ax.containers  # no error bars
  assert ax.get_legend().get_texts()[0].get_text() == "fedavg (mean ± std over 2/3 seeds)"


def test_the_sweep_titles_its_figure_by_the_swept_values_and_the_model_built(
    saved_figures, tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_async.sweeps import sweep  # pylint: disable=g-import-not-at-top
  base = _config(algorithm="fedavg", dataset="synthetic", model="auto", num_clients=4,
                 rounds=2, local_epochs=1, batch_size=10, delay_fraction=0.45,
                 checkpoint_every=0, quiet=True, output_dir=str(tmp_path))
  cfgs = sweep.grid(base, {"delay_fraction": [0.0, 0.3]}, num_seeds=2)
  sweep.run_grid(base, cfgs, ["delay_fraction"], experiment.load_data(base),
                 jax.devices()[:1], 2)
  title = saved_figures[-1].get_suptitle().replace("\n", " ")  # wrapped
  assert "δ swept: 0, 0.3" in title and "0.45" not in title, title
  assert "logreg" in title and "auto" not in title and "shards" not in title, title


def test_the_virtual_clock_draws_several_seeds_as_one_band(saved_figures, tmp_path):
  from fedjax_async.asynchronous import config as aconfig  # pylint: disable=g-import-not-at-top
  from fedjax_async.asynchronous import experiment as async_experiment  # pylint: disable=g-import-not-at-top
  cfg = aconfig.AsyncRunConfig().replace(output_dir=str(tmp_path), model="auto",
                                              dataset="synthetic")
  summary = {"dataset": "synthetic_1_1", "model": "logreg"}
  rows = lambda acc, t0: [{"virtual_time": t0 + i, "test_accuracy": a, "train_loss": 1.0}
                          for i, a in enumerate(acc)]
  run = lambda acc: types.SimpleNamespace(summary=summary, rows=rows(acc, 0.0))
  result = types.SimpleNamespace(figure=None, by_seed={
      0: {"fedasync": run([0.2, 0.4, 0.6])}, 3: {"fedasync": run([0.4, 0.8, 0.8])}})
  async_experiment.plot_seeds(cfg, result)
  ax = saved_figures[-1].axes[0]
  mean, std = [0.3, 0.6, 0.7], np.std([[0.2, 0.4, 0.6], [0.4, 0.8, 0.8]], axis=0, ddof=1)
  assert _band(ax) == _expected_band([0, 1, 2], mean, std)
  title = saved_figures[-1].get_suptitle().replace("\n", " ")  # wrapped
  assert "seeds 0, 3" in title and "logreg" in title and "natural partition" in title, title
  assert result.figure == str(tmp_path / "curves.png")


@pytest.fixture(scope="module")
def pafed_table():
  import importlib.util  # pylint: disable=g-import-not-at-top
  for name in ("pafed_table_module", "pafed_table"):  # loaded once per process (its flags)
    if name in sys.modules:
      return sys.modules[name]
  spec = importlib.util.spec_from_file_location(
      "pafed_table_module", os.path.join(ROOT, "experiments", "pafed_table.py"))
  module = importlib.util.module_from_spec(spec)
  # its dataclasses look their module up; benchmarks/table_v.py loads it as pafed_table
  sys.modules["pafed_table_module"] = sys.modules["pafed_table"] = module
  spec.loader.exec_module(module)
  return module


def test_the_pafed_table_draws_the_seeds_it_averages_as_a_band(pafed_table, saved_figures,
                                                                tmp_path):
  acc = {0: [0.1, 0.5], 1: [0.3, 0.7], 2: [0.9, 0.9]}  # seed 2 diverged: left out
  runs = [({"setting": {"delay_fraction": 0.3}, "diverged_round": 1 if s == 2 else None,
            "dataset": "fashion_mnist", "model": "cnn"},
           [{"round": i + 1, "test_accuracy": a} for i, a in enumerate(v)])
          for s, v in acc.items()]
  pafed_table.plot_curves({("dirichlet", "pafed"): runs}, ["dirichlet"], ["pafed"],
                          str(tmp_path), "reduced config",
                          _config(dataset="fashion_mnist", dirichlet_alpha=0.1).data)
  ax = saved_figures[-1].axes[0]
  assert _band(ax) == _expected_band([1, 2], [0.2, 0.6], [0.1, 0.1])
  assert ax.get_legend().get_texts()[0].get_text() == "PAFed (mean ± std over 2 seeds)"
  assert ax.get_title().startswith("fashion_mnist (Dirichlet α = 0.1, N = 30), cnn; δ = 0.3")
