r"""Seeds and scalar hyperparameters of one configuration as ONE vmapped computation.

  python experiments/sweep.py --algorithm=pafed,fedavg --num_seeds=3 \
      --sweep_lr=0.05,0.1 --sweep_delay_fraction=0,0.3 --rounds=30 --output_dir=runs/sweep

Every flag of experiments/run.py sets the shared (static) configuration; ``--sweep_<name>``
(lr, momentum, server_lr, delay_fraction, alpha = PAFed's alpha0..2, and every float
hyper-parameter the round engine's algorithms declare: --helpfull lists them) lists values
whose cartesian product with the seeds ``--seed .. --seed+num_seeds-1`` is run, per
algorithm, as one ``jit(vmap(run_chunk))`` (the run axis sharded over all devices when
there are several). Writes ``<output_dir>/runs/<algorithm>/<setting>_seed=<s>/``
(metrics.jsonl, summary.json), ``aggregate.csv`` / ``aggregate.md`` (mean and std over
seeds of average best and final accuracy per setting), ``aggregate.png`` (that mean +- std
against the first swept value) and ``sweep.json``. Diverged runs are left out of the means
(counted in the ``diverged`` column).

``--output_dir`` defaults to ``runs/sweep``; one that holds a sweep is refused unless
``--resume`` or ``--overwrite`` (which deletes the sweep's own outputs there first). Each
computation's runs are written as soon as it finishes, and a computation still running is
checkpointed every ``--checkpoint_every`` rounds (default 10; 0: off; ``--keep_checkpoints``
kept) under ``<output_dir>/checkpoints``: after an interruption, ``--resume`` reads back
the runs already stored under ``--output_dir`` with the same configuration, continues an
interrupted computation from its latest checkpoint, and runs the others (stored runs and
checkpoints made with other flags are run again, naming the flags). ``--tensorboard`` is
not supported by sweeps and is refused when given.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from fedjax_async import cli

cli.import_modules(sys.argv)  # --import_modules: algorithms registered before the flags
cli.define_run_flags()
cli.define_sweep_flags()
flags.FLAGS.set_default("output_dir", "runs/sweep")  # not experiments/run.py's runs/latest
cli.help.ESSENTIAL[:] = ["algorithm", "dataset", "rounds", "num_clients", "num_seeds", "sweep_lr",
                         "sweep_delay_fraction", "seed", "output_dir", "flagfile"]


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(flags.FLAGS)
  cli.sweep_main_from_flags(flags.FLAGS)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
