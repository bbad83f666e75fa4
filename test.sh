#!/usr/bin/env bash
# The test suite, in two legs (fast tests; add -m slow for the slow ones, see BUILD.md):
#   1. Python 3.10, jax 0.6.2 and OpenFHE (.venv): every test, pytest -n 2;
#   2. Python 3.12 and the newest JAX that setup.cfg allows (.venv312): the tests marked
#      py312 (tests/conftest.py's list), the crypto ones skipped there with the reason
#      (OpenFHE's 3.12 wheel does not load on Debian 12).
# Extra arguments are passed to pytest in both legs (replacing leg 2's -m py312 when they
# hold a -m). FEDJAX_TEST_LEGS=310 or 312 runs one leg; FEDJAX_PYTHON312 names the 3.12
# interpreter (default: python3.12, or pyenv's 3.12). --dist loadgroup: the tests marked
# xdist_group("...") run on one worker, so the module fixture they share (e.g. the
# five-algorithm run of tests/test_experiment.py) is computed once, not once per worker.
set -euo pipefail
cd "$(dirname "$0")"
legs="${FEDJAX_TEST_LEGS:-310,312}"
case "$legs" in 310|312|310,312) ;; *)
  echo "[test] FEDJAX_TEST_LEGS: expected 310, 312 or 310,312, got '$legs'" >&2; exit 2;; esac
status=0
# Leg 2's environment is set up in the background while leg 1 runs (mostly downloads and
# unpacking on a clean clone: a minute or two of the suite's wall time otherwise).
boot312_log="${TMPDIR:-/tmp}/fedjax_async_boot312.$$.log"
boot312_pid=""
find_py312() {
  local p
  if [ -n "${FEDJAX_PYTHON312:-}" ]; then echo "$FEDJAX_PYTHON312"; return; fi
  for p in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python; do
    # (a pyenv shim named python3.12 can exist and still not run)
    if "$p" -c "import sys" >/dev/null 2>&1; then echo "$p"; return; fi
  done
}
run_leg() {  # run_leg NAME VENV PYTEST_ARGS...
  local name=$1 venv=$2 t0=$SECONDS rc=0
  shift 2
  echo "[test] $name: pytest -n 2 --dist loadgroup -rs tests $*"
  "$venv/bin/python" -m pytest -n 2 --dist loadgroup -rs tests "$@" || rc=$?
  echo "[test] $name: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || status=$rc
}

py312=""
if [[ ",$legs," == *,312,* ]]; then
  py312=$(find_py312)
  if [ -z "$py312" ]; then
    echo "[test] leg 2: no Python 3.12 found; set FEDJAX_PYTHON312 (or FEDJAX_TEST_LEGS=310)" >&2
    exit 1
  fi
  if [[ ",$legs," == *,310,* ]]; then
    FEDJAX_PYTHON="$py312" FEDJAX_VENV=.venv312 FEDJAX_SKIP_APT=1 scripts/bootstrap.sh \
      > "$boot312_log" 2>&1 &
    boot312_pid=$!
    trap 'kill "$boot312_pid" 2>/dev/null || true' EXIT
  fi
fi

if [[ ",$legs," == *,310,* ]]; then
  scripts/bootstrap.sh
  run_leg "leg 1 (Python 3.10, jax 0.6.2, OpenFHE)" "${FEDJAX_VENV:-.venv}" "$@"
fi

if [[ ",$legs," == *,312,* ]]; then
  if [ -n "$boot312_pid" ]; then
    boot_rc=0
    wait "$boot312_pid" || boot_rc=$?
    cat "$boot312_log"
    rm -f "$boot312_log"
    if [ "$boot_rc" != 0 ]; then
      echo "[test] leg 2: setting up .venv312 failed (exit $boot_rc)" >&2
      exit "$boot_rc"
    fi
  else
    FEDJAX_PYTHON="$py312" FEDJAX_VENV=.venv312 FEDJAX_SKIP_APT=1 scripts/bootstrap.sh
  fi
  marker=(-m "py312 and not slow")
  for a in "$@"; do case "$a" in -m|-m*) marker=();; esac; done
  run_leg "leg 2 (Python 3.12, current JAX; the py312 tests)" .venv312 \
    ${marker[@]+"${marker[@]}"} "$@"
fi
exit "$status"
