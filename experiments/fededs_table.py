r"""FedEDS on Fashion-MNIST (the paper's Table II, plus rounds-to-target as Tables III-V
and the S1 / S2 ablations of Tables VI-VII).

  # the paper's grid (alpha in {0.1, 0.5, 10}, K in {5, 10, 20}, T = 30), PAFed CNN
  python experiments/fededs_table.py --output_dir=out/fededs
  # minutes on 2 CPU cores: one setting, few rounds, a subset of the data
  python experiments/fededs_table.py --quick --output_dir=out/fededs_quick

Per (alpha, K): Alg. 1 runs once (vmapped over clients) and its encrypted sets are shared
by every base algorithm; then each base in --bases runs as ``base`` (fixed
--base_epochs, no sharing), ``s1`` (annealing only), ``s2`` (sharing only) and ``fededs``
(both), as chosen by --variants. All variants use the same SGD (lr, momentum 0.9, weight
decay 1e-4). Outputs: table.md / table.csv (final and best top-1 accuracy, rounds to
--target_accuracy), rows.jsonl (per-round metrics), encryption_grid.png and
privacy.json (PSNR / SSIM of encrypted vs original, layer on / off: Fig. 3).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_async import algorithms  # noqa: E402
from fedjax_async import data as data_lib  # noqa: E402
from fedjax_async import engine  # noqa: E402
from fedjax_async import cli  # noqa: E402
from fedjax_async import experiment  # noqa: E402
from fedjax_async import fededs  # noqa: E402
from fedjax_async import timeline as timeline_lib  # noqa: E402

flags.DEFINE_string("output_dir", "out/fededs", "Where tables, metrics and figures go.")
flags.DEFINE_boolean("quick", False, "Few rounds on a data subset (minutes on 2 CPU cores): "
                     "presets every flag below that is not given explicitly.")
flags.DEFINE_string("alphas", "0.1,0.5,10", "Dirichlet concentrations alpha.")
flags.DEFINE_string("num_clients", "5,10,20", "Numbers of clients K.")
flags.DEFINE_string("bases", "fedavg,fedprox,fednova", "Base algorithms.")
flags.DEFINE_string("variants", "base,fededs", "Any of base, s1 (annealing only), "
                    "s2 (sharing only), fededs.")
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
flags.DEFINE_integer("share_rows", 0, "Share at most n encrypted rows per client (0 = all).")
flags.DEFINE_string("transfer_mode", "sample", "sample (Eq. 8) | all (Eq. 7).")
flags.DEFINE_integer("seed", 0, "Seed of partition, model, layers and training.")
flags.DEFINE_integer("rounds_per_call", 1, "Rounds per jitted call (one progress line "
                     "with rounds/s and ETA after each call; the same run to float rounding).")
flags.DEFINE_string("data_dir", None, "Fashion-MNIST IDX directory (default: the system one).")
flags.DEFINE_boolean("privacy", True, "Save the encryption grid and privacy report "
                     "(trains a second set of encryptors without the layer, first setting).")

FLAGS = flags.FLAGS
QUICK = dict(alphas="0.1", num_clients="5", bases="fedavg", variants="base,s1,s2,fededs",
             rounds=5, train_subset=1000, test_subset=500, encryptor_epochs=3,
             pretrain_epochs=2, unet_width=4, hidden=64, model="mlp",
             target_accuracy=0.6)
VARIANTS = {"base": (False, False), "s1": (True, False), "s2": (False, True),
            "fededs": (True, True)}


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
            ("rounds_per_call", FLAGS.rounds_per_call >= 1, ">= 1"),
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
  fededs.save_encryption_grid(orig, with_l, os.path.join(out_dir, "encryption_grid.png"),
                              without_l)
  rep = fededs.privacy_report(orig, with_l, without_l)
  rep["encryptor_loss_last_with_layer"] = float(np.mean(gen.encryptor_loss[:, -1]))
  rep["encryptor_loss_last_without_layer"] = float(np.mean(no_layer.encryptor_loss[:, -1]))
  with open(os.path.join(out_dir, "privacy.json"), "w") as f:
    json.dump(rep, f, indent=2)
  print("[fededs] privacy:", json.dumps(rep), flush=True)


def run_setting(alpha, k, bases, variants, pool, out_dir, do_privacy, jsonl):
  tx, ty, vx, vy = pool
  parts = data_lib.partition_dirichlet(ty, k, alpha, min_size=10, seed=FLAGS.seed)
  fd = data_lib.federate(tx, ty, parts, vx, vy, 10, "fashion_mnist")
  dev = engine.DeviceData.from_federated(fd)
  model = fededs.SplitModel(FLAGS.model, 10, fd.feature_shape, hidden=FLAGS.hidden)
  w0, apply_flat, split = model.flat(jax.random.PRNGKey(FLAGS.seed))
  cfg = fededs_config()
  tl = timeline_lib.build(k, FLAGS.rounds, 1.0, timeline_lib.DelayConfig(max_delay=1),
                          seed=FLAGS.seed)
  shared = None
  if any(VARIANTS[v][1] for v in variants):
    layers = fededs.client_stochastic_layers(FLAGS.seed, k, FLAGS.hidden)
    encryptor = fededs.make_encryptor(fd.feature_shape, width=FLAGS.unet_width)
    t0 = time.perf_counter()
    gen = fededs.generate_encrypted(model, encryptor, split(w0), layers, dev.x, dev.y,
                                    dev.counts, jax.random.PRNGKey(FLAGS.seed), cfg,
                                    share_rows=FLAGS.share_rows or None,
                                    client_loop=_client_loop())
    shared = gen.shared
    jax.block_until_ready(shared.x)
    print(f"[fededs] alpha={alpha} K={k}: Alg. 1 in {time.perf_counter() - t0:.1f}s, "
          f"encryptor loss {np.mean(gen.encryptor_loss[:, 0]):.3f} -> "
          f"{np.mean(gen.encryptor_loss[:, -1]):.3f}", flush=True)
    if do_privacy:
      privacy_outputs(model, encryptor, split(w0), layers, dev, cfg, gen, out_dir)
  results = []
  for b in bases:
    base_hp = {"lr": FLAGS.lr, "momentum": 0.9, "server_lr": 1.0, "mu": FLAGS.mu,
               "weight_decay": cfg.weight_decay}
    for v in variants:
      anneal, share = VARIANTS[v]
      alg = fededs.wrap(algorithms.get(b), model, split, shared if share else None,
                        batch=cfg.transfer_batch, mode=FLAGS.transfer_mode, seed=FLAGS.seed)
      t0 = time.perf_counter()
      progress = experiment.Progress(f"fededs alpha={alpha} K={k} {b}/{v}", FLAGS.rounds)
      _, rows = fededs.run(apply_flat, alg, w0, dev, tl, base_hp, cfg, anneal=anneal,
                           share=share, fixed_epochs=FLAGS.base_epochs, seed=FLAGS.seed,
                           rounds_per_call=FLAGS.rounds_per_call,
                           on_chunk=lambda state, rows: progress(rows))
      accs = [r["test_accuracy"] for r in rows]
      res = {"alpha": alpha, "num_clients": k, "base": b, "variant": v,
             "final_accuracy": accs[-1], "best_accuracy": max(a for a in accs if a is not None),
             "rounds_to_target": fededs.rounds_to_target(accs, FLAGS.target_accuracy),
             "total_client_steps": int(sum(r["client_steps"] for r in rows)),
             "seconds": time.perf_counter() - t0}
      results.append(res)
      for r in rows:
        jsonl.write(json.dumps({**{kk: res[kk] for kk in ("alpha", "num_clients", "base",
                                                          "variant")},
                                **{kk: vv for kk, vv in r.items()
                                   if not isinstance(vv, np.ndarray)}}) + "\n")
      jsonl.flush()
      print(f"[fededs] alpha={alpha} K={k} {b}/{v}: final {res['final_accuracy']:.4f} "
            f"best {res['best_accuracy']:.4f} rounds->{FLAGS.target_accuracy:.0%} "
            f"{res['rounds_to_target']} ({res['seconds']:.0f}s)", flush=True)
  return results


def write_tables(results, out_dir):
  keys = ["alpha", "num_clients", "base", "variant", "final_accuracy", "best_accuracy",
          "rounds_to_target", "total_client_steps", "seconds"]
  with open(os.path.join(out_dir, "table.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(results)
  target = f"rounds to {FLAGS.target_accuracy:.0%}"
  lines = [f"| alpha | K | algorithm | final top-1 (%) | best top-1 (%) | {target} | "
           "client steps |", "|---|---|---|---|---|---|---|"]
  names = {"base": "{b}", "s1": "{b} + S1 (annealing)", "s2": "{b} + S2 (sharing)",
           "fededs": "FedEDS + {b}"}
  for r in results:
    rt = r["rounds_to_target"]
    lines.append(f"| {r['alpha']:g} | {r['num_clients']} | "
                 f"{names[r['variant']].format(b=r['base'])} | "
                 f"{100 * r['final_accuracy']:.2f} | {100 * r['best_accuracy']:.2f} | "
                 f"{'x' if rt is None else rt} | {r['total_client_steps']} |")
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


def main(argv):
  """Errors: one ``error: --flag ...`` line; Ctrl-C / SIGTERM: one line, status 130 / 143."""
  del argv  # stray words: refused by cli.parse_flags
  experiment.quiet_library_logs(FLAGS)
  apply_quick_presets()
  try:
    setting = validate()
  except app.UsageError as e:  # absl would print the whole help text above it
    sys.exit(f"error: {e}")
  experiment.exit_on_interrupt(
      lambda: _main(*setting), "FedEDS runs take no checkpoints: table.md and rows.jsonl "
      f"under {FLAGS.output_dir} hold the finished runs; rerun the same command to start "
      "again")


def _main(alphas, ks, bases, variants):
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  with open(os.path.join(FLAGS.output_dir, "flags.json"), "w") as f:
    json.dump({name: FLAGS[name].value for name in
               ["quick", "alphas", "num_clients", "bases", "variants", "rounds", "model",
                "hidden", "train_subset", "test_subset", "target_accuracy", "lr", "mu",
                "base_epochs", "batch_size", "pretrain_epochs", "encryptor_epochs",
                "unet_width", "share_rows", "transfer_mode", "seed"]}, f, indent=2)
  try:
    pool = load_pool()
  except (OSError, ValueError) as e:  # the messages name the file (and --data_dir)
    sys.exit(f"error: {e}")
  results = []
  with open(os.path.join(FLAGS.output_dir, "rows.jsonl"), "w") as jsonl:
    first = True
    for alpha in alphas:
      for k in ks:
        results += run_setting(alpha, k, bases, variants, pool, FLAGS.output_dir,
                               FLAGS.privacy and first, jsonl)
        first = False
        write_tables(results, FLAGS.output_dir)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
