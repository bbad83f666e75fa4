"""Several processes (hosts) as one simulation: JAX's multi-controller runtime.

Every process runs the same program on the same configuration. ``initialize`` joins them
(``jax.distributed.initialize``); ``jax.devices()`` then lists every process's devices,
and the engine's client mesh (``sharding.client_mesh``) and a sweep's run mesh span all of
them, so a round's clients (or a sweep's runs) are split across processes by the same
GSPMD program as across the devices of one process. What each process holds:

* ``client_data="sharded"`` (``sharding.shard_clients``): the padded client data
  ``[N, M, ...]`` and the per-client state ``[N, d]`` split by client over the global
  mesh; each process places only its own clients' rows. XLA gathers a round's minibatch
  rows and state rows across devices (one all-reduce of the gathered rows each).
* ``client_data="replicated"``: every device holds every client (no communication for the
  gathers; the data's memory on every device).
* everything else (global model, ring buffer, server state, timeline) replicated; the
  round's server reduction over the K uploads is the one collective over the model size.

Process 0 writes the files (metrics, summaries, figures, TensorBoard); checkpoints are
written by orbax from every process (each its own shards) into the same folder, which
must be on a file system all processes see.
"""

from __future__ import annotations

from typing import Optional

import jax
from jax.experimental import multihost_utils
import numpy as np


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
               *, auto: bool = False) -> bool:
  """Joins this process to the others (``jax.distributed.initialize``); must run before
  JAX's first operation. Returns whether it did.

  ``coordinator_address`` (``host:port`` of process 0), ``num_processes`` and
  ``process_id``: given, or left to JAX's detection (``auto``, or the address in
  ``JAX_COORDINATOR_ADDRESS``) under SLURM, Open MPI or on a TPU pod slice. On CPU the
  collectives go through gloo. ValueError naming ``--coordinator_address`` /
  ``--num_processes`` / ``--process_id`` when they do not add up.
  """
  if num_processes < 0 or process_id < -1:
    raise ValueError(f"--num_processes / --process_id: must be >= 0 (0 / -1: not given), "
                     f"got --num_processes={num_processes} --process_id={process_id}")
  given = bool(coordinator_address) or num_processes > 0 or process_id >= 0
  if not (given or auto):
    return False
  if given and not auto:
    if not coordinator_address:
      raise ValueError("--coordinator_address: needed with --num_processes / --process_id "
                       "(host:port of process 0, e.g. localhost:12355), or pass "
                       "--distributed to let JAX detect SLURM / Open MPI / a TPU pod")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id: must be in [0, --num_processes) with "
                       f"--num_processes >= 1, got --process_id={process_id} "
                       f"--num_processes={num_processes}")
  try:  # CPU collectives across processes (jax's default CPU client has none)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except (AttributeError, ValueError, RuntimeError):
    pass
  kwargs = {}
  if coordinator_address:
    kwargs["coordinator_address"] = coordinator_address
  if num_processes > 0:
    kwargs["num_processes"] = num_processes
  if process_id >= 0:
    kwargs["process_id"] = process_id
  try:
    jax.distributed.initialize(**kwargs)
  except (RuntimeError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"--coordinator_address: joining the other processes failed ({first}); "
                     "every process needs the same --coordinator_address and "
                     "--num_processes and its own --process_id") from None
  return True


def joined() -> bool:
  """Whether ``initialize`` joined this process to others (asked without starting JAX's
  backend, so that a CLI can still set the number of CPU devices after asking)."""
  return jax.distributed.is_initialized()


def is_main() -> bool:
  """Whether this process writes the run's files (process 0; always in one process)."""
  return not joined() or jax.process_index() == 0


def sync(name: str):
  """A barrier across processes (nothing in one process)."""
  if joined() and jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
  """``flag`` OR-ed over the processes, e.g. "a signal arrived somewhere": every process
  then takes the same branch (a checkpoint, a stop) and none waits in a collective alone."""
  if not joined() or jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.asarray([bool(flag)]))))


def split_across_processes(x) -> bool:
  """Whether ``x`` is a global array whose parts live in several processes (no process
  can read all of it by itself)."""
  return isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated)


def to_host(tree):
  """Host (numpy) copies of ``tree``'s arrays. An array split across processes is
  gathered from all of them (``process_allgather``); the others are copied as they are."""
  def one(x):
    if split_across_processes(x):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)


def place(x, sharding: jax.sharding.Sharding) -> jax.Array:
  """``x`` (the same host value in every process) as one global array under ``sharding``;
  each process copies only the slices its own devices hold."""
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def describe() -> Optional[str]:
  """One console line on the processes (None in one process)."""
  if not joined() or jax.process_count() == 1:
    return None
  return (f"process {jax.process_index()} of {jax.process_count()}: "
          f"{jax.local_device_count()} local / {jax.device_count()} global devices")
