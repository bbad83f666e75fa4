"""The performance suite of the README's "Measured figures" in one command, on this machine.

  PYTHONPATH=. .venv/bin/python benchmarks/run_all.py --tag=h100      # everything (hours on CPU)
  ... --quick                      # every step at toy sizes: a few minutes, a smoke run
  ... --only=fraction_of_peak,throughput      ... --skip=peers      ... --dry_run

It asks JAX which platform this is (the GPU where there is one; ``JAX_PLATFORMS=cpu`` pins
the CPU) and runs the steps below with the sizes for it, each in its own process, the
output shown as it comes and saved to ``<results_dir>/logs/<tag>/<step>.log``:

* ``fraction_of_peak``: the Fashion-MNIST CNN round (6 local steps, batch 10) as a fraction
  of a matmul timed in the same run, and against the per-client jit loop, K = 10, 50, 200
  (then K = 1000 alone, engine only, on CPU);
* ``throughput``: logistic regression, engine against the per-client jit loop and fedjax's
  per-step pattern, K = 10 .. 1000 (with 2+ devices or cores, the engine over all of them
  too); on an accelerator also the CNN, and logreg at K = 10,000 (engine only);
* ``scaling``: time and peak memory per round as K and N grow (device memory on an
  accelerator), and the largest N that fits;
* ``multidevice``: weak and strong scaling of the client-sharded round (forced host devices
  on CPU; the machine's own devices on an accelerator with several);
* ``multiprocess`` (CPU): the same over processes, 1 to 2 processes and 4 of one device
  each, logreg and the CNN (``jax.distributed`` on localhost, docs/distributed.md);
* ``peers``: pfl-research's CIFAR-10 workload by the engine, the loop, pfl and Flower (peers
  from ``--peers_python``; a peer that cannot run is reported as such);
* then ``report.py`` over the rows this run wrote: tables (``report.md``) and figures
  (PNG) next to the logs.

``--device_suite`` is the run prepared for an accelerator lent for a short window (a lease
of 15 minutes of device time, the machine's start included; BUILD.md "The device suite"),
in one command of at most 10 minutes: ``peaks`` (the dense matmul peak in float32, TF32,
bf16 and JAX's default precision, beside the datasheet's, and the memory bandwidth),
``paper_shapes`` (the CNN round at Table V's shapes, B = 50 and 120 local steps, 20 runs
vmapped, float32 and bf16 local training, the convolutions as lax convolutions and as
im2col GEMMs, against the peak in the same precision and the shape's roofline, each
profiled), and last ``table_v`` (``table_v.py``: whole runs
of the PAFed paper's Table V in its own configuration, as many as the time left allows,
skipping the runs whose rows are committed; its rows under ``<results_dir>/table_v/``).
``--only`` adds the other steps at the accelerator sizes (``fraction_of_peak``,
``throughput``, ``scaling``, ``peers``, ``multidevice``; each but the first needs most of
a lease). ``--time_budget_min`` (9 by
default there) bounds the whole run: ``table_v`` plans its computations to end before it
(``FEDJAX_ASYNC_DEADLINE``), a step still running at the end is stopped (its finished rows
stay), the steps after it are listed as not run, and the report (``report.md``, Table V
after the performance tables) is written. With ``--quick`` the same steps run at toy
sizes: the CPU dry run in the test suite.

The steps run with tcmalloc preloaded where it is installed (``--allocator``; on CPU it
spares each call the page faults of fresh large buffers, docs/performance.md, "The
allocator"); every row records the allocator. Before anything runs, every step's flags
are checked (``--only_check_args``), so that a typo stops the suite at once and not hours
in. A step that fails is reported and the next one runs; Ctrl-C stops the running step
and prints what ran. The benchmarks append each row to
``<results_dir>/<benchmark>.jsonl`` as soon as it is measured (``peers.py``, whose ratios
need every system's turns, at its end), so an interruption loses only the configuration
it cut short.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")

from benchmarks import flagcheck  # noqa: E402  (no JAX import)
from benchmarks import paths  # noqa: E402  (no JAX import)

STEPS = ("peaks", "fraction_of_peak", "throughput", "scaling", "multidevice", "multiprocess",
         "peers", "paper_shapes", "table_v")
DEVICE_SUITE_BUDGET_MIN = 9.0  # --time_budget_min's default with --device_suite
# The device suite's steps without --only: they end within one lease's command, Table V
# taking the time the others leave (peaks 48 s, paper_shapes 237 s on an H200,
# benchmarks/results/logs/nvidia_h200_2026-11-28; fraction_of_peak, 90 s there, by --only).
DEVICE_DEFAULT = ("peaks", "paper_shapes", "table_v")
DEADLINE_ENV = "FEDJAX_ASYNC_DEADLINE"  # the suite's deadline (Unix time), for table_v

FLAGS = flags.FLAGS


def _known_steps(value: Sequence[str]) -> bool:
  return set(value) <= set(STEPS)


def define_flags():
  """The command line's flags (not defined on import, so that tests can import ``plan``
  next to other benchmarks that define ``--tag``)."""
  flags.DEFINE_string("tag", "", "Label stored with every row and naming the log folder "
                      "(default: the device kind and today's date, e.g. cpu_2026-11-25).")
  flags.DEFINE_bool("quick", False, "Every step at toy sizes (one repetition): a smoke run.")
  flags.DEFINE_list("only", [], f"Run only these steps, from: {', '.join(STEPS)}.")
  flags.DEFINE_list("skip", [], "Steps not to run.")
  flags.DEFINE_bool("dry_run", False,
                    "Check every step's flags, print the commands, run none.")
  flags.DEFINE_string("results_dir", paths.results_dir(), "Where the rows and logs go "
                      "(default: $FEDJAX_ASYNC_BENCH_RESULTS when set, else "
                      "benchmarks/results).")
  flags.DEFINE_string("peers_python", os.path.join(ROOT, ".venv-peers", "bin", "python"),
                      "The peers' Python (pfl, Flower); see "
                      "benchmarks/requirements-peers.txt.")
  flags.DEFINE_bool("device_suite", False,
                    "The accelerator run in one command, at the accelerator sizes whatever "
                    f"the platform: {', '.join(DEVICE_DEFAULT)} (Table V's whole runs in "
                    "the time left), within --time_budget_min; --only adds the other steps. "
                    "With --quick: toy sizes (the CPU dry run).")
  flags.DEFINE_float("time_budget_min", None,
                     "Minutes the whole run may take: a step still running then is stopped "
                     "and the later ones are not started (default: "
                     f"{DEVICE_SUITE_BUDGET_MIN:g} with --device_suite, else no limit).")
  flags.DEFINE_string("data_dir", None, "table_v: the Fashion-MNIST IDX files' folder "
                      "(default: the package's, /usr/share/datasets/fashion-mnist).")
  flags.DEFINE_enum("allocator", "auto", ["auto", "tcmalloc", "system"],
                    "malloc of the steps: tcmalloc preloaded (LD_PRELOAD; 'auto': when it "
                    "is installed, Debian package libtcmalloc-minimal4) or the system's. "
                    "Every row records it.")
  for name in ("only", "skip"):
    flags.register_validator(name, _known_steps,
                             message=f"--{name}: each item must be one of {', '.join(STEPS)}")
  flags.register_validator(
      "time_budget_min", lambda v: v is None or 0 < v < float("inf"),
      message="--time_budget_min: expected a number of minutes > 0")
  flags.register_multi_flags_validator(
      ["only", "device_suite"],
      lambda v: v["device_suite"] or not {"table_v", "peaks", "paper_shapes"} & set(
          v["only"] or ()),
      message="--only: peaks, paper_shapes and table_v are steps of --device_suite")
  flags.register_validator(
      "data_dir", lambda v: v is None or os.path.isdir(v),
      message="--data_dir: not a folder (expected the Fashion-MNIST IDX files' folder)")


@dataclasses.dataclass
class Platform:
  """What the suite's sizes depend on."""
  backend: str  # "cpu", "gpu", "tpu"
  devices: int
  device_kind: str
  cores: int


_DETECT = """
import dataclasses, json, os
from benchmarks import common  # quiets JAX's TPU probe
import jax
devs = jax.devices()
kind = common.cpu_model() if devs[0].platform == "cpu" else devs[0].device_kind
print("PLATFORM " + json.dumps([jax.default_backend(), len(devs), kind, os.cpu_count() or 1]))
"""


def detect_platform(env: Optional[Dict[str, str]] = None) -> Platform:
  """This machine, as JAX sees it (on CPU the device kind is the CPU model and ISA).

  Asked in a child process: JAX in this process would hold the accelerator (a CUDA
  context, and 75 % of its memory preallocated) while the steps run."""
  env = dict(os.environ if env is None else env)
  env["PYTHONPATH"] = paths.pythonpath(env)
  proc = subprocess.run([sys.executable, "-c", _DETECT], env=env, capture_output=True,
                        text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("PLATFORM ")]
  if proc.returncode or not lines:
    sys.exit("error: JAX could not start here: "
             + ((proc.stderr.strip().splitlines() or ["?"])[-1]))
  return Platform(*json.loads(lines[-1][len("PLATFORM "):]))


@dataclasses.dataclass
class Step:
  name: str  # one of STEPS (a step may have several parts: name, then name_2 ...)
  script: str  # file under benchmarks/, or a path from the checkout's root ("experiments/...")
  args: List[str]
  tagged: bool = True  # takes --tag (the benchmarks; not the Table V driver)

  def argv(self, tag: str, python: str = sys.executable) -> List[str]:
    path = os.path.join(ROOT if "/" in self.script else HERE, self.script)
    return [python, path] + self.args + ([f"--tag={tag}"] if self.tagged else [])


def plan(p: Platform, quick: bool, peers_python: str) -> List[Step]:
  """The suite for platform ``p``: the README's commands on CPU, larger K and one vmap of
  all K on an accelerator, toy sizes with ``quick``."""
  cpu = p.backend == "cpu"
  peers = [f"--peers_python={peers_python}"]
  if quick:
    return [
        Step("fraction_of_peak", "fraction_of_peak.py",
             ["--model=logreg", "--clients=4", "--examples=20", "--rounds=1", "--reps=1"]),
        Step("throughput", "throughput.py",
             ["--models=logreg", "--clients=4", "--rounds=2", "--reps=1"]),
        Step("scaling", "scaling.py",
             ["--sweep=k,n", "--models=logreg", "--k_logreg=4", "--n_logreg=100,200",
              "--k_fixed_logreg=4", "--rounds=1"]),
        Step("multidevice", "multidevice.py",
             ["--devices=1,2", "--k_strong=4", "--k_per_device=2", "--rounds=1", "--reps=1"]
             + (["--platform=default"] if not cpu and p.devices > 1 else [])),
        Step("multiprocess", "multiprocess_scaling.py",
             ["--configs=1x1,2x1", "--k_strong=4", "--k_per_device=2", "--rounds=1",
              "--reps=1"]),
        # 20 peer rounds: at 2 the toy rounds (~10 ms) vanished in pfl's set-up noise and
        # pfl came out "NOT RUN: too short to time"
        Step("peers", "peers.py",
             ["--clients=2", "--examples=10", "--rounds=20", "--engine_rounds=1", "--reps=1",
              "--systems=engine,loop,pfl,flower"] + peers),
    ]
  if cpu:
    engine_devices = min(p.cores, 8)
    return [
        Step("fraction_of_peak", "fraction_of_peak.py",
             ["--clients=10,50,200", "--examples=60", "--rounds=1", "--reps=2",
              "--client_chunk=1"]),
        Step("fraction_of_peak", "fraction_of_peak.py",
             ["--clients=1000", "--examples=60", "--rounds=1", "--reps=1", "--client_chunk=1",
              "--loop=false"]),
        Step("throughput", "throughput.py",
             ["--models=logreg", "--clients=10,50,200,1000", "--reps=3"]
             + ([f"--engine_devices={engine_devices}"] if engine_devices > 1 else [])),
        # 20 rounds per call, as an experiment runs them
        Step("scaling", "scaling.py",
             ["--sweep=k,n", "--models=logreg", "--rounds=20", "--reps=3"]),
        # k_fit: the CNN's K also with its uploads kept as [K, d], for the memory they cost
        Step("scaling", "scaling.py",
             ["--sweep=k_fit,n", "--models=cnn", "--n_cnn=20,60,120", "--rounds=1",
              "--examples=20"]),
        Step("multidevice", "multidevice.py", ["--reps=2"]),
        Step("multiprocess", "multiprocess_scaling.py", []),
        Step("multiprocess", "multiprocess_scaling.py",
             ["--model=cnn", "--k_strong=4", "--k_per_device=1", "--rounds=2", "--reps=2",
              "--configs=1x1,2x1,1x2,4x1"]),
        Step("peers", "peers.py", ["--reps=2", "--engine_rounds=2"] + peers),
    ]
  device_counts = [d for d in (1, 2, 4, 8, 16) if d <= p.devices]
  many = p.devices > 1
  return [
      Step("fraction_of_peak", "fraction_of_peak.py",
           ["--clients=10,50,200,1000", "--examples=60", "--rounds=2", "--reps=3",
            "--client_chunk=0"]),
      Step("throughput", "throughput.py",
           ["--models=logreg,cnn", "--clients=10,50,200,1000", "--reps=3"]
           + ([f"--engine_devices={p.devices}"] if many else [])),
      Step("throughput", "throughput.py",
           ["--models=logreg", "--clients=10000", "--reps=3", "--loop=false",
            "--fedjax_loop=false"]),
      Step("scaling", "scaling.py",
           ["--sweep=k,n", "--models=logreg", "--rounds=20", "--reps=3", "--budget_gib=0",
            "--client_chunk=0"]),
      Step("scaling", "scaling.py",
           ["--sweep=k,n", "--models=cnn", "--rounds=2", "--reps=2", "--budget_gib=0",
            "--client_chunk=0"]),
  ] + ([Step("multidevice", "multidevice.py",
             ["--platform=default", f"--devices={','.join(map(str, device_counts))}",
              "--reps=3"])] if many else []) + [
      Step("peers", "peers.py", ["--reps=2", "--engine_rounds=2"] + peers),
  ]


# The device suite's sizes: an accelerator's, and the toy ones of its CPU dry run
# (--device_suite --quick), which runs the same steps with the same flags otherwise.
DEVICE_SIZES = {
    False: dict(
        fop=["--model=cnn", "--clients=10,50,200,1000", "--examples=60", "--rounds=2",
             "--reps=3"],
        tp=["--models=logreg,cnn", "--clients=10,50,200,1000", "--reps=3",
            "--fedjax_loop_max_clients=50"],
        tp_big=["--models=logreg", "--clients=10000", "--reps=3"],
        # the largest K per round that fits: fitted over K, in the device's memory
        scaling_logreg=["--models=logreg", "--k_logreg=10,100,1000,10000,100000",
                        "--rounds=20", "--reps=3"],
        scaling_cnn=["--models=cnn", "--k_cnn=10,50,200,1000", "--rounds=2", "--reps=2"],
        peers=["--reps=2", "--engine_rounds=2"],
        peaks=[],
        # 20 runs: a Table V computation (4 deltas x 5 seeds); float32 runs TF32 there.
        # vjp against im2col by slices (patches' extraction ran as FFT convolutions on
        # the H200: 2.7x slower than vjp, logs/nvidia_h200_2026-11-28's profile)
        paper_shapes=["--runs=20", "--precisions=float32,bf16", "--impls=vjp,slices",
                      "--profile"],
        table_v=[]),  # the paper's and the authors' flag files, whole runs, 5 seeds
    True: dict(
        fop=["--model=logreg", "--clients=2", "--examples=20", "--rounds=1", "--reps=1"],
        tp=["--models=logreg", "--clients=2", "--rounds=2", "--reps=1"],
        tp_big=None,  # (None: a part that at toy sizes would only repeat the one before)
        scaling_logreg=["--models=logreg", "--k_logreg=2,4", "--n_logreg=4,8",
                        "--k_fixed_logreg=2", "--rounds=1"],
        scaling_cnn=None,
        peers=["--clients=2", "--examples=10", "--rounds=20", "--engine_rounds=1",
               "--reps=1"],
        peaks=["--sizes=128", "--min_time=0.01", "--reps=1", "--bandwidth_mib=16"],
        paper_shapes=["--model=logreg", "--runs=2", "--clients=2", "--num_clients=4",
                      "--examples=20", "--batch=10", "--epochs=1", "--reps=1",
                      "--precisions=float32,bf16", "--impls=vjp", "--bandwidth_mib=16",
                      "--profile"],
        table_v=["--flagfiles=experiments/flags/pafed_table_paper.flags", "--model=logreg",
                 "--rounds=2", "--local_epochs=1", "--num_clients=10", "--test_subset=100",
                 "--num_seeds=1", "--algorithm=fedavg,pafed", "--partitions=shards",
                 "--deltas=0,0.7"]),
}


def device_plan(p: Platform, quick: bool, results_dir: str,
                data_dir: Optional[str] = None) -> List[Step]:
  """The device suite (``--device_suite``) on platform ``p``: the performance steps at the
  accelerator sizes (toy sizes with ``quick``), one vmap of all K, the device's memory as
  the budget, the peers run by this Python (pfl / Flower where installed), and Table V."""
  z = DEVICE_SIZES[quick]
  device_counts = [d for d in (1, 2, 4, 8, 16) if d <= p.devices]
  data = [f"--data_dir={data_dir}"] if data_dir else []
  steps = [
      Step("peaks", "peaks.py", z["peaks"]),
      Step("fraction_of_peak", "fraction_of_peak.py", z["fop"] + ["--client_chunk=0"]),
      Step("throughput", "throughput.py", z["tp"] + (
          [f"--engine_devices={p.devices}"] if p.devices > 1 else [])),
      z["tp_big"] and Step("throughput", "throughput.py",
                           z["tp_big"] + ["--loop=false", "--fedjax_loop=false"]),
      Step("scaling", "scaling.py", ["--sweep=k_fit,n"] + z["scaling_logreg"]
           + ["--budget_gib=0", "--client_chunk=0"]),
      z["scaling_cnn"] and Step("scaling", "scaling.py", ["--sweep=k_fit,n"]
                                + z["scaling_cnn"] + ["--budget_gib=0", "--client_chunk=0"]),
      Step("peers", "peers.py", z["peers"] + ["--systems=engine,loop,pfl,flower",
                                              f"--peers_python={sys.executable}"]),
      p.devices > 1 and Step(
          "multidevice", "multidevice.py",
          ["--platform=default", f"--devices={','.join(map(str, device_counts))}",
           "--reps=1" if quick else "--reps=3"]
          + (["--k_strong=4", "--k_per_device=2", "--rounds=1"] if quick else [])),
      Step("paper_shapes", "paper_shapes.py", z["paper_shapes"]),
      # last: whole runs of Table V in the time the others leave (benchmarks/table_v.py),
      # its rows beside the suite's; the committed rows are skipped
      Step("table_v", "table_v.py",
           z["table_v"] + [f"--new_rows={os.path.join(results_dir, 'table_v', 'rows.jsonl')}"]
           + data),
  ]
  return [s for s in steps if s]


def select(steps: List[Step], only: Sequence[str], skip: Sequence[str],
           device_suite: bool) -> List[Step]:
  """The steps ``--only`` names (without it: all, or ``DEVICE_DEFAULT`` in the device
  suite), less those ``--skip`` names."""
  chosen = only or (DEVICE_DEFAULT if device_suite else STEPS)
  return [s for s in steps if s.name in chosen and s.name not in skip]


def default_tag(p: Platform) -> str:
  kind = re.sub(r"[^A-Za-z0-9]+", "_", p.device_kind).strip("_").lower() or p.backend
  return f"{kind}_{time.strftime('%Y-%m-%d')}"


def allocator_env(choice: str, env: Dict[str, str]) -> Dict[str, str]:
  """``env`` with tcmalloc preloaded for ``--allocator`` ``"auto"`` (when installed) and
  ``"tcmalloc"`` (an error naming the flag when it is not); ``"system"``: ``env``."""
  if choice == "system":
    return env
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  lib = common.find_tcmalloc()
  if lib is None:
    if choice == "tcmalloc":
      raise app.UsageError(
          "--allocator=tcmalloc: tcmalloc's library (libtcmalloc_minimal) is not "
          "installed; install the Debian/Ubuntu package libtcmalloc-minimal4 (or "
          "gperftools), or pass --allocator=system")
    return env
  preload = " ".join(p for p in (env.get("LD_PRELOAD", ""), lib) if p)
  return dict(env, LD_PRELOAD=preload)


def check_flags(steps: Sequence[Step], tag: str, env: Dict[str, str]) -> List[str]:
  """Each step's command with ``--only_check_args`` (all at once: each is a Python start
  and imports): the messages of those that fail."""
  procs = [subprocess.Popen(step.argv(tag) + ["--only_check_args"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
           for step in steps]
  errors = []
  for step, proc in zip(steps, procs):
    stderr = proc.communicate()[1]
    if proc.returncode:
      lines = [l for l in stderr.strip().splitlines() if "error" in l.lower()]
      errors.append(f"{step.name}: {(lines or stderr.strip().splitlines() or ['?'])[-1]}")
  return errors


TIMED_OUT = "timed out"  # run_step's result for a step stopped at the deadline
NOT_RUN = "not run"  # the time budget was spent before the step's turn


def _stop(proc: subprocess.Popen):
  """Ends a step and the processes it started (its own process group)."""
  try:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()


def run_step(step: Step, tag: str, env: Dict[str, str], log_path: str,
             deadline: Optional[float] = None):
  """Runs one step, its output shown and written to ``log_path`` as it comes: its exit
  status, or ``TIMED_OUT`` when it was still running at ``deadline`` (``time.monotonic``)
  and was stopped, with the processes it started."""
  with open(log_path, "a") as log:
    log.write(f"$ {shlex.join(paths.shown_argv(step.argv(tag)))}\n")
    log.flush()
    proc = subprocess.Popen(step.argv(tag), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)
    expired = threading.Event()
    timer = None
    if deadline is not None:
      def expire():
        expired.set()
        _stop(proc)
      timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
      timer.daemon = True
      timer.start()
    try:
      for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
        log.flush()
      rc = proc.wait()
    except KeyboardInterrupt:
      _stop(proc)
      raise
    finally:
      if timer is not None:
        timer.cancel()
    if expired.is_set():
      msg = f"[run_all] {step.name}: stopped at the end of the time budget (--time_budget_min)"
      print(msg, flush=True)
      log.write(msg + "\n")
      return TIMED_OUT
    return rc


def _result(rc) -> str:
  if rc == 0:
    return "ok"
  if rc == TIMED_OUT:
    return "stopped: time budget spent (its finished rows are kept)"
  if rc == NOT_RUN:
    return "not run: time budget spent"
  return f"FAILED (exit {rc})"


def summary(done: List[tuple]) -> str:
  lines = ["| step | result | seconds | log |", "|---|---|---|---|"]
  for name, rc, secs, log in done:
    rel = os.path.relpath(log, ROOT)
    lines.append(f"| {name} | {_result(rc)} | "
                 f"{secs:.0f} | {log if rel.startswith('..') else rel} |")
  return "\n".join(lines)


def read_table_v_md(results: str) -> str:
  """The Table V job's table (``<results>/table_v/table_v.md``), or '' when it did not
  write one."""
  path = os.path.join(results, "table_v", "table_v.md")
  if not os.path.isfile(path):
    return ""
  with open(path) as f:
    return f.read()


def table_v_section(table_v_md: str) -> str:
  """The Table V job's table (``table_v.py``'s markdown, ``read_table_v_md``) as a report
  section, or '' when there is none."""
  if not table_v_md:
    return ""
  table = table_v_md.strip().replace("\n# ", "\n### ").replace("\n## ", "\n### ")
  table = table.split("\n", 1)[1] if table.startswith("# ") else table
  return ("\n\n## Table V (PAFed paper, Fashion-MNIST): ours beside the paper's\n\n"
          "`benchmarks/table_v.py`, this lease's rows in `table_v/rows.jsonl`.\n\n"
          f"{table}\n")


def report_text(rows: Sequence[dict], tag: str, device: Optional[str] = None,
                done: Sequence[tuple] = (), table_v_md: str = "") -> str:
  """A suite run's report.md: ``report.render`` of its rows; for the device suite
  (``device``, e.g. "1 x NVIDIA H200") after a title and its steps (``done``, as
  ``summary``), with Table V's table last (``table_v_section``)."""
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  text = report.render(rows)
  if device is None:
    return text
  return (f"# Device suite, tag {tag}: {device}\n\n" + summary(done) + "\n\n" + text
          + table_v_section(table_v_md))


def run_steps(steps: Sequence[Step], tag: str, env: Dict[str, str], log_dir: str,
              deadline: Optional[float] = None) -> List[tuple]:
  """Runs the steps in turn: (part, result, seconds, log) of each, the result an exit
  status, ``TIMED_OUT`` (stopped at ``deadline``) or ``NOT_RUN`` (its turn came after the
  deadline). Ctrl-C stops the running step and returns what ran."""
  done, seen = [], {}
  try:
    for s in steps:
      seen[s.name] = seen.get(s.name, 0) + 1
      part = s.name if seen[s.name] == 1 else f"{s.name}_{seen[s.name]}"
      log = os.path.join(log_dir, f"{part}.log")
      if deadline is not None and time.monotonic() >= deadline:
        done.append((part, NOT_RUN, 0.0, log))
        continue
      print(f"[run_all] {part}: {shlex.join(paths.shown_argv(s.argv(tag)[1:]))}", flush=True)
      t0 = time.perf_counter()
      rc = run_step(s, tag, env, log, deadline)
      done.append((part, rc, time.perf_counter() - t0, log))
  except KeyboardInterrupt:
    print("[run_all] interrupted; the rows of the steps that finished are written",
          flush=True)
  return done


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  t_start = time.monotonic()
  results = os.path.abspath(FLAGS.results_dir or paths.results_dir())
  env = allocator_env(FLAGS.allocator,
                      dict(os.environ, PYTHONPATH=paths.pythonpath(),
                           FEDJAX_ASYNC_BENCH_RESULTS=results))
  p = detect_platform(env)
  tag = FLAGS.tag or default_tag(p)
  if FLAGS.device_suite:
    steps = device_plan(p, FLAGS.quick, results, FLAGS.data_dir)
  else:
    steps = plan(p, FLAGS.quick, FLAGS.peers_python)
  steps = select(steps, FLAGS.only, FLAGS.skip, FLAGS.device_suite)
  budget_min = FLAGS.time_budget_min
  if budget_min is None and FLAGS.device_suite:
    budget_min = DEVICE_SUITE_BUDGET_MIN
  deadline = None if budget_min is None else t_start + 60.0 * budget_min
  if deadline is not None:  # table_v sizes its computations to end before it
    env[DEADLINE_ENV] = f"{time.time() + deadline - time.monotonic():.1f}"
  print(f"[run_all] {p.backend}: {p.devices} x {p.device_kind}, {p.cores} CPU cores; tag "
        f"{tag!r}; {len(steps)} step(s); rows to {paths.shown(results)}; malloc: "
        f"{env.get('LD_PRELOAD') or 'the system allocator'}"
        + (f"; time budget {budget_min:g} min" if budget_min else ""), flush=True)
  if (not FLAGS.device_suite and any(s.name == "peers" for s in steps)
      and not os.path.exists(FLAGS.peers_python)):
    print(f"warning: --peers_python={FLAGS.peers_python} does not exist: the peers step "
          "will report pfl and Flower as not run (install them with "
          "benchmarks/requirements-peers.txt, see BUILD.md)", file=sys.stderr, flush=True)
  errors = check_flags(steps, tag, env)
  if errors:
    sys.exit("error: these steps' flags were refused, nothing was run:\n  "
             + "\n  ".join(errors))
  if FLAGS.dry_run:
    for s in steps:
      print(shlex.join(s.argv(tag)))
    return
  log_dir = os.path.join(results, "logs", tag)
  os.makedirs(log_dir, exist_ok=True)
  done = run_steps(steps, tag, env, log_dir, deadline)
  print(summary(done), flush=True)
  if done:
    report_md = os.path.join(log_dir, "report.md")
    from benchmarks import report  # pylint: disable=g-import-not-at-top
    rows = report.select(report.load(results), tag=tag)
    text = report_text(rows, tag, f"{p.devices} x {p.device_kind}" if FLAGS.device_suite
                       else None, done, read_table_v_md(results))
    with open(report_md, "w") as f:
      f.write(text)
    print(text)
    figures = report.plot(rows, log_dir)
    print(f"[run_all] report: {paths.shown(report_md)}; figures: {', '.join(sorted(figures))}",
          flush=True)
  if any(rc not in (0, NOT_RUN, TIMED_OUT) for _, rc, _, _ in done):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=flagcheck.parse_flags)
