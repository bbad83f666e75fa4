"""Test-run set-up: one compilation cache for experiment subprocesses, which are forks of
a process that imported JAX once (``forkserver``); a loadgroup check.

Many tests run ``experiments/run.py`` (or ``sweep.py``) in a subprocess on the same tiny
configurations; each such process would compile the same programs again (most of a tiny
run's time on a 2-core CPU). ``tests/run_script.env()`` points those subprocesses at one
cache directory, made here once per test run (before pytest-xdist starts its workers, which
inherit it) and removed at the end. The pytest workers use it too: many tests build the
same engine programs in new closures, which jit's in-memory cache does not share (test_engine
and test_models: 150-153 s against 172-177 s, taking turns). A cached executable is the one
XLA would compile for the same program, with the same HLO text and memory analysis (which
some tests read), so results are the same bit for bit; set FEDJAX_ASYNC_TEST_JAX_CACHE=
(empty) to run without it.

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

import functools
import os
import shutil
import subprocess
import tempfile
import warnings

import pytest

import forkserver

CACHE_ENV = "FEDJAX_ASYNC_TEST_JAX_CACHE"
FAST_COMPILE_ENV = "FEDJAX_ASYNC_TEST_FAST_COMPILE"
FAST_COMPILE_FLAG = "--xla_backend_extra_options=xla_cpu_optimize_for_size"

# OpenFHE's OpenMP reads OMP_NUM_THREADS once, when the library loads, and the test
# modules load it at collection (``pytest.importorskip("openfhe")``), before
# ``crypto.ckks`` could limit it: with two xdist workers its default (one thread per core)
# oversubscribes the cores, and the crypto tests took 166 s instead of 33 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")

if (os.environ.get(FAST_COMPILE_ENV, "1") != "0"
    and "xla_backend_extra_options" not in os.environ.get("XLA_FLAGS", "")):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()


# The tests' ``python <script>`` / ``python -c`` subprocesses: forks of a process that
# imported JAX once (tests/forkserver.py; FEDJAX_ASYNC_TEST_FORK=0: real subprocesses).
subprocess.run = forkserver.run


class _MarkFirst:
  """Marks added before ``-m`` selects (a conftest has one hook of each name; this one is
  registered as a plugin that runs first)."""

  @pytest.hookimpl(tryfirst=True)
  def pytest_collection_modifyitems(self, items):
    mark_py312(items)
    skip_crypto_without_openfhe(items)


def pytest_configure(config):
  config.pluginmanager.register(_MarkFirst(), "fedjax_async_mark_first")
  if hasattr(config, "workerinput") or CACHE_ENV in os.environ:
    return  # an xdist worker (it inherited the controller's), or set by the user
  path = tempfile.mkdtemp(prefix="fedjax_async_test_jax_cache_")
  os.environ[CACHE_ENV] = path
  # the pytest workers too (they start after this and inherit it)
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", path)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  config._fedjax_async_jax_cache = path  # pylint: disable=protected-access


def pytest_unconfigure(config):
  path = getattr(config, "_fedjax_async_jax_cache", None)
  if path:
    shutil.rmtree(path, ignore_errors=True)
    os.environ.pop(CACHE_ENV, None)


@functools.lru_cache(maxsize=None)
def openfhe_error():
  """Why ``import openfhe`` fails here (its 3.12 wheel needs a newer libstdc++ than Debian
  12's), or None when it loads. Imported through ``crypto.ckks``, which first limits
  OpenFHE's OpenMP threads."""
  try:
    from fedjax_async.crypto import ckks  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"{type(e).__name__}: {e}"
  return None


# The second leg of ./test.sh (Python 3.12, the newest JAX setup.cfg allows) runs the tests
# marked py312: about a minute on 2 cores (BUILD.md "Tests"). They cover what differs between JAX versions: the engine against its plain
# references, the virtual clock, checkpoints (orbax), the public API's main job end to end,
# the device suite's plan, flags and time budget (its CPU dry run is marked slow), and the
# Table V job's toy run (the accelerator runs Python 3.12).
PY312_TESTS = frozenset({
    "test_device_suite.py::test_device_plan_runs_the_accelerator_sizes_and_table_v_on_any_"
    "platform",
    "test_device_suite.py::test_every_step_of_the_device_suite_passes_its_flag_checks",
    "test_device_suite.py::test_a_step_still_running_at_the_deadline_is_stopped_with_what_it_"
    "started",
    "test_device_suite.py::test_a_gpu_trace_is_summed_by_op_and_category_from_its_op_line_only",
    "test_table_v.py::test_dry_run_plans_computations_writes_rows_and_skips_them_on_the_next_"
    "call",
    "test_async.py::test_fedasync_batched_equals_event_loop[0]",
    "test_checkpoint.py::test_round_trip_restores_every_array_and_the_rows",
    "test_engine.py::test_engine_equals_sequential_reference[pafed-0.5-received]",
    "test_engine.py::test_engine_equals_sequential_reference[fedadmm-0.5-last_local]",
    "test_engine.py::test_delayed_clients_start_from_their_dispatch_round_model",
    "test_api.py::test_simulate_writes_nothing_unless_asked_and_returns_rows_state_and_table",
    "test_natural_data.py::test_streamed_rounds_equal_rounds_on_the_whole_padded_arrays",
    "test_text_models.py::test_the_lstm_layer_is_haikus_lstm",
    "test_augment.py::test_crops_and_flips_are_those_of_the_padded_image",
})


def mark_py312(items):
  """Adds the ``py312`` mark to the second leg's tests (``PY312_TESTS``)."""
  for item in items:
    module = os.path.basename(str(item.fspath))
    name = item.nodeid.split("::", 1)[-1]
    if f"{module}::{name}" in PY312_TESTS or f"{module}::{name.split('[')[0]}" in PY312_TESTS:
      item.add_marker(pytest.mark.py312)


# Tests of other modules that need OpenFHE: those that run a crypto benchmark (their node
# id names the script) and these (by name, parameters left out).
CRYPTO_SCRIPTS = ("classification_error.py", "ducc_round.py", "min_depth.py")
CRYPTO_TESTS = frozenset({
    "test_benchmarks.py::test_classification_error_writes_under_the_results_dir_not_the_cwd",
    "test_benchmarks.py::test_ducc_round_times_every_stage_of_the_protocol",
    "test_benchmarks.py::test_ducc_round_streamed_writes_the_measured_row_with_the_issue_keys",
    "test_engine.py::test_ducc_classifies_by_the_direction_of_the_online_mean",
    "test_experiment.py::test_ckks_min_scale_is_checked_and_only_taken_with_ckks",
})


def skip_crypto_without_openfhe(items):
  """Tests marked ``crypto`` (and those of ``CRYPTO_SCRIPTS`` / ``CRYPTO_TESTS``) are skipped,
  with the import error, where openfhe does not load (modules that import the crypto package
  at the top skip themselves the same way: ``pytest.importorskip("openfhe",
  exc_type=ImportError)``)."""
  for item in items:
    module = os.path.basename(str(item.fspath))
    name = item.nodeid.split("::", 1)[-1].split("[")[0]
    if (f"{module}::{name}" in CRYPTO_TESTS
        or (module == "test_benchmarks.py" and any(s in item.nodeid for s in CRYPTO_SCRIPTS))):
      item.add_marker(pytest.mark.crypto)
  crypto = [item for item in items if item.get_closest_marker("crypto")]
  if crypto and openfhe_error():
    skip = pytest.mark.skip(reason=f"openfhe does not load ({openfhe_error()}): the crypto "
                            "features need it (BUILD.md)")
    for item in crypto:
      item.add_marker(skip)


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


@pytest.fixture
def sigint_default():
  """SIGINT's disposition set to Python's own handler for the test, the previous one
  restored after: a test that sends itself a SIGINT needs it, whatever the suite was
  launched with (a script's background job, ``nohup`` from a script: SIGINT ignored,
  which ``interrupts.handle_interrupts`` leaves ignored)."""
  import signal  # pylint: disable=g-import-not-at-top
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
