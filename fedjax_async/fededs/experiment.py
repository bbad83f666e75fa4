"""FedEDS on Fashion-MNIST from a configuration: the paper's Table II grid, rounds to
target (Tables III-V) and the S1 / S2 ablations (Tables VI-VII).

  from fedjax_async.fededs import config, experiment
  cfg = config.FedEDSRunConfig().replace(**config.QUICK, output_dir="out/fededs_quick")
  result = experiment.run_fededs_grid(cfg)   # a results.Result; result.table()
  experiment.run_fededs_grid(cfg, data=fed)  # your FederatedData's clients: one setting

Per (alpha, K): Alg. 1 runs once (vmapped over clients) and its encrypted sets are shared
by every base algorithm; then each base of grid.bases runs as each variant of
grid.variants (``config.VARIANTS``). Under ``output.output_dir``: table.md / table.csv,
rows.jsonl, encryption_grid.png and privacy.json (Fig. 3), shared.md, and under
``runs/alpha<a>_K<k>/`` Alg. 1's sets (``alg1.npz``) and each run's metrics.jsonl,
summary.json and checkpoints (``loop.HostLoop``); ``output.resume`` reads back what is
finished and continues the rest from its latest checkpoint. Without ``output.output_dir``
(Python's default) all of it goes to a temporary folder, deleted at the end: nothing kept.
``data=`` (a ``FederatedData``) replaces Fashion-MNIST and the grid's partitions: its
clients are the one setting, named ``<data name> K=<clients>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time

import jax
import numpy as np

from fedjax_async import algorithms
from fedjax_async import checkpoint as checkpoint_lib
from fedjax_async import console
from fedjax_async import cost as cost_lib
from fedjax_async import data as data_lib
from fedjax_async import loop
from fedjax_async import metrics as metrics_lib
from fedjax_async import outputs
from fedjax_async import results
from fedjax_async import results_table
from fedjax_async.algorithms import base
from fedjax_async.config import ConfigError, check
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.core.progress import Progress
from fedjax_async.data import FederatedData
from fedjax_async.fededs import alg1, report, store
from fedjax_async.fededs import engine as fededs_engine
from fedjax_async.fededs.config import VARIANTS, FedEDSRunConfig, validate
from fedjax_async.fededs.model import SplitModel, client_stochastic_layers, make_encryptor
from fedjax_async.fededs.schedule import FedEDSConfig, annealed_epochs, equal_work_epochs
from fedjax_async.fededs.transfer import wrap
from fedjax_async.rounds import engine

class DataError(ValueError):
  """Fashion-MNIST cannot be read: the message names the file (and data.data_dir)."""


# Everything an invocation writes into output.output_dir (output.overwrite deletes these).
OUTPUTS = ("flags.json", "rows.jsonl", "table.md", "table.csv", "privacy.json",
           "encryption_grid.png", "shared.md", "runs", results_table.FILE)


def load_pool(cfg: FedEDSRunConfig):
  """Fashion-MNIST (train x, y, test x, y), subsets drawn with run.seed."""
  d = cfg.data
  kw = {} if d.data_dir is None else {"data_dir": d.data_dir}
  tx, ty, vx, vy = data_lib.load_fashion_mnist(**kw)
  rng = np.random.default_rng(cfg.run.seed)
  if d.train_subset:
    idx = rng.choice(len(ty), size=min(d.train_subset, len(ty)), replace=False)
    tx, ty = tx[idx], ty[idx]
  if d.test_subset:
    vx, vy = vx[:d.test_subset], vy[:d.test_subset]
  return tx, ty, vx, vy


def fededs_config(cfg: FedEDSRunConfig) -> FedEDSConfig:
  t, a = cfg.training, cfg.alg1
  return FedEDSConfig(lr=t.lr, batch_size=t.batch_size, pretrain_epochs=a.pretrain_epochs,
                      encryptor_epochs=a.encryptor_epochs, unet_width=a.unet_width,
                      transfer_batch=t.batch_size)


def prepare_output_dir(cfg: FedEDSRunConfig):
  """Refuses a folder holding a FedEDS run unless output.resume (its result-changing
  fields must match) or output.overwrite (its outputs are deleted first)."""
  out_dir = cfg.output.output_dir
  outputs.lock_output_dir(out_dir)  # (in use by another run: refused)
  if not cfg.output.overwrite:  # the runs of a packed folder (results_table)
    results_table.unpack_missing(out_dir)
  flags_path = os.path.join(out_dir, "flags.json")
  if not os.path.exists(flags_path):
    if cfg.output.resume:
      console.say(f"[fededs] resume: no FedEDS run under {out_dir}, starting fresh")
    return
  if cfg.output.resume:
    try:
      with open(flags_path) as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      raise ConfigError("output.resume", f"{flags_path} cannot be read ({e}); pass "
                        "output.overwrite to start over") from None
    bad = store.mismatch(saved, store.run_config(cfg))
    check(not bad, "output.resume", f"the runs under {out_dir} were made with other "
          f"flags: {bad}; pass output.overwrite to start over, or use another "
          "output.output_dir")
    return
  check(cfg.output.overwrite, "output.output_dir", f"{out_dir} already holds a FedEDS run "
        "(flags.json): pass output.resume to continue it, output.overwrite to start over, or "
        "another output.output_dir")
  for name in OUTPUTS:
    path = os.path.join(out_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def data_digest(fed) -> str:
  """A fingerprint of ``data=``'s arrays: resumption compares it (Alg. 1's sets, runs)."""
  h = hashlib.sha1()
  for a in (fed.x, fed.y, fed.counts, fed.test_x, fed.test_y):
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()[:16]


def own_data_check(cfg: FedEDSRunConfig, fed, variants):
  """``data=``: what FedEDS needs of it (ConfigError naming ``data`` or ``model.name``):
  image examples [H, W, C] with H and W divisible by 4 when Alg. 1's UNet encryptor runs
  (a sharing variant, run.privacy or alg1.utility_epochs), and a model that takes them."""
  if not isinstance(fed, FederatedData):
    raise ConfigError("data", "expected a FederatedData (fa.data.from_arrays, "
                      f"fa.data.from_clients), got {type(fed).__name__}")
  shape = fed.feature_shape
  alg1_runs = [why for why, on in (
      (f"variants {','.join(v for v in variants if VARIANTS[v][1])}",
       any(VARIANTS[v][1] for v in variants)), ("run.privacy", cfg.run.privacy),
      ("alg1.utility_epochs", cfg.alg1.utility_epochs > 0)) if on]
  image = len(shape) == 3 and shape[0] % 4 == 0 and shape[1] % 4 == 0
  check(image or not alg1_runs, "data", f"FedEDS's encryptor (a UNet, Alg. 1, run for "
        f"{' and '.join(alg1_runs)}) needs image examples [H, W, C] with H and W "
        f"divisible by 4, got {list(shape)}; other data run with variants=base,equal,s1, "
        "privacy=False, utility_epochs=0")
  try:
    jax.eval_shape(SplitModel(cfg.model.name, fed.num_classes, shape,
                              hidden=cfg.model.hidden).init, jax.random.PRNGKey(0))
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError("model.name", f"{cfg.model.name} cannot take examples of shape "
                      f"{list(shape)} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                      "model='mlp' takes any") from None


def run_variant(cfg, name, alg, apply_flat, w0, dev, tl, base_hp, fcfg, anneal, share,
                run_dir, config, fixed_epochs, callbacks=()):
  """One run with checkpoints every output.checkpoint_every rounds; with output.resume it
  continues from the latest. Returns (result, rows); raises engine.Diverged.

  Args:
    cfg: the ``FedEDSRunConfig``.
    name: the run's name (progress lines).
    alg: the (wrapped) algorithm.
    apply_flat: the model's forward pass on flat parameters.
    w0: [d] the initial model.
    dev: the device data.
    tl: the timeline.
    base_hp: the hyper-parameters every round starts from.
    fcfg: the ``FedEDSConfig``.
    anneal: E_t by Eq. 5 (else ``fixed_epochs``).
    share: the transfer weights of Eqs. 9-10 (else (1, 0)).
    run_dir: the run's directory (metrics, checkpoints).
    config: the run's configuration (checked against a checkpoint's).
    fixed_epochs: the epochs without ``anneal``: an int, or one per round.
    callbacks: ``loop.Callback``s after every compiled chunk.
  """
  os.makedirs(run_dir, exist_ok=True)
  t = cfg.training
  ckpt = loop.Checkpoints(os.path.join(run_dir, "checkpoints"), config,
                          every=cfg.output.checkpoint_every, total=t.rounds,
                          resume=cfg.output.resume, mismatch=store.checkpoint_mismatch)
  try:
    resumed = ckpt.restore(fededs_engine.init_state(alg, w0, int(dev.counts.shape[0])))
    state = None
    if resumed is not None:
      state = jax.tree.map(jax.numpy.asarray, resumed.state)
      console.say(f"[{name}] resuming from the checkpoint of round {resumed.position} "
                  f"({ckpt.directory})")
    message = metrics_lib.message_bytes(w0)
    host = loop.host_loop(
        run_dir, ckpt, resumed, lambda st: int(st.round),
        progress=None if cfg.output.quiet else Progress(
            name, t.rounds, len(resumed.rows) if resumed else 0),
        callbacks=callbacks,
        annotate=lambda rows: metrics_lib.add_round_bytes(rows, tl.valid.sum(1), tl.sampled,
                                                          message))
    metrics = host.metrics
    try:
      fededs_engine.run(apply_flat, alg, w0, dev, tl, base_hp, fcfg, anneal=anneal, share=share,
                 fixed_epochs=fixed_epochs, seed=cfg.run.seed,
                 rounds_per_call=t.rounds_per_call, on_chunk=host, state=state)
    finally:
      metrics.close()
  finally:
    ckpt.close()
  rows = [checkpoint_lib.to_json_ready(r) for r in metrics.rows]
  res = {**report.run_result(rows, t.target_accuracy), "seconds": host.wall(),
         **metrics_lib.bytes_totals(rows)}
  return res, rows


def encrypted_sets(cfg, setting, sdir, model, w0, split, fd, dev, pool, fcfg, out_dir,
                   do_privacy):
  """Alg. 1's shared sets of a setting (read back with output.resume when stored), its
  shared.json, and Fig. 3 when ``do_privacy``.

  Args:
    cfg: the ``FedEDSRunConfig``.
    setting: the setting (alpha, num_clients).
    sdir: the setting's directory.
    model: the split model.
    w0: [d] the initial model.
    split: flat parameters -> (theta_g, theta_c).
    fd: the setting's federated data.
    dev: its device data.
    pool: (train x, train y, test x, test y).
    fcfg: the ``FedEDSConfig``.
    out_dir: the grid's output directory (Fig. 3's files).
    do_privacy: also Fig. 3 and privacy.json.
  """
  k, seed = setting["num_clients"], cfg.run.seed
  layers = client_stochastic_layers(seed, k, cfg.model.hidden)
  encryptor = make_encryptor(fd.feature_shape, width=cfg.alg1.unet_width)
  config = {**setting, **store.run_config(cfg)}
  alg1_path = os.path.join(sdir, "alg1.npz")
  gen = store.load_generation(alg1_path, config) if cfg.output.resume else None
  where = f"[fededs] {report.setting_label(setting)}:"
  if gen is not None:
    console.say(f"{where} Alg. 1's encrypted sets read back from {alg1_path}")
  else:
    t0 = time.perf_counter()
    job = alg1.Alg1(model, encryptor, split(w0), layers, dev.x, dev.y, dev.counts,
                    jax.random.PRNGKey(seed), fcfg, share_rows=cfg.alg1.share_rows or None,
                    client_loop=report.client_loop())
    gen = alg1.run(job, os.path.join(sdir, "alg1.partial.npz"), config, where,
                   cfg.output.resume)  # a Ctrl-C stops it within an epoch, saving the rest
    store.save_generation(alg1_path, gen, config)
    console.say(f"{where} Alg. 1 in {time.perf_counter() - t0:.1f}s, encryptor loss "
                f"{np.mean(gen.encryptor_loss[:, 0]):.3f} -> "
                f"{np.mean(gen.encryptor_loss[:, -1]):.3f}")
  if cfg.alg1.utility_epochs:
    report.shared_report(cfg, sdir, setting, config, gen, model, split(w0), dev, pool, fcfg)
  if do_privacy:
    report.privacy_outputs(cfg, model, encryptor, split(w0), layers, dev, fcfg, gen, out_dir,
                           setting)
  return gen.shared


def run_setting(cfg, alpha, k, bases, variants, pool, do_privacy, done, callbacks=(),
                fed=None):
  """The runs of one (alpha, K): Alg. 1 once, then every base x variant. ``done(res,
  rows)`` after each run, in grid order. ``fed``: the caller's data (alpha None).

  Args:
    cfg: the ``FedEDSRunConfig``.
    alpha: the Dirichlet concentration (None with ``fed``).
    k: the number of clients.
    bases: the base algorithms.
    variants: the variants (``VARIANTS``).
    pool: (train x, train y, test x, test y).
    do_privacy: also Fig. 3 and privacy.json.
    done: called as ``done(res, rows)`` after each run.
    callbacks: ``loop.Callback``s after every compiled chunk.
    fed: the caller's federated data (None: a Dirichlet split of ``pool``).
  """
  tx, ty, vx, vy = pool
  seed, t, out_dir = cfg.run.seed, cfg.training, cfg.output.output_dir
  if fed is None:
    parts = data_lib.partition_dirichlet(ty, k, alpha, min_size=10, seed=seed)
    fd = data_lib.federate(tx, ty, parts, vx, vy, 10, "fashion_mnist")
    setting = {"alpha": alpha, "num_clients": k}
  else:
    fd, setting = fed, {"alpha": None, "num_clients": k, "data": fed.name,
                        "data_digest": data_digest(fed)}
  dev = engine.DeviceData.from_federated(fd)
  model = SplitModel(cfg.model.name, fd.num_classes, fd.feature_shape,
                     hidden=cfg.model.hidden)
  w0, apply_flat, split = model.flat(jax.random.PRNGKey(seed))
  fcfg = fededs_config(cfg)
  tl = timeline_lib.build(k, t.rounds, 1.0, timeline_lib.DelayConfig(0.0, max_delay=1), seed=seed)
  label = report.setting_label(setting)
  sdir = os.path.join(out_dir, "runs", re.sub(r"[^\w.-]+", "_", label.replace("=", "")
                                              .replace(" ", "_")))
  os.makedirs(sdir, exist_ok=True)
  runs = []  # (base, variant, run_dir, config, finished or None)
  for b in bases:
    for v in variants:
      run_dir = os.path.join(sdir, f"{b}_{v}")
      config = {"run": f"{label} {b}/{v}", **store.run_config(cfg)}
      runs.append((b, v, run_dir, config, store.finished_run(run_dir, config, t.rounds)
                   if cfg.output.resume else None))
  privacy_pending = do_privacy and not (
      cfg.output.resume and os.path.exists(os.path.join(out_dir, "privacy.json")))
  shared = None
  if privacy_pending or any(VARIANTS[v][1] and fin is None for _, v, _, _, fin in runs):
    shared = encrypted_sets(cfg, setting, sdir, model, w0, split, fd, dev, pool, fcfg,
                            out_dir, privacy_pending)
  base_hp = {"lr": t.lr, "momentum": 0.9, **base.server_hparams(1.0), "mu": t.mu,
             "weight_decay": fcfg.weight_decay}
  for b, v, run_dir, config, fin in runs:
    name = f"fededs {label} {b}/{v}"
    if fin is not None:
      res, rows = fin
      console.say(f"[{name}] read back from {run_dir} (finished, same flags)")
    else:
      anneal, share = VARIANTS[v]
      alg = wrap(algorithms.get(b), model, split, shared if share else None,
                 batch=fcfg.transfer_batch, mode=cfg.alg1.transfer_mode, seed=seed)
      fixed = equal_work_epochs(t.rounds, fcfg) if v == "equal" else t.base_epochs
      try:
        res, rows = run_variant(cfg, name, alg, apply_flat, w0, dev, tl, base_hp, fcfg,
                                anneal, share, run_dir, config, fixed, callbacks)
      except engine.Diverged as e:
        console.say(f"[{name}] diverged: {e}; left out of the table", console.RESULT)
        continue
      res = {**setting, "base": b, "variant": v, **res}
      store.atomic_json(os.path.join(run_dir, "summary.json"), {"result": res, "config": config})
      console.say(f"[fededs] {label} {b}/{v}: final {res['final_accuracy']:.4f} "
                  f"best {res['best_accuracy']:.4f} rounds->{t.target_accuracy:.0%} "
                  f"{res['rounds_to_target']} ({res['seconds']:.0f}s)", console.RESULT)
    done(res, rows)


def run_name(res: dict) -> str:
  """A FedEDS run's name in ``Result.runs``: its setting, base and variant."""
  return f"{report.setting_label(res)} {res['base']}/{res['variant']}"


def _table(result: results.Result) -> str:
  """FedEDS's tables (markdown) of the runs' summaries."""
  return report.table(result.summaries(), result.config.training.target_accuracy)


def estimate_cost(cfg: FedEDSRunConfig, num_settings: int, bases: int, variants,
                  device=None, fed=None) -> cost_lib.Cost:
  """A FedEDS invocation (``fededs.experiment.run_fededs_grid``) of ``cfg`` (a
  ``FedEDSRunConfig``): per (alpha, K) setting Alg. 1 (E_c pre-training and E_g encryptor
  epochs over every client's data, the UNet and the model), every base x variant for
  training.rounds rounds of E_t epochs over the data (the sharing variants with as much
  again on the shared sets), the shared sets' utility; Fig. 3's second Alg. 1 once.
  ``fed``: ``data=``, in place of Fashion-MNIST.

  Args:
    cfg: the ``FedEDSRunConfig``.
    num_settings: the (alpha, K) settings.
    bases: the number of base algorithms.
    variants: the variants.
    device: the device (None: ``cost.detect()``).
    fed: the caller's data (None: Fashion-MNIST).
  """
  shape = (28, 28, 1) if fed is None else fed.feature_shape  # Fashion-MNIST
  split = SplitModel(cfg.model.name, 10 if fed is None else fed.num_classes, shape,
                     hidden=cfg.model.hidden)
  x1 = jax.ShapeDtypeStruct((1,) + shape, np.float32)
  theta = jax.eval_shape(split.init, jax.random.PRNGKey(0))
  num_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(theta))
  fwd, act = cost_lib.forward_counts(lambda th, x: split.forward(th[0], th[1], x), theta, x1)
  enc_fwd = enc_act = 0  # no Alg. 1 for data that are no images (own_data_check)
  if len(shape) == 3 and shape[0] % 4 == 0 and shape[1] % 4 == 0:
    unet = make_encryptor(shape, width=cfg.alg1.unet_width)
    phi = jax.eval_shape(lambda x: unet.init(jax.random.PRNGKey(0), x), x1)
    enc_fwd, enc_act = cost_lib.forward_counts(lambda p, x: unet.apply(p, x), phi, x1)
  n = cfg.data.train_subset or 60000 if fed is None else int(np.sum(fed.counts))
  t, a = cfg.training, cfg.alg1
  fcfg = fededs_config(cfg)
  annealed = sum(annealed_epochs(r, fcfg.e_max, fcfg.e_min, fcfg.t_alpha, fcfg.t_beta)
                 for r in range(1, t.rounds + 1))
  epochs = sum((annealed if VARIANTS[v][0] or v == "equal" else t.base_epochs * t.rounds)
               * (2 if VARIANTS[v][1] else 1) for v in variants)
  alg1 = n * (a.pretrain_epochs * 3 * fwd + a.encryptor_epochs * 3 * (enc_fwd + fwd))
  alg1_runs = num_settings + (1 if cfg.run.privacy else 0)
  test = cfg.data.test_subset or 10000 if fed is None else len(fed.test_y)
  flops = (alg1_runs * alg1
           + num_settings * (bases * epochs * n * 3 * fwd
                             + bases * len(variants) * t.rounds * test * fwd
                             + 2 * a.utility_epochs * n * 3 * fwd))
  device = device or cost_lib.detect()
  steps = num_settings * bases * len(variants) * t.rounds
  clients = (max(int(k) for k in str(cfg.grid.num_clients).split(",") if k)
             if fed is None else fed.num_clients)
  # the pool, the clients' padded sets, the encrypted sets
  memory = (4.0 * n * int(np.prod(shape)) * 3
            + 4.0 * (num_params * 8 + 2 * (act + enc_act) * t.batch_size) * clients)
  alg1_steps = alg1_runs * -(-n // t.batch_size) * (a.pretrain_epochs + a.encryptor_epochs)
  seconds = (flops / device.flops_per_second + steps * device.step_seconds
             + alg1_steps * (cost_lib.CPU_ALG1_STEP_SECONDS if device.backend == "cpu"
                             else cost_lib.ACCELERATOR_ALG1_STEP_SECONDS)
             + cost_lib.COMPILE_SECONDS * (alg1_runs + num_settings * bases * len(variants)))
  return cost_lib.Cost(flops, memory, seconds, device)


# With data=, the fields that pick and split Fashion-MNIST (not used).
FASHION_MNIST_FIELDS = ("alphas", "num_clients", "train_subset", "test_subset", "data_dir")


def run_fededs_grid(cfg: FedEDSRunConfig, callbacks=(), record: dict = None,
             data=None) -> results.Result:
  """Every setting of the grid, every run; a ``Result`` whose runs (``run_name``: setting,
  base, variant) are the finished ones in grid order, each with its summary (the
  accuracy metrics, rounds to the target, client steps) and rows. ``record``: more keys
  for flags.json (the CLI's own flags). ``data``: a ``FederatedData`` whose clients are
  the one setting, in place of Fashion-MNIST's grid. Without ``output.output_dir``
  everything goes to a temporary folder, deleted before returning. ``output.quiet``:
  nothing printed."""
  with console.silenced(cfg.output.quiet), outputs.run_scope():
    return _grid(cfg, callbacks, record, data)


def _grid(cfg: FedEDSRunConfig, callbacks, record, data) -> results.Result:
  """``run_fededs_grid``'s work."""
  alphas, ks, bases, variants = validate(cfg)
  if data is not None:
    own_data_check(cfg, data, variants)
  if cfg.output.output_dir is None:
    with tempfile.TemporaryDirectory(prefix="fededs_") as tmp:
      result = _grid(cfg.replace(output_dir=tmp), callbacks, record, data)
    result.config = cfg
    return result
  out_dir = cfg.output.output_dir
  prepare_output_dir(cfg)
  os.makedirs(out_dir, exist_ok=True)
  if data is not None:
    flat, default = cfg.flat(), FedEDSRunConfig().flat()
    unused = [f"{'.'.join(FedEDSRunConfig.keys()[k])}={flat[k]!r}"
              for k in FASHION_MNIST_FIELDS if flat[k] != default[k]]
    if unused:
      outputs.warn(f"[fededs] data={data.name}: its {data.num_clients} clients are the one "
                   f"setting; not used: {', '.join(unused)} (Fashion-MNIST's grid)")
    pool, alphas, ks = (None, None, data.test_x, data.test_y), [None], [data.num_clients]
  else:
    try:
      pool = load_pool(cfg)
    except (OSError, ValueError) as e:
      raise DataError(str(e)) from None
  cost_lib.announce(estimate_cost(cfg, len(alphas) * len(ks), len(bases), variants,
                                  fed=data), cost_lib.FEDEDS_SMALLER, "fededs")
  flat = cfg.flat()  # the record of the invocation (grid included); resumption compares it
  store.atomic_json(os.path.join(out_dir, "flags.json"), checkpoint_lib.to_json_ready(
      {**store.run_config(cfg), **{k: flat[k] for k in store.RESUME_FREE_FIELDS
                                   if k in flat and k not in ("resume", "overwrite")},
       **(record or {})}))
  finished = []

  def done(res, rows):
    finished.append((res, rows))
    report.write_rows(finished, out_dir)
    report.write_tables([r for r, _ in finished], out_dir, cfg.training.target_accuracy,
                        echo=False)

  first = True
  for alpha in alphas:
    for k in ks:
      run_setting(cfg, alpha, k, bases, variants, pool, cfg.run.privacy and first, done,
                  callbacks, data)
      first = False
  report.write_tables([r for r, _ in finished], out_dir, cfg.training.target_accuracy)
  report.write_shared(out_dir)
  return results.Result(cfg, {run_name(res): results.Run(report.run_summary(res, cfg.run.seed),
                                                         rows) for res, rows in finished},
                        tabulate=_table)
