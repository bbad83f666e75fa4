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
* ``peers``: pfl-research's CIFAR-10 workload by the engine, the loop, pfl and Flower (peers
  from ``--peers_python``; a peer that cannot run is reported as such);
* then ``report.py`` over the rows this run wrote: tables (``report.md``) and figures
  (PNG) next to the logs.

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
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Sequence

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, ROOT)

from benchmarks import flagcheck  # noqa: E402  (no JAX import)
from benchmarks import paths  # noqa: E402  (no JAX import)

STEPS = ("fraction_of_peak", "throughput", "scaling", "multidevice", "peers")

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
  flags.DEFINE_enum("allocator", "auto", ["auto", "tcmalloc", "system"],
                    "malloc of the steps: tcmalloc preloaded (LD_PRELOAD; 'auto': when it "
                    "is installed, Debian package libtcmalloc-minimal4) or the system's. "
                    "Every row records it.")
  for name in ("only", "skip"):
    flags.register_validator(name, _known_steps,
                             message=f"--{name}: each item must be one of {', '.join(STEPS)}")


@dataclasses.dataclass
class Platform:
  """What the suite's sizes depend on."""
  backend: str  # "cpu", "gpu", "tpu"
  devices: int
  device_kind: str
  cores: int


def detect_platform() -> Platform:
  """This machine, as JAX sees it (on CPU the device kind is the CPU model and ISA)."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top  (quiets JAX's TPU probe)
  import jax  # pylint: disable=g-import-not-at-top
  devs = jax.devices()
  kind = common.cpu_model() if devs[0].platform == "cpu" else devs[0].device_kind
  return Platform(jax.default_backend(), len(devs), kind, os.cpu_count() or 1)


@dataclasses.dataclass
class Step:
  name: str  # one of STEPS (a step may have several parts: name, then name_2 ...)
  script: str  # file under benchmarks/
  args: List[str]

  def argv(self, tag: str, python: str = sys.executable) -> List[str]:
    return [python, os.path.join(HERE, self.script)] + self.args + [f"--tag={tag}"]


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
  """Each step's command with ``--only_check_args``: the messages of those that fail."""
  errors = []
  for step in steps:
    proc = subprocess.run(step.argv(tag) + ["--only_check_args"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
      lines = [l for l in proc.stderr.strip().splitlines() if "error" in l.lower()]
      errors.append(f"{step.name}: {(lines or proc.stderr.strip().splitlines() or ['?'])[-1]}")
  return errors


def run_step(step: Step, tag: str, env: Dict[str, str], log_path: str) -> int:
  """Runs one step, its output shown and written to ``log_path`` as it comes."""
  with open(log_path, "a") as log:
    log.write(f"$ {shlex.join(step.argv(tag))}\n")
    log.flush()
    proc = subprocess.Popen(step.argv(tag), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
      for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
        log.flush()
      return proc.wait()
    except KeyboardInterrupt:
      proc.terminate()
      proc.wait()
      raise


def summary(done: List[tuple]) -> str:
  lines = ["| step | result | seconds | log |", "|---|---|---|---|"]
  for name, rc, secs, log in done:
    rel = os.path.relpath(log, ROOT)
    lines.append(f"| {name} | {'ok' if rc == 0 else f'FAILED (exit {rc})'} | "
                 f"{secs:.0f} | {log if rel.startswith('..') else rel} |")
  return "\n".join(lines)


def main(argv):
  del argv  # stray words: refused by cli.parse_flags
  results = os.path.abspath(FLAGS.results_dir or paths.results_dir())
  env = allocator_env(FLAGS.allocator,
                      dict(os.environ, PYTHONPATH=ROOT, FEDJAX_ASYNC_BENCH_RESULTS=results))
  p = detect_platform()
  tag = FLAGS.tag or default_tag(p)
  steps = [s for s in plan(p, FLAGS.quick, FLAGS.peers_python)
           if (not FLAGS.only or s.name in FLAGS.only) and s.name not in FLAGS.skip]
  print(f"[run_all] {p.backend}: {p.devices} x {p.device_kind}, {p.cores} CPU cores; tag "
        f"{tag!r}; {len(steps)} step(s); rows to {results}; malloc: "
        f"{env.get('LD_PRELOAD') or 'the system allocator'}", flush=True)
  if any(s.name == "peers" for s in steps) and not os.path.exists(FLAGS.peers_python):
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
  done, seen = [], {}
  try:
    for s in steps:
      seen[s.name] = seen.get(s.name, 0) + 1
      part = s.name if seen[s.name] == 1 else f"{s.name}_{seen[s.name]}"
      log = os.path.join(log_dir, f"{part}.log")
      print(f"[run_all] {part}: {shlex.join(s.argv(tag)[1:])}", flush=True)
      t0 = time.perf_counter()
      rc = run_step(s, tag, env, log)
      done.append((part, rc, time.perf_counter() - t0, log))
  except KeyboardInterrupt:
    print("[run_all] interrupted; the rows of the steps that finished are written",
          flush=True)
  print(summary(done), flush=True)
  if done:
    report_md = os.path.join(log_dir, "report.md")
    from benchmarks import report  # pylint: disable=g-import-not-at-top
    rows = report.select(report.load(results), tag=tag)
    text = report.render(rows)
    with open(report_md, "w") as f:
      f.write(text)
    print(text)
    figures = report.plot(rows, log_dir)
    print(f"[run_all] report: {report_md}; figures: {', '.join(sorted(figures))}", flush=True)
  if any(rc for _, rc, _, _ in done):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=flagcheck.parse_flags)
