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

Usage::

  mesh = sharding.client_mesh()                      # all local devices
  cfg = dataclasses.replace(cfg, client_sharding=sharding.client_sharding(mesh))
  tl = sharding.pad_timeline(tl, mesh.size)          # K a multiple of the device count
  state = sharding.replicate(state, mesh)
  data = sharding.replicate(data, mesh)
  runner = engine.make_runner(apply_flat, algorithm, cfg)

``cfg.client_sharding = None`` (the default) is the unsharded engine, bit for bit.
On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` makes 4 host devices to
test this on one machine (they share its cores).
"""

from __future__ import annotations

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
