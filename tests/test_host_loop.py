"""The host loop and the static part of local training, each built in one place
(``loop.host_loop``, ``building.local_config``) for the round engine, the virtual clock,
FedEDS and the sweeps."""

import ast
import json
import os

import numpy as np

import fedjax_async as fa
from fedjax_async import loop
from fedjax_async.asynchronous.config import AsyncRunConfig
from fedjax_async.core import building
from fedjax_async.core.client import LocalConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "fedjax_async")


def constructions(name: str):
  """The package's files (relative paths) that call ``name(...)`` (or ``x.name(...)``)."""
  found = set()
  for d, _, files in os.walk(ROOT):
    for f in files:
      if not f.endswith(".py"):
        continue
      path = os.path.join(d, f)
      with open(path) as fh:
        tree = ast.parse(fh.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.Call):
          fn = node.func
          called = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
          if called == name:
            found.add(os.path.relpath(path, ROOT).replace(os.sep, "/"))
  return found


def test_the_host_loop_and_local_config_are_each_built_in_one_place():
  assert constructions("HostLoop") == {"loop.py"}
  assert constructions("MetricsFile") == {"loop.py"}
  assert constructions("LocalConfig") == {"core/building.py"}


def small_data(shape=(3,)):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40,) + shape).astype(np.float32)
  y = rng.integers(0, 2, 40)
  return fa.data.from_arrays(x, y, (x[:8], y[:8]), num_clients=4, seed=1)


def test_local_config_reads_each_engines_local_part_and_keywords_replace_it():
  fed = small_data()
  m = int(fed.x.shape[1])  # the padded client size
  cfg = fa.RunConfig().replace(batch_size=7, local_epochs=3, random_local_epochs=True,
                               momentum=0.0, local_steps=5, precision="bf16",
                               client_grad_clip=2.5)
  assert building.local_config(cfg, fed) == LocalConfig(
      7, 3, m, True, momentum=False, local_steps=5, precision="bf16", grad_clip=2.5)
  assert building.local_config(cfg, fed, momentum=True, grad_clip=0.0) == LocalConfig(
      7, 3, m, True, momentum=True, local_steps=5, precision="bf16", grad_clip=0.0)
  # the virtual clock's part has no random epochs or precision: LocalConfig's defaults
  acfg = AsyncRunConfig().replace(batch_size=6, local_epochs=2, momentum=0.5,
                                  local_steps=4, client_grad_clip=1.5)
  assert building.local_config(acfg, fed) == LocalConfig(
      6, 2, m, False, momentum=True, local_steps=4, precision="float32", grad_clip=1.5)
  # FedEDS's own settings: no configuration part
  assert building.local_config(batch_size=4, max_epochs=2, max_examples=9) == LocalConfig(
      4, 2, 9)
  images = small_data((8, 8, 1))
  made = building.local_config(cfg.replace(augment="crop_flip", normalize="fedadmm"), images)
  assert made.augment == "crop_flip"  # padded with black: (0 - 0.1307) / 0.3081
  np.testing.assert_allclose(made.augment_fill, [-0.1307 / 0.3081], rtol=1e-6)


def test_host_loop_counts_chunks_writes_rows_and_goes_on_from_a_checkpoint(tmp_path):
  lengths = loop.ChunkLengths(4)
  restored = [{"group": g, "test_accuracy": 0.5} for g in (1, 2)]
  resumed = loop.Resumed(position=2, state=None, rows=restored, wall_before=100.0,
                         config={})
  host = loop.host_loop(str(tmp_path), None, resumed, loop.ChunkCount(2, lengths, 7),
                        annotate=lambda rows: [r.setdefault("seen", 1) for r in rows])
  positions = []
  done = 2
  while done < 7:
    n = lengths.next(7 - done, done)
    rows = [{"group": done + i + 1, "test_accuracy": 0.5} for i in range(n)]
    host(None, rows)
    done += n
    positions.append(host.position(None))
  host.metrics.close()
  assert positions == [4, 7]  # 2 -> 4 (a chunk ends on a multiple of 4), then 3 more
  assert host.chunk == [{"group": g, "test_accuracy": 0.5, "seen": 1} for g in (5, 6, 7)]
  with open(tmp_path / "metrics.jsonl") as f:
    written = [json.loads(line) for line in f]
  assert [r["group"] for r in written] == [1, 2, 3, 4, 5, 6, 7]
  assert all(r["seen"] == 1 for r in written) and host.rows == written
  assert host.wall() >= 100.0
  fresh = loop.host_loop(None, None, None, lambda state: 0)
  assert fresh.metrics.file is None and fresh.rows == [] and fresh.wall() < 100.0
