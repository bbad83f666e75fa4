#!/usr/bin/env bash
# The main job: PAFed vs FedADMM, FedAvg and FedProx on Synthetic(1,1) with delayed clients.
# Extra arguments are passed to experiments/run.py (e.g. ./run.sh --rounds=20).
# Each ./run.sh replaces the previous one's output in runs/latest (it passes --overwrite).
# With --output_dir, --flagfile, --[no]resume or --[no]overwrite it passes the arguments as
# they are: run.py then refuses a directory that holds a run unless --resume (continue it)
# or --overwrite (start over).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
overwrite=(--overwrite)
for arg in "$@"; do
  case "$arg" in
    --output_dir|--output_dir=*|--flagfile|--flagfile=*|--resume|--resume=*|--noresume|\
    --overwrite|--overwrite=*|--nooverwrite) overwrite=() ;;
  esac
done
set -- ${overwrite[@]+"${overwrite[@]}"} "$@"
echo "[run] python experiments/run.py $*"
exec "${FEDJAX_VENV:-.venv}/bin/python" experiments/run.py "$@"
