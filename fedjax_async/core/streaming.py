"""A natural data set on one device, a chunk of rounds at a time.

The round engine's timeline is drawn before the run, so the clients that train in rounds
[start, end) are known before the chunk runs. :class:`StreamedData` (what the round engine
gets for a lazily held data set, ``data.natural``, on one device) copies only them to the
device: ``for_rounds`` reads their examples from the host store, pads them to the largest
client of the data set (M: one compiled chunk for every chunk of the same length) into
``[L * K, M, ...]`` arrays (L rounds of K slots: room for every training slot), and hands
the engine a ``DeviceData`` whose ``rows [N]`` map each client id to its row there. The
client sizes ``[N]`` and the central test set stay on the device for the whole run. The
device then holds ``L * K`` clients' rows instead of all N (``benchmarks/natural_clients.py``
measures both).
"""

from __future__ import annotations

import numpy as np

import jax.numpy as jnp

from fedjax_async.core.device import DeviceData
from fedjax_async.data import natural


def streams(fed) -> bool:
  """Whether ``fed`` is held lazily (its clients are read on demand)."""
  return natural.is_lazy(fed)


class StreamedData:
  """The engine's data for a lazily held ``fed`` (module docstring). ``x`` / ``y``: the
  last chunk's rows on the device (what the divergence advice reads)."""

  def __init__(self, fed):
    self.fed = fed
    self.counts = jnp.asarray(np.asarray(fed.counts))
    self.test_x, self.test_y = jnp.asarray(fed.test_x), jnp.asarray(fed.test_y)
    self.last = None

  def for_rounds(self, timeline, start: int, end: int) -> DeviceData:
    """The device data of rounds [start, end) of ``timeline``."""
    slots = timeline.slice(start, end)
    trains = slots["valid"] | slots["lost"]
    clients = np.unique(slots["client"][trains])
    x, y = natural.padded_rows(self.fed, clients, slots["client"].size)
    rows = np.zeros(len(self.fed.counts), np.int32)
    rows[clients] = np.arange(len(clients), dtype=np.int32)
    self.last = DeviceData(jnp.asarray(x), jnp.asarray(y), self.counts, self.test_x,
                           self.test_y, jnp.asarray(rows))
    return self.last

  @property
  def x(self):
    return self.last.x if self.last is not None else self.test_x[:0]

  @property
  def y(self):
    return self.last.y if self.last is not None else self.test_y[:0]
