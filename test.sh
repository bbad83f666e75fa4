#!/usr/bin/env bash
# The test suite (fast tests; add -m slow for the slow ones, see BUILD.md).
# Extra arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
echo "[test] pytest -n 2 tests $*"
exec "${FEDJAX_VENV:-.venv}/bin/python" -m pytest -n 2 tests "$@"
