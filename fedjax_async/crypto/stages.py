"""A round's timers and wire accounting, around the protocol (both designs' steps).

``Stages`` is handed to a step: it carries each message between two parties (through a
``wire.Wire``, counted, or as the objects themselves), times the round's stages on the
step's clock (``STAGES``, and the sub-stages S1's answers add to S0's own breakdown), and
makes the step's ``StepResult``: the new model, the stages' seconds, the per-stage
breakdown, the wire's bytes per link and the recipients' models.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np

# A round's stages, as a step's timings (seconds) have them, in order.
STAGES = ("client_encrypt", "ducc", "key_transform", "decrypt")
# The clients' stages: ``server_wall_s`` is the round's wall time but theirs.
CLIENT_STAGES = ("client_encrypt", "decrypt")


class StepResult(NamedTuple):
  """One protocol round: ``w`` is w^{tau+1} as client 0 decrypts it; ``timings`` the
  ``STAGES``' seconds; ``breakdown`` seconds per stage and sub-stage (S0's phases, S1's
  answers, ``wire_s`` the messages' (de)serialisation, ``workers_cpu_s`` the pools');
  ``wire_bytes`` the bytes per link (``wire.Wire.links``; None without a wire);
  ``client_models`` {client i: Enc_pk_i(w^{tau+1}) chunks} from the key transformation."""

  w: np.ndarray
  timings: Dict[str, float]
  breakdown: Dict[str, float]
  wire_bytes: Optional[Dict[str, int]]
  client_models: Dict[int, List[object]]


class Stages:
  """The round's timers on ``clock`` and its messages through ``wire`` (reset here; None:
  passed as objects). ``server_wall``: the breakdown also has ``server_wall_s``, the
  wall time since this was made but the clients' stages'."""

  def __init__(self, wire, clock: Callable[[], float], server_wall: bool = False):
    self.wire, self.clock, self.server_wall = wire, clock, server_wall
    if wire is not None:
      wire.reset()
    self.seconds: Dict[str, float] = {}
    self.extra: Dict[str, float] = {}
    self._wall0, self._client_wall = time.perf_counter(), 0.0

  def send(self, sender: str, receiver: str, message, deliver: bool = True):
    """A message between two parties: as bytes through the wire (counted), or the objects
    themselves without one."""
    return message if self.wire is None else self.wire.send(sender, receiver, message,
                                                            deliver)

  def add(self, stage: str, seconds: float):
    self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

  @contextlib.contextmanager
  def timed(self, *stages: str):
    """Adds the block's seconds to each of ``stages`` (a client stage's wall time is kept
    out of ``server_wall_s``)."""
    t, tw = self.clock(), time.perf_counter()
    yield
    dt = self.clock() - t
    if any(s in CLIENT_STAGES for s in stages):
      self._client_wall += time.perf_counter() - tw
    for s in stages:
      self.add(s, dt)

  def note(self, key: str, value: float):
    """A figure of the breakdown besides the clock's (``workers_cpu_s``)."""
    self.extra[key] = float(value)

  def result(self, w: np.ndarray, s0_timings: Dict[str, float],
             client_models: Dict[int, List[object]]) -> StepResult:
    """The round's ``StepResult``: S0's own phases' seconds (``s0_timings``) with the
    stages' added, then the notes, the server's wall time and the wire's figures."""
    server_wall = time.perf_counter() - self._wall0 - self._client_wall
    breakdown = dict(s0_timings)
    for stage, seconds in self.seconds.items():
      breakdown[stage] = breakdown.get(stage, 0.0) + seconds
    if self.server_wall:
      breakdown["server_wall_s"] = server_wall
    breakdown.update(self.extra)
    links: Optional[Dict[str, int]] = None
    if self.wire is not None:
      breakdown["wire_s"] = float(sum(self.wire.seconds.values()))
      links = self.wire.links()
    timings = {s: self.seconds.get(s, 0.0) for s in STAGES}
    return StepResult(w, timings, breakdown, links, client_models)

