#!/usr/bin/env bash
# The main job: PAFed vs FedADMM, FedAvg and FedProx on Synthetic(1,1) with delayed clients.
# Extra arguments are passed to experiments/run.py (e.g. ./run.sh --rounds=20).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
echo "[run] python experiments/run.py $*"
exec "${FEDJAX_VENV:-.venv}/bin/python" experiments/run.py "$@"
