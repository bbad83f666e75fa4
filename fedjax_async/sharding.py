"""Splitting the clients of a round over several devices (client-axis data parallelism).

The engine trains the K arrival slots of a round in one ``jax.vmap``; with a device mesh
the slot axis K is split over the mesh's ``"clients"`` axis, each device training K / D
clients, and XLA (GSPMD) inserts the one collective a round needs: the server's reduction
over the K uploads. Everything else is replicated:

* the global model ``w``, the ring buffer ``[R, d]`` and the server state (small);
* the per-client state ``[N, d]`` (ADMM/PAFed duals and last local models) and the padded
  client data ``[N, M, ...]``: every device holds all of it, so the gather by client id
  of a round is local. (Sharding these over N as well would save memory per device at
  the price of an all-to-all per round; not done here.)

``experiments/run.py --devices=D`` does all of it (``shard_clients``); by hand::

  mesh = sharding.client_mesh()                      # all local devices
  cfg = dataclasses.replace(cfg, client_sharding=sharding.client_sharding(mesh))
  tl = sharding.pad_timeline(tl, mesh.size)          # K a multiple of the device count
  state = sharding.replicate(state, mesh)
  data = sharding.replicate(data, mesh)
  runner = engine.make_runner(apply_flat, algorithm, cfg)

``cfg.client_sharding = None`` (the default) is the unsharded engine, bit for bit.
On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (or ``--cpu_devices=4`` of
the experiment scripts, i.e. ``jax_num_cpu_devices``) makes 4 host devices on one machine:
they share its cores, and each runs its share of the clients on its own thread, which is
how the engine uses several CPU cores for many small clients (docs/performance.md,
"Several devices").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_async import timeline as timeline_lib

CLIENT_AXIS = "clients"


def client_mesh(devices: Optional[Sequence[Any]] = None, axis: str = CLIENT_AXIS) -> Mesh:
  """A 1-D mesh named ``axis`` over ``devices`` (default: all of ``jax.devices()``)."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (axis,))


def client_sharding(mesh: Mesh, axis: str = CLIENT_AXIS) -> NamedSharding:
  """Leading (client-slot) axis split over ``axis``; trailing axes replicated."""
  return NamedSharding(mesh, PartitionSpec(axis))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, PartitionSpec())


def replicate(tree, mesh: Mesh):
  """``jax.device_put`` of every leaf of ``tree``, replicated over ``mesh``."""
  return jax.device_put(tree, replicated(mesh))


def set_cpu_devices(n: int, flag: str = "cpu_devices"):
  """Makes ``n`` XLA CPU devices (``jax_num_cpu_devices``; 0: JAX's default, one).

  JAX accepts it only before its first operation; later it is a ValueError naming
  ``--flag``. The devices share the machine's cores; each runs its own work on its own
  thread.
  """
  if n < 0:
    raise ValueError(f"--{flag}: must be >= 0 (0 = JAX's default), got {n}")
  if n == 0:
    return
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError as e:
    raise ValueError(f"--{flag}: JAX has already started, too late to set the number of CPU "
                     f"devices ({e}); use XLA_FLAGS=--xla_force_host_platform_device_count="
                     f"{n}") from None


def select_devices(requested: int, flag: str = "devices") -> list:
  """The first ``requested`` of ``jax.devices()`` (0: all); ValueError naming ``--flag``."""
  available = jax.devices()
  if requested < 0:
    raise ValueError(f"--{flag}: must be >= 0 (0 = all {len(available)} devices), got "
                     f"{requested}")
  if requested > len(available):
    hint = (f"; on CPU, --cpu_devices={requested} (or XLA_FLAGS="
            f"--xla_force_host_platform_device_count={requested}) makes that many host "
            "devices" if available[0].platform == "cpu" else "")
    raise ValueError(f"--{flag}: asked for {requested} devices but JAX sees "
                     f"{len(available)} ({available[0].platform}){hint}")
  return list(available[:requested or len(available)])


def shard_clients(cfg, tl: timeline_lib.Timeline, state, data, devices: Sequence[Any]):
  """(cfg, tl, state, data) ready to run a round's clients split over ``devices``.

  ``cfg`` is an ``engine.EngineConfig``: it gets ``client_sharding`` over a 1-D mesh of
  ``devices``; the timeline's slot axis K is padded to a multiple of their number; the
  state and the data are replicated on all of them. One device: returned unchanged (the
  unsharded engine, bit for bit).
  """
  if len(devices) <= 1:
    return cfg, tl, state, data
  mesh = client_mesh(devices)
  cfg = dataclasses.replace(cfg, client_sharding=client_sharding(mesh))
  # Wait for the copies: a device whose copy of the data is still being written starts
  # the round late, and XLA:CPU (jax 0.6) aborts the process when a device reaches a
  # collective 10 s after the others (measured: replicating 4.8 GB of padded Synthetic
  # data to a second CPU device takes longer than that here).
  state, data = jax.block_until_ready(replicate((state, data), mesh))
  return cfg, pad_timeline(tl, mesh.size), state, data


def padded_size(k: int, multiple: int) -> int:
  """The least multiple of ``multiple`` that is >= ``k`` (and >= ``multiple``)."""
  return max(multiple, -(-k // multiple) * multiple)


def pad_timeline(tl: timeline_lib.Timeline, multiple: int) -> timeline_lib.Timeline:
  """``tl`` with its slot axis K padded to a multiple of ``multiple`` (the device count).

  Padding slots are what ``timeline.build`` pads with: client id N (out of bounds, so
  the engine's scatter drops them), ``valid = online = False`` and dispatch = the round
  itself (staleness 0), so the padded timeline gives the same rounds.
  """
  t, k = tl.client.shape
  k2 = padded_size(k, multiple)
  if k2 == k:
    return tl
  extra = k2 - k
  # The engine ignores the id of an invalid slot (it scatters to N, out of bounds); reuse
  # build's padding id N where the timeline has one, else any id past the largest seen.
  pad_client = (int(tl.client[~tl.valid].max()) if not tl.valid.all()
                else int(tl.client.max()) + 1)
  rounds = np.arange(t, dtype=tl.dispatch.dtype)[:, None]
  return tl._replace(
      client=np.concatenate([tl.client, np.full((t, extra), pad_client, tl.client.dtype)],
                            1),
      dispatch=np.concatenate([tl.dispatch, np.broadcast_to(rounds, (t, extra))], 1),
      online=np.concatenate([tl.online, np.zeros((t, extra), bool)], 1),
      valid=np.concatenate([tl.valid, np.zeros((t, extra), bool)], 1))


def shard_spec(x: jax.Array) -> Optional[PartitionSpec]:
  """The ``PartitionSpec`` of a ``NamedSharding``-placed array (None otherwise)."""
  s = getattr(x, "sharding", None)
  return s.spec if isinstance(s, NamedSharding) else None
