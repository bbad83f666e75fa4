r"""Runs the fully asynchronous family on the virtual clock and compares the runs.

  python experiments/async_family.py --algorithm=fedasync,fedbuff --dataset=synthetic \
      --num_clients=30 --concurrency=10 --num_updates=300
  python experiments/async_family.py --flagfile=experiments/flags/privaasyncfed_fmnist_eps5.flags

Algorithms: fedasync | fedbuff | double_compensation | privaasyncfed | dp_fedasync
(comma list). ``--mix_alpha`` takes a comma list too; FedAsync-type algorithms then run once
per value (``fedasync_a0.4`` ...), as in Guo et al.'s FedAsync-hinge baselines.
Each run writes ``<output_dir>/<run>/metrics.jsonl`` (one row per kept arrival; test
accuracy where evaluated) and ``summary.json`` (final accuracy, staleness histogram,
updates per virtual second, wall time, and for DP runs the epsilon spent; with
``--target_accuracy`` the virtual time, updates and arrivals to it, with ``--time_budget``
the accuracy at that simulated second, where every run stops), one run as several; the
invocation ends with ``comparison.md``; ``curves.png`` plots test accuracy and train loss
(a running mean of 10 arrivals) against the virtual clock.

Each run is checkpointed every ``--checkpoint_every`` calls of ``--groups_per_call``
groups (``<run>/checkpoints``: the state, the rows so far and the flags). After Ctrl-C,
SIGTERM or a crash, the same command with ``--resume`` reads back the finished runs and
continues the others from their latest checkpoint, to the result of an uninterrupted run
(tested); flags that change the results must be the same (else it says which differ). A
folder that holds a run is refused before any work unless ``--resume`` or ``--overwrite``
(which deletes this driver's outputs there, and nothing else, first).

The flags are the fields of ``asynchronous.config.AsyncRunConfig``; this script parses
them and calls ``asynchronous.experiment.run_virtual_clock`` (``fedjax_async.simulate`` with an
``AsyncRunConfig`` does the same from Python).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from fedjax_async import api
from fedjax_async import cli
from fedjax_async import config as config_lib
from fedjax_async import interrupts
from fedjax_async import outputs
from fedjax_async import sharding
from fedjax_async.asynchronous import config as async_config
from fedjax_async.asynchronous import experiment as async_experiment

# The flags: one per field of the virtual clock's configuration (AsyncRunConfig), and one
# per hyper-parameter of an algorithm registered by a module of --import_modules.
if "import_modules" not in flags.FLAGS:  # (experiments/run.py imported them already)
  cli.import_modules(sys.argv)
cli.define_config_flags(async_config.AsyncRunConfig)
cli.help.ESSENTIAL[:] = ["algorithm", "dataset", "model", "num_updates", "num_clients",
                         "concurrency", "seeds", "local_epochs", "output_dir", "flagfile"]
FLAGS = flags.FLAGS


def config_from_flags(fl) -> async_config.AsyncRunConfig:
  """The ``AsyncRunConfig`` of the parsed flags; ValueError naming the flag."""
  cli.check_flag(not (fl.num_arrivals and fl["num_updates"].present), "num_arrivals",
                 "replaces --num_updates: give one of them")
  return async_config.AsyncRunConfig.from_flat(
      cli.flat_from_flags(fl, async_config.AsyncRunConfig))


def main(argv):
  """Ctrl-C / SIGTERM: one line naming --resume, exit status 130 / 143."""
  every = FLAGS.checkpoint_every
  every = config_lib.ENGINE_DEFAULTS["checkpoint_every"]["virtual_clock"] if every is None else (
      every)
  interrupts.exit_on_interrupt(
      lambda: _main(argv), f"the runs under {FLAGS.output_dir} are checkpointed every "
      f"--checkpoint_every={every} call(s) of --groups_per_call groups: "
      "rerun the same command with --resume to continue them")


def _main(argv):
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(FLAGS)  # no INFO lines from JAX's backend probing
  outputs.name_fields = cli.as_flags  # the console's messages name the flags
  with cli.reported():  # error: / internal error: lines (cli.errors)
    sharding.set_cpu_devices(FLAGS.cpu_devices)
    cfg = config_from_flags(FLAGS)
    api.print_unread_note(cfg, cli.given_flags(FLAGS))
    result = async_experiment.run_virtual_clock(cfg)
  if len(result.by_seed) > 1:
    print(result.table())


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
