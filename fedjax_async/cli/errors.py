"""Whose fault an error is, as the command line says it (every driver's main):

* a configuration error, one line ``error: <message>`` (its fields named by their flags):
  an exception of a class the project defines (``config.ConfigError``,
  ``sweep.SetupError``, ``checkpoint.CheckpointError``, ``integrity.DamagedFile``,
  ``download.DownloadError``, ...; a divergence: ``error: diverged: ...``), a ValueError,
  RuntimeError or OSError that a ``raise`` statement of the project's own code raised (its
  checks, under ``fedjax_async/``, ``experiments/`` and ``benchmarks/``), and an OSError
  the system reports (an errno or a file name: missing, unwritable, disk full);
* anything else, an internal error: ``internal error: <Type>: <message> (at
  <file>:<line> in <function>; rerun with --traceback ...)``, the innermost frame of its
  traceback: another type (TypeError, KeyError, ...), or a ValueError / RuntimeError
  raised inside JAX, numpy, optax or your own modules (``--import_modules``).

Both exit with status 1; ``--traceback`` or ``FEDJAX_ASYNC_TRACEBACK=1`` prints the whole
traceback first.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Callable

from absl import flags

from fedjax_async.cli import help as help_lib
from fedjax_async.core import divergence

TRACEBACK_ENV = "FEDJAX_ASYNC_TRACEBACK"
# The checkout: the folders whose ``raise`` statements are the project's checks.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OWN_FOLDERS = tuple(os.path.join(_ROOT, d) + os.sep
                    for d in ("fedjax_async", "experiments", "benchmarks"))


def define_traceback_flag():
  """``--traceback`` (once, whichever driver defines its flags first)."""
  if "traceback" not in flags.FLAGS:
    flags.DEFINE_boolean("traceback", False, f"Print an error's traceback (or "
                         f"{TRACEBACK_ENV}=1).")
    help_lib.GROUPS["traceback"] = "output"


def wants_traceback() -> bool:
  """``--traceback`` given, or ``FEDJAX_ASYNC_TRACEBACK`` set to anything but 0 / ''."""
  if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
    return True
  fv = flags.FLAGS
  return "traceback" in fv and fv.is_parsed() and bool(fv.traceback)


def _own_code(filename: str) -> bool:
  return os.path.abspath(filename).startswith(_OWN_FOLDERS)


def is_user_error(e: BaseException) -> bool:
  """``e`` is a configuration error (the module docstring's rule)."""
  if type(e).__module__.split(".")[0] == "fedjax_async":
    return True
  if isinstance(e, OSError) and (e.filename is not None or e.errno is not None):
    return True  # the system's own report: a file, the disk, the network
  if type(e) not in (ValueError, RuntimeError) and not isinstance(e, OSError):
    return False
  frames = traceback.extract_tb(e.__traceback__)
  return bool(frames) and _own_code(frames[-1].filename) and (
      (frames[-1].line or "").startswith("raise"))


def _shown(filename: str) -> str:
  """``filename`` relative to the installed packages' folder holding it, else to the
  checkout, else to the ``sys.path`` entry holding it."""
  path = os.path.abspath(filename)
  entries = sorted((os.path.abspath(p) for p in sys.path if p), key=len, reverse=True)
  packages = [p for p in entries if os.path.basename(p) in ("site-packages", "dist-packages")]
  for base in packages + [_ROOT] + entries:
    if path.startswith(base + os.sep):
      return os.path.relpath(path, base)
  return filename


def message(e: BaseException, name_fields: Callable[[str], str] = str) -> str:
  """The one line the command line prints for ``e`` (``name_fields``: a configuration
  error's fields as flags, ``run_flags.as_flags``)."""
  if isinstance(e, divergence.Diverged):
    return f"error: diverged: {name_fields(str(e))}"
  if is_user_error(e):
    return f"error: {name_fields(str(e))}"
  frames = traceback.extract_tb(e.__traceback__)
  where = (f"at {_shown(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}; "
           if frames else "")
  return (f"internal error: {type(e).__name__}: {e} ({where}rerun with --traceback or "
          f"{TRACEBACK_ENV}=1 for the whole traceback)")


@contextlib.contextmanager
def reported(name_fields: Callable[[str], str] = str):
  """Any exception of the block (not Ctrl-C, not ``sys.exit``) as ``message``'s line on
  stderr, exit status 1; the whole traceback before it with ``wants_traceback``."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if wants_traceback():
      traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    raise SystemExit(message(e, name_fields)) from None
