"""List flags for the benchmarks that reject bad values at parsing, naming the flag.

No JAX import, so the crypto benchmarks can use it too.

  flagcheck.int_list("clients", ["10", "50"], "Clients per round K.")   # FLAGS.clients: [int]
  flagcheck.choice_list("models", ["logreg"], ["logreg", "cnn"], "Models.")
  flagcheck.item_list("mixes", ["200x10"], "Mixes.", "mixes 'nxK'", item_ok=ok_fn)
  flagcheck.power_of_two("ring_dim", 0, "Ring dimension N (0: OpenFHE's choice).")
  app.run(main, flags_parser=flagcheck.parse_flags)   # stray arguments refused too
"""

from __future__ import annotations

from typing import Callable, Sequence

from absl import flags

from fedjax_async import cli


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
      message=f"--{name}: each item must be one of {', '.join(choices)} (one or more, "
              "comma-separated)",
      flag_values=flag_values)


def item_list(name: str, default: Sequence[str], help_text: str, expected: str,
              item_ok: Callable[[str], bool] = lambda item: True,
              flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """A non-empty comma-separated list of non-empty items that each pass ``item_ok``;
  refused with ``--NAME: expected a non-empty comma-separated list of EXPECTED``."""
  flags.DEFINE_list(name, list(default), help_text, flag_values=flag_values)
  flags.register_validator(
      name, lambda v: bool(v) and all(item and item_ok(item) for item in v),
      message=f"--{name}: expected a non-empty comma-separated list of {expected}",
      flag_values=flag_values)


def power_of_two(name: str, default: int, help_text: str,
                 flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """An integer that is 0 (unset: the default's meaning, given in ``help_text``) or a power
  of two >= 2 (a ring dimension)."""
  flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
  flags.register_validator(
      name, lambda v: v == 0 or (v >= 2 and v & (v - 1) == 0),
      message=f"--{name}: expected 0 (unset) or a power of two, e.g. 16384 or 65536",
      flag_values=flag_values)


# app.run's flags_parser (bad values, unknown flags and stray words as one error line)
parse_flags = cli.parse_flags
