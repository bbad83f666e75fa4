"""The progress lines every engine prints: a run's rounds, rates and ETA from its steady
chunks (``Progress``), all algorithms' ETA (``Overall``), a client far outside its round
(``HealthWatch``), and the compilation's own line (``CompileTimer``)."""

from __future__ import annotations

import sys
import time
from typing import Callable, List, Optional

import jax
import numpy as np

from fedjax_async import console
from fedjax_async.core import divergence

# What a rule does with a client's upload however large it is (``HealthWatch``' lines).
UPLOAD_FATES = {
    "pafed": "normalised by PAFed (Alg. 3 line 8): the server does not see it",
    "fedavg": "averaged into the global model at its size",
    "fedprox": "averaged into the global model at its size",
    "fedadmm": "averaged into the global model at its size (Eq. 11)",
    "fednova": "averaged into the global model, divided by its step count (FedNova)",
    "fedasync": "mixed into the global model at its size (weight alpha s(staleness))",
    "fedbuff": "summed into the buffer at its size",
}


class HealthWatch:
  """A console line for each round whose worst client is far outside it
  (``divergence.outlier``: local loss or ||Delta|| over ``divergence.OUTLIER_RATIO`` x the
  round's median, or a non-finite result; on the virtual clock an arrival against the
  last ``divergence.ARRIVAL_WINDOW`` arrivals), naming the client once per kind (an outlier,
  a non-finite result), with what the algorithm does with its upload; at most ``limit``
  lines a run (the rows' health fields hold every round)."""

  def __init__(self, name: str, algorithm: Optional[str] = None, stream=None,
               limit: int = 10):
    self.name, self.algorithm, self.stream, self.limit = name, algorithm or name, stream, limit
    self.named, self.lines = set(), 0
    self.tail: List[dict] = []  # the virtual clock's last arrivals (their medians)

  def fate(self, row: dict, kind: str) -> str:
    if kind == "nonfinite" and row.get("dropped_nonfinite"):
      what = "dropped by the server (drop_nonfinite_uploads): its state is kept"
    elif kind == "nonfinite":
      what = ("taken in by the server: the global model is "
              f"{'not finite' if row.get('nonfinite') else 'still finite'}")
    else:
      what = UPLOAD_FATES.get(self.algorithm, "taken in by the server")
    state = row.get("worst_client_state_norm")
    if state is not None and not (kind == "nonfinite" and row.get("dropped_nonfinite")):
      what += f"; its dual now holds ||y|| = {float(state):.4g}"
    return what

  def __call__(self, rows: List[dict]):
    if rows and "event" in rows[0]:  # the virtual clock's arrivals, one client each
      rows, self.tail = (divergence.arrival_health(rows, self.tail),
                         (self.tail + list(rows))[-divergence.ARRIVAL_WINDOW:])
    for r in rows:
      kind = divergence.outlier(r)
      if kind is None or (r["worst_client"], kind) in self.named or self.lines > self.limit:
        continue
      self.named.add((r["worst_client"], kind))
      self.lines += 1
      if self.lines > self.limit:
        fields = ("client_loss_max, delta_norm_max and worst_client" if "round" in r else
                  "train_loss and delta_norm")
        console.say(f"[{self.name}] more clients far outside the others: see the rows' "
                    f"{fields}", console.PROGRESS, self.stream)
        continue
      where = f"round {r['round']}" if "round" in r else f"group {r.get('group')}"
      scope = ("the round" if "round" in r else
               f"the arrivals before it (the last {divergence.ARRIVAL_WINDOW})")
      what = ("a non-finite result" if kind == "nonfinite" else
              f"far outside {scope} (median loss {r['client_loss_median']:.4g}, median "
              f"||Delta|| {r['delta_norm_median']:.4g})")
      console.say(f"[{self.name}] {where}: {divergence.describe(r, dual=False)}: {what}; "
                  f"{self.fate(r, kind)}", console.PROGRESS, self.stream)

class Overall:
  """The rounds still to run over the algorithms of one invocation, for an ETA over all of
  them: the current run's ETA, plus the later runs' rounds at the current run's steady
  seconds per round, plus for each later run the start-up (compilation, first chunk) that
  the runs so far took beyond their steady rounds."""

  def __init__(self, count: int, rounds: int):
    self.count, self.rounds, self.left = count, rounds, count * rounds
    self.startups: List[float] = []

  def skip(self, rounds: int):
    """Rounds a resumed run does not run again."""
    self.left -= rounds

  def advance(self, rounds: int):
    self.left -= rounds

  def startup(self, seconds: float):
    """A run's first chunk took ``seconds`` more than its rounds at the steady rate."""
    self.startups.append(max(seconds, 0.0))

  def eta(self, current_eta: float, current_left: int, per_round: float) -> float:
    later = max(self.left - current_left, 0)
    startup = sum(self.startups) / len(self.startups) if self.startups else 0.0
    return current_eta + later * per_round + -(-later // max(self.rounds, 1)) * startup


def log_interval(log_every: int, rounds: int) -> int:
  """Rounds between console lines: ``log_every``, or for 0 about ten lines per run."""
  return log_every if log_every > 0 else max(1, -(-rounds // 10))


class Progress:
  """A console line every ``every`` rounds, at the last round, and for the last round of
  a chunk that comes back ``max_silence`` seconds or more after the previous line:
  accuracy, arrivals, staleness, and on a chunk's last line the steady rounds/s and ETA.

  The first chunk's time holds the compilation, so the rate is measured from the end of
  the first chunk on (remaining rounds x seconds per round of the chunks since); until a
  second chunk is back the line says "ETA after the first steady chunk". With
  ``position`` = (i, n), i.e. algorithm i of n in one invocation, the lines say so and,
  with ``overall``, the ETA of all n runs follows this run's. ``health``: a
  ``HealthWatch`` that ``loop.HostLoop`` calls first with every chunk's rows (before the
  divergence check: the blow-up that led to it is said). ``clock``: the time in
  seconds (tests pass a fake one)."""

  MAX_SILENCE = 10.0  # seconds without a line before one from inside a chunk

  def __init__(self, name: str, total: int, start: int = 0, stream=None,
               position: Optional[tuple] = None, overall: Optional[Overall] = None,
               every: int = 1, max_silence: Optional[float] = None,
               clock: Optional[Callable[[], float]] = None,
               health: Optional[HealthWatch] = None):
    self.name, self.total, self.stream = name, total, stream
    self.health = health
    self.clock = clock or time.perf_counter
    self.t0, self.start = self.clock(), start
    self.position, self.overall = position, overall
    self.last = start
    self.every = max(1, int(every))
    self.max_silence = self.MAX_SILENCE if max_silence is None else max_silence
    self.last_line = self.t0
    self.steady = None  # (time, rounds done) when the first chunk came back
    self.first_chunk = None  # (seconds, rounds) of the first chunk

  def _print(self, line: str):
    console.say(line, console.PROGRESS, self.stream)

  def per_round(self, done: int, now: float) -> Optional[float]:
    """Seconds per round over the chunks after the first; None before one is back."""
    if self.steady is None or done <= self.steady[1]:
      return None
    return (now - self.steady[0]) / (done - self.steady[1])

  def tick(self, rounds_done):
    """From inside a compiled chunk (``EngineConfig.progress``): a line when none came for
    ``max_silence`` seconds, so a long chunk of rounds shows that it runs. It names the
    chunk's first round, as its rounds' own lines follow when the chunk returns."""
    now = self.clock()
    if now - self.last_line < self.max_silence:
      return
    done = int(rounds_done)
    spr = self.per_round(done, now)
    eta = (f" | {1 / max(spr, 1e-9):.2f} rounds/s ETA {(self.total - done) * spr:.0f}s"
           if spr is not None else "")
    self._print(f"[{self.name}] compiled chunk from round {self.last + 1} running: "
                f"{done - self.last} of its rounds done{eta}")
    (self.stream or sys.stdout).flush()
    self.last_line = now

  def _timing(self, done: int, now: float) -> str:
    """`` | r rounds/s ETA s`` (and all algorithms' ETA), or the wait for a steady chunk."""
    if self.steady is None:  # the first chunk (with the compilation) is back
      self.steady, self.first_chunk = (now, done), (now - self.t0, done - self.start)
    spr = self.per_round(done, now)
    if spr is None:
      return " | ETA after the first steady chunk" if done < self.total else ""
    eta = (self.total - done) * spr
    tail = ""
    if self.overall is not None and self.overall.count > 1:
      if self.first_chunk is not None:  # once per run: its start-up beyond steady rounds
        self.overall.startup(self.first_chunk[0] - self.first_chunk[1] * spr)
        self.first_chunk = None
      tail = (f", all {self.overall.count} algorithms "
              f"{self.overall.eta(eta, self.total - done, spr):.0f}s")
    return f" | {1 / max(spr, 1e-9):.2f} rounds/s ETA {eta:.0f}s{tail}"

  def __call__(self, rows: List[dict]):
    """The lines of a chunk's rows (one per round, in order, after the rounds so far)."""
    now = self.clock()
    first, done = self.last + 1, self.last + len(rows)
    where = ""
    if self.position is not None and self.position[1] > 1:
      where = f" algorithm {self.position[0]}/{self.position[1]}"
    if self.overall is not None:
      self.overall.advance(done - self.last)
    self.last = done
    timing = self._timing(done, now)
    due = [(first + i, r) for i, r in enumerate(rows)
           if (first + i) % self.every == 0 or first + i == self.total or (
               i == len(rows) - 1 and now - self.last_line >= self.max_silence)]
    for i, (t, r) in enumerate(due):
      acc = "  -   " if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
      # The rate and ETA on the chunk's last line: its earlier rounds were not timed.
      self._print(f"[{self.name}]{where} round {t:4d}/{self.total} acc {acc} "
                  f"train_loss {r['train_loss']:.4f} online {r['online']} delayed "
                  f"{r['delayed']} dropped {r['dropped']} staleness "
                  f"{r['mean_staleness']:.2f}{timing if i == len(due) - 1 else ''}")
      self.last_line = now
    (self.stream or sys.stdout).flush()


class CompileTimer:
  """``runner`` (a jitted chunk) compiled ahead of its first call for each new argument
  shape, saying so: the first chunk of a run is mostly compilation and would otherwise be
  silent for seconds to minutes. The compiled program is the one ``jit`` would run."""

  def __init__(self, runner, name: str, stream=None):
    self.runner, self.name, self.stream = runner, name, stream
    self.compiled = getattr(runner, "compiled", {})  # shared by a kept runner's runs

  def __call__(self, *args):
    key = jax.tree_util.tree_structure(args), tuple(
        (np.shape(x), str(getattr(x, "dtype", type(x))), getattr(x, "sharding", None))
        for x in jax.tree_util.tree_leaves(args))
    fn = self.compiled.get(key)
    if fn is None:
      rounds = np.shape(args[2])[0]  # the chunk's eval schedule: one entry per round
      console.say(f"[{self.name}] compiling the round program ({rounds} rounds per call) ...",
                  console.PROGRESS, self.stream)
      t0 = time.perf_counter()
      fn = self.compiled[key] = self.runner.lower(*args).compile()
      console.say(f"[{self.name}] compiled in {time.perf_counter() - t0:.1f} s",
                  console.PROGRESS, self.stream)
    getattr(self.runner, "activate", lambda: None)()
    return fn(*args)

