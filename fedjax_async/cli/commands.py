"""The commands: ``experiments/run.py``'s main (flags -> ``RunConfig`` -> ``api.simulate``),
the sweep's and the data command's flags and mains."""

from __future__ import annotations

import os
import signal
import sys
from typing import Dict, List

from absl import app
from absl import flags
from absl import logging

from fedjax_async import api
from fedjax_async import config as config_lib
from fedjax_async import console
from fedjax_async import data
from fedjax_async import distributed
from fedjax_async import interrupts
from fedjax_async import outputs
from fedjax_async import sharding
from fedjax_async.cli import errors
from fedjax_async.cli import help as help_lib
from fedjax_async.cli.run_flags import as_flags, check_flag, config_from_flags, parse_flags
from fedjax_async.sweeps import sweep


def quiet_library_logs(FLAGS):
  """orbax logs every checkpoint step at INFO through absl; keep the progress lines
  readable unless the user asked for a --verbosity. The command line's --quiet keeps each
  run's result, the table and warnings (``console.quiet_keeps``)."""
  console.quiet_keeps(console.RESULT)
  if "verbosity" not in FLAGS or not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def join_processes(FLAGS):
  """``--coordinator_address`` / ``--num_processes`` / ``--process_id`` or ``--distributed``:
  joins the other processes (``distributed.initialize``); their console output goes to
  process 0's (the others print errors only)."""
  if distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                            FLAGS.process_id, auto=FLAGS.distributed):
    if not distributed.is_main():
      sys.stdout.flush()  # its file descriptor, so that streams bound earlier follow
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    line = distributed.describe()
    if line:
      print(line, flush=True)


def given_flags(FLAGS) -> List[str]:
  """The flags given on the command line or in a --flagfile."""
  return [name for name in FLAGS if FLAGS[name].present]


def reported():
  """``errors.reported``, a configuration error's fields named by their flags: one
  ``error:`` line, anything else one ``internal error:`` line (``--traceback``: the whole
  traceback first)."""
  return errors.reported(as_flags)


def main_from_flags(FLAGS):
  """experiments/run.py's main: flags -> ``RunConfig`` -> ``api.simulate``, a
  configuration error as one ``error:`` line naming the flag, any other as one
  ``internal error:`` line (``errors``), Ctrl-C / SIGTERM as one line and exit status
  130 / 143. A given flag that the algorithms do not read is named (``api.unread_note``)."""
  quiet_library_logs(FLAGS)
  outputs.name_fields = as_flags  # the console's messages name the flags
  with reported():
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    join_processes(FLAGS)
    cfg = config_from_flags(FLAGS)
    sharding.select_devices(cfg.run.devices)  # a bad --devices named before any work
    api.print_unread_note(cfg, given_flags(FLAGS))
  # SIGTERM and Ctrl-C stop the run with one line naming the checkpoint to resume from
  # (no traceback) and exit status 143 / 130.
  try:
    with interrupts.handle_interrupts():
      _main(cfg)
  except KeyboardInterrupt as e:  # Interrupted from a run says where; else no round ran
    e = e if isinstance(e, interrupts.Interrupted) else interrupts.Interrupted("", signal.SIGINT)
    print(as_flags(str(e)) or f"interrupted ({signal.Signals(e.signum).name}) while no round was "
          "running", file=sys.stderr, flush=True)
    sys.exit(e.exit_code)


def _main(cfg):
  with reported():
    result = api.simulate(cfg)
  print(f"figure: {result.figure}")
  if len(result.all_runs()) > 1:  # last, where the eye lands when the run ends
    print(result.table())


# ------------------------------------------------------------------- experiments/sweep.py

# Flags of experiments/run.py that sweeps do not support (refused when given).
SWEEP_UNSUPPORTED_FLAGS = ("tensorboard",)


def define_sweep_flags():
  """--num_seeds, --max_runs_per_computation and --sweep_<name> for each sweepable name."""
  flags.DEFINE_integer("num_seeds", 1, "Seeds --seed .. --seed+num_seeds-1 per setting.")
  flags.DEFINE_integer("max_runs_per_computation", 0,
                       "Split the runs of an algorithm into vmapped computations of at most "
                       "this many runs (memory); 0 = all runs in one.")
  for name in sweep.sweepable():
    flags.DEFINE_string(f"sweep_{name}", "", f"Comma-separated values of --{name} "
                        "(cartesian product with the other sweeps and the seeds).")
  help_lib.GROUPS.update(dict.fromkeys(
      ["num_seeds", "max_runs_per_computation"] + [f"sweep_{n}" for n in sweep.sweepable()],
      "sweep"))


def sweeps_from_flags(FLAGS) -> Dict[str, List[float]]:
  """``{name: values}`` of the given --sweep_<name> flags (ValueError naming the flag)."""
  out = {}
  for name in sweep.sweepable():
    if f"sweep_{name}" not in FLAGS:  # registered after the flags were defined
      continue
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
  """experiments/sweep.py: every algorithm of --algorithm over the sweep grid (errors as
  ``main_from_flags``'s); its output folder locked while it runs."""
  quiet_library_logs(FLAGS)
  with outputs.run_scope():
    _sweep_main(FLAGS)


def _sweep_main(FLAGS):
  with reported():
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    join_processes(FLAGS)
    check_sweep_flags(FLAGS)
    base = config_from_flags(FLAGS)
    sweeps = sweeps_from_flags(FLAGS)
    names = list(sweeps)
    check_flag(not (FLAGS["seeds"].present and FLAGS["num_seeds"].present), "seeds",
               "replaces --num_seeds: give one of them")
    seeds = config_lib.seeds_of(base) if base.run.seeds else None
    num_seeds = len(seeds) if seeds else FLAGS.num_seeds
    cfgs = sweep.grid(base, sweeps, num_seeds, seeds)
    devices = sharding.select_devices(base.run.devices)  # the run axis is split over them
    outputs.prepare_output_dir(base.output.output_dir, base.output.resume, base.output.overwrite,
                                  sweep.SWEEP_OUTPUTS)
    api.print_unread_note(base, [n for n in given_flags(FLAGS) if n not in sweeps])
    fed_data, _ = sweep.load_checked(base)

  def run_all():
    with reported():
      table = sweep.run_grid(base, cfgs, names, fed_data, devices, num_seeds,
                             FLAGS.max_runs_per_computation)
    if table is not None:
      print(table)  # last

  interrupts.exit_on_interrupt(
      run_all, sweep.interrupted_message(base.output.output_dir,
                                         base.output.checkpoint_every, "--resume"))


# --------------------------------------------------------------- python -m fedjax_async.cli.data


def define_data_flags():
  """The flags of ``python -m fedjax_async.cli.data`` (one data set's partition, printed)."""
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
  errors.define_traceback_flag()
  help_lib.GROUPS.update(dict.fromkeys(
      ("dataset", "partition", "num_clients", "alpha", "shards_per_client", "min_size", "seed",
       "data_dir", "data_source", "synthetic_alpha", "synthetic_beta", "tfds_download"),
      "data"))
  help_lib.ESSENTIAL[:] = ["dataset", "partition", "num_clients", "alpha", "shards_per_client",
                           "seed", "data_dir", "data_source", "png", "flagfile"]
  return flags.FLAGS


def data_main():
  """``python -m fedjax_async.cli.data``: loads and partitions a data set, prints its label
  histogram per client (``--png``: and draws it)."""
  fl = define_data_flags()

  def _run(argv):
    del argv  # stray words: refused by parse_flags
    folder = os.path.dirname(os.path.abspath(fl.png)) if fl.png else ""
    if folder and not os.path.isdir(folder):  # say so before loading, not after
      raise SystemExit(f"error: --png: cannot write {fl.png}: folder {folder} does not exist")
    if fl.png and os.path.isdir(fl.png):
      raise SystemExit(f"error: --png: {fl.png} is a directory; expected a file name such "
                       "as hist.png")
    with reported():  # messages name the file or the flag
      fed = data.load(fl.dataset, partition=fl.partition, num_clients=fl.num_clients,
                      alpha=fl.alpha, shards_per_client=fl.shards_per_client,
                      min_size=fl.min_size, seed=fl.seed, data_dir=fl.data_dir,
                      data_source=fl.data_source, synthetic_alpha=fl.synthetic_alpha,
                      synthetic_beta=fl.synthetic_beta, tfds_download=fl.tfds_download)
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
