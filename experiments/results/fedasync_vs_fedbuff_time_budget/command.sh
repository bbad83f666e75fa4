#!/usr/bin/env bash
# FedAsync vs FedBuff on the virtual clock, seeds 0-2: the accuracy at simulated second T
# (--time_budget) and the simulated time, server updates and arrivals to --target_accuracy.
cd "$(dirname "$0")/../../.."
out=experiments/results/fedasync_vs_fedbuff_time_budget
PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python experiments/run.py \
    --algorithm=fedasync,fedbuff --concurrency=5 --buffer_k=5 --num_updates=100000 \
    --time_budget=30 --target_accuracy=0.6 --eval_every=1 --seeds=0,1,2 \
    --checkpoint_every=0 --quiet --output_dir=$out --overwrite
# the runs as one table (runs.jsonl); comparison.md and curves.png stay
PYTHONPATH=. .venv/bin/python -m fedjax_async.results_table pack $out
rm -r $out/seed0 $out/seed1 $out/seed2
