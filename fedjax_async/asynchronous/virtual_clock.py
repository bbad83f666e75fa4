"""Virtual clock of fully asynchronous FL: who finishes when, and at which server version.

Host-side numpy and model-independent (like ``fedjax_async.core.timeline`` for the round
engine): the event order of an asynchronous run does not depend on the model, so it is
drawn up front from its own seed and the jitted engine (``fedjax_async.asynchronous.engine``)
only consumes it.

Clients. Each client i gets a compute speed ``sec_per_example_i`` and a communication time
``comm_i`` drawn once from configurable distributions (``Distribution``: constant, uniform,
exponential, lognormal). A "device class" mix (PrivaAsyncFed Sec. IV-A.3: fast,
medium-fast, medium-slow and slow devices in proportions 3:3:2:2) multiplies both by the
class's slow-down factor; the class index also selects the client's pruning scale
S[p] (PrivaAsyncFed Eq. 10). One task's completion time is (``completion_time``)

    duration_i = examples_i * sec_per_example_i + comm_i,

examples_i = epochs * n_i, or with ``local_steps`` the examples of the task's first
``local_steps`` minibatches of B (``task_examples``).

Server. C clients are in flight at once. All start at time 0 with version 0. When one
finishes, the server receives its update at version v (the number of server updates so
far); FedAsync-type servers apply every arrival (v -> v + 1), FedBuff applies every K-th
(``buffer_k``). The server then immediately dispatches the current model (version after
this arrival) to a client drawn uniformly among the idle ones (seeded), the one just
finished included. Staleness of an arrival = v - dispatch version. An arrival whose
staleness exceeds what a ring buffer of R past models holds (staleness > R - 1) is dropped
(counted; it neither updates the model nor fills FedBuff's buffer). The run stops after
``num_updates`` server updates, or with a ``time_budget`` T before the first arrival
after T (the arrivals at times <= T are those of the run without T: the event loop does
not look ahead); updates still in flight then are counted.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import NamedTuple, Optional, Sequence

import numpy as np

DISTRIBUTIONS = ("constant", "uniform", "exponential", "lognormal")


@dataclasses.dataclass(frozen=True)
class Distribution:
  """A positive random quantity: constant(a), uniform[a, b], exponential(mean a),
  lognormal(median a, log-sd b)."""

  kind: str = "constant"
  a: float = 1.0
  b: float = 0.0

  def __post_init__(self):
    if self.kind not in DISTRIBUTIONS:
      raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {self.kind!r}")
    if self.a < 0 or (self.kind == "uniform" and self.b < self.a):
      raise ValueError(f"bad parameters for {self.kind}: a={self.a}, b={self.b}")

  def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
    if self.kind == "constant":
      return np.full(size, self.a, np.float64)
    if self.kind == "uniform":
      return rng.uniform(self.a, self.b, size)
    if self.kind == "exponential":
      return rng.exponential(self.a, size)
    return self.a * np.exp(self.b * rng.standard_normal(size))

  @classmethod
  def parse(cls, spec: str, flag: str = "distribution") -> "Distribution":
    """'constant:a' | 'uniform:a,b' | 'exponential:mean' | 'lognormal:median,sigma'."""
    kind, _, params = spec.partition(":")
    try:
      vals = [float(v) for v in params.split(",")] if params else []
      return cls(kind, *vals)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{flag}: cannot parse {spec!r} ({e})") from None


@dataclasses.dataclass(frozen=True)
class DeviceClass:
  """A device tier: its share of clients, slow-down factor and pruning-scale index."""

  probability: float
  slowdown: float = 1.0
  scale_index: int = 0


# PrivaAsyncFed Sec. IV-A.3: 3 fast, 3 medium-fast, 2 medium-slow, 2 slow of 10 clients,
# with sub-model scales S = {1, 0.75, 0.5, 0.25} (Eq. 10).
PRIVAASYNCFED_CLASSES = (DeviceClass(0.3, 1.0, 0), DeviceClass(0.3, 2.0, 1),
                         DeviceClass(0.2, 4.0, 2), DeviceClass(0.2, 8.0, 3))


def parse_device_classes(spec: str, flag: str = "clock.device_classes") -> tuple:
  """'p:slowdown[:scale_index],...' e.g. '0.3:1:0,0.3:2:1,0.2:4:2,0.2:8:3'; '' = none.
  Without a scale index, classes get 0, 1, 2, ... in the order given."""
  if not spec:
    return ()
  classes = []
  for i, item in enumerate(spec.split(",")):
    parts = item.split(":")
    try:
      p, slow = float(parts[0]), float(parts[1]) if len(parts) > 1 else 1.0
      idx = int(parts[2]) if len(parts) > 2 else i
    except ValueError:
      raise ValueError(f"{flag}: cannot parse {item!r}") from None
    if p < 0 or slow <= 0 or idx < 0:
      raise ValueError(f"{flag}: need p >= 0, slowdown > 0, scale index >= 0 in {item!r}")
    classes.append(DeviceClass(p, slow, idx))
  if abs(sum(c.probability for c in classes) - 1.0) > 1e-6:
    raise ValueError(f"{flag}: class probabilities must sum to 1, got {spec!r}")
  return tuple(classes)


@dataclasses.dataclass(frozen=True)
class ClockConfig:
  concurrency: int = 2  # C clients in flight
  num_updates: int = 100  # server updates (model versions) to simulate
  buffer_k: int = 1  # K: arrivals per server update (1 = FedAsync family, >1 = FedBuff)
  epochs: int = 1  # local epochs (the work is epochs * n_i examples)
  local_steps: int = 0  # > 0: at most this many minibatches of batch_size per task
  batch_size: int = 1  # B (read only with local_steps)
  compute: Distribution = Distribution("constant", 1e-3)  # seconds per example
  comm: Distribution = Distribution("constant", 0.0)  # seconds per task
  device_classes: tuple = ()  # DeviceClass mix; () = one class
  ring_size: int = 0  # R past models kept; 0 = no drops (R = max staleness + 1)
  pruned_scales: tuple = ()  # S table: a client of scale index p works S[p]^2 as long
  time_budget: float = 0.0  # T > 0: no arrival after virtual time T

  def __post_init__(self):
    if self.concurrency < 1:
      raise ValueError(f"clock.concurrency: must be >= 1, got {self.concurrency}")
    if self.num_updates < 1:
      raise ValueError(f"clock.num_updates: must be >= 1, got {self.num_updates}")
    if self.buffer_k < 1:
      raise ValueError(f"clock.buffer_k: must be >= 1, got {self.buffer_k}")
    if self.epochs < 1:
      raise ValueError(f"local.local_epochs: must be >= 1, got {self.epochs}")
    if self.ring_size < 0:
      raise ValueError(f"clock.ring_size: must be >= 0, got {self.ring_size}")
    if self.local_steps < 0:
      raise ValueError(f"local.local_steps: must be >= 0, got {self.local_steps}")
    if self.batch_size < 1:
      raise ValueError(f"local.batch_size: must be >= 1, got {self.batch_size}")
    if not self.time_budget >= 0:
      raise ValueError(f"clock.time_budget: must be >= 0 (0: none), got {self.time_budget}")


def task_examples(epochs, num_examples, local_steps=0, batch_size=1):
  """Examples one task trains on: epochs * n_i, or with ``local_steps`` S > 0 those of its
  first min(S, epochs * ceil(n_i / B)) minibatches (an epoch's last one holds the rest)."""
  n = np.asarray(num_examples, np.int64)
  if not local_steps:
    return epochs * n
  spe = np.maximum(-(-n // batch_size), 1)
  steps = np.minimum(local_steps, epochs * spe)
  return (steps // spe) * n + np.minimum((steps % spe) * batch_size, n)


def completion_time(epochs, num_examples, sec_per_example, comm, local_steps=0,
                    batch_size=1):
  """Task duration: task_examples * sec_per_example_i + comm_i.

  Args:
    epochs: the task's local epochs.
    num_examples: n_i, the client's examples.
    sec_per_example: the client's seconds per example trained.
    comm: the client's communication seconds per task.
    local_steps: > 0: at most this many minibatch steps.
    batch_size: B, the local minibatch size.
  """
  return (task_examples(epochs, num_examples, local_steps, batch_size)
          * np.asarray(sec_per_example) + np.asarray(comm))


def assign_classes(classes: Sequence[DeviceClass], num_clients: int,
                   rng: np.random.Generator) -> np.ndarray:
  """Class index per client: largest-remainder shares (3/3/2/2 of 10 for 0.3/0.3/0.2/0.2),
  shuffled over clients."""
  probs = np.array([c.probability for c in classes])
  counts = np.floor(probs * num_clients).astype(int)
  rest = num_clients - counts.sum()
  order = np.argsort(-(probs * num_clients - counts), kind="stable")
  counts[order[:rest]] += 1
  labels = np.repeat(np.arange(len(classes)), counts)
  return rng.permutation(labels)


class Clients(NamedTuple):
  sec_per_example: np.ndarray  # float [N]
  comm: np.ndarray  # float [N]
  device_class: np.ndarray  # int [N]
  scale_index: np.ndarray  # int [N]: index into the pruning-scale table
  duration: np.ndarray  # float [N]: one task's completion time


def draw_clients(cfg: ClockConfig, counts: np.ndarray, rng: np.random.Generator) -> Clients:
  n = len(counts)
  spe = cfg.compute.draw(rng, n)
  comm = cfg.comm.draw(rng, n)
  if cfg.device_classes:
    cls = assign_classes(cfg.device_classes, n, rng)
    slow = np.array([c.slowdown for c in cfg.device_classes])[cls]
    scale = np.array([c.scale_index for c in cfg.device_classes])[cls]
    spe, comm = spe * slow, comm * slow
    if cfg.pruned_scales:  # a sub-model has S[p]^2 of the parameters (Eq. 11)
      work = np.asarray(cfg.pruned_scales, np.float64)[scale] ** 2
      spe, comm = spe * work, comm * work
  else:
    cls, scale = np.zeros(n, np.int64), np.zeros(n, np.int64)
  return Clients(spe, comm, cls, scale, completion_time(cfg.epochs, counts, spe, comm,
                                                      cfg.local_steps, cfg.batch_size))


class Schedule(NamedTuple):
  """Every arrival of the run, in arrival order (dropped ones included, flagged)."""

  client: np.ndarray  # int32 [A]
  dispatch_version: np.ndarray  # int32 [A]: version of the model the client trained from
  dispatch_index: np.ndarray  # int32 [A]: global dispatch counter (unique; seeds training)
  arrival_version: np.ndarray  # int32 [A]: server version the update is applied to
  time: np.ndarray  # float [A]: virtual arrival time (seconds)
  dropped: np.ndarray  # bool [A]: staleness > R - 1
  applies: np.ndarray  # bool [A]: this arrival creates version arrival_version + 1
  clients: Clients
  ring_size: int
  num_updates: int
  in_flight_at_end: int
  buffer_k: int
  stopped_at_budget: bool = False  # the run ended at ClockConfig.time_budget
  in_flight: Optional[np.ndarray] = None  # int32: the clients still training at the end

  @property
  def staleness(self) -> np.ndarray:
    return self.arrival_version - self.dispatch_version

  def kept(self) -> np.ndarray:
    return ~self.dropped

  def staleness_histogram(self) -> np.ndarray:
    """Counts of staleness 0, 1, 2, ... over the kept (non-dropped) arrivals."""
    return np.bincount(self.staleness[self.kept()], minlength=1)

  @property
  def end_time(self) -> float:
    return float(self.time[self.applies][-1]) if self.applies.any() else 0.0

  def updates_per_second(self) -> float:
    """Server updates per unit of virtual time."""
    return self.num_updates / max(self.end_time, 1e-12)

  def summary(self) -> dict:
    s = self.staleness[self.kept()]
    return {"arrivals": int(len(self.client)), "dropped": int(self.dropped.sum()),
            "server_updates": self.num_updates, "virtual_time_s": self.end_time,
            "updates_per_virtual_second": self.updates_per_second(),
            "mean_staleness": float(s.mean()) if s.size else 0.0,
            "max_staleness": int(s.max()) if s.size else 0,
            "staleness_histogram": self.staleness_histogram().tolist(),
            "in_flight_at_end": self.in_flight_at_end, "ring_size": self.ring_size}


def draw_schedule(cfg: ClockConfig, counts: Sequence[int], seed: int) -> Schedule:
  """Runs the event loop of the module docstring (deterministic from ``seed``); with a
  time budget ``num_updates`` is the server updates made by then."""
  counts = np.asarray(counts)
  num_clients = len(counts)
  if cfg.concurrency > num_clients:
    raise ValueError(f"clock.concurrency ({cfg.concurrency}) must be <= data.num_clients "
                     f"({num_clients})")
  rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA5C]))
  clients = draw_clients(cfg, counts, rng)
  ring = cfg.ring_size if cfg.ring_size else np.iinfo(np.int32).max
  idle = np.ones(num_clients, bool)
  heap = []  # (finish time, dispatch index, client, dispatch version)
  dispatches = 0

  def dispatch(now, version):
    nonlocal dispatches
    c = int(rng.choice(np.flatnonzero(idle)))
    idle[c] = False
    heapq.heappush(heap, (now + clients.duration[c], dispatches, c, version))
    dispatches += 1

  for _ in range(cfg.concurrency):
    dispatch(0.0, 0)
  rows = []  # (client, dispatch version, dispatch index, arrival version, time, dropped, applies)
  version, buffered, stopped = 0, 0, False
  while version < cfg.num_updates:
    if cfg.time_budget and heap[0][0] > cfg.time_budget:  # the next arrival is after T
      stopped = True
      break
    now, index, c, v0 = heapq.heappop(heap)
    idle[c] = True
    dropped = version - v0 > ring - 1
    applies = False
    if not dropped:
      buffered += 1
      if buffered == cfg.buffer_k:
        applies, buffered = True, 0
    rows.append((c, v0, index, version, now, dropped, applies))
    version += int(applies)
    dispatch(now, version)
  if not rows:
    raise ValueError(f"clock.time_budget: {cfg.time_budget:g} s ends before the first "
                     f"arrival (at {heap[0][0]:.4g} s)")
  a = np.array(rows, dtype=object).reshape(-1, 7)
  staleness = (a[:, 3] - a[:, 1]).astype(np.int64)
  max_kept = int(staleness[~a[:, 5].astype(bool)].max())
  return Schedule(
      client=a[:, 0].astype(np.int32), dispatch_version=a[:, 1].astype(np.int32),
      dispatch_index=a[:, 2].astype(np.int32), arrival_version=a[:, 3].astype(np.int32),
      time=a[:, 4].astype(np.float64), dropped=a[:, 5].astype(bool),
      applies=a[:, 6].astype(bool), clients=clients,
      ring_size=cfg.ring_size if cfg.ring_size else max_kept + 1,
      num_updates=version, in_flight_at_end=len(heap), buffer_k=cfg.buffer_k,
      stopped_at_budget=stopped, in_flight=np.array([h[2] for h in heap], np.int32))


def group(schedule: Schedule, max_group: int) -> np.ndarray:
  """Splits the kept arrivals into groups that can train in one vmap (async_engine).

  Greedy, in arrival order: a group starts at arrival i with v0 = its arrival version
  (the server version when the group starts) and takes the following kept arrivals while
  each was dispatched at a version <= v0 (its start model already exists) and the group
  has fewer than ``max_group`` members. Returns ``[num_groups, max_group]`` event indices
  into the schedule, -1 for padding.
  """
  kept = np.flatnonzero(schedule.kept())
  groups, cur, v0 = [], [], None
  for i in kept:
    if cur and (schedule.dispatch_version[i] > v0 or len(cur) == max_group):
      groups.append(cur)
      cur = []
    if not cur:
      v0 = schedule.arrival_version[i]
    cur.append(i)
  if cur:
    groups.append(cur)
  out = np.full((len(groups), max_group), -1, np.int64)
  for g, members in enumerate(groups):
    out[g, :len(members)] = members
  return out
