r"""FedEDS on Fashion-MNIST (the paper's Table II, plus rounds-to-target as Tables III-V
and the S1 / S2 ablations of Tables VI-VII).

  # the paper's grid (alpha in {0.1, 0.5, 10}, K in {5, 10, 20}, T = 30), PAFed CNN
  python experiments/fededs_table.py --output_dir=out/fededs
  # minutes on 2 CPU cores: one setting, few rounds, a subset of the data
  python experiments/fededs_table.py --quick --output_dir=out/fededs_quick

Per (alpha, K): Alg. 1 runs once (vmapped over clients) and its encrypted sets are shared
by every base algorithm; then each base in --bases runs as ``base`` (fixed
--base_epochs, no sharing), ``equal`` (FedEDS's total local epochs spread evenly: the
same local steps, no sharing), ``s1`` (annealing only), ``s2`` (sharing only) and ``fededs``
(both), as chosen by --variants. All variants use the same SGD (lr, momentum 0.9, weight
decay 1e-4). Outputs: table.md / table.csv (final and best top-1 accuracy, rounds to
--target_accuracy), rows.jsonl (per-round metrics), encryption_grid.png and
privacy.json (PSNR / SSIM of encrypted vs original, layer on / off: Fig. 3), shared.md
(per setting: the encryptor's loss and the accuracy of a model trained on the shared
sets alone).

Nothing finished is lost to an interruption. Under ``runs/alpha<a>_K<k>/`` each setting
keeps Alg. 1's encrypted sets (``alg1.npz``, written once complete) and each run its
``metrics.jsonl``, ``summary.json`` and a checkpoint every ``--checkpoint_every`` rounds.
After Ctrl-C, SIGTERM or a crash, the same command with ``--resume`` reads back the
finished runs and Alg. 1's sets and continues the others from their latest checkpoint, to
the rows of an uninterrupted run; flags that change the results are compared first (the
grid flags --alphas, --num_clients, --bases, --variants and --privacy may change: a
resumed command can add settings). A folder that holds a FedEDS run is refused unless
``--resume`` or ``--overwrite``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from fedjax_async import interrupts
from fedjax_async import algorithms
from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import data as data_lib
from fedjax_async.rounds import engine
from fedjax_async import cli
from fedjax_async.rounds import experiment
from fedjax_async import fededs
from fedjax_async import loop
from fedjax_async.rounds import timeline as timeline_lib

flags.DEFINE_string("output_dir", "out/fededs", "Where tables, metrics and figures go.")
flags.DEFINE_boolean("quick", False, "Few rounds on a data subset (minutes on 2 CPU cores): "
                     "presets every flag below that is not given explicitly.")
flags.DEFINE_string("alphas", "0.1,0.5,10", "Dirichlet concentrations alpha.")
flags.DEFINE_string("num_clients", "5,10,20", "Numbers of clients K.")
flags.DEFINE_string("bases", "fedavg,fedprox,fednova", "Base algorithms.")
flags.DEFINE_string("variants", "base,equal,fededs", "Any of base (--base_epochs per "
                    "round), equal (no annealing, no sharing, FedEDS's total local epochs "
                    "spread evenly over the rounds: the same local steps), s1 (annealing "
                    "only), s2 (sharing only), fededs.")
flags.DEFINE_integer("rounds", 30, "Communication rounds T (paper: 30 on Fashion-MNIST).")
flags.DEFINE_string("model", "cnn", "cnn (PAFed CNN, split after FC 512) | mlp | resnet18 "
                    "(the paper's ResNet-18 without BatchNorm, split after the global pool; "
                    "slow on CPU).")
flags.DEFINE_integer("hidden", 512, "Feature width (the stochastic layer's size).")
flags.DEFINE_integer("train_subset", 0, "Use n random training examples (0 = all 60000).")
flags.DEFINE_integer("test_subset", 0, "Evaluate on the first n test examples (0 = all).")
flags.DEFINE_float("target_accuracy", 0.8, "Target for rounds-to-target (fraction).")
flags.DEFINE_float("lr", 0.01, "Client SGD learning rate.")
flags.DEFINE_float("mu", 0.1, "FedProx mu.")
flags.DEFINE_integer("base_epochs", 1, "Local epochs without annealing (base, s2).")
flags.DEFINE_integer("batch_size", 50, "Client minibatch size.")
flags.DEFINE_integer("pretrain_epochs", 5, "E_c of Alg. 1.")
flags.DEFINE_integer("encryptor_epochs", 20, "E_g of Alg. 1 (paper: 20).")
flags.DEFINE_integer("unet_width", 16, "Channels of the UNet's first level.")
flags.DEFINE_integer("utility_epochs", 5, "Epochs of training on the shared encrypted sets "
                     "alone (and, for reference, on the raw training data) to measure what "
                     "they teach (shared.md); 0: off.")
flags.DEFINE_integer("share_rows", 0, "Share at most n encrypted rows per client (0 = all).")
flags.DEFINE_string("transfer_mode", "sample", "sample (Eq. 8) | all (Eq. 7).")
flags.DEFINE_integer("seed", 0, "Seed of partition, model, layers and training.")
flags.DEFINE_integer("rounds_per_call", 1, "Rounds per jitted call (one progress line "
                     "with rounds/s and ETA after each call; the same run to float rounding).")
flags.DEFINE_string("data_dir", None, "Fashion-MNIST IDX directory (default: the system one).")
flags.DEFINE_boolean("privacy", True, "Save the encryption grid and privacy report "
                     "(trains a second set of encryptors without the layer, first setting).")
flags.DEFINE_integer("checkpoint_every", 5, "Checkpoint each run every k rounds (at the end "
                     "of a --rounds_per_call call; under runs/<setting>/<run>/checkpoints; "
                     "0: off).")
flags.DEFINE_boolean("resume", False, "Read back the finished runs and Alg. 1's encrypted "
                     "sets under --output_dir and continue the other runs from their latest "
                     "checkpoint.")
flags.DEFINE_boolean("overwrite", False, "Delete the FedEDS outputs in --output_dir and "
                     "start over; without it (or --resume) a folder holding a run is "
                     "refused.")

FLAGS = flags.FLAGS
QUICK = dict(alphas="0.1", num_clients="5", bases="fedavg", variants="base,s1,s2,fededs",
             rounds=5, train_subset=1000, test_subset=500, encryptor_epochs=3,
             pretrain_epochs=2, unet_width=4, hidden=64, model="mlp",
             target_accuracy=0.6, utility_epochs=1)
VARIANTS = {"base": (False, False), "equal": (False, False), "s1": (True, False),
            "s2": (False, True), "fededs": (True, True)}
# Flags that change no run's model or rows: the grid (a resumed command may add settings),
# where the outputs go, and --quick (its presets are compared as the flags they set).
RESUME_FREE_FLAGS = ("output_dir", "resume", "overwrite", "checkpoint_every", "quick",
                     "alphas", "num_clients", "bases", "variants", "privacy")
# Everything this driver writes into --output_dir (--overwrite deletes these alone).
OUTPUTS = ("flags.json", "rows.jsonl", "table.md", "table.csv", "privacy.json",
           "encryption_grid.png", "shared.md", "runs")


def _floats(name):
  try:
    return [float(v) for v in getattr(FLAGS, name).split(",") if v]
  except ValueError as e:
    raise app.UsageError(f"--{name}: comma-separated numbers expected ({e})")


def _ints(name):
  try:
    return [int(v) for v in getattr(FLAGS, name).split(",") if v]
  except ValueError as e:
    raise app.UsageError(f"--{name}: comma-separated integers expected ({e})")


def apply_quick_presets():
  if not FLAGS.quick:
    return
  for name, value in QUICK.items():
    if not FLAGS[name].present:
      setattr(FLAGS, name, value)


def validate():
  """Checks every flag, naming it in the message."""
  alphas, ks = _floats("alphas"), _ints("num_clients")
  if not alphas or any(a <= 0 for a in alphas):
    raise app.UsageError(f"--alphas must be positive numbers, got {FLAGS.alphas!r}")
  if not ks or any(k < 2 for k in ks):
    raise app.UsageError(f"--num_clients must be integers >= 2, got {FLAGS.num_clients!r}")
  bases = [b for b in FLAGS.bases.split(",") if b]
  for b in bases:
    if b not in ("fedavg", "fedprox", "fednova"):
      raise app.UsageError(f"--bases: {b!r} is not one of fedavg, fedprox, fednova")
  variants = [v for v in FLAGS.variants.split(",") if v]
  for v in variants:
    if v not in VARIANTS:
      raise app.UsageError(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
  if not bases or not variants:
    raise app.UsageError("--bases and --variants must not be empty")
  checks = [("rounds", FLAGS.rounds >= 1, ">= 1"), ("hidden", FLAGS.hidden >= 1, ">= 1"),
            ("train_subset", FLAGS.train_subset >= 0, ">= 0"),
            ("test_subset", FLAGS.test_subset >= 0, ">= 0"),
            ("target_accuracy", 0 < FLAGS.target_accuracy <= 1, "in (0, 1]"),
            ("lr", FLAGS.lr > 0, "> 0"), ("mu", FLAGS.mu >= 0, ">= 0"),
            ("base_epochs", FLAGS.base_epochs >= 1, ">= 1"),
            ("batch_size", FLAGS.batch_size >= 1, ">= 1"),
            ("pretrain_epochs", FLAGS.pretrain_epochs >= 1, ">= 1"),
            ("encryptor_epochs", FLAGS.encryptor_epochs >= 1, ">= 1"),
            ("unet_width", FLAGS.unet_width >= 1, ">= 1"),
            ("share_rows", FLAGS.share_rows >= 0, ">= 0"),
            ("utility_epochs", FLAGS.utility_epochs >= 0, ">= 0 (0: off)"),
            ("rounds_per_call", FLAGS.rounds_per_call >= 1, ">= 1"),
            ("checkpoint_every", FLAGS.checkpoint_every >= 0, ">= 0 (0: off)"),
            ("seed", FLAGS.seed >= 0, ">= 0")]
  for name, ok, expected in checks:
    if not ok:
      raise app.UsageError(f"--{name}: must be {expected}, got {getattr(FLAGS, name)!r}")
  if FLAGS.model not in ("cnn", "mlp", "resnet18"):
    raise app.UsageError(f"--model must be cnn, mlp or resnet18, got {FLAGS.model!r}")
  if FLAGS.model == "resnet18" and FLAGS.hidden != 512:
    raise app.UsageError(f"--hidden must be 512 with --model=resnet18 (its pooled "
                         f"features), got {FLAGS.hidden}")
  if FLAGS.transfer_mode not in ("sample", "all"):
    raise app.UsageError(f"--transfer_mode must be sample or all, got {FLAGS.transfer_mode!r}")
  if FLAGS.resume and FLAGS.overwrite:
    raise app.UsageError("--overwrite: cannot be combined with --resume (--resume continues "
                         "the runs in --output_dir, --overwrite deletes them)")
  return alphas, ks, bases, variants


def load_pool():
  kw = {} if FLAGS.data_dir is None else {"data_dir": FLAGS.data_dir}
  tx, ty, vx, vy = data_lib.load_fashion_mnist(**kw)
  rng = np.random.default_rng(FLAGS.seed)
  if FLAGS.train_subset:
    idx = rng.choice(len(ty), size=min(FLAGS.train_subset, len(ty)), replace=False)
    tx, ty = tx[idx], ty[idx]
  if FLAGS.test_subset:
    vx, vy = vx[:FLAGS.test_subset], vy[:FLAGS.test_subset]
  return tx, ty, vx, vy


def _client_loop():
  """Alg. 1 over clients: vmap on accelerators, a sequential map on CPU."""
  return "map" if jax.default_backend() == "cpu" else "vmap"


def fededs_config():
  return fededs.FedEDSConfig(lr=FLAGS.lr, batch_size=FLAGS.batch_size,
                             pretrain_epochs=FLAGS.pretrain_epochs,
                             encryptor_epochs=FLAGS.encryptor_epochs,
                             unet_width=FLAGS.unet_width, transfer_batch=FLAGS.batch_size)


def privacy_outputs(model, encryptor, theta0, layers, dev, cfg, gen, out_dir):
  """Fig. 3 for client 0: originals, encrypted with / without the stochastic layer."""
  no_layer = fededs.generate_encrypted(model, encryptor, theta0, layers, dev.x, dev.y,
                                       dev.counts, jax.random.PRNGKey(FLAGS.seed + 1), cfg,
                                       share_rows=16, use_layer=False,
                                       client_loop=_client_loop())
  n = int(min(8, int(dev.counts[0])))
  orig = np.asarray(dev.x[0, :n])
  with_l = np.asarray(gen.shared.x[0, :n])
  without_l = np.asarray(no_layer.shared.x[0, :n])
  fededs.save_encryption_grid(
      orig, with_l, os.path.join(out_dir, "encryption_grid.png"), without_l,
      title=f"FedEDS encryptor, client 0, Fashion-MNIST, model {FLAGS.model} (Fig. 3)")
  rep = fededs.privacy_report(orig, with_l, without_l)
  rep["encryptor_loss_last_with_layer"] = float(np.mean(gen.encryptor_loss[:, -1]))
  rep["encryptor_loss_last_without_layer"] = float(np.mean(no_layer.encryptor_loss[:, -1]))
  with open(os.path.join(out_dir, "privacy.json"), "w") as f:
    json.dump(rep, f, indent=2)
  print("[fededs] privacy:", json.dumps(rep), flush=True)


class ResumeError(ValueError):
  """A run's checkpoint that --resume cannot continue from (other flags, unreadable files):
  one error line naming it."""


def run_flags() -> dict:
  """The flags that change the results (not RESUME_FREE_FLAGS), as each run's summary and
  checkpoints store them to compare with on --resume."""
  module = sys.modules[__name__]
  names = sorted(f.name for f in FLAGS.get_flags_for_module(module)
                 if f.name not in RESUME_FREE_FLAGS)
  return checkpoint_lib.to_json_ready({n: FLAGS[n].value for n in names})


def flags_mismatch(saved: dict, now: dict) -> str:
  """'--lr=0.01 (now 0.02), ...' for the result-changing flags that differ ('' if none).
  A flag that ``saved`` lacks (stored before the flag existed) counts as its default."""
  keys = sorted((set(saved) | set(now)) - set(RESUME_FREE_FLAGS))
  was = {k: saved[k] if k in saved else FLAGS[k].default if k in FLAGS else None
         for k in keys}
  return ", ".join(f"--{k}={was[k]!r} (now {now.get(k)!r})" for k in keys
                   if was[k] != now.get(k))


def setting_dir(out_dir, alpha, k):
  return os.path.join(out_dir, "runs", f"alpha{alpha:g}_K{k}")


def _atomic_json(path, obj):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def save_generation(path: str, gen: fededs.Generation, config: dict):
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


def load_generation(path: str, config: dict):
  """``save_generation``'s file as a ``fededs.Generation`` (no local models), or None when
  there is none, or (saying so, naming the file) it cannot be read or was made with other
  flags: Alg. 1 then runs again."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path) as z:
      saved = json.loads(str(z["config"]))
      arrays = {n: z[n] for n in z.files if n != "config"}
  except (OSError, ValueError, KeyError, EOFError) as e:
    print(f"[fededs] {path} cannot be read ({type(e).__name__}: {e}): Alg. 1 runs again",
          flush=True)
    return None
  if saved != config:
    print(f"[fededs] {path} was made with other flags ({flags_mismatch(saved, config)}): "
          "Alg. 1 runs again", flush=True)
    return None
  layers = {n[len("layer."):]: jax.numpy.asarray(v) for n, v in arrays.items()
            if n.startswith("layer.")}
  shared = fededs.SharedData(jax.numpy.asarray(arrays["x"]), jax.numpy.asarray(arrays["soft"]),
                             jax.numpy.asarray(arrays["counts"]), layers)
  return fededs.Generation(shared, arrays["pretrain_loss"], arrays["encryptor_loss"], None,
                           None)


def finished_run(run_dir: str, config: dict):
  """(result, rows) of a finished run under ``run_dir`` made with ``config``, else None."""
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):
    return None
  if summary.get("config") != config or len(rows) != FLAGS.rounds:
    return None
  return summary["result"], rows


def checkpoint_mismatch(saved: dict, now: dict):
  """The flags (and the run's name) that differ between a checkpoint and this run."""
  flags = flags_mismatch(saved, now)
  bad = [flags] if flags else []
  if saved.get("run") != now.get("run"):
    bad.append(f"run {saved.get('run')!r} (now {now.get('run')!r})")
  return bad


def run_variant(name, alg, apply_flat, w0, dev, tl, base_hp, cfg, anneal, share, run_dir,
                config, fixed_epochs):
  """One run with checkpoints every --checkpoint_every rounds; with --resume it continues
  from the latest. Returns (result, rows); raises engine.Diverged."""
  os.makedirs(run_dir, exist_ok=True)
  ckpt = loop.Checkpoints(os.path.join(run_dir, "checkpoints"), config,
                          every=FLAGS.checkpoint_every, total=FLAGS.rounds,
                          resume=FLAGS.resume, mismatch=checkpoint_mismatch)
  try:
    try:
      resumed = ckpt.restore(fededs.init_state(alg, w0, int(dev.counts.shape[0])))
    except ValueError as e:
      raise ResumeError(str(e)) from None
    state, rows_before = None, []
    if resumed is not None:
      state, rows_before = jax.tree.map(jax.numpy.asarray, resumed.state), resumed.rows
      print(f"[{name}] resuming from the checkpoint of round {resumed.position} "
            f"({ckpt.directory})", flush=True)
    metrics = loop.MetricsFile(os.path.join(run_dir, "metrics.jsonl"), rows_before)
    host = loop.HostLoop(metrics, ckpt, lambda st: int(st.round),
                         experiment.Progress(name, FLAGS.rounds, len(rows_before)),
                         resumed.wall_before if resumed else 0.0)
    try:
      fededs.run(apply_flat, alg, w0, dev, tl, base_hp, cfg, anneal=anneal, share=share,
                 fixed_epochs=fixed_epochs, seed=FLAGS.seed,
                 rounds_per_call=FLAGS.rounds_per_call, on_chunk=host, state=state)
    finally:
      metrics.close()
  finally:
    ckpt.close()
  all_rows = metrics.rows
  rows = [checkpoint_lib.to_json_ready(r) for r in all_rows]
  accs = [r["test_accuracy"] for r in rows]
  res = {"final_accuracy": accs[-1], "best_accuracy": max(a for a in accs if a is not None),
         "rounds_to_target": fededs.rounds_to_target(accs, FLAGS.target_accuracy),
         "total_client_steps": int(sum(r["client_steps"] for r in rows)),
         "seconds": host.wall()}
  return res, rows


def run_setting(alpha, k, bases, variants, pool, out_dir, do_privacy, done):
  """The runs of one (alpha, K): Alg. 1 once (read back with --resume when it is stored),
  then every base x variant. ``done(res, rows)`` after each run, in grid order."""
  tx, ty, vx, vy = pool
  parts = data_lib.partition_dirichlet(ty, k, alpha, min_size=10, seed=FLAGS.seed)
  fd = data_lib.federate(tx, ty, parts, vx, vy, 10, "fashion_mnist")
  dev = engine.DeviceData.from_federated(fd)
  model = fededs.SplitModel(FLAGS.model, 10, fd.feature_shape, hidden=FLAGS.hidden)
  w0, apply_flat, split = model.flat(jax.random.PRNGKey(FLAGS.seed))
  cfg = fededs_config()
  tl = timeline_lib.build(k, FLAGS.rounds, 1.0, timeline_lib.DelayConfig(max_delay=1),
                          seed=FLAGS.seed)
  sdir = setting_dir(out_dir, alpha, k)
  os.makedirs(sdir, exist_ok=True)
  setting = {"alpha": alpha, "num_clients": k}
  runs = []  # (base, variant, run_dir, config, finished or None)
  for b in bases:
    for v in variants:
      run_dir = os.path.join(sdir, f"{b}_{v}")
      config = {"run": f"alpha={alpha:g} K={k} {b}/{v}", **run_flags()}
      runs.append((b, v, run_dir, config,
                   finished_run(run_dir, config) if FLAGS.resume else None))
  privacy_pending = do_privacy and not (
      FLAGS.resume and os.path.exists(os.path.join(out_dir, "privacy.json")))
  shared = None
  if privacy_pending or any(VARIANTS[v][1] and fin is None for _, v, _, _, fin in runs):
    layers = fededs.client_stochastic_layers(FLAGS.seed, k, FLAGS.hidden)
    encryptor = fededs.make_encryptor(fd.feature_shape, width=FLAGS.unet_width)
    alg1_path, alg1_config = os.path.join(sdir, "alg1.npz"), {**setting, **run_flags()}
    gen = load_generation(alg1_path, alg1_config) if FLAGS.resume else None
    if gen is not None:
      print(f"[fededs] alpha={alpha} K={k}: Alg. 1's encrypted sets read back from "
            f"{alg1_path}", flush=True)
    else:
      t0 = time.perf_counter()
      gen = fededs.generate_encrypted(model, encryptor, split(w0), layers, dev.x, dev.y,
                                      dev.counts, jax.random.PRNGKey(FLAGS.seed), cfg,
                                      share_rows=FLAGS.share_rows or None,
                                      client_loop=_client_loop())
      jax.block_until_ready(gen.shared.x)
      save_generation(alg1_path, gen, alg1_config)
      print(f"[fededs] alpha={alpha} K={k}: Alg. 1 in {time.perf_counter() - t0:.1f}s, "
            f"encryptor loss {np.mean(gen.encryptor_loss[:, 0]):.3f} -> "
            f"{np.mean(gen.encryptor_loss[:, -1]):.3f}", flush=True)
    shared = gen.shared
    if FLAGS.utility_epochs:
      shared_report(sdir, setting, gen, model, split(w0), dev, pool)
    if privacy_pending:
      privacy_outputs(model, encryptor, split(w0), layers, dev, cfg, gen, out_dir)
  base_hp = {"lr": FLAGS.lr, "momentum": 0.9, "server_lr": 1.0, "mu": FLAGS.mu,
             "weight_decay": cfg.weight_decay}
  for b, v, run_dir, config, fin in runs:
    name = f"fededs alpha={alpha} K={k} {b}/{v}"
    if fin is not None:
      res, rows = fin
      print(f"[{name}] read back from {run_dir} (finished, same flags)", flush=True)
    else:
      anneal, share = VARIANTS[v]
      alg = fededs.wrap(algorithms.get(b), model, split, shared if share else None,
                        batch=cfg.transfer_batch, mode=FLAGS.transfer_mode, seed=FLAGS.seed)
      try:
        fixed = (fededs.equal_work_epochs(FLAGS.rounds, cfg) if v == "equal"
                 else FLAGS.base_epochs)
        res, rows = run_variant(name, alg, apply_flat, w0, dev, tl, base_hp, cfg, anneal,
                                share, run_dir, config, fixed)
      except engine.Diverged as e:
        print(f"[{name}] diverged: {e}; left out of the table", flush=True)
        continue
      res = {**setting, "base": b, "variant": v, **res}
      _atomic_json(os.path.join(run_dir, "summary.json"), {"result": res, "config": config})
      print(f"[fededs] alpha={alpha} K={k} {b}/{v}: final {res['final_accuracy']:.4f} "
            f"best {res['best_accuracy']:.4f} rounds->{FLAGS.target_accuracy:.0%} "
            f"{res['rounds_to_target']} ({res['seconds']:.0f}s)", flush=True)
    done(res, rows)


def shared_report(sdir, setting, gen, model, theta0, dev, pool):
  """shared.json of a setting: Alg. 1's encryptor loss (first and last epoch, mean over
  clients), and the test accuracy of a model trained --utility_epochs epochs from the
  initial global model on the shared sets alone (L_dis with each sender's layer) beside
  one trained as long on the raw training rows they were made from (CE)."""
  path = os.path.join(sdir, "shared.json")
  config = {**setting, **run_flags()}
  if FLAGS.resume and os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("config") == config:
      return saved
  _, _, vx, vy = pool
  cfg = fededs_config()
  key = jax.random.PRNGKey(FLAGS.seed + 7)
  t0 = time.perf_counter()
  shared_acc = fededs.shared_set_utility(model, gen.shared, theta0, vx, vy, key, cfg,
                                         FLAGS.utility_epochs)
  rows = gen.shared.x.shape[1]  # the rows each client shared (--share_rows)
  raw_shared = fededs.SharedData(
      dev.x[:, :rows], jax.nn.one_hot(dev.y[:, :rows], 10), gen.shared.counts,
      {"gain": jax.numpy.ones_like(gen.shared.layers["gain"]),
       "bias": jax.numpy.zeros_like(gen.shared.layers["bias"])})
  raw_acc = fededs.shared_set_utility(model, raw_shared, theta0, vx, vy, key, cfg,
                                      FLAGS.utility_epochs)
  soft = np.asarray(gen.shared.soft)
  rows_mask = np.arange(soft.shape[1])[None, :] < np.asarray(gen.shared.counts)[:, None]
  y = np.asarray(dev.y)[:, :soft.shape[1]]
  rep = {**setting, "encryptor_loss_first_epoch": float(np.mean(gen.encryptor_loss[:, 0])),
         "encryptor_loss_last_epoch": float(np.mean(gen.encryptor_loss[:, -1])),
         "soft_label_agreement": float(np.mean((soft.argmax(-1) == y)[rows_mask])),
         "shared_set_accuracy": shared_acc, "raw_rows_accuracy": raw_acc,
         "utility_epochs": FLAGS.utility_epochs, "config": config}
  _atomic_json(path, rep)
  print(f"[fededs] alpha={setting['alpha']} K={setting['num_clients']}: encryptor loss "
        f"{rep['encryptor_loss_first_epoch']:.3f} -> {rep['encryptor_loss_last_epoch']:.3f}, "
        f"soft labels agree with y on {rep['soft_label_agreement']:.1%}; trained "
        f"{FLAGS.utility_epochs} epochs on the shared sets alone: {shared_acc:.2%} test "
        f"accuracy (on the raw rows: {raw_acc:.2%}) ({time.perf_counter() - t0:.0f}s)",
        flush=True)
  return rep


def write_shared(out_dir):
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
    lines.append(f"| {r['alpha']:g} | {r['num_clients']} | "
                 f"{r['encryptor_loss_first_epoch']:.3f} -> {r['encryptor_loss_last_epoch']:.3f}"
                 f" | {100 * r['soft_label_agreement']:.1f} % | "
                 f"{100 * r['shared_set_accuracy']:.2f} % | {100 * r['raw_rows_accuracy']:.2f} % |")
  with open(os.path.join(out_dir, "shared.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


def write_rows(finished, out_dir):
  """rows.jsonl: every finished run's per-round metrics, in grid order."""
  path = os.path.join(out_dir, "rows.jsonl")
  with open(path + ".tmp", "w") as f:
    for res, rows in finished:
      ident = {kk: res[kk] for kk in ("alpha", "num_clients", "base", "variant")}
      for r in rows:
        f.write(json.dumps({**ident, **{kk: vv for kk, vv in r.items()
                                        if not isinstance(vv, (list, np.ndarray))}}) + "\n")
  os.replace(path + ".tmp", path)


def write_tables(results, out_dir, echo=True):
  keys = ["alpha", "num_clients", "base", "variant", "final_accuracy", "best_accuracy",
          "rounds_to_target", "total_client_steps", "seconds"]
  with open(os.path.join(out_dir, "table.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(results)
  target = f"rounds to {FLAGS.target_accuracy:.0%}"
  lines = [f"| alpha | K | algorithm | final top-1 (%) | best top-1 (%) | {target} | "
           "client steps |", "|---|---|---|---|---|---|---|"]
  names = {"base": "{b}", "equal": "{b}, equal work", "s1": "{b} + S1 (annealing)",
           "s2": "{b} + S2 (sharing)", "fededs": "FedEDS + {b}"}
  for r in results:
    rt = r["rounds_to_target"]
    lines.append(f"| {r['alpha']:g} | {r['num_clients']} | "
                 f"{names[r['variant']].format(b=r['base'])} | "
                 f"{100 * r['final_accuracy']:.2f} | {100 * r['best_accuracy']:.2f} | "
                 f"{'x' if rt is None else rt} | {r['total_client_steps']} |")
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  if echo:
    print("\n".join(lines))


def main(argv):
  """Errors: one ``error: --flag ...`` line; Ctrl-C / SIGTERM: one line, status 130 / 143."""
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(FLAGS)
  apply_quick_presets()
  try:
    setting = validate()
  except app.UsageError as e:  # absl would print the whole help text above it
    sys.exit(f"error: {cli.as_flags(str(e))}")
  every = (f"checkpointed every --checkpoint_every={FLAGS.checkpoint_every} rounds"
           if FLAGS.checkpoint_every else "not checkpointed (--checkpoint_every=0)")
  interrupts.exit_on_interrupt(
      lambda: _main(*setting), f"the FedEDS runs under {FLAGS.output_dir}/runs are {every}: "
      "rerun the same command with --resume to continue them (finished runs and Alg. 1's "
      "encrypted sets are read back)")


def prepare_output_dir(out_dir):
  """Refuses a folder holding a FedEDS run unless --resume (its result-changing flags must
  match) or --overwrite (its outputs are deleted first)."""
  flags_path = os.path.join(out_dir, "flags.json")
  if not os.path.exists(flags_path):
    if FLAGS.resume:
      print(f"[fededs] --resume: no FedEDS run under {out_dir}, starting fresh", flush=True)
    return
  if FLAGS.resume:
    try:
      with open(flags_path) as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      sys.exit(f"error: --resume: {flags_path} cannot be read ({e}); rerun with "
               "--overwrite to start over")
    bad = flags_mismatch(saved, run_flags())
    if bad:
      sys.exit(f"error: --resume: the runs under {out_dir} were made with other flags: "
               f"{bad}; rerun with --overwrite to start over, or use another --output_dir")
    return
  if not FLAGS.overwrite:
    sys.exit(f"error: --output_dir: {out_dir} already holds a FedEDS run (flags.json): pass "
             "--resume to continue it, --overwrite to start over, or another --output_dir")
  for name in OUTPUTS:
    path = os.path.join(out_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def _main(alphas, ks, bases, variants):
  prepare_output_dir(FLAGS.output_dir)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  try:
    pool = load_pool()
  except (OSError, ValueError) as e:  # the messages name the file (and --data_dir)
    sys.exit(f"error: {cli.as_flags(str(e))}")
  # the record of the command (grid included); --resume compares its run_flags()
  _atomic_json(os.path.join(FLAGS.output_dir, "flags.json"),
               {**run_flags(), **{n: FLAGS[n].value for n in RESUME_FREE_FLAGS
                                  if n not in ("resume", "overwrite")}})
  finished = []

  def done(res, rows):
    finished.append((res, rows))
    write_rows(finished, FLAGS.output_dir)
    write_tables([r for r, _ in finished], FLAGS.output_dir, echo=False)

  first = True
  for alpha in alphas:
    for k in ks:
      try:
        run_setting(alpha, k, bases, variants, pool, FLAGS.output_dir,
                    FLAGS.privacy and first, done)
      except ResumeError as e:
        sys.exit(f"error: {cli.as_flags(str(e))}")
      first = False
  write_tables([r for r, _ in finished], FLAGS.output_dir)
  write_shared(FLAGS.output_dir)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
