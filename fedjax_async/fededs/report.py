"""What a FedEDS invocation writes besides its runs: Fig. 3 and privacy.json, each
setting's shared.json (what the shared sets teach), and the grid's rows.jsonl, table.md,
table.csv and shared.md."""

from __future__ import annotations

import csv
import json
import os
import time

import jax
import numpy as np

from fedjax_async import console
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async.fededs import alg1, store
from fedjax_async.fededs.engine import rounds_to_target, shared_set_utility
from fedjax_async.fededs.generation import SharedData
from fedjax_async.fededs.privacy import privacy_report, save_encryption_grid


def setting_label(setting: dict) -> str:
  """``alpha=0.1 K=5`` (a grid setting), ``<data name> K=20`` (``data=``)."""
  a = setting.get("alpha")
  head = f"alpha={a:g}" if a is not None else setting.get("data", "data")
  return f"{head} K={setting['num_clients']}"


def alpha_cell(setting: dict) -> str:
  """The alpha column: the Dirichlet alpha, or (``data=``) ``given (<data name>)``."""
  a = setting.get("alpha")
  return f"{a:g}" if a is not None else f"given ({setting.get('data', 'data')})"


def client_loop() -> str:
  """Alg. 1 over clients: vmap on accelerators, a sequential map on CPU."""
  return "map" if jax.default_backend() == "cpu" else "vmap"


def privacy_outputs(cfg, model, encryptor, theta0, layers, dev, fcfg, gen, out_dir,
                    setting=None):
  """Fig. 3 for client 0: originals, encrypted with / without the stochastic layer
  (``setting``: the grid's alpha and num_clients, named in the title).

  Args:
    cfg: the ``FedEDSRunConfig``.
    model: the split model.
    encryptor: the UNet g(x; phi).
    theta0: the initial global (theta_g, theta_c).
    layers: the clients' stochastic layers theta_l.
    dev: the device data.
    fcfg: the ``FedEDSConfig``.
    gen: Alg. 1's generation with the layer on.
    out_dir: where the grid and privacy.json go.
    setting: the grid's alpha and num_clients (None: none named).
  """
  job = alg1.Alg1(model, encryptor, theta0, layers, dev.x, dev.y, dev.counts,
                  jax.random.PRNGKey(cfg.run.seed + 1), fcfg, share_rows=16, use_layer=False,
                  client_loop=client_loop())
  no_layer = alg1.run(job, os.path.join(out_dir, "runs", "fig3_alg1.partial.npz"),
                      {**store.run_config(cfg), "fig3_counts": np.asarray(dev.counts).tolist()},
                      "[fededs] Fig. 3 (encryptors without the layer):", cfg.output.resume)
  n = int(min(8, int(dev.counts[0])))
  orig = np.asarray(dev.x[0, :n])
  with_l = np.asarray(gen.shared.x[0, :n])
  without_l = np.asarray(no_layer.shared.x[0, :n])
  save_encryption_grid(
      orig, with_l, os.path.join(out_dir, "encryption_grid.png"), without_l,
      title=encryption_grid_title(model.kind, setting))
  rep = privacy_report(orig, with_l, without_l)
  rep["encryptor_loss_last_with_layer"] = float(np.mean(gen.encryptor_loss[:, -1]))
  rep["encryptor_loss_last_without_layer"] = float(np.mean(no_layer.encryptor_loss[:, -1]))
  with open(os.path.join(out_dir, "privacy.json"), "w") as f:
    json.dump(rep, f, indent=2)
  console.say(" ".join(map(str, ("[fededs] privacy:", json.dumps(rep)))))


def encryption_grid_title(model: str, setting=None) -> str:
  """Fig. 3's title: the data set, its partition (the setting's Dirichlet alpha and K, when
  given) and the model built."""
  data = (setting or {}).get("data") or "Fashion-MNIST"
  part = ("" if not setting else f" (K = {setting['num_clients']})"
          if setting.get("alpha") is None else
          f" (Dirichlet α = {setting['alpha']:g}, K = {setting['num_clients']})")
  return f"FedEDS encryptor, client 0, {data}{part}, model {model} (Fig. 3)"


def shared_report(cfg, sdir, setting, config, gen, model, theta0, dev, pool, fcfg):
  """shared.json of a setting: Alg. 1's encryptor loss (first and last epoch, mean over
  clients), and the test accuracy of a model trained alg1.utility_epochs epochs from the
  initial global model on the shared sets alone (L_dis with each sender's layer) beside
  one trained as long on the raw training rows they were made from (CE).

  Args:
    cfg: the ``FedEDSRunConfig``.
    sdir: the setting's directory.
    setting: the setting (alpha, num_clients).
    config: the setting's configuration (compared with a stored report on resume).
    gen: Alg. 1's generation.
    model: the split model.
    theta0: the initial global (theta_g, theta_c).
    dev: the device data.
    pool: (train x, train y, test x, test y); the test pair scores the models.
    fcfg: the ``FedEDSConfig``.
  """
  path = os.path.join(sdir, "shared.json")
  if cfg.output.resume and os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("config") == config:
      return saved
  _, _, vx, vy = pool
  epochs = cfg.alg1.utility_epochs
  key = jax.random.PRNGKey(cfg.run.seed + 7)
  t0 = time.perf_counter()
  shared_acc = shared_set_utility(model, gen.shared, theta0, vx, vy, key, fcfg, epochs)
  rows = gen.shared.x.shape[1]  # the rows each client shared (alg1.share_rows)
  raw_shared = SharedData(
      dev.x[:, :rows], jax.nn.one_hot(dev.y[:, :rows], model.num_classes),
      gen.shared.counts,
      {"gain": jax.numpy.ones_like(gen.shared.layers["gain"]),
       "bias": jax.numpy.zeros_like(gen.shared.layers["bias"])})
  raw_acc = shared_set_utility(model, raw_shared, theta0, vx, vy, key, fcfg, epochs)
  soft = np.asarray(gen.shared.soft)
  rows_mask = np.arange(soft.shape[1])[None, :] < np.asarray(gen.shared.counts)[:, None]
  y = np.asarray(dev.y)[:, :soft.shape[1]]
  rep = {**setting, "encryptor_loss_first_epoch": float(np.mean(gen.encryptor_loss[:, 0])),
         "encryptor_loss_last_epoch": float(np.mean(gen.encryptor_loss[:, -1])),
         "soft_label_agreement": float(np.mean((soft.argmax(-1) == y)[rows_mask])),
         "shared_set_accuracy": shared_acc, "raw_rows_accuracy": raw_acc,
         "utility_epochs": epochs, "config": config}
  store.atomic_json(path, rep)
  console.say(f"[fededs] {setting_label(setting)}: encryptor loss "
              f"{rep['encryptor_loss_first_epoch']:.3f} -> {rep['encryptor_loss_last_epoch']:.3f}, "
              f"soft labels agree with y on {rep['soft_label_agreement']:.1%}; trained "
              f"{epochs} epochs on the shared sets alone: {shared_acc:.2%} test "
              f"accuracy (on the raw rows: {raw_acc:.2%}) ({time.perf_counter() - t0:.0f}s)")
  return rep


def write_shared(out_dir: str):
  """shared.md: every setting's shared.json as one table."""
  reps = []
  for name in sorted(os.listdir(os.path.join(out_dir, "runs"))):
    path = os.path.join(out_dir, "runs", name, "shared.json")
    if os.path.exists(path):
      with open(path) as f:
        reps.append(json.load(f))
  if not reps:
    return
  lines = ["| alpha | K | encryptor loss, epoch 1 -> last | soft label = y | trained on the "
           "shared sets alone | on the raw rows |", "|---|---|---|---|---|---|"]
  for r in reps:
    lines.append(f"| {alpha_cell(r)} | {r['num_clients']} | "
                 f"{r['encryptor_loss_first_epoch']:.3f} -> {r['encryptor_loss_last_epoch']:.3f}"
                 f" | {100 * r['soft_label_agreement']:.1f} % | "
                 f"{100 * r['shared_set_accuracy']:.2f} % | {100 * r['raw_rows_accuracy']:.2f} % |")
  with open(os.path.join(out_dir, "shared.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  console.say("\n".join(lines), console.RESULT)


def write_rows(finished, out_dir: str):
  """rows.jsonl: every finished run's per-round metrics, in grid order."""
  path = os.path.join(out_dir, "rows.jsonl")
  with open(path + ".tmp", "w") as f:
    for res, rows in finished:
      ident = {kk: res[kk] for kk in ("alpha", "num_clients", "base", "variant")}
      for r in rows:
        f.write(json.dumps({**ident, **{kk: vv for kk, vv in r.items()
                                        if not isinstance(vv, (list, np.ndarray))}}) + "\n")
  os.replace(path + ".tmp", path)


def run_result(rows, target_accuracy: float) -> dict:
  """A run's result of its rows: the accuracy metrics, the rounds to ``target_accuracy``
  and the client steps."""
  accs = [r["test_accuracy"] for r in rows]
  return {**metrics_lib.accuracy_summary(accs),
          "rounds_to_target": rounds_to_target(accs, target_accuracy),
          "total_client_steps": int(sum(r["client_steps"] for r in rows))}


def run_summary(res: dict, seed: int) -> dict:
  """A run's summary in ``Result.runs``: ``res`` with its ``algorithm`` (``<base>/<variant>``),
  ``seed`` and ``setting`` (its grid's Dirichlet alpha, where the grid drew one, and K)."""
  return {**res, "algorithm": f"{res['base']}/{res['variant']}", "seed": seed,
          "setting": {k: res[k] for k in ("alpha", "num_clients") if res.get(k) is not None}}


def table(results, target_accuracy: float) -> str:
  """Markdown: one line per configuration (setting, base, variant): final and best top-1,
  rounds to the target and client steps, of its one seed or over its seeds (mean ± std (n),
  ``outputs.seed_cell``; each seed's rounds to the target)."""
  lines = [f"| alpha | K | algorithm | final top-1 (%) | best top-1 (%) | "
           f"rounds to {target_accuracy:.0%} | client steps |", "|---|---|---|---|---|---|---|"]
  names = {"base": "{b}", "equal": "{b}, equal work", "s1": "{b} + S1 (annealing)",
           "s2": "{b} + S2 (sharing)", "fededs": "FedEDS + {b}"}
  groups = {}
  for r in results:
    groups.setdefault((alpha_cell(r), r["num_clients"], r["base"], r["variant"]), []).append(r)
  for (alpha, k, base, variant), group in groups.items():
    cell = lambda key: outputs.seed_cell([100 * r[key] for r in group], ".2f")  # pylint: disable=cell-var-from-loop
    steps = np.mean([r["total_client_steps"] for r in group])
    lines.append(f"| {alpha} | {k} | {names[variant].format(b=base)} | "
                 f"{cell('final_accuracy')} | {cell('best_accuracy')} | "
                 + "/".join("x" if r["rounds_to_target"] is None else str(r["rounds_to_target"])
                            for r in group) + f" | {steps:.0f} |")
  if any(len(g) > 1 for g in groups.values()):
    lines += ["", f"{outputs.SEEDS_NOTE}; rounds to {target_accuracy:.0%}: each seed's."]
  return "\n".join(lines)


def write_tables(results, out_dir: str, target_accuracy: float, echo: bool = True):
  """table.csv and table.md (printed when ``echo``)."""
  keys = ["alpha", "num_clients", "base", "variant", "final_accuracy", "best_accuracy",
          "rounds_to_target", "total_client_steps", "seconds"]
  with open(os.path.join(out_dir, "table.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(results)
  text = table(results, target_accuracy)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(text + "\n")
  if echo:
    console.say(text, console.RESULT)
