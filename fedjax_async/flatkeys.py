"""The flat-key machinery every configuration shares: a configuration is a frozen
dataclass of parts (frozen dataclasses), each field declared with ``option`` (its help,
its flag's name when it differs); ``FlatKeys`` gives every field a flat key (its flag's
name) to read and replace it by, ``flag_specs`` what the CLI needs to make the flags,
``check_types`` / ``check`` the ``ConfigError`` naming a field by its path
(``did_you_mean``: the names close to a wrong one).

Nothing here knows a particular configuration: ``config.RunConfig`` (the round engine),
``asynchronous.config.AsyncRunConfig`` (the virtual clock) and
``fededs.config.FedEDSRunConfig`` build on it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np


def option(default, help_text: str, *, flag: Optional[str] = None, cli_default=None,
           choices: Optional[Tuple[str, ...]] = None):
  """A config field with what its flag needs: the help text, the flag's name when it is not
  the field's, a CLI default when it differs (``output_dir``), an enum's choices.

  Args:
    default: the field's default.
    help_text: the flag's help.
    flag: the flag's name (None: the field's).
    cli_default: the flag's default where it differs from ``default``.
    choices: an enum's allowed values.
  """
  meta = {"help": help_text}
  if flag is not None:
    meta["flag"] = flag
  if cli_default is not None:
    meta["cli_default"] = cli_default
  if choices is not None:
    meta["choices"] = choices
  return dataclasses.field(default=default, metadata=meta)


def did_you_mean(value: str, known) -> str:
  """``"; did you mean x?"`` for the names in ``known`` closest to ``value`` (its
  abbreviation first: fmnist for fashion_mnist), or ``""``."""
  known = list(dict.fromkeys(known))
  short = [k for k in known if "_" in k and value == "".join(
      p[0] for p in k.split("_")[:-1]) + k.split("_")[-1]]
  close = list(dict.fromkeys(short + difflib.get_close_matches(value, known, n=2,
                                                                 cutoff=0.7)))[:2]
  return f"; did you mean {' or '.join(close)}?" if close else ""


class ConfigError(ValueError):
  """A wrong value: ``path`` (e.g. ``local.lr``) and what is wrong with it."""

  def __init__(self, path: str, message: str):
    super().__init__(f"{path}: {message}")
    self.path, self.message = path, message


_FLAT_KEYS: Dict[type, Dict[str, Tuple[str, str]]] = {}


class _Resolved(type):
  """``Config(...)``, and so ``dataclasses.replace``, builds the configuration of the parts
  its class's ``resolve_parts`` makes of those given: the defaults that depend on other
  fields are filled in before construction, once; no instance changes after it."""

  def __call__(cls, *args, **kwargs):
    try:
      bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    except TypeError:  # (the constructor's own error: an unknown or missing part)
      return super().__call__(*args, **kwargs)
    bound.apply_defaults()
    parts = dict(list(bound.arguments.items())[1:])  # (without the instance)
    return super().__call__(**cls.resolve_parts(parts))


class FlatKeys(metaclass=_Resolved):
  """A configuration of parts (frozen dataclasses) whose fields each have a flat key, the
  name of its flag: ``RunConfig`` and the virtual clock's ``AsyncRunConfig``."""

  @classmethod
  def resolve_parts(cls, parts: Dict[str, object]) -> Dict[str, object]:
    """The parts ``{name: part}`` the configuration is built of, from those given: a
    configuration's defaults that depend on other fields (``RunConfig``'s by engine and
    data set); these, none."""
    return parts

  @classmethod
  def keys(cls) -> Dict[str, Tuple[str, str]]:
    """flat key -> (part, field), in the parts' order."""
    if cls not in _FLAT_KEYS:
      _FLAT_KEYS[cls] = {name: tuple(spec.path.split("."))
                         for name, spec in flag_specs(cls).items()}
    return _FLAT_KEYS[cls]

  def replace(self, **flat):
    """A copy with fields replaced by their flat keys (``lr=0.05``, ``algorithm="fedavg"``),
    or whole parts by their names (``local=LocalTraining(...)``). An unknown key raises
    ``ConfigError`` naming it, with the closest keys."""
    keys, part_names = self.keys(), {f.name for f in dataclasses.fields(self)}
    parts: Dict[str, dict] = {}
    new = {}
    for key, value in flat.items():
      if key in part_names and isinstance(value, type(getattr(self, key))):  # a whole part
        new[key] = value  # ("algorithm" is also the flat key of algorithm.names, a string)
        continue
      if key in part_names and key not in keys:
        raise ConfigError(key, f"expected a {type(getattr(self, key)).__name__}, got "
                          f"{value!r} ({type(value).__name__})")
      if key not in keys:
        close = difflib.get_close_matches(key, list(keys), n=3, cutoff=0.6)
        raise ConfigError(key, f"not a {type(self).__name__} field" + (
            f"; did you mean {' or '.join(close)}?" if close else ""))
      part, name = keys[key]
      parts.setdefault(part, {})[name] = value
    for part, values in parts.items():
      new[part] = dataclasses.replace(new.get(part, getattr(self, part)), **values)
    return dataclasses.replace(self, **new)

  def get(self, key: str):
    """The value of the field whose flat key is ``key`` (``lr``, ``concurrency``)."""
    if key not in self.keys():
      raise ConfigError(key, f"not a {type(self).__name__} field")
    part, name = self.keys()[key]
    return getattr(getattr(self, part), name)

  def flat(self) -> Dict[str, object]:
    """Every field by its flat key."""
    return {key: self.get(key) for key in self.keys()}

  @classmethod
  def from_flat(cls, flat: dict):
    """The configuration of flat keys (parsed flags, a stored configuration)."""
    return cls().replace(**flat)


class FlagSpec(NamedTuple):
  """What the CLI needs to make one field's flag."""
  path: str  # local.lr
  kind: str  # str | int | float | bool
  default: object  # RunConfig's default (``cli_default`` where the CLI's differs)
  help: str
  choices: Optional[Tuple[str, ...]]


def flag_specs(config_class) -> Dict[str, FlagSpec]:
  """flag name -> ``FlagSpec``, for every field of ``config_class`` (``RunConfig``, the
  virtual clock's ``AsyncRunConfig``, FedEDS's ``FedEDSRunConfig``), in the parts'
  order."""
  out = {}
  for part in dataclasses.fields(config_class):
    for f in dataclasses.fields(type(part.default)):
      meta = f.metadata
      out[meta.get("flag", f.name)] = FlagSpec(
          f"{part.name}.{f.name}", str(f.type).replace("Optional[", "").rstrip("]"),
          meta.get("cli_default", getattr(part.default, f.name)), meta["help"],
          meta.get("choices"))
  return out


def check(condition: bool, field_path: str, message: str):
  """Raises ``ConfigError(field_path, message)`` unless ``condition``."""
  if not condition:
    raise ConfigError(field_path, message)


_KINDS = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool, np.bool_),
          "str": (str,)}


def check_part_types(part, prefix: str) -> None:
  """Every field of ``part`` (one part of a configuration) has its declared type (an int
  for a float field is fine, a bool is no number); ``ConfigError`` naming
  ``prefix.field`` otherwise (``run.rounds: expected int, got '5' (str)``)."""
  for f in dataclasses.fields(part):
    declared = str(f.type)
    optional = declared.startswith("Optional[")
    kind = declared.replace("Optional[", "").rstrip("]")
    value = getattr(part, f.name)
    if kind not in _KINDS or (optional and value is None):
      continue
    ok = isinstance(value, _KINDS[kind]) and (kind == "bool" or not isinstance(
        value, (bool, np.bool_)))
    if not ok:
      raise ConfigError(f"{prefix}.{f.name}", f"expected {kind}, got {value!r} "
                        f"({type(value).__name__})")


def check_types(cfg) -> None:
  """Every field of every part of ``cfg`` (a ``FlatKeys`` configuration) has its declared
  type (``check_part_types``)."""
  for part in dataclasses.fields(cfg):
    check_part_types(getattr(cfg, part.name), part.name)


def parse_hp(text) -> Dict[str, float]:
  """``algorithm.hp``: ``"beta=0.9,gamma=2"`` (or a dict, or (name, value) pairs) ->
  {name: float}; ConfigError
  naming the field otherwise."""
  if isinstance(text, dict):
    items = list(text.items())
  elif isinstance(text, (tuple, list)):  # (name, value) pairs, as the config holds them
    items = [tuple(p) for p in text]
  else:
    items = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
      name, sep, value = part.partition("=")
      if not sep or not name.strip():
        raise ConfigError("algorithm.hp", f"expected name=value,..., got {text!r}")
      items.append((name.strip(), value))
  out = {}
  for name, value in items:
    try:
      out[name] = float(value)
    except (TypeError, ValueError):
      text = value.strip() if isinstance(value, str) else value
      if isinstance(text, str) and len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # simulate(hp={"beta": "high"}) arrives as beta='high'
      raise ConfigError(f"algorithm.hp.{name}", f"expected a number (float), got {text!r} "
                        f"({type(text).__name__}); e.g. hp={{{name!r}: 0.5}}") from None
  return out
