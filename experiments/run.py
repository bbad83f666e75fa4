r"""Runs one or several federated algorithms on the round engine and compares them.

Without flags this is the README's main job: PAFed, FedADMM, FedAvg and FedProx on the
embedded Synthetic(1,1) data set (30 clients, 10 sampled per round as in the FedProx
paper), a fraction 0.3 of the sampled clients delayed by 1-3 rounds.

  python experiments/run.py
  python experiments/run.py --algorithm=pafed --dataset=fashion_mnist --partition=shards \
      --num_clients=100 --participation=0.1 --local_epochs=10 --rounds=100
  python experiments/run.py --flagfile=experiments/flags/pafed_fmnist_noniid.flags

The virtual-clock family and FedEDS run from here too (their own flags; see
experiments/async_family.py and experiments/fededs_table.py):

  python experiments/run.py --algorithm=fedasync,fedbuff --num_updates=300
  python experiments/run.py --algorithm=fedavg --fededs --quick

Each algorithm writes ``<output_dir>/<algorithm>/metrics.jsonl`` (one JSON object per
round) and ``summary.json``, one algorithm as several; the run ends with a comparison table
(``comparison.md`` / ``comparison.csv``); ``curves.png`` plots test accuracy and train loss
per round for every algorithm of the run; ``--seeds=0,1,2``: all of it per seed under
``seed<s>/``, then the comparison as mean ± std and ``curves.png`` as ±1 std bands. An
``--output_dir`` that holds a run is refused unless ``--resume`` (continue from its
checkpoint) or ``--overwrite`` (start over). Ctrl-C or SIGTERM stops a run with one line
naming the checkpoint that ``--resume`` continues from (exit status 130 / 143).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from fedjax_async import algorithms
from fedjax_async import cli
from fedjax_async import config as config_lib
from fedjax_async.asynchronous import config as async_config

ASYNC = algorithms.names("virtual_clock")  # the built-in ones, for the hints and --helpfull
FEDEDS_VARIANTS = {"fededs": "fededs", "s1": "s1", "s2": "s2"}
MODES = {"rounds": "rounds", "virtual_clock": "async"}  # algorithms.engine_of's: the driver's


def mode_of(argv) -> str:
  """What must be settled before absl parses the command line: 'fededs' (FedEDS defines
  other flags: experiments/fededs_table.py's, where --num_clients is a list), else the
  engine whose flags --help and --helpfull list, 'rounds' or 'async'. Which engine runs
  is decided from the parsed flags (``main_engines``)."""
  try:
    args = flags.FlagValues().read_flags_from_files(list(argv[1:]), force_gnu=False)
  except flags.Error as e:  # e.g. a --flagfile that cannot be read
    sys.exit(f"error: --flagfile: {e}")
  names, fededs = None, False
  for i, a in enumerate(args):
    if a.startswith("--algorithm="):
      names = a.split("=", 1)[1]
    elif a == "--algorithm" and i + 1 < len(args):
      names = args[i + 1]
    elif a in ("--fededs", "--fededs=true", "--fededs=True") or a.startswith(
        "--fededs_ablation"):
      fededs = True
  if fededs:
    return "fededs"
  return "rounds" if names is None else mode_of_names(names)


def mode_of_names(names: str) -> str:
  """'async' or 'rounds': the engine ``algorithms.engine_of`` picks for the comma list
  ``names`` (as ``simulate`` does); its ``ConfigError`` as one ``error: --algorithm:``
  line (exit status 1)."""
  try:
    return MODES[algorithms.engine_of(names)]
  except config_lib.ConfigError as e:  # its path, the flat key algorithm: the flag's field
    field = ".".join(config_lib.RunConfig.keys()[e.path])
    sys.exit(cli.errors.message(config_lib.ConfigError(field, e.message), cli.as_flags))


def main_rounds(argv):
  del argv  # stray words: refused by cli.parse_flags
  cli.main_from_flags(flags.FLAGS)


PROCESS_FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed",
                 "cpu_devices")


def engine_flags(mode: str) -> set:
  """The flags of one engine ('rounds' or 'async'): its configuration's fields, the
  hyper-parameters of the algorithms --import_modules registered, --traceback, and (the
  round engine) the process flags."""
  cls = async_config.AsyncRunConfig if mode == "async" else config_lib.RunConfig
  extra = ("import_modules", "traceback", "cpu_devices") if mode == "async" else (
      ("import_modules", "traceback") + PROCESS_FLAGS)
  return ({n for n, spec in config_lib.flag_specs(cls).items() if spec.kind != "tuple"}
          | set(cli.own_hparams(cls)) | set(extra))


def main_engines(argv):
  """The round engine or the virtual clock, as the parsed --algorithm says; a flag of the
  other engine that was given is one ``error:`` line saying what to use instead."""
  fl = flags.FLAGS
  mode = "rounds" if fl.algorithm is None else mode_of_names(fl.algorithm)
  other = engine_flags("rounds" if mode == "async" else "async") - engine_flags(mode)
  hints = {**ASYNC_HINTS, **ONE_PROCESS_HINTS} if mode == "async" else {}
  for name in sorted(n for n in other if n in fl and fl[n].present):
    sys.exit(f"error: --{name}: " + hints.get(name, (
        f"a flag of the round engine's algorithms ({', '.join(algorithms.names('rounds'))})"
        if mode == "async" else ROUNDS_HINT)))
  if mode == "async":
    sibling("async_family").main(argv)
  else:
    main_rounds(argv)


def main_fededs(argv, driver):
  """--algorithm=fedavg --fededs: FedEDS plugged into a base algorithm (fededs_table.py
  runs one (alpha, K) setting; --fededs_ablation=s1|s2 runs an ablation instead)."""
  fl = flags.FLAGS
  for name in fl.algorithm.split(","):
    if name not in ("fedavg", "fedprox", "fednova"):
      sys.exit(f"error: --algorithm: FedEDS plugs into fedavg, fedprox or fednova, got "
               f"{name!r}{cli.did_you_mean(name, ('fedavg', 'fedprox', 'fednova'))}")
  variant = fl.fededs_ablation or "fededs"
  if variant not in FEDEDS_VARIANTS:
    sys.exit(f"error: --fededs_ablation: expected s1 (annealing only) or s2 (sharing "
             f"only), got {variant!r}")
  fl.bases = fl.algorithm
  fl.variants = ("base," if fl.fededs_compare_base else "") + FEDEDS_VARIANTS[variant]
  fl["bases"].present = fl["variants"].present = 1  # so --quick does not override them
  driver.main(argv)


# What a flag of the round engine means to a user who gives it to the virtual clock.
ASYNC_HINTS = {
    "rounds": "the virtual-clock algorithms count server updates, not rounds: use "
              "--num_updates=N, or --num_arrivals=N to give every algorithm the same "
              "number of client arrivals",
    "participation": "the virtual clock keeps --concurrency clients training at a time "
                     "instead of sampling a fraction per round",
    "delay_fraction": "on the virtual clock staleness follows from the clients' "
                      "--compute_time and --comm_time, not a delayed fraction",
    "rounds_per_call": "the virtual clock's unit of a compiled call is --groups_per_call",
}
# The process flags exist for the round engine and sweeps only (docs/distributed.md).
ONE_PROCESS_HINTS = {
    name: "FedEDS and the virtual clock run in one process; the round engine's algorithms "
          "and sweeps run across processes (docs/distributed.md)"
    for name in ("coordinator_address", "num_processes", "process_id", "distributed")}
ROUNDS_HINT = (f"a flag of the virtual-clock algorithms ({', '.join(ASYNC)}); the round "
               "engine's algorithms run --rounds")
HELP_SECTIONS = (("the round engine: --algorithm=pafed,fedadmm,fedavg,fedprox,fednova,dp_fedavg",
                  []),
                 (f"the virtual clock: --algorithm={','.join(ASYNC)}", ["--algorithm=fedasync"]),
                 ("FedEDS: --algorithm=fedavg|fedprox|fednova --fededs", ["--fededs"]))


def print_every_flag():
  """--helpfull: the flags of all three drivers, each section with the flags the earlier
  ones lack (each driver defines its own flags, so each lists them, as JSON, in a child
  process)."""
  env = dict(os.environ, **{cli.help.JSON_ENV: "json"})
  sections = []
  imports = [a for a in sys.argv[1:] if a.startswith("--import_modules=")]
  for title, args in HELP_SECTIONS:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args, *imports,
                          "--helpfull"],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
      sys.exit(out.stderr.strip() or f"error: --helpfull: the {title} section failed")
    sections.append((title, json.loads(out.stdout)))
  cli.help.emit(cli.help.sections_help(sections, __doc__))


def sibling(name: str):
  """``experiments/NAME.py`` (a sibling driver) as the module ``name``, loaded once, from
  its file: also when this script runs through runpy, which puts no folder on sys.path."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
  return sys.modules[name]


def main():
  if cli.help.requested(sys.argv[1:]) == "full" and not os.environ.get(cli.help.JSON_ENV):
    print_every_flag()
    return
  cli.import_modules(sys.argv)  # algorithms they register: names and flags
  mode = mode_of(sys.argv)
  if mode == "fededs":
    cli.HINTS.update(ONE_PROCESS_HINTS)
    fededs_table = sibling("fededs_table")
    flags.DEFINE_string("algorithm", "fedavg", "Base algorithm(s): fedavg, fedprox, fednova.")
    flags.DEFINE_boolean("fededs", True, "Plug FedEDS into --algorithm.")
    flags.DEFINE_string("fededs_ablation", "", "s1 (annealing only) | s2 (sharing only).")
    flags.DEFINE_boolean("fededs_compare_base", True, "Also run the base algorithm alone.")
    flags.FLAGS.set_default("alphas", "0.5")
    flags.FLAGS.set_default("num_clients", "10")
    cli.help.ESSENTIAL[:] = ["algorithm", "fededs", "fededs_ablation", "quick", "alphas",
                             "num_clients", "rounds", "seed", "output_dir", "flagfile"]
    app.run(lambda argv: main_fededs(argv, fededs_table),
            flags_parser=cli.parse_flags)
    return
  # One set of flags for both engines (a flag of both: one definition, one default).
  essential = list(cli.help.ESSENTIAL)
  cli.define_run_flags()
  sibling("async_family")  # (loading it defined the virtual clock's own flags)
  if mode == "rounds":
    cli.help.ESSENTIAL[:] = essential
  if cli.help.requested(sys.argv[1:]):  # the flags of the engine --algorithm names
    cli.help.ONLY = engine_flags(mode)
  app.run(main_engines, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  main()
