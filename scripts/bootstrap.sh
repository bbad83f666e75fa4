#!/usr/bin/env bash
# Idempotent set-up: a virtual environment with the pinned packages (Python 3.10: jax 0.6.2
# and OpenFHE; Python 3.12: current JAX, OpenFHE where it loads; setup.cfg's markers pick
# the ranges), and the Debian Fashion-MNIST data package (and tcmalloc, which the benchmark
# suite preloads: docs/performance.md, "The allocator"). Safe to run again: each step is skipped
# when done.
# Environment: FEDJAX_PYTHON (interpreter), FEDJAX_VENV (default .venv), FEDJAX_EXTRAS
# (default "test": pytest, pytest-xdist, pdoc, pandas, hypothesis; on Python >= 3.11 the extra "crypto", openfhe, is tried on top),
# FEDJAX_SKIP_APT=1 to skip the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[bootstrap] %s\n' "$*"; }

venv="${FEDJAX_VENV:-.venv}"
extras="${FEDJAX_EXTRAS:-test}"

find_python() {
  if [ -n "${FEDJAX_PYTHON:-}" ]; then echo "$FEDJAX_PYTHON"; return; fi
  for p in python3.10 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python python3.12 python3; do
    if command -v "$p" >/dev/null 2>&1; then
      v=$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
      case "$v" in 3.10|3.12) echo "$p"; return;; esac
    fi
  done
  return 1
}

if [ ! -x "$venv/bin/python" ]; then
  py=$(find_python) || { say "no Python 3.10 or 3.12 found; set FEDJAX_PYTHON (see BUILD.md)"; exit 1; }
  say "creating virtual environment $venv with $py ($("$py" --version 2>&1))"
  "$py" -m venv "$venv"
fi

pyver=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
stamp="$venv/.fedjax_async-installed"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ "$(cat "$stamp")" != "$extras" ]; then
  say "installing fedjax_async[$extras] and its pinned dependencies into $venv (Python $pyver; a few minutes the first time)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[$extras]"
  case ",$extras," in
    *,crypto,*) ;;
    *) if [ "$pyver" != 3.10 ]; then
         # openfhe is required on 3.10; elsewhere it is the extra "crypto" (no wheel for
         # every Python and platform): tried, and the crypto features skip without it
         say "installing the extra crypto (openfhe) for Python $pyver"
         "$venv/bin/python" -m pip install --quiet -e ".[$extras,crypto]" \
           || say "openfhe could not be installed: the crypto features and their tests are skipped"
       fi;;
  esac
  echo "$extras" > "$stamp"
  say "$("$venv/bin/python" -c 'import jax, flax, optax, orbax.checkpoint as o, sys; print("Python %d.%d.%d" % sys.version_info[:3], "jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, "orbax-checkpoint", o.__version__)' 2>&1 | tail -n 1)"
else
  say "packages already installed in $venv (delete $stamp to reinstall)"
fi
if ! err=$("$venv/bin/python" -c 'import openfhe' 2>&1); then
  say "openfhe does not load in $venv ($(printf '%s' "$err" | tail -n 1)): the crypto features and their tests are skipped (BUILD.md)"
fi

# apt_install PACKAGE WHAT IF_MISSING: installs a Debian package (via sudo when not root;
# after an apt-get update if the first try fails), unless FEDJAX_SKIP_APT=1.
apt_install() {
  local pkg=$1 what=$2 if_missing=$3 sudo=""
  if [ "${FEDJAX_SKIP_APT:-0}" = 1 ]; then
    say "FEDJAX_SKIP_APT=1: not installing $pkg ($if_missing)"
    return
  fi
  [ "$(id -u)" = 0 ] || sudo="sudo"
  say "installing Debian package $pkg ($what)"
  if ! $sudo apt-get install -y -q "$pkg" >/dev/null 2>&1; then
    $sudo apt-get update -q >/dev/null 2>&1 || true
    $sudo apt-get install -y -q "$pkg" >/dev/null 2>&1 || say "could not install $pkg; $if_missing"
  fi
}

fm=/usr/share/datasets/fashion-mnist
if [ -f "$fm/train-images-idx3-ubyte.gz" ] || [ -f "$fm/train-images-idx3-ubyte" ]; then
  say "Fashion-MNIST present in $fm"
else
  apt_install dataset-fashion-mnist "real Fashion-MNIST IDX files" \
    "the Fashion-MNIST tests skip, see BUILD.md"
fi

if ldconfig -p 2>/dev/null | grep libtcmalloc_minimal >/dev/null; then  # (not -q: with pipefail, grep -q quitting early failed the pipe)
  say "tcmalloc present (benchmarks/run_all.py preloads it)"
else
  apt_install libtcmalloc-minimal4 "tcmalloc, for the benchmark suite" \
    "the benchmarks use the system malloc"
fi
