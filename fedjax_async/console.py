"""The library's one console: every line a run says goes through ``say`` or ``warn``.

Levels, lowest first: ``PROGRESS`` (per-round and per-chunk lines, compilation),
``INFO`` (loading, the data, the cost estimate, resumes, notes), ``RESULT`` (each run's
final line, the table, the figure's path), ``WARNING`` (stderr). ``quiet=True`` from
Python (``simulate``, the drivers) prints nothing: ``silenced()`` raises the threshold
above every level for the call, in every thread (the in-chunk progress lines come from
XLA's callback thread). The command line's ``--quiet`` keeps results and warnings
(``cli`` sets ``quiet_keeps(RESULT)``).

  from fedjax_async import console
  console.say("[fedavg] round 3/10 ...", console.PROGRESS)
  console.warn("warning: ...")
  with console.silenced():
    ...                      # nothing printed
"""

from __future__ import annotations

import contextlib
import sys

PROGRESS, INFO, RESULT, WARNING = 10, 20, 30, 40
SILENT = 100

_state = {"threshold": 0, "quiet_threshold": SILENT}


def shown(level: int = INFO) -> bool:
  """Whether a line of ``level`` is printed now."""
  return level >= _state["threshold"]


def say(message: str = "", level: int = INFO, stream=None, end: str = "\n") -> None:
  """``message`` on ``stream`` (default stdout) unless its ``level`` is below the
  threshold (``silenced``)."""
  if shown(level):
    stream = stream or sys.stdout
    stream.write(f"{message}{end}")
    stream.flush()


def err(message: str = "", level: int = INFO, end: str = "\n") -> None:
  """``message`` on stderr (loading and download lines, which keep stdout for results)."""
  say(message, level, sys.stderr, end)


def warn(message: str = "", stream=None) -> None:
  """``message`` on stderr (``stream``) at ``WARNING`` level."""
  say(message, WARNING, stream or sys.stderr)


def quiet_keeps(level: int) -> None:
  """What ``silenced()`` still shows: lines of ``level`` and above (``SILENT``: none,
  the library's default; the CLI's ``--quiet``: ``RESULT``)."""
  _state["quiet_threshold"] = level


@contextlib.contextmanager
def silenced(on: bool = True):
  """While active (and ``on``), only lines at or above ``quiet_keeps``' level (none by
  default) are printed; nested uses keep the strictest."""
  if not on:
    yield
    return
  before = _state["threshold"]
  _state["threshold"] = max(before, _state["quiet_threshold"])
  try:
    yield
  finally:
    _state["threshold"] = before
