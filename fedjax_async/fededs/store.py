"""What a FedEDS invocation keeps on disk to be resumed: Alg. 1's encrypted sets
(``alg1.npz``), each run's summary, and the comparison of a stored configuration with
this one (by field path: ``training.lr=0.01 (now 0.02)``)."""

from __future__ import annotations

import json
import os
from typing import List, Optional

import jax
import numpy as np

from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import console
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async.fededs.config import FedEDSRunConfig
from fedjax_async.fededs.generation import Generation, SharedData

# Fields that change no run's model or rows: the grid (a resumed invocation may add
# settings) and where the outputs go ("quick": stored by earlier versions of the CLI).
RESUME_FREE_FIELDS = ("output_dir", "resume", "overwrite", "checkpoint_every", "quick",
                      "quiet", "alphas", "num_clients", "bases", "variants", "privacy")


def run_config(cfg: FedEDSRunConfig) -> dict:
  """The fields that change the results (not RESUME_FREE_FIELDS) by flat key, as each
  run's summary, checkpoints and Alg. 1's file store them."""
  flat = cfg.flat()
  return checkpoint_lib.to_json_ready(
      {k: flat[k] for k in sorted(flat) if k not in RESUME_FREE_FIELDS})


def mismatch(saved: dict, now: dict) -> str:
  """'training.lr=0.01 (now 0.02), ...' for the result-changing fields that differ ('' if
  none). A field that ``saved`` lacks (stored before it existed) counts as its default."""
  keys = sorted((set(saved) | set(now)) - set(RESUME_FREE_FIELDS))
  defaults, paths = FedEDSRunConfig().flat(), FedEDSRunConfig.keys()
  was = {k: saved[k] if k in saved else defaults.get(k) for k in keys}
  return ", ".join(f"{'.'.join(paths[k]) if k in paths else k}={was[k]!r} "
                   f"(now {now.get(k)!r})" for k in keys if was[k] != now.get(k))


def checkpoint_mismatch(saved: dict, now: dict) -> List[str]:
  """The fields (and the run's name) that differ between a checkpoint and this run."""
  fields = mismatch(saved, now)
  bad = [fields] if fields else []
  if saved.get("run") != now.get("run"):
    bad.append(f"run {saved.get('run')!r} (now {now.get('run')!r})")
  return bad


def atomic_json(path: str, obj):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def save_generation(path: str, gen: Generation, config: dict):
  """Alg. 1's outputs that the runs and Fig. 3 use (the shared sets, the per-epoch losses),
  written under a temporary name and renamed: a file there is complete."""
  sh = gen.shared
  arrays = {"x": sh.x, "soft": sh.soft, "counts": sh.counts,
            "pretrain_loss": gen.pretrain_loss, "encryptor_loss": gen.encryptor_loss,
            **{f"layer.{n}": v for n, v in sh.layers.items()}}
  tmp = path + ".tmp.npz"
  np.savez(tmp, config=np.asarray(json.dumps(config)),
           **{n: np.asarray(jax.device_get(v)) for n, v in arrays.items()})
  os.replace(tmp, path)


def load_generation(path: str, config: dict) -> Optional[Generation]:
  """``save_generation``'s file as a ``Generation`` (no local models), or None when there
  is none, or (saying so, naming the file) it cannot be read or was made with another
  configuration: Alg. 1 then runs again."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path) as z:
      saved = json.loads(str(z["config"]))
      arrays = {n: z[n] for n in z.files if n != "config"}
  except (OSError, ValueError, KeyError, EOFError) as e:
    console.say(f"[fededs] {path} cannot be read ({type(e).__name__}: {e}): Alg. 1 runs again")
    return None
  if saved != config:
    console.say(outputs.name_fields(f"[fededs] {path} was made with other settings "
                                    f"({mismatch(saved, config)}): Alg. 1 runs again"))
    return None
  asarray = jax.numpy.asarray
  layers = {n[len("layer."):]: asarray(v) for n, v in arrays.items() if n.startswith("layer.")}
  shared = SharedData(asarray(arrays["x"]), asarray(arrays["soft"]), asarray(arrays["counts"]),
                      layers)
  return Generation(shared, arrays["pretrain_loss"], arrays["encryptor_loss"], None, None)


def finished_run(run_dir: str, config: dict, rounds: int):
  """(result, rows) of a finished run under ``run_dir`` made with ``config``, else None."""
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      rows = metrics_lib.count_from_one([json.loads(line) for line in f if line.strip()])
  except (OSError, ValueError):
    return None
  if summary.get("config") != config or len(rows) != rounds:
    return None
  return summary["result"], rows
