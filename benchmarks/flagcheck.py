"""List flags for the benchmarks that reject bad values at parsing, naming the flag.

No JAX import, so the crypto benchmarks can use it too.

  flagcheck.int_list("clients", ["10", "50"], "Clients per round K.")   # FLAGS.clients: [int]
  flagcheck.choice_list("models", ["logreg"], ["logreg", "cnn"], "Models.")
"""

from __future__ import annotations

from typing import Sequence

from absl import flags


def _ints(values, minimum):
  try:
    return all(int(v) >= minimum for v in values) and bool(values)
  except ValueError:
    return False


def int_list(name: str, default: Sequence[str], help_text: str, minimum: int = 1,
             flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """A comma-separated list of integers >= ``minimum`` (read it with ``map(int, ...)``)."""
  flags.DEFINE_list(name, list(default), help_text, flag_values=flag_values)
  flags.register_validator(
      name, lambda v: _ints(v, minimum),
      message=f"--{name}: expected a non-empty comma-separated list of integers >= {minimum}",
      flag_values=flag_values)


def choice_list(name: str, default: Sequence[str], choices: Sequence[str], help_text: str,
                flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """A non-empty comma-separated list whose items are each one of ``choices``."""
  flags.DEFINE_list(name, list(default), f"{help_text} One or more of: {', '.join(choices)}.",
                    flag_values=flag_values)
  flags.register_validator(
      name, lambda v: bool(v) and set(v) <= set(choices),
      message=f"--{name}: each item must be one of {', '.join(choices)}",
      flag_values=flag_values)
