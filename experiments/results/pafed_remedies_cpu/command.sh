#!/usr/bin/env bash
# PAFed, the authors'-code flags on the MLP, non-IID, delta = 0.3, 40 rounds: paper-faithful,
# --client_grad_clip=10, --drop_nonfinite_uploads; seeds 1-3.
cd "$(dirname "$0")/../../.."
COMMON="--flagfile=experiments/flags/pafed_fmnist_common.flags --model=mlp --normalize=fedadmm --random_local_epochs --server_lr2=0.5 --server_lr_switch_round=24 --mu=0.1 --max_delay=4 --rounds=40 --local_epochs=2 --algorithm=pafed --delay_fraction=0.3 --checkpoint_every=0 --notensorboard"
for seed in 3 1 2; do
  for remedy in none clip drop; do
    case $remedy in none) extra="";; clip) extra="--client_grad_clip=10";; drop) extra="--drop_nonfinite_uploads";; esac
    out=experiments/results/pafed_remedies_cpu/${remedy}_s${seed}
    .venv/bin/python experiments/run.py $COMMON --seed=$seed $extra --output_dir=$out --overwrite > $out.log 2>&1
    echo "$remedy seed $seed rc $?"
  done
done
