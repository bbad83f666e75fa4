"""Test-run set-up: one compilation cache for experiment subprocesses; a loadgroup check.

Many tests run ``experiments/run.py`` (or ``sweep.py``) in a subprocess on the same tiny
configurations; each such process would compile the same programs again (most of a tiny
run's time on a 2-core CPU). ``tests/run_script.env()`` points those subprocesses at one
cache directory, made here once per test run (before pytest-xdist starts its workers, which
inherit it) and removed at the end. The pytest processes themselves do not use it: tests
that read a compiled program (its HLO text, XLA's cost analysis) always compile afresh.
A cached executable is the one XLA would compile for the same program, so results are the
same bit for bit; set FEDJAX_ASYNC_TEST_JAX_CACHE= (empty) to run without it.

XLA:CPU compiles the suite's programs for size (``FAST_COMPILE_FLAG``, added to ``XLA_FLAGS``
here, before any test imports JAX; subprocesses inherit it, and ``run_script.xla_flags``
keeps it where a test sets its own ``XLA_FLAGS``). Almost all of the suite's time is
compilation of small programs, and LLVM's code generation is most of that: FedEDS's Alg. 1
on the test's toy data compiled in 24 s instead of 53 s, the engine's round chunk in 3.4-4.4 s
instead of 5.7-6.3 s, with the same run times (docs/performance.md, "Compile time"). Results
can differ in the last bits (the order of some float sums), more after a chaotic run
amplifies them; the tests compare runs made under the same option, with float32
tolerances. An ``XLA_FLAGS`` that already sets ``xla_backend_extra_options`` is left as it
is. ``FEDJAX_ASYNC_TEST_FAST_COMPILE=0 ./test.sh`` runs with XLA's defaults.
"""

import os
import shutil
import tempfile
import warnings

import pytest

CACHE_ENV = "FEDJAX_ASYNC_TEST_JAX_CACHE"
FAST_COMPILE_ENV = "FEDJAX_ASYNC_TEST_FAST_COMPILE"
FAST_COMPILE_FLAG = "--xla_backend_extra_options=xla_cpu_optimize_for_size"

if (os.environ.get(FAST_COMPILE_ENV, "1") != "0"
    and "xla_backend_extra_options" not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()


def pytest_configure(config):
  if hasattr(config, "workerinput") or CACHE_ENV in os.environ:
    return  # an xdist worker (it inherited the controller's), or set by the user
  path = tempfile.mkdtemp(prefix="fedjax_async_test_jax_cache_")
  os.environ[CACHE_ENV] = path
  config._fedjax_async_jax_cache = path  # pylint: disable=protected-access


def pytest_unconfigure(config):
  path = getattr(config, "_fedjax_async_jax_cache", None)
  if path:
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop(CACHE_ENV, None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """Warns when --dist loadgroup does not group (pytest-dev/pytest-xdist#1386).

  ``./test.sh`` runs ``--dist loadgroup`` so that tests marked ``xdist_group`` share one
  worker and their module fixture; pytest-xdist marks them by a suffix ``@group`` on the
  node id, which pytest 9.2 ignores. The tests still pass then, each worker computing the
  fixture again: this says so instead of silently taking minutes longer.
  """
  if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
    return
  grouped = [item for item in items if item.get_closest_marker("xdist_group")]
  if grouped and "@" not in grouped[0].nodeid:
    warnings.warn("--dist loadgroup: xdist_group marks are not grouping tests with pytest "
                  f"{pytest.__version__} (pytest-dev/pytest-xdist#1386); install pytest<9.2 "
                  "(setup.cfg pins it) or expect shared fixtures to be computed per worker")
