"""SIGINT / SIGTERM as an exception at a safe place, for the drivers that save their work.

Within ``handle_interrupts()`` SIGTERM (kill, a batch system's time limit) and SIGINT
(Ctrl-C) raise ``Interrupted``, which the drivers turn into one line naming what was kept
and exit status 130 / 143. Within ``deferred()`` (a checkpoint being written) a signal is
only recorded, and raised when the block ends: raised in the middle of orbax's save it
left the checkpoint of that round unwritten and orbax's worker threads printing tracebacks
while the interpreter shut down.

Whose SIGINT it is: within ``handle_interrupts()`` the run's handler replaces whatever
Python-level handler SIGINT had (Python's own, or one a notebook or a library installed),
and that one is restored when the block ends, so Ctrl-C always reaches the run; an ignored
SIGINT (a script's background job, ``nohup`` from a script: the launcher's choice) stays
ignored, and the first block says so once on a terminal. A handler installed outside
Python cannot be restored, so it is left in place, also said once. SIGTERM is always the
run's. Tests that send a signal set the disposition they need themselves.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import List, Optional

from fedjax_async import console


class Interrupted(KeyboardInterrupt):
  """SIGINT (Ctrl-C) or SIGTERM during a run; ``str`` says where the run stopped and how
  to continue it, ``exit_code`` is 128 + the signal's number (130, 143)."""

  def __init__(self, message: str = "", signum: int = signal.SIGINT):
    super().__init__(message)
    self.signum = int(signum)

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


# Signals received by the handler: an exception raised in a garbage-collector callback or
# a __del__ is printed and dropped by Python, and one that arrives within ``deferred()``
# waits for its end, so the drivers also check this list at every chunk boundary.
_signals_received: List[int] = []
_defer_depth = [0]
_graceful: List[Optional[str]] = [None]  # within graceful(): the first signal's notice
_handling = [0]  # depth of handle_interrupts() blocks (the outermost one installs)
_said: set = set()  # the notes on SIGINT's disposition already printed (once a process)


def _raise_interrupted(signum, frame):  # pylint: disable=unused-argument
  _signals_received.append(signum)
  if _defer_depth[0]:
    return
  if _graceful[0] is not None and len(_signals_received) == 1:
    if _graceful[0]:
      console.warn(_graceful[0])
    return
  raise Interrupted("", signum)


def record(signum: int):
  """Records ``signum`` as received here (another process of the run received it): the
  drivers then stop at their next safe point as if it had arrived here."""
  _signals_received.append(int(signum))


def pending() -> bool:
  """A signal was received and not raised yet (within ``graceful()`` or ``deferred()``)."""
  return bool(_signals_received)


@contextlib.contextmanager
def graceful(notice: str):
  """A block whose first signal is only recorded (and ``notice`` printed, unless empty):
  the caller stops at its next safe point (``pending()``), saving the state it holds
  there; a second signal raises ``Interrupted`` at once. Nested, the outer notice stays."""
  previous = _graceful[0]
  _graceful[0] = notice if previous is None else previous
  try:
    yield
  finally:
    _graceful[0] = previous


def check_interrupted():
  """Raises the Interrupted of a signal received but not raised yet (dropped by Python,
  or received within ``deferred()``)."""
  if _signals_received:
    raise Interrupted("", _signals_received[-1])


@contextlib.contextmanager
def deferred():
  """A block that a signal does not interrupt: one received within it is raised as
  ``Interrupted`` when the block ends (unless it ends with an exception of its own)."""
  _defer_depth[0] += 1
  try:
    yield
  finally:
    _defer_depth[0] -= 1
  if not _defer_depth[0]:
    check_interrupted()


class handle_interrupts:  # pylint: disable=invalid-name
  """Within it SIGTERM and SIGINT raise ``Interrupted`` (SIGINT's rule: the module's
  docstring), and Python's note on a KeyboardInterrupt it had to drop (in a gc callback)
  is not printed. Nested blocks, and blocks outside the main thread (where no handler can
  be installed), change nothing."""

  def __enter__(self):
    self.active = (not _handling[0]
                   and threading.current_thread() is threading.main_thread())
    _handling[0] += 1
    if not self.active:
      return self
    del _signals_received[:]
    # SIGINT and SIGTERM unblocked within the block (a blocked one never reaches the
    # handler), the caller's mask restored after it.
    self.mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    self.previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      if sig == signal.SIGINT and not _takes_sigint():
        continue
      self.previous[sig] = signal.signal(sig, _raise_interrupted)
    self.unraisablehook = sys.unraisablehook
    sys.unraisablehook = lambda u: (None if isinstance(u.exc_value, KeyboardInterrupt)
                                    else self.unraisablehook(u))
    return self

  def __exit__(self, *exc):
    _handling[0] -= 1
    if not self.active:
      return
    del _signals_received[:]  # handled or not, no later check_interrupted raises them
    for sig, handler in self.previous.items():
      signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    sys.unraisablehook = self.unraisablehook
    signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _takes_sigint() -> bool:
  """Whether ``handle_interrupts`` installs its SIGINT handler (the module's rule); an
  ignored SIGINT, or a handler installed outside Python, is said once on a terminal."""
  current = signal.getsignal(signal.SIGINT)
  if current is signal.SIG_IGN:
    _say_once("ignored", "note: SIGINT is ignored in this process (started in the "
              "background by a script?): Ctrl-C does not stop the run; SIGTERM (kill PID) "
              "stops it as Ctrl-C would")
    return False
  if current is None:
    _say_once("foreign", "note: SIGINT has a handler installed outside Python, left in "
              "place: Ctrl-C is answered by it; SIGTERM (kill PID) stops the run as "
              "Ctrl-C would")
    return False
  return True


def _say_once(key: str, note: str):
  """``note`` on stderr once a process, when stderr is a terminal (the console)."""
  if key in _said:
    return
  _said.add(key)
  if getattr(sys.stderr, "isatty", lambda: False)():
    console.warn(note)


def exit_on_interrupt(fn, how: str):
  """``fn()``; SIGINT (Ctrl-C) or SIGTERM during it prints one line, ``interrupted
  (SIGINT): <how>`` (``how``: what was kept and how to continue), and exits with status
  130 / 143 instead of a traceback. For the drivers other than run.py's round engine
  (sweeps, the Table V driver, the virtual clock, FedEDS)."""
  try:
    with handle_interrupts():
      return fn()
  except KeyboardInterrupt as e:
    signum = getattr(e, "signum", signal.SIGINT)
    console.warn(f"interrupted ({signal.Signals(signum).name}): {how}")
    sys.exit(128 + signum)
