"""The round timeline: who is sampled, who is delayed, and when each update arrives.

Asynchrony is kept separate from aggregation (as FLSim and FedScale do): which clients are
sampled in round t, which of them are delayed by how many rounds, and when their updates
reach the server do not depend on the model, so the whole timeline is drawn up front on the
host from its own seed. The jitted round step then only *consumes* it: arrival slots
``[T, K]`` (padded to the largest round), each naming a client and the round it was
dispatched in (its starting model is gathered from the ring buffer by that round).

Round model (PAFed, Table III): each round samples sigma * N clients among those not still
busy with an earlier dispatch; a fraction delta of them are delayed: each trains from the
global model of its dispatch round and its update arrives D rounds later, D drawn per
update from ``fixed`` (D = k), ``uniform`` on {1..Dmax} or ``geometric`` with mean m.
Online clients report in the round they were sampled. A delayed client is not sampled
again until its update has arrived. An update whose staleness exceeds what the ring buffer
of R past models holds (staleness > R - 1) is dropped and counted in its arrival round
(``dropped_warning`` says so before a run).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import numpy as np

from fedjax_async.flatkeys import check, check_part_types, option

DELAY_DISTRIBUTIONS = ("fixed", "uniform", "geometric")


@dataclasses.dataclass(frozen=True)
class DelayConfig:
  """Which sampled clients are delayed, and by how many rounds (``RunConfig.delay``)."""
  fraction: float = option(0.3, "delta, fraction of sampled clients that are delayed.",
                           flag="delay_fraction")
  distribution: str = option("uniform", "fixed | uniform | geometric.",
                             flag="delay_distribution", choices=DELAY_DISTRIBUTIONS)
  max_delay: int = option(3, "Dmax (uniform) or k (fixed), rounds.")
  mean: float = option(2.0, "Mean delay for geometric delays, rounds.",  # support 1, 2, ...
                       flag="delay_mean")
  buffer_size: int = option(0, "R, past global models kept (0: Dmax + 1).")
  train_dropped: bool = option(
      False, "A delayed update older than the ring buffer: False drops it whole (its client "
      "never trains, its ADMM dual never moves); True trains the client in its dispatch "
      "round (state and dual step kept) and loses only its upload.")

  def __post_init__(self):  # built alone or in RunConfig: the errors name delay.<field>
    check_part_types(self, "delay")
    check(0.0 <= self.fraction <= 1.0, "delay.fraction",
          f"must be in [0, 1], got {self.fraction}")
    check(self.distribution in DELAY_DISTRIBUTIONS, "delay.distribution",
          f"must be one of {DELAY_DISTRIBUTIONS}, got {self.distribution!r}")
    check(self.max_delay >= 1, "delay.max_delay", f"must be >= 1, got {self.max_delay}")
    check(self.distribution != "geometric" or self.mean >= 1.0, "delay.mean",
          f"must be >= 1 for geometric delays, got {self.mean}")
    check(self.buffer_size >= 0, "delay.buffer_size",
          f"must be >= 0, got {self.buffer_size}")

  @property
  def ring_size(self) -> int:
    """R: the default keeps every model a fixed/uniform delay can need (Dmax + 1)."""
    if self.buffer_size:
      return self.buffer_size
    if self.distribution == "geometric":
      return int(np.ceil(4 * self.mean)) + 1  # holds > 98% of geometric delays
    return self.max_delay + 1

  def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
    if self.distribution == "fixed":
      return np.full(size, self.max_delay, np.int64)
    if self.distribution == "uniform":
      return rng.integers(1, self.max_delay + 1, size)
    return rng.geometric(1.0 / self.mean, size)


class Timeline(NamedTuple):
  """Arrival slots of every round, padded to K = the most arrivals in any round."""

  client: np.ndarray  # int32 [T, K]; num_clients in padding slots
  dispatch: np.ndarray  # int32 [T, K]; the round whose global model the client trained from
  online: np.ndarray  # bool [T, K]; dispatched this round (staleness 0)
  valid: np.ndarray  # bool [T, K]
  dropped: np.ndarray  # int32 [T]; updates arriving this round but older than the buffer
  sampled: np.ndarray  # int32 [T]; clients sampled (dispatched) this round
  in_flight_at_end: int  # delayed updates still travelling after the last round
  # bool [T, K]; a client that trains in this round (its dispatch round) but whose upload
  # is lost (dropped, DelayConfig.train_dropped): not valid, it never reaches the server
  lost: Optional[np.ndarray] = None

  @property
  def num_rounds(self) -> int:
    return self.client.shape[0]

  def staleness(self) -> np.ndarray:
    return np.arange(self.num_rounds)[:, None] - self.dispatch

  def slice(self, start: int, stop: int) -> dict:
    """The per-round arrays for rounds [start, stop), as the round step consumes them."""
    lost = (np.zeros_like(self.valid) if self.lost is None else self.lost)[start:stop]
    return {"client": self.client[start:stop], "dispatch": self.dispatch[start:stop],
            "online": self.online[start:stop], "valid": self.valid[start:stop],
            "dropped": self.dropped[start:stop], "lost": lost}


def build(num_clients: int, num_rounds: int, participation: float, delay: DelayConfig,
          seed: int, min_slots: int = 1) -> Timeline:
  """Draws the round timeline (host side, deterministic from ``seed``).

  Args:
    num_clients: N.
    num_rounds: the rounds.
    participation: the fraction of the clients sampled each round.
    delay: the delay law (``DelayConfig``).
    seed: the draws' seed.
    min_slots: the fewest slots K a round has.
  """
  if num_clients < 1:
    raise ValueError(f"data.num_clients must be >= 1, got {num_clients}")
  if not 0.0 < participation <= 1.0:
    raise ValueError(f"run.participation must be in (0, 1], got {participation}")
  if num_rounds < 1:
    raise ValueError(f"run.rounds must be >= 1, got {num_rounds}")
  rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7173]))
  per_round = max(1, int(round(participation * num_clients)))
  ring = delay.ring_size
  free_from = np.zeros(num_clients, np.int64)  # first round a client may be sampled again
  arrivals = [[] for _ in range(num_rounds)]  # (client, dispatch round, online, lost)
  dropped = np.zeros(num_rounds, np.int32)
  sampled_count = np.zeros(num_rounds, np.int32)
  in_flight_at_end = 0
  for t in range(num_rounds):
    available = np.flatnonzero(free_from <= t)
    chosen = rng.choice(available, size=min(per_round, available.size), replace=False)
    sampled_count[t] = chosen.size
    num_delayed = int(round(delay.fraction * chosen.size))
    is_delayed = np.zeros(chosen.size, bool)
    is_delayed[rng.choice(chosen.size, size=num_delayed, replace=False)] = True
    delays = delay.draw(rng, num_delayed)
    for c in chosen[~is_delayed]:
      arrivals[t].append((c, t, True, False))
      free_from[c] = t + 1
    for c, d in zip(chosen[is_delayed], delays):
      arrive = t + int(d)
      free_from[c] = arrive + 1
      if arrive >= num_rounds:
        in_flight_at_end += 1
      elif d > ring - 1:  # its dispatch model has left the ring buffer
        dropped[arrive] += 1
        if delay.train_dropped:  # trains now, from w^t; its upload never arrives
          arrivals[t].append((c, t, False, True))
      else:
        arrivals[arrive].append((c, t, False, False))
  k = max(min_slots, max(len(a) for a in arrivals))
  client = np.full((num_rounds, k), num_clients, np.int32)
  dispatch = np.zeros((num_rounds, k), np.int32)
  online = np.zeros((num_rounds, k), bool)
  valid = np.zeros((num_rounds, k), bool)
  lost = np.zeros((num_rounds, k), bool)
  for t, slots in enumerate(arrivals):
    # online first, then by dispatch; the lost ones last
    slots.sort(key=lambda s: (s[3], not s[2], s[1], s[0]))
    for j, (c, d, on, gone) in enumerate(slots):
      client[t, j], dispatch[t, j], online[t, j] = c, d, on
      valid[t, j], lost[t, j] = not gone, gone
    dispatch[t, len(slots):] = t
  return Timeline(client, dispatch, online, valid, dropped, sampled_count, in_flight_at_end,
                  lost)


def delayed_only_rounds(tl: Timeline) -> np.ndarray:
  """The rounds in which delayed updates arrive but no online one: PAFed's DUCC has no
  online mean m to classify them against there (Alg. 4 line 3 divides by |C_o| = 0)."""
  valid = tl.valid.astype(bool)
  online = (valid & tl.online).any(axis=1)
  delayed = (valid & ~tl.online).any(axis=1)
  return np.flatnonzero(delayed & ~online)


def delayed_only_warning(tl: Timeline) -> Optional[str]:
  """A warning line for PAFed when some rounds have delayed updates and no online one
  (``delayed_only_rounds``), else None."""
  rounds = delayed_only_rounds(tl)
  if not len(rounds):
    return None
  lost = int((tl.valid & ~tl.online)[rounds].sum())
  shown = ", ".join(str(int(r)) for r in rounds[:5]) + (", ..." if len(rounds) > 5 else "")
  return (f"warning: pafed: {len(rounds)} of {tl.num_rounds} rounds (round {shown}) receive "
          f"delayed updates but no online one; DUCC has no online mean to classify them "
          f"against (Alg. 4 line 3), so those rounds leave the model unchanged and "
          f"{lost} delayed updates go unused; raise run.participation or lower "
          f"delay.fraction")


def dropped_warning(delay: DelayConfig, tl: Timeline) -> Optional[str]:
  """A warning line when the ring buffer of ``delay.ring_size`` past models is too short
  for the delays drawn (their updates are dropped), else None. Dropping stale updates is a
  legitimate setting (a bounded-staleness server), so this warns rather than refuses."""
  if delay.fraction <= 0:
    return None
  ring = delay.ring_size
  dropped = int(tl.dropped.sum())
  arrived = int((tl.valid & ~tl.online).sum())  # delayed updates that reached the server
  total = dropped + arrived
  buffer = (f"delay.buffer_size={delay.buffer_size} keeps {ring} past global models"
            if delay.buffer_size else f"delay.buffer_size=0 (auto) keeps {ring} past global models")
  clients = ("; their clients still train (delay.train_dropped)" if delay.train_dropped else
             "; their clients never train, so their ADMM duals do not move (delay.train_dropped "
             "trains them and loses only the upload)")
  if delay.distribution in ("fixed", "uniform") and ring < delay.max_delay + 1:
    law = ("every delayed update is" if delay.distribution == "fixed"
           else f"delays of {ring}..{delay.max_delay} rounds are")
    return (f"warning: {buffer} but delay.max_delay={delay.max_delay} needs "
            f"{delay.max_delay + 1}: {law} dropped ({dropped} of the {total} delayed "
            f"updates that arrive within run.rounds){clients}; set delay.buffer_size >= "
            f"{delay.max_delay + 1} (or 0) to keep them")
  if dropped:
    return (f"warning: {buffer} (staleness <= {ring - 1}); the timeline drops {dropped} of "
            f"the {total} delayed updates that arrive within run.rounds (delay.distribution="
            f"{delay.distribution}, delay.mean={delay.mean}){clients}; raise delay.buffer_size "
            f"to keep them")
  return None
