"""The run flags made from ``RunConfig``'s defaults, flags -> config, and the parsing
shared by ``experiments/`` and ``benchmarks/`` (one ``error:`` line per mistake)."""

from __future__ import annotations

import difflib
import sys
from typing import Dict, List

from absl import flags

# Flags a driver does not define but a user may well give it (the other engine's), with
# the sentence that replaces "unknown flag" for them; set by the driver before parsing.
HINTS: Dict[str, str] = {}


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
  """
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
  return rest


# ------------------------------------------------------------------ run flags


def define_run_flags():
  """The run flags: one per ``RunConfig`` field, then the flags of processes and devices
  that are not part of a configuration."""
  define_config_flags()
  _define_process_flags()


def define_config_flags(config_class=None):
  """One flag per field of ``config_class`` (default ``RunConfig``;
  ``config.flag_specs``: its name, type, default, help and choices)."""
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  define = {"str": flags.DEFINE_string, "int": flags.DEFINE_integer,
            "float": flags.DEFINE_float, "bool": flags.DEFINE_boolean}
  for name, spec in config.flag_specs(config_class).items():
    if spec.choices:
      flags.DEFINE_enum(name, spec.default, list(spec.choices), spec.help)
    else:
      define[spec.kind](name, spec.default, spec.help)


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
  flags.DEFINE_integer("cpu_devices", 0, "CPU only: make this many XLA host devices "
                       "(jax_num_cpu_devices) so that --devices can split the clients over "
                       "the cores; 0: JAX's default (one).")


def config_from_flags(FLAGS):
  """The ``RunConfig`` of the parsed run flags, validated; a ValueError names the flag
  (``config.as_flags`` of the library's field path)."""
  from fedjax_async import config  # pylint: disable=g-import-not-at-top
  try:
    cfg = config.RunConfig.from_flat({name: FLAGS[name].value
                                      for name in config.flag_specs()})
    config.validate(cfg)
  except ValueError as e:
    raise ValueError(config.as_flags(str(e))) from None
  return cfg
