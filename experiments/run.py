r"""Runs one or several federated algorithms on the round engine and compares them.

Without flags this is the README's main job: PAFed, FedADMM, FedAvg and FedProx on the
embedded Synthetic(1,1) data set (30 clients, 10 sampled per round as in the FedProx
paper), a fraction 0.3 of the sampled clients delayed by 1-3 rounds.

  python experiments/run.py
  python experiments/run.py --algorithm=pafed --dataset=fashion_mnist --partition=shards \
      --num_clients=100 --participation=0.1 --local_epochs=10 --rounds=100
  python experiments/run.py --flagfile=experiments/flags/pafed_fmnist_noniid.flags

Each algorithm writes ``<output_dir>/<algorithm>/metrics.jsonl`` (one JSON object per
round) and ``summary.json``; a comma-separated ``--algorithm`` ends with a comparison table
(``comparison.md`` / ``comparison.csv``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from fedjax_async import experiment  # noqa: E402

experiment.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  experiment.main_from_flags(flags.FLAGS)


if __name__ == "__main__":
  app.run(main)
