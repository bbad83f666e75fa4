"""Command-line parsing shared by ``experiments/`` and ``benchmarks/`` (no JAX import).

  app.run(main, flags_parser=cli.parse_flags)
"""

from __future__ import annotations

import difflib
import sys
from typing import Dict, List

from absl import flags

# Flags a driver does not define but a user may well give it (the other engine's), with
# the sentence that replaces "unknown flag" for them; set by the driver before parsing.
HINTS: Dict[str, str] = {}


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
