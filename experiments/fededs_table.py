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

The flags are the fields of ``fededs.config.FedEDSRunConfig`` (and ``--quick``); this
script parses them and calls ``fededs.experiment.run_fededs_grid``.
"""

from __future__ import annotations

from absl import app
from absl import flags

from fedjax_async import cli
from fedjax_async import interrupts
from fedjax_async import outputs
from fedjax_async.fededs import config as fededs_config
from fedjax_async.fededs import experiment

flags.DEFINE_boolean("quick", False, "Few rounds on a data subset (minutes on 2 CPU cores): "
                     "presets every flag below that is not given explicitly.")
# The flags: one per field of FedEDS's configuration (FedEDSRunConfig).
cli.define_config_flags(fededs_config.FedEDSRunConfig)
cli.help.ESSENTIAL[:] = ["quick", "alphas", "num_clients", "bases", "variants", "rounds", "seed",
                         "model", "output_dir", "flagfile"]
FLAGS = flags.FLAGS


def config_from_flags(fl) -> fededs_config.FedEDSRunConfig:
  """The parsed flags, with --quick's presets for the flags not given."""
  flat = {name: fl[name].value
          for name in fededs_config.FedEDSRunConfig.keys()}
  if fl.quick:
    flat.update({k: v for k, v in fededs_config.QUICK_FIELDS.items() if not fl[k].present})
  return fededs_config.FedEDSRunConfig.from_flat(flat)


def main(argv):
  """Errors: one ``error: --flag ...`` or ``internal error:`` line (``cli.errors``);
  Ctrl-C / SIGTERM: one line, status 130 / 143."""
  del argv  # stray words: refused by cli.parse_flags
  cli.quiet_library_logs(FLAGS)
  outputs.name_fields = cli.as_flags  # the console's messages name the flags
  with cli.reported():
    cfg = config_from_flags(FLAGS)
    experiment.validate(cfg)
  every = (f"checkpointed every --checkpoint_every={cfg.output.checkpoint_every} rounds"
           if cfg.output.checkpoint_every else "not checkpointed (--checkpoint_every=0)")
  interrupts.exit_on_interrupt(
      lambda: _main(cfg), f"the FedEDS runs under {cfg.output.output_dir}/runs are {every}: "
      "rerun the same command with --resume to continue them (finished runs and Alg. 1's "
      "encrypted sets are read back)")


def _main(cfg):
  with cli.reported():  # error: naming the field or the file; else internal error:
    experiment.run_fededs_grid(cfg, record={"quick": FLAGS.quick})


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
