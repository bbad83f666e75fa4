"""What a run will cost, said before any work starts: one line such as

  cost: 0.47 PFLOP, ~1.2 GiB, ~3 h on cpu (2 cores)

and, when the time exceeds ``WARN_SECONDS``, a warning naming how to pick a smaller
setting. The drivers print it to stderr (not with quiet=True).

FLOPs: the model's forward pass on one example, counted from its jaxpr as
``models.analytic_flops`` counts (2 x output size x contraction length of every matrix
product and convolution; element-wise work left out), times 3 for a trained example
(the forward pass and the backward pass's two products, the gradients of the activations
and of the weights), times the examples the run trains on, plus one forward pass per
evaluated test example. Memory: the data set (float32), the model's copies (the ring of
past models and each client trained at once: weights, gradient, optimiser state and
upload) and the activations of every client's minibatch (each matrix product's output,
kept for the backward pass). Time: the FLOPs at the backend's throughput, plus a fixed
cost per server step (small models are bound by it, not by arithmetic) and a compilation
per run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable, Optional

import jax
import numpy as np
from fedjax_async import console
from fedjax_async import models
from fedjax_async import outputs
from fedjax_async.data import natural

WARN_SECONDS = 180.0

# Throughput of the engines' training (FLOPs counted as above / wall time), per CPU core,
# and the fixed seconds per server step and per run, calibrated on this project's 2-core
# AMD EPYC VM (AVX-512), jax 0.6.2, idle, against the README's commands
# (benchmarks/cost_check.py prints estimate / measured for each; the estimates sit ~1.3x
# above the idle times, so that a machine up to ~2.5x slower under load stays within 2x):
# the CNN command (PAFed, 5 rounds of 10 clients, 3.4 TFLOP) took 19.8 s, 86 GFLOP/s a
# core; the main job's 100 logistic-regression rounds 1.2-1.7 s a run, compilation from
# JAX's disk cache included.
CPU_FLOPS_PER_CORE = 65e9
# Accelerators were not measured here: the H200's CNN rounds ran at 7-12 TFLOP/s
# (docs/performance.md, "On a GPU"); TPUs are taken as alike.
ACCELERATOR_FLOPS = 7e12
# Seconds per server step besides arithmetic: a round of the round engine (a scanned
# step, ~0.005 s in the main job), an Alg. 1 epoch.
CPU_STEP_SECONDS = 0.006
ACCELERATOR_STEP_SECONDS = 0.01
# A group of the virtual clock's arrivals in server steps (one client and its metrics
# row against a round's clients and evaluation): the clock's command, 300 FedAsync / 1,500
# FedBuff arrivals in groups of one, took 0.9 / 2.0 s.
CLOCK_GROUP_STEPS = 0.2
COMPILE_SECONDS = 1.0  # per run: the engines' programs (JAX's disk cache keeps them)
# FedEDS's Alg. 1 per minibatch step (a client's 50 rows through the UNet encryptor, whose
# narrow convolutions run far below the throughput above): the quick setting's 25
# client-epochs of 4 steps took 19 s on this CPU, 400 encryptor epochs of one client 150 s.
CPU_ALG1_STEP_SECONDS = 0.08
ACCELERATOR_ALG1_STEP_SECONDS = 0.002


@dataclasses.dataclass(frozen=True)
class Device:
  """Where the work runs: ``backend`` (cpu, gpu, tpu), ``cores`` (CPU cores; 0 for an
  accelerator), ``name`` (as the line says it), its throughput and step overhead."""
  backend: str
  cores: int
  name: str
  flops_per_second: float
  step_seconds: float


def detect() -> Device:
  """The default JAX backend: a CPU by its usable cores, else the first device's kind."""
  backend = jax.default_backend()
  if backend == "cpu":
    try:
      cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
      cores = os.cpu_count() or 1
    return Device("cpu", cores, f"cpu ({cores} core{'s' if cores > 1 else ''})",
                  CPU_FLOPS_PER_CORE * cores, CPU_STEP_SECONDS)
  devices = jax.devices()
  kind = getattr(devices[0], "device_kind", backend)
  count = f"{len(devices)} x " if len(devices) > 1 else ""
  return Device(backend, 0, f"{backend} ({count}{kind})", ACCELERATOR_FLOPS * len(devices),
                ACCELERATOR_STEP_SECONDS)


@dataclasses.dataclass(frozen=True)
class Cost:
  """An estimate: total ``flops``, peak ``memory_bytes``, wall ``seconds`` on ``device``."""
  flops: float
  memory_bytes: float
  seconds: float
  device: Device

  def line(self) -> str:
    return (f"cost: {_flops(self.flops)}, ~{_bytes(self.memory_bytes)}, "
            f"~{_duration(self.seconds)} on {self.device.name}")


def _number(v: float) -> str:
  """Two significant digits, no exponent (0.47, 3.2, 89, 320)."""
  return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def _flops(f: float) -> str:
  for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9),
                      ("MFLOP", 1e6)):
    if f >= 0.1 * scale:
      return f"{_number(f / scale)} {unit}"
  return f"{_number(f)} FLOP"


def _bytes(b: float) -> str:
  for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
    if b >= 0.1 * scale:
      return f"{_number(b / scale)} {unit}"
  return f"{_number(max(b, 0) / 2 ** 10)} KiB"


def _duration(s: float) -> str:
  if s < 90:
    return f"{max(s, 1):.0f} s"
  if s < 90 * 60:
    return f"{s / 60:.0f} min"
  if s < 48 * 3600:
    return f"{_number(s / 3600)} h"
  return f"{_number(s / 86400)} days"


# ----------------------------------------------------------------------- the model


def forward_counts(fn: Callable, *args) -> tuple:
  """(FLOPs, activation elements) of ``fn(*args)``: its matrix products as
  ``models.analytic_flops`` counts them, and the sizes of their outputs."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return models.analytic_flops(fn, *args), float(_product_outputs(jaxpr))


def _product_outputs(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
      total += int(np.prod(eqn.outvars[0].aval.shape))
      continue
    subs = [_product_outputs(getattr(v, "jaxpr", v))
            for value in eqn.params.values()
            for v in (value if isinstance(value, (tuple, list)) else (value,))
            if hasattr(getattr(v, "jaxpr", v), "eqns")]
    total += eqn.params.get("length", 1) * sum(subs) if eqn.primitive.name != "cond" else (
        max(subs, default=0))
  return total


def model_counts(apply_flat: Callable, w0, input_shape) -> tuple:
  """(forward FLOPs, activation elements) of ``apply_flat`` on one example (traced, no
  compute)."""
  x = jax.ShapeDtypeStruct((1,) + tuple(input_shape), np.float32)
  w = jax.ShapeDtypeStruct(np.shape(w0), np.float32)
  return forward_counts(lambda w, x: apply_flat(w, x), w, x)


def estimate(*, forward_flops: float, activations: float, num_params: int,
             examples_trained: float, examples_evaluated: float, data_bytes: float,
             clients_at_once: int, batch_size: int, model_copies: int, steps: float,
             runs: int = 1, device: Optional[Device] = None) -> Cost:
  """The cost of ``runs`` runs, each training on ``examples_trained`` examples and
  evaluating ``examples_evaluated`` in ``steps`` server steps (see the module
  docstring).

  Args:
    forward_flops: one example's forward-pass FLOPs.
    activations: one example's activation elements (the matrix products' outputs).
    num_params: the model's parameter count.
    examples_trained: the examples trained on by one run.
    examples_evaluated: the test examples evaluated by one run.
    data_bytes: the bytes of data on the device.
    clients_at_once: the clients trained in one vmap.
    batch_size: the local minibatch size.
    model_copies: the copies of the model held (the ring of past models).
    steps: one run's server steps.
    runs: the number of runs.
    device: the device (None: ``detect()``).
  """
  device = device or detect()
  flops = runs * (3.0 * forward_flops * examples_trained
                  + forward_flops * examples_evaluated)
  memory = (data_bytes + 4.0 * num_params * (model_copies + 4 * clients_at_once)
            + 4.0 * 2 * activations * batch_size * clients_at_once)
  seconds = (flops / device.flops_per_second
             + runs * (steps * device.step_seconds + COMPILE_SECONDS))
  return Cost(flops, memory, seconds, device)


def _nbytes(*arrays) -> float:
  """float32 bytes of arrays (or anything with a ``shape``)."""
  return float(sum(4 * math.prod(a.shape) for a in arrays))


# --------------------------------------------------------------------- the drivers


def round_engine(cfg, fed, model, runs: int = 1, device: Optional[Device] = None) -> Cost:
  """A round-engine run (``rounds.experiment.run``) of ``cfg`` (a ``RunConfig``) on
  ``fed`` with ``model`` (name, w0, apply_flat), ``runs`` times: participation x
  num_clients clients a round, each local_steps x batch_size examples or local_epochs
  passes over its data (the mean of 1..E with random_local_epochs).

  Args:
    cfg: the ``RunConfig``.
    fed: the federated data set.
    model: ``(name, w0, apply_flat)``.
    runs: the number of runs.
    device: the device (None: ``detect()``).
  """
  _, w0, apply_flat = model
  counts = np.asarray(fed.counts, np.float64)
  loc, r = cfg.local, cfg.run
  per_round = max(1, round(r.participation * len(counts)))
  epochs = (loc.local_epochs + 1) / 2 if loc.random_local_epochs else loc.local_epochs
  per_client = epochs * counts.mean()
  if loc.local_steps:
    per_client = min(per_client, loc.local_steps * loc.batch_size)
  evals = min(r.rounds, r.rounds // r.eval_every + 10)  # (and the last 10 rounds)
  fwd, act = model_counts(apply_flat, w0, fed.x.shape[2:])
  return estimate(forward_flops=fwd, activations=act, num_params=int(np.size(w0)),
                  examples_trained=r.rounds * per_round * per_client,
                  examples_evaluated=evals * fed.test_x.shape[0],
                  data_bytes=_round_data_bytes(fed, r.rounds_per_call * per_round),
                  clients_at_once=per_round,
                  batch_size=loc.batch_size, model_copies=cfg.delay.ring_size,
                  steps=r.rounds, runs=runs, device=device)


def _round_data_bytes(fed, streamed_rows: int) -> float:
  """The device bytes of ``fed``: its padded arrays, or, held lazily (a natural data set,
  streamed chunk by chunk on one device: ``core.streaming``), a chunk's rows."""
  if natural.is_lazy(fed):
    rows = min(streamed_rows, fed.x.shape[0])
    return _nbytes(fed.test_x) + 4.0 * rows * math.prod(fed.x.shape[1:])
  return _nbytes(fed.x, fed.test_x)


def virtual_clock(cfg, fed, model, client_steps, num_updates: int, clients_at_once: int,
                  ring_size: int, device: Optional[Device] = None,
                  num_groups: Optional[int] = None) -> Cost:
  """A virtual-clock run (``asynchronous.experiment.run_one``) of ``cfg`` (an
  ``AsyncRunConfig``): ``client_steps`` the local steps of every kept task (per client,
  ``engine.client_steps``), of local.batch_size examples, ``clients_at_once`` trained in
  one vmap, in ``num_groups`` scanned groups (None: one per server update), each
  ``CLOCK_GROUP_STEPS`` server steps.

  Args:
    cfg: the ``AsyncRunConfig``.
    fed: the federated data set.
    model: ``(name, w0, apply_flat)``.
    client_steps: the local steps of every kept task.
    num_updates: the server updates (steps) of the run.
    clients_at_once: the clients trained in one vmap.
    ring_size: the copies of the model held (the ring of past models).
    device: the device (None: ``detect()``).
    num_groups: the groups the arrivals train in (None: ``num_updates``).
  """
  _, w0, apply_flat = model
  b = cfg.local.batch_size
  fwd, act = model_counts(apply_flat, w0, fed.x.shape[2:])
  evals = num_updates // cfg.run.eval_every + 1
  return estimate(forward_flops=fwd, activations=act, num_params=int(np.size(w0)),
                  examples_trained=float(np.sum(client_steps)) * b,
                  examples_evaluated=evals * fed.test_x.shape[0],
                  data_bytes=_nbytes(fed.x, fed.test_x), clients_at_once=clients_at_once,
                  batch_size=b, model_copies=ring_size,
                  steps=CLOCK_GROUP_STEPS * (num_updates if num_groups is None
                                             else num_groups), device=device)


# ---------------------------------------------------------------------- the console


def announce(cost: Cost, smaller: str, what: str = "", stream=None) -> str:
  """Prints ``cost.line()`` (``what``: which run) and, past ``WARN_SECONDS``, a warning
  naming ``smaller`` (how to pick a small setting) to stderr; returns what it printed."""
  text = (f"[{what}] " if what else "") + cost.line()
  if cost.seconds > WARN_SECONDS:
    text += (f"\nwarning: this setting takes ~{_duration(cost.seconds)} here; for a "
             f"small one use {smaller}")
  text = outputs.name_fields(text)
  console.say(text, stream=stream or sys.stderr)
  return text


# How to pick a small setting, per driver (field paths: the CLI names them as flags).
ROUND_ENGINE_SMALLER = ("model.name=mlp (or logreg), fewer run.rounds or local.local_epochs, "
                        "or a smaller run.participation")
VIRTUAL_CLOCK_SMALLER = ("model.name=mlp (or logreg), fewer clock.num_updates, or "
                         "local.local_steps=1")
FEDEDS_SMALLER = ("--quick (fededs.config.QUICK_FIELDS), or fewer training.rounds, grid.alphas, "
                  "grid.num_clients or grid.variants, model.name=mlp")
