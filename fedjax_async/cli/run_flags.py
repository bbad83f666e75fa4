"""The run flags made from ``RunConfig``'s defaults, flags -> config, and the parsing
shared by ``experiments/`` and ``benchmarks/`` (one ``error:`` line per mistake)."""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from typing import Dict, List

from absl import flags

from fedjax_async import algorithms
from fedjax_async import config
from fedjax_async import data
from fedjax_async import models
from fedjax_async.asynchronous import config as async_config
from fedjax_async.cli import errors
from fedjax_async.cli import help as help_lib
from fedjax_async.data import loader
from fedjax_async.fededs import config as fededs_config
from fedjax_async.flatkeys import did_you_mean

# Flags a driver does not define but a user may well give it (the other engine's), with
# the sentence that replaces "unknown flag" for them; set by the driver before parsing.
HINTS: Dict[str, str] = {}


def as_flags(message: str) -> str:
  """``message`` with each field path replaced by its flag: ``local.lr: must be > 0`` ->
  ``--lr: must be > 0`` (the CLI's view of a library error), for the paths of
  ``RunConfig``, the virtual clock's ``AsyncRunConfig`` and FedEDS's
  ``FedEDSRunConfig``."""
  by_path = {spec.path: name for cls in (config.RunConfig, async_config.AsyncRunConfig,
                                         fededs_config.FedEDSRunConfig)
             for name, spec in config.flag_specs(cls).items()}
  message = re.sub(r"\balgorithm\.hp\.([a-z_][a-z_0-9]*)\b", r"--\1", message)  # own ones
  return re.sub(r"\b[a-z_][a-z_0-9]*\.[a-z_0-9]+\b",
                lambda m: "--" + by_path[m.group(0)] if m.group(0) in by_path else m.group(0),
                message)


def check_flag(condition: bool, flag: str, message: str):
  """A driver's own flag: ValueError ``--flag: message`` unless ``condition``."""
  if not condition:
    raise ValueError(f"--{flag}: {message}")


def unknown_flag_message(name: str, known) -> str:
  """``--name: unknown flag; did you mean --x?`` (close names among ``known``), or the
  driver's hint for ``name``."""
  if name in HINTS:
    return f"--{name}: {HINTS[name]}"
  close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.7)
  guess = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
  return f"--{name}: unknown flag{guess} (--helpfull lists them)"


def parse_flags(argv: List[str]) -> List[str]:
  """absl's parse of the command line for ``app.run``, with what it would reject in a
  "FATAL Flags parsing error" block, or silently ignore, as one ``error:`` line (exit
  status 1), before anything runs (``--only_check_args`` included):

  * a value absl cannot parse: ``error: --rounds=abc: invalid literal for int() ...``;
  * an unknown flag: ``error: --roundz: unknown flag; did you mean --rounds? (--helpfull
    lists them)``, or the driver's ``HINTS`` sentence for it;
  * a word that is not a flag (``clients=10``, a stray value), which would otherwise be
    ignored while the defaults ran: ``error: unexpected argument(s) 'clients=10' ...``.

  ``--help`` / ``--helpfull`` print the project's flags (``cli.help``) and exit (status 0);
  a --dataset, --model or --algorithm value close to a known name is refused with a
  suggestion (``check_names``).
  """
  wanted = help_lib.requested(argv[1:])
  if wanted:
    help_lib.print_help(wanted)
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    msg = str(e)
    if msg.startswith("flag --"):  # "flag --rounds=abc: invalid literal for int() ..."
      msg = msg[len("flag "):]
    elif msg.startswith("flags ") and ": --" in msg:  # a multi-flag validator's message,
      msg = msg.split(": ", 1)[1]  # "flags a=5, b=10: --a: must be >= --b", names its flag
    elif isinstance(e, flags.UnrecognizedFlagError):
      msg = unknown_flag_message(e.flagname, list(flags.FLAGS))
    sys.exit(f"error: {msg}")
  if len(rest) > 1:
    sys.exit(f"error: unexpected argument(s) {' '.join(rest[1:])!r}: flags are written "
             "--name=value (see --help)")
  try:
    check_names(flags.FLAGS)
  except ValueError as e:
    sys.exit(f"error: {e}")
  return rest


def _known_names(flag: str):
  """The names ``--flag`` takes (every engine's algorithms; the built-in data sets and the
  natural ones, ``data.NATURAL_DATASETS``), or None."""
  return {"algorithm": algorithms.names(),
          "dataset": tuple(data.DATASETS) + tuple(data.NATURAL_DATASETS),
          "model": ("auto",) + tuple(models.MODEL_NAMES)}.get(flag)


def check_names(fv) -> None:
  """ValueError ``--dataset: unknown dataset 'fmnist'; did you mean fashion_mnist?`` for
  a given --dataset, --model or --algorithm (each item of a comma list) of the project's
  configurations that is no known name but close to one (a tensorflow-datasets name is a
  data set; a name close to none is left to the configuration's own check)."""
  for flag in ("algorithm", "dataset", "model"):
    if (flag not in fv or not fv[flag].present or help_lib.GROUPS.get(flag) is None
        or not isinstance(fv[flag].value, str)):
      continue
    known = _known_names(flag)
    values = fv[flag].value.split(",") if flag == "algorithm" else [fv[flag].value]
    for value in values:
      guess = did_you_mean(value, known) if value not in known else ""
      if guess and not (flag == "dataset" and loader.is_tfds_name(value)):
        tfds = " or a tensorflow-datasets name" if flag == "dataset" else ""
        raise ValueError(f"--{flag}: unknown {flag} {value!r}{guess} (choices: "
                         f"{', '.join(known)}{tfds})")


# ------------------------------------------------------------------ run flags


def define_run_flags():
  """The run flags: one per ``RunConfig`` field, then the flags of processes and devices
  that are not part of a configuration."""
  define_config_flags()
  _define_process_flags()


_DEFINE = {"str": flags.DEFINE_string, "int": flags.DEFINE_integer,
           "float": flags.DEFINE_float, "bool": flags.DEFINE_boolean}
# The engine whose algorithms a configuration class runs (their own hyper-parameters' flags).
ENGINES = {config.RunConfig: "rounds", async_config.AsyncRunConfig: "virtual_clock"}


def define_config_flags(config_class=None):
  """One flag per field of ``config_class`` (default ``RunConfig``;
  ``config.flag_specs``: its name, type, default, help and choices), and one per
  hyper-parameter of a registered algorithm that is no field (``own_hparams``); and
  ``--traceback`` (``errors``)."""
  cls = config_class or config.RunConfig
  for name, spec in config.flag_specs(cls).items():
    if spec.kind == "tuple":  # algorithm.hp: its entries are flags of their own (below)
      continue
    if name in flags.FLAGS:  # another engine's, defined first: one flag, one default
      if flags.FLAGS[name].default != spec.default:
        raise ValueError(f"--{name}: defined with default {flags.FLAGS[name].default!r}, "
                         f"{cls.__name__} has {spec.default!r}")
      continue
    help_lib.GROUPS[name] = spec.path.split(".")[0]
    if spec.choices:
      flags.DEFINE_enum(name, spec.default, list(spec.choices), spec.help)
    else:
      _DEFINE[spec.kind](name, spec.default, spec.help)
  for name, (algo, h) in own_hparams(cls).items():
    if name in flags.FLAGS:
      continue
    help_lib.GROUPS[name] = "algorithm"
    _DEFINE[h.kind](name, None, f"{h.help} [{algo}; {h.bounds}] (default: "
                    f"{h.default:g})")
  errors.define_traceback_flag()


def own_hparams(config_class) -> Dict[str, tuple]:
  """``{name: (algorithm, base.HParam)}``: the hyper-parameters that the algorithms
  registered from Python (``algorithms.register``) declare and ``config_class`` has no
  field for; they reach a run through ``algorithm.hp``."""
  engine = ENGINES.get(config_class)
  keys = config_class.keys()
  return {n: pairs[0] for n, pairs in (algorithms.declared(engine).items() if engine else ())
          if n not in keys}


def import_modules(argv: List[str]) -> None:
  """``--import_modules=my_pkg.my_algo,...`` (on the command line or in a --flagfile):
  imports each module before the flags are defined, so that the algorithms it registers
  (``algorithms.register``) have their names and hyper-parameters as flags; defines the
  flag itself. One ``error:`` line when a module cannot be imported."""
  flags.DEFINE_string("import_modules", "", "Python modules to import first (each may "
                      "register algorithms).")
  help_lib.GROUPS["import_modules"] = "algorithm"
  try:
    args = flags.FlagValues().read_flags_from_files(list(argv[1:]), force_gnu=False)
  except flags.Error:
    return  # parse_flags names the unreadable --flagfile
  for i, a in enumerate(args):
    value = (a.split("=", 1)[1] if a.startswith("--import_modules=") else
             args[i + 1] if a == "--import_modules" and i + 1 < len(args) else "")
    for name in filter(None, (v.strip() for v in value.split(","))):
      try:
        importlib.import_module(name)
      except Exception as e:  # pylint: disable=broad-except
        sys.exit(f"error: --import_modules: cannot import {name!r}: {type(e).__name__}: {e} "
                 "(is its folder on PYTHONPATH?)")


def _define_process_flags():
  """Several processes, and XLA's host devices: how the program starts, not the run."""
  flags.DEFINE_string("coordinator_address", "", "Several processes: host:port of process 0 "
                      "(jax.distributed.initialize); every process gets the same value.")
  flags.DEFINE_integer("num_processes", 0, "Several processes: how many (with "
                       "--coordinator_address).")
  flags.DEFINE_integer("process_id", -1, "Several processes: this one's index, 0 .. "
                       "--num_processes - 1.")
  flags.DEFINE_boolean("distributed", False, "Join the other processes of a SLURM job, an "
                       "Open MPI launch or a TPU pod slice as JAX detects them (no other "
                       "flag needed).")
  flags.DEFINE_integer("cpu_devices", 0, config.SHARED_HELP["cpu_devices"])
  help_lib.GROUPS.update(dict.fromkeys(("coordinator_address", "num_processes", "process_id",
                                        "distributed", "cpu_devices"), "processes"))


def config_from_flags(FLAGS):
  """The ``RunConfig`` of the parsed run flags, validated; a ValueError names the flag
  (``as_flags`` of the library's field path)."""
  try:
    cfg = config.RunConfig.from_flat(flat_from_flags(FLAGS, config.RunConfig))
    config.validate(cfg)
  except ValueError as e:
    raise ValueError(as_flags(str(e))) from None
  return cfg


def flat_from_flags(FLAGS, config_class) -> dict:
  """The flat keys of ``config_class`` from the parsed flags, the given flags of
  ``own_hparams`` in ``hp``."""
  flat = {name: FLAGS[name].value for name, spec in config.flag_specs(config_class).items()
          if spec.kind != "tuple"}
  flat["hp"] = {n: float(FLAGS[n].value) for n in own_hparams(config_class)
                if n in FLAGS and FLAGS[n].value is not None}
  return flat
