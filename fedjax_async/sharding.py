"""Splitting the clients of a round over several devices (client-axis data parallelism).

The engine trains the K arrival slots of a round in one ``jax.vmap``; with a device mesh
the slot axis K is split over the mesh's ``"clients"`` axis, each device training K / D
clients, and XLA (GSPMD) inserts the one collective a round needs: the server's reduction
over the K uploads. Everything else is replicated:

* the global model ``w``, the ring buffer ``[R, d]`` and the server state (small);
* the per-client state ``[N, d]`` (ADMM/PAFed duals and last local models) and the padded
  client data ``[N, M, ...]``: by default every device holds all of it, so the gather by
  client id of a round is local; ``client_data="sharded"`` (the default across processes,
  ``fedjax_async.distributed``) splits them by client instead, each device holding N / D
  clients, and XLA gathers a round's rows across devices (an all-reduce of the gathered
  minibatch rows per local step and of the state rows per round).

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

from fedjax_async import distributed
from fedjax_async.core import timeline as timeline_lib

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


CLIENT_DATA = ("auto", "replicated", "sharded")


def data_placement(client_data: str, num_devices: int) -> str:
  """``"replicated"`` or ``"sharded"`` for ``RunConfig.client_data``: ``auto`` shards the
  clients when the devices span several processes (each process then holds only its own
  clients), and replicates them over the devices of one process (no gathers across
  devices)."""
  if client_data not in CLIENT_DATA:
    raise ValueError(f"run.client_data: one of {', '.join(CLIENT_DATA)}, got {client_data!r}")
  if client_data == "auto":
    return "sharded" if jax.process_count() > 1 and num_devices > 1 else "replicated"
  return client_data


def shard_clients(cfg, tl: timeline_lib.Timeline, state, data, devices: Sequence[Any],
                  client_data: str = "auto"):
  """(cfg, tl, state, data) ready to run a round's clients split over ``devices``.

  ``cfg`` is an ``engine.EngineConfig``: it gets ``client_sharding`` over a 1-D mesh of
  ``devices``; the timeline's slot axis K is padded to a multiple of their number. The
  client data ``[N, M, ...]`` and the per-client state ``[N, d]`` are replicated on every
  device, or split by client (``client_data``, see ``data_placement``; N must then be a
  multiple of the device count); the rest is replicated. Across processes every process
  places only the slices its devices hold (``distributed.place``). One device: returned
  unchanged (the unsharded engine, bit for bit).

  Args:
    cfg: the ``engine.EngineConfig`` to run.
    tl: the timeline; its slot axis is padded to a multiple of the device count.
    state: the engine state (per-client state ``[N, d]`` under ``client_state``).
    data: the device data ``(x, y, counts, test_x, test_y)``.
    devices: the devices to split the clients over (one: nothing changes).
    client_data: ``auto``, ``replicated`` or ``sharded`` (``data_placement``).
  """
  if len(devices) <= 1:
    return cfg, tl, state, data
  mesh = client_mesh(devices)
  cfg = dataclasses.replace(cfg, client_sharding=client_sharding(mesh))
  by_client = data_placement(client_data, len(devices)) == "sharded"
  # by client: data is (x, y, counts, test_x, test_y), an engine.DeviceData
  num_clients = data[2].shape[0] if by_client else 0
  if by_client and num_clients % mesh.size:
    raise ValueError(f"run.client_data=sharded: the {num_clients} clients do not split evenly "
                     f"over {mesh.size} devices; use a data.num_clients that is a multiple of "
                     f"{mesh.size}, or run.client_data=replicated")
  split, rep = client_sharding(mesh), replicated(mesh)
  data_s = jax.tree.map(lambda _: rep, data)
  state_s = jax.tree.map(lambda _: rep, state)
  if by_client:  # the clients' rows split: x, y, counts and the [N, d] client state
    data_s = type(data)(*([split] * 3 + [rep] * 2)) if hasattr(data, "_fields") else (
        split, split, split, rep, rep)
    if hasattr(state, "client_state"):
      state_s = state_s._replace(client_state={k: split for k in state.client_state})
  if jax.process_count() > 1:
    put = lambda tree, shardings: jax.tree.map(
        lambda x, s: x if getattr(x, "sharding", None) == s else distributed.place(
            jax.device_get(x), s), tree, shardings)
  else:
    put = jax.device_put
  # Wait for the copies: a device whose copy of the data is still being written starts
  # the round late, and XLA:CPU (jax 0.6) aborts the process when a device reaches a
  # collective 10 s after the others (measured: replicating 4.8 GB of padded Synthetic
  # data to a second CPU device takes longer than that here).
  state, data = jax.block_until_ready((put(state, state_s), put(data, data_s)))
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
  idle = ~tl.valid if tl.lost is None else ~(tl.valid | tl.lost)
  pad_client = (int(tl.client[idle].max()) if idle.any() else int(tl.client.max()) + 1)
  rounds = np.arange(t, dtype=tl.dispatch.dtype)[:, None]
  return tl._replace(
      client=np.concatenate([tl.client, np.full((t, extra), pad_client, tl.client.dtype)],
                            1),
      dispatch=np.concatenate([tl.dispatch, np.broadcast_to(rounds, (t, extra))], 1),
      online=np.concatenate([tl.online, np.zeros((t, extra), bool)], 1),
      valid=np.concatenate([tl.valid, np.zeros((t, extra), bool)], 1),
      lost=None if tl.lost is None else np.concatenate([tl.lost, np.zeros((t, extra), bool)],
                                                       1))


def shard_spec(x: jax.Array) -> Optional[PartitionSpec]:
  """The ``PartitionSpec`` of a ``NamedSharding``-placed array (None otherwise)."""
  s = getattr(x, "sharding", None)
  return s.spec if isinstance(s, NamedSharding) else None
