"""The command-line layer: the run flags made from ``RunConfig``'s defaults, flags ->
config, and the parsing shared by ``experiments/`` and ``benchmarks/``. The library
takes dataclasses; importing this module does not load JAX.

  cli.define_run_flags()
  app.run(lambda argv: cli.main_from_flags(flags.FLAGS), flags_parser=cli.parse_flags)
"""

from __future__ import annotations

import difflib
import os
import signal
import sys
from typing import Dict, List

from absl import flags

# Flags a driver does not define but a user may well give it (the other engine's), with
# the sentence that replaces "unknown flag" for them; set by the driver before parsing.
HINTS: Dict[str, str] = {}


def unknown_flag_message(name: str, known) -> str:
  """``--name: unknown flag; did you mean --x?`` (close names among ``known``), or the
  driver's hint for ``name``."""
  if name in HINTS:
    return f"--{name}: {HINTS[name]}"
  close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.7)
  guess = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
  return f"--{name}: unknown flag{guess} (--helpfull lists them)"


def parse_flags(argv: List[str]) -> List[str]:
  """absl's parse of the command line for ``app.run``, with what it would reject in a
  "FATAL Flags parsing error" block, or silently ignore, as one ``error:`` line (exit
  status 1), before anything runs (``--only_check_args`` included):

  * a value absl cannot parse: ``error: --rounds=abc: invalid literal for int() ...``;
  * an unknown flag: ``error: --roundz: unknown flag; did you mean --rounds? (--helpfull
    lists them)``, or the driver's ``HINTS`` sentence for it;
  * a word that is not a flag (``clients=10``, a stray value), which would otherwise be
    ignored while the defaults ran: ``error: unexpected argument(s) 'clients=10' ...``.
  """
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    msg = str(e)
    if msg.startswith("flag --"):  # "flag --rounds=abc: invalid literal for int() ..."
      msg = msg[len("flag "):]
    elif msg.startswith("flags ") and ": --" in msg:  # a multi-flag validator's message,
      msg = msg.split(": ", 1)[1]  # "flags a=5, b=10: --a: must be >= --b", names its flag
    elif isinstance(e, flags.UnrecognizedFlagError):
      msg = unknown_flag_message(e.flagname, list(flags.FLAGS))
    sys.exit(f"error: {msg}")
  if len(rest) > 1:
    sys.exit(f"error: unexpected argument(s) {' '.join(rest[1:])!r}: flags are written "
             "--name=value (see --help)")
  return rest


# ------------------------------------------------------------------ run flags


def define_run_flags():
  """Defines the run flags (call once, from the experiment script), each with
  ``RunConfig``'s default."""
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  d = config.RunConfig()
  for define in (_define_data_flags, _define_training_flags, _define_execution_flags,
                 _define_output_flags):
    define(flags, d)


def _define_data_flags(f, d):
  """The run flags of the algorithm, the data, the model, participation and delays."""
  from fedjax_async import algorithms  # pylint: disable=g-import-not-at-top
  f.DEFINE_string("algorithm", d.algorithm,
                  f"Algorithm or comma-separated list; choices: {', '.join(algorithms.names('rounds'))}.")
  f.DEFINE_string("dataset", d.dataset, "synthetic | synthetic_iid | fashion_mnist | mnist | "
                  "cifar10 | cifar100 | any tensorflow-datasets name.")
  f.DEFINE_string("model", d.model, "logreg | mlp | cnn | cifar10_cnn | cifar100_cnn | "
                  "simple_cnn | auto (by data set).")
  f.DEFINE_integer("num_clients", d.num_clients, "N, number of clients.")
  f.DEFINE_string("partition", d.partition, "iid | shards | dirichlet (image data sets).")
  f.DEFINE_float("dirichlet_alpha", d.dirichlet_alpha, "Dirichlet concentration.")
  f.DEFINE_integer("shards_per_client", d.shards_per_client, "Label shards per client.")
  f.DEFINE_string("data_dir", None, "IDX directory or tensorflow-datasets data_dir.")
  f.DEFINE_string("data_source", d.data_source, "auto | idx | tfds.")
  f.DEFINE_float("participation", d.participation, "sigma, fraction sampled per round.")
  f.DEFINE_float("delay_fraction", d.delay.fraction, "delta, fraction of sampled clients "
                 "that are delayed (the library default is 0; the main job uses 0.3).")
  f.DEFINE_string("delay_distribution", d.delay.distribution, "fixed | uniform | geometric.")
  f.DEFINE_integer("max_delay", d.delay.max_delay, "Dmax (uniform) or k (fixed), rounds.")
  f.DEFINE_float("delay_mean", d.delay.mean, "Mean delay for geometric delays, rounds.")
  f.DEFINE_integer("buffer_size", 0, "R, past global models kept (0: Dmax + 1).")
  f.DEFINE_integer("rounds", d.rounds, "T, communication rounds.")


def _define_training_flags(f, d):
  """The run flags of local training and the algorithms' hyperparameters."""
  f.DEFINE_integer("local_epochs", d.local_epochs, "E, local epochs.")
  f.DEFINE_boolean("random_local_epochs", False, "E_i ~ U{1..E} per client and round.")
  f.DEFINE_integer("local_steps", d.local_steps, "> 0: at most this many minibatch steps "
                   "per client and round, within the E epochs' shuffles; 0: E epochs.")
  f.DEFINE_integer("batch_size", d.batch_size, "B, local minibatch size.")
  f.DEFINE_float("lr", d.lr, "Local learning rate.")
  f.DEFINE_float("momentum", d.momentum, "Local SGD momentum.")
  f.DEFINE_float("rho", d.rho, "ADMM penalty rho (FedADMM, PAFed).")
  f.DEFINE_string("admm_upload", d.admm_upload, "FedADMM / PAFed upload (Eq. 16): "
                  "received = (w_end - model received) + dy/rho, as Gong et al.'s code; "
                  "last_local = (w_end - client's last local model) + dy/rho, the equation "
                  "as printed (the global model's scale can diverge: docs/design.md).")
  f.DEFINE_float("mu", d.mu, "FedProx proximal coefficient mu.")
  by_dataset = "default: 0.4 on the synthetic data sets, 0.8 (the paper's) on the others"
  f.DEFINE_float("alpha0", None, f"PAFed Eq. 17 weight of the online mean; {by_dataset}.")
  f.DEFINE_float("alpha1", None, f"PAFed Eq. 17 weight of the non-conflicting delayed "
                 f"mean; {by_dataset}.")
  f.DEFINE_float("alpha2", None, f"PAFed Eq. 17 weight of the projected conflicting "
                 f"mean; {by_dataset}.")
  f.DEFINE_float("server_lr", d.server_lr,
                 "Server learning rate eta (FedAvg, FedProx, FedNova, FedADMM).")
  f.DEFINE_float("server_lr2", -1.0, "eta_2 from --server_lr_switch_round on (<0: eta).")
  f.DEFINE_integer("server_lr_switch_round", -1, "Round where eta_2 starts (-1: never).")
  f.DEFINE_integer("seed", d.seed, "Seed of data, timeline, initialisation and clients.")


def _define_execution_flags(f, d):
  """The run flags of how a run executes: evaluation, compiled chunks, devices and processes."""
  f.DEFINE_integer("eval_every", d.eval_every, "Evaluate every k rounds (and the last 10).")
  f.DEFINE_integer("rounds_per_call", d.rounds_per_call,
                   "Rounds fused into one jitted scan between host visits.")
  f.DEFINE_integer("client_chunk", d.client_chunk, "Train a round's clients as a lax.scan over "
                   "chunks of this many vmapped clients (0: one vmap over all; -1: auto, "
                   "1 for models of >= 100k parameters on CPU, else 0).")
  f.DEFINE_integer("devices", d.devices, "D: split each round's clients over the first D "
                   "devices JAX sees (0: all of them; 1: no sharding); sweeps split their "
                   "runs over them instead.")
  f.DEFINE_enum("client_data", d.client_data, ["auto", "replicated", "sharded"],
                "Clients' data and per-client state on the devices: replicated on each, or "
                "sharded (each device, and each process, holds only its own clients); auto: "
                "sharded across processes, replicated within one.")
  f.DEFINE_string("coordinator_address", "", "Several processes: host:port of process 0 "
                  "(jax.distributed.initialize); every process gets the same value.")
  f.DEFINE_integer("num_processes", 0, "Several processes: how many (with "
                   "--coordinator_address).")
  f.DEFINE_integer("process_id", -1, "Several processes: this one's index, 0 .. "
                   "--num_processes - 1.")
  f.DEFINE_boolean("distributed", False, "Join the other processes of a SLURM job, an Open "
                   "MPI launch or a TPU pod slice as JAX detects them (no other flag needed).")
  f.DEFINE_integer("cpu_devices", 0, "CPU only: make this many XLA host devices "
                   "(jax_num_cpu_devices) so that --devices can split the clients over the "
                   "cores; 0: JAX's default (one).")


def _define_output_flags(f, d):
  """The run flags of outputs, checkpoints, encryption and the console."""
  f.DEFINE_string("output_dir", "runs/latest", "Where metrics and summaries go.")
  f.DEFINE_string("secure_aggregation", d.secure_aggregation,
                  "none | ckks (PAFed's server under OpenFHE CKKS).")
  f.DEFINE_string("ckks_preset", d.ckks_preset, "secure (128-bit, HEStd_128_classic) | "
                  "insecure_test (ring 2^11, NOT secure: tests and quick looks only).")
  f.DEFINE_boolean("allow_insecure_ckks", d.allow_insecure_ckks, "Run "
                   "--ckks_preset=insecure_test, which is NOT secure (the run warns and its "
                   "summary and tables are marked INSECURE).")
  f.DEFINE_integer("ckks_min_depth", d.ckks_min_depth, "d, iterations of Cheon et al.'s "
                   "Min polynomial; the context depth is 2d + 8.")
  f.DEFINE_string("ckks_design", d.ckks_design, "one_context (Alg. 4 as printed, every "
                  "product at the Min's depth) | streamed (model-size vectors at depth 2, "
                  "the scalars moved to a deep context by S1; fits the CNN, "
                  "docs/crypto.md).")
  f.DEFINE_float("ckks_min_scale", d.ckks_min_scale, "c in (0, 4]: the Min's input "
                 "y = cos / 4 times c, so Wilkes' iteration sees (c y)^2 in [0, 1]; 4 cuts "
                 "the class weights' error 4x at no depth (1 = Alg. 1 as printed).")
  f.DEFINE_integer("checkpoint_every", d.checkpoint_every,
                   "Checkpoint the simulation every k rounds (at the first chunk boundary "
                   "at or past each multiple of k, and at the end) under "
                   "<output_dir>/checkpoints; 0 = off.")
  f.DEFINE_integer("keep_checkpoints", d.keep_checkpoints, "Checkpoints kept (max_to_keep).")
  f.DEFINE_boolean("resume", d.resume, "Continue from the latest checkpoint in the output "
                   "directory (fresh start when there is none).")
  f.DEFINE_boolean("overwrite", d.overwrite, "Delete the previous run's outputs in the "
                   "output directory (metrics.jsonl, summary.json, checkpoints, tb, "
                   "comparison and curves) and start over; without it (or --resume) a run "
                   "refuses a directory that holds one.")
  f.DEFINE_boolean("tensorboard", d.tensorboard, "Write TensorBoard scalars under "
                   "<output_dir>/tb.")
  f.DEFINE_integer("log_every", d.log_every, "A console line every k rounds, and one at "
                   "least every ~10 s (0: about ten lines per run; metrics.jsonl has every "
                   "round).")
  f.DEFINE_boolean("quiet", d.quiet, "No per-round lines: each run's result and the "
                   "comparison table only.")


def config_from_flags(FLAGS):
  """The ``RunConfig`` of the parsed run flags, validated (ValueError naming the flag)."""
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  from fedjax_async import timeline as timeline_lib  # pylint: disable=g-import-not-at-top
  delay = None
  try:
    delay = timeline_lib.DelayConfig(FLAGS.delay_fraction, FLAGS.delay_distribution,
                                     FLAGS.max_delay, FLAGS.delay_mean, FLAGS.buffer_size)
  except ValueError as e:
    raise ValueError(str(e)) from None
  cfg = config.RunConfig(
      algorithm=FLAGS.algorithm, dataset=FLAGS.dataset, model=FLAGS.model,
      num_clients=FLAGS.num_clients, partition=FLAGS.partition,
      dirichlet_alpha=FLAGS.dirichlet_alpha, shards_per_client=FLAGS.shards_per_client,
      data_dir=FLAGS.data_dir, data_source=FLAGS.data_source,
      participation=FLAGS.participation, delay=delay, rounds=FLAGS.rounds,
      local_epochs=FLAGS.local_epochs, random_local_epochs=FLAGS.random_local_epochs,
      local_steps=FLAGS.local_steps,
      batch_size=FLAGS.batch_size, lr=FLAGS.lr, momentum=FLAGS.momentum, rho=FLAGS.rho,
      admm_upload=FLAGS.admm_upload, mu=FLAGS.mu, alpha0=FLAGS.alpha0,
      alpha1=FLAGS.alpha1, alpha2=FLAGS.alpha2,
      server_lr=FLAGS.server_lr, server_lr2=FLAGS.server_lr2,
      server_lr_switch_round=FLAGS.server_lr_switch_round, seed=FLAGS.seed,
      eval_every=FLAGS.eval_every, rounds_per_call=FLAGS.rounds_per_call,
      client_chunk=FLAGS.client_chunk, devices=FLAGS.devices, client_data=FLAGS.client_data,
      output_dir=FLAGS.output_dir, secure_aggregation=FLAGS.secure_aggregation,
      ckks_preset=FLAGS.ckks_preset, ckks_min_depth=FLAGS.ckks_min_depth,
      ckks_min_scale=FLAGS.ckks_min_scale, ckks_design=FLAGS.ckks_design,
      allow_insecure_ckks=FLAGS.allow_insecure_ckks,
      checkpoint_every=FLAGS.checkpoint_every, keep_checkpoints=FLAGS.keep_checkpoints,
      resume=FLAGS.resume, overwrite=FLAGS.overwrite, tensorboard=FLAGS.tensorboard,
      log_every=FLAGS.log_every, quiet=FLAGS.quiet)
  config.validate(cfg)
  return cfg


def quiet_library_logs(FLAGS):
  """orbax logs every checkpoint step at INFO through absl; keep the progress lines
  readable unless the user asked for a --verbosity."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  if "verbosity" not in FLAGS or not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def join_processes(FLAGS):
  """``--coordinator_address`` / ``--num_processes`` / ``--process_id`` or ``--distributed``:
  joins the other processes (``distributed.initialize``); their console output goes to
  process 0's (the others print errors only)."""
  from fedjax_async import distributed  # pylint: disable=g-import-not-at-top
  if distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                            FLAGS.process_id, auto=FLAGS.distributed):
    if not distributed.is_main():
      sys.stdout.flush()  # its file descriptor, so that streams bound earlier follow
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    line = distributed.describe()
    if line:
      print(line, flush=True)


def main_from_flags(FLAGS):
  """experiments/run.py's main: flags -> ``RunConfig`` -> ``api.simulate``, each error as
  one ``error:`` line naming the flag, Ctrl-C / SIGTERM as one line and exit status
  130 / 143."""
  from fedjax_async import interrupts, sharding  # pylint: disable=g-import-not-at-top
  quiet_library_logs(FLAGS)
  try:
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    join_processes(FLAGS)
    cfg = config_from_flags(FLAGS)
    sharding.select_devices(cfg.devices)  # a bad --devices named before any work
  except ValueError as e:
    sys.exit(f"error: {e}")
  # SIGTERM and Ctrl-C stop the run with one line naming the checkpoint to resume from
  # (no traceback) and exit status 143 / 130.
  try:
    with interrupts.handle_interrupts():
      _main(cfg)
  except KeyboardInterrupt as e:  # Interrupted from run_one says where; else no round ran
    e = e if isinstance(e, interrupts.Interrupted) else interrupts.Interrupted("", signal.SIGINT)
    print(str(e) or f"interrupted ({signal.Signals(e.signum).name}) while no round was "
          "running", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)


def _main(cfg):
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_async import api, engine  # pylint: disable=g-import-not-at-top
  try:
    result = api.simulate(cfg)
  except engine.Diverged as e:
    sys.exit(f"error: diverged: {e}")
  except (ValueError, OSError, RuntimeError) as e:
    if isinstance(e, jax.errors.JaxRuntimeError):  # XLA's own: the traceback says where
      raise
    sys.exit(f"error: {e}")
  print(f"figure: {result.figure}")
  if len(result.runs) > 1:  # last, where the eye lands when the run ends
    print(result.table())


# ------------------------------------------------------------------- experiments/sweep.py

# Flags of experiments/run.py that sweeps do not support (refused when given).
SWEEP_UNSUPPORTED_FLAGS = ("tensorboard",)


def define_sweep_flags():
  """--num_seeds, --max_runs_per_computation and --sweep_<name> for each sweepable name."""
  from fedjax_async import sweep  # pylint: disable=g-import-not-at-top
  flags.DEFINE_integer("num_seeds", 1, "Seeds --seed .. --seed+num_seeds-1 per setting.")
  flags.DEFINE_integer("max_runs_per_computation", 0,
                       "Split the runs of an algorithm into vmapped computations of at most "
                       "this many runs (memory); 0 = all runs in one.")
  for name in sweep.SWEEPABLE:
    flags.DEFINE_string(f"sweep_{name}", "", f"Comma-separated values of --{name} "
                        "(cartesian product with the other sweeps and the seeds).")


def sweeps_from_flags(FLAGS) -> Dict[str, List[float]]:
  """``{name: values}`` of the given --sweep_<name> flags (ValueError naming the flag)."""
  from fedjax_async import sweep  # pylint: disable=g-import-not-at-top
  out = {}
  for name in sweep.SWEEPABLE:
    values = sweep.parse_values(f"sweep_{name}", getattr(FLAGS, f"sweep_{name}"))
    if values:
      out[name] = values
  if FLAGS.max_runs_per_computation < 0:
    raise ValueError("--max_runs_per_computation: must be >= 0, got "
                     f"{FLAGS.max_runs_per_computation}")
  return out


def check_sweep_flags(FLAGS) -> None:
  """--tensorboard given to a sweep: ValueError (a sweep writes each run's metrics.jsonl
  and summary.json when its computation finishes, and no TensorBoard files)."""
  for name in SWEEP_UNSUPPORTED_FLAGS:
    if name in FLAGS and FLAGS[name].present and FLAGS[name].value:
      raise ValueError(f"--{name}: not supported by sweeps (no TensorBoard files; each "
                       "run's metrics.jsonl and summary.json are written when its "
                       "computation finishes)")


def sweep_main_from_flags(FLAGS):
  """experiments/sweep.py: every algorithm of --algorithm over the sweep grid."""
  from fedjax_async import experiment, sharding, sweep  # pylint: disable=g-import-not-at-top
  try:
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    join_processes(FLAGS)
    check_sweep_flags(FLAGS)
    base = config_from_flags(FLAGS)
    sweeps = sweeps_from_flags(FLAGS)
    names = list(sweeps)
    cfgs = sweep.grid(base, sweeps, FLAGS.num_seeds)
    devices = sharding.select_devices(base.devices)  # the run axis is split over them
    experiment.prepare_output_dir(base.output_dir, base.resume, base.overwrite,
                                  sweep.SWEEP_OUTPUTS)
    fed_data, _ = sweep.load_checked(base)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None

  def run_all():
    table = sweep.run_grid(base, cfgs, names, fed_data, devices, FLAGS.num_seeds,
                           FLAGS.max_runs_per_computation)
    if table is not None:
      print(table)  # last

  experiment.exit_on_interrupt(
      run_all, sweep.interrupted_message(base.output_dir, base.checkpoint_every, "--resume"))


# --------------------------------------------------------------- python -m fedjax_async.data


def define_data_flags():
  """The flags of ``python -m fedjax_async.data`` (one data set's partition, printed)."""
  from fedjax_async import data  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("dataset", "fashion_mnist", f"One of {data.DATASETS} or a tfds name.")
  flags.DEFINE_string("partition", "shards", f"One of {data.PARTITIONS}.")
  flags.DEFINE_integer("num_clients", 100, "Number of clients.")
  flags.DEFINE_float("alpha", 0.5, "Dirichlet concentration.")
  flags.DEFINE_integer("shards_per_client", 2, "Shards per client.")
  flags.DEFINE_integer("min_size", 10, "Dirichlet: minimum examples per client.")
  flags.DEFINE_integer("seed", 0, "Seed.")
  flags.DEFINE_string("data_dir", None, "IDX directory or tensorflow-datasets data_dir.")
  flags.DEFINE_string("data_source", "auto", f"One of {data.DATA_SOURCES}.")
  flags.DEFINE_float("synthetic_alpha", 1.0, "Synthetic(alpha, beta): alpha.")
  flags.DEFINE_float("synthetic_beta", 1.0, "Synthetic(alpha, beta): beta.")
  flags.DEFINE_bool("tfds_download", False, "Let tensorflow-datasets download the data.")
  flags.DEFINE_string("png", None, "Write the histogram heat map to this PNG file.")
  return flags.FLAGS


def data_main():
  """``python -m fedjax_async.data``: loads and partitions a data set, prints its label
  histogram per client (``--png``: and draws it)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from fedjax_async import data  # pylint: disable=g-import-not-at-top
  fl = define_data_flags()

  def _run(argv):
    del argv  # stray words: refused by parse_flags
    folder = os.path.dirname(os.path.abspath(fl.png)) if fl.png else ""
    if folder and not os.path.isdir(folder):  # say so before loading, not after
      raise SystemExit(f"error: --png: cannot write {fl.png}: folder {folder} does not exist")
    if fl.png and os.path.isdir(fl.png):
      raise SystemExit(f"error: --png: {fl.png} is a directory; expected a file name such "
                       "as hist.png")
    try:
      fed = data.load(fl.dataset, partition=fl.partition, num_clients=fl.num_clients,
                      alpha=fl.alpha, shards_per_client=fl.shards_per_client,
                      min_size=fl.min_size, seed=fl.seed, data_dir=fl.data_dir,
                      data_source=fl.data_source, synthetic_alpha=fl.synthetic_alpha,
                      synthetic_beta=fl.synthetic_beta, tfds_download=fl.tfds_download)
    except (ValueError, OSError, RuntimeError) as e:  # messages name the file or the flag
      raise SystemExit(f"error: {e}") from None
    hist = data.label_histogram(fed)
    print(f"{fed.name}: {fed.num_clients} clients, {int(fed.counts.sum())} train "
          f"examples (max {fed.max_examples} per client), {len(fed.test_y)} test, "
          f"features {fed.feature_shape}, {fed.num_classes} classes")
    print(data.format_histogram(hist))
    if fl.png:
      title = f"{fed.name} {fl.partition} ({fed.num_clients} clients)"
      data.save_histogram_png(hist, fl.png, title)
      print(f"wrote {fl.png}")

  app.run(_run, flags_parser=parse_flags)
