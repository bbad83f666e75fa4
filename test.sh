#!/usr/bin/env bash
# The test suite (fast tests; add -m slow for the slow ones, see BUILD.md).
# Extra arguments are passed to pytest. --dist loadgroup: the tests marked
# xdist_group("...") run on one worker, so the module fixture they share (e.g. the
# five-algorithm run of tests/test_experiment.py) is computed once, not once per worker.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
echo "[test] pytest -n 2 --dist loadgroup tests $*"
exec "${FEDJAX_VENV:-.venv}/bin/python" -m pytest -n 2 --dist loadgroup tests "$@"
