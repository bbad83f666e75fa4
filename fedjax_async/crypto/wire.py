"""Messages between the parties as bytes (OpenFHE's binary serialisation), with sizes.

``Wire.send(sender, receiver, message)`` serialises every ciphertext of a message (a
ciphertext, or lists / tuples / dicts of them, with plain numbers beside them: 8 bytes
each), adds its size to ``bytes[(sender, receiver)]`` and returns what the receiver
deserialises, a copy that shares no object with what was sent. ``deliver=False`` only
counts (a message to a client the simulation does not decrypt for). ``seconds`` holds the
time spent serialising and deserialising, per receiver.
"""

from __future__ import annotations

import collections
import time
from typing import Dict, Tuple

import openfhe

NUMBER_BYTES = 8


def _is_ct(x) -> bool:
  return hasattr(x, "GetLevel")


def ciphertext_bytes(ct) -> bytes:
  return openfhe.Serialize(ct, openfhe.BINARY)


def ciphertext_from_bytes(data: bytes):
  return openfhe.DeserializeCiphertextString(data, openfhe.BINARY)


class Wire:
  """Carries the round's messages as bytes and counts them per (sender, receiver)."""

  def __init__(self):
    self.bytes: Dict[Tuple[str, str], int] = collections.Counter()
    self.messages: Dict[Tuple[str, str], int] = collections.Counter()
    self.seconds: Dict[str, float] = collections.Counter()

  def reset(self):
    self.bytes.clear()
    self.messages.clear()
    self.seconds.clear()

  def send(self, sender: str, receiver: str, message, deliver: bool = True):
    t = time.process_time()
    size = [0]

    def carry(x):
      if _is_ct(x):
        data = ciphertext_bytes(x)
        size[0] += len(data)
        return ciphertext_from_bytes(data) if deliver else None
      if isinstance(x, (list, tuple)):
        return type(x)(carry(v) for v in x)
      if isinstance(x, dict):
        return {k: carry(v) for k, v in x.items()}
      if x is None:
        return None
      size[0] += NUMBER_BYTES
      return x

    out = carry(message)
    self.bytes[(sender, receiver)] += size[0]
    self.messages[(sender, receiver)] += 1
    self.seconds[receiver] += time.process_time() - t
    return out

  def per_party(self) -> Dict[str, int]:
    """Bytes sent and received per party: {'<party>_sent': ..., '<party>_received': ...}
    with the clients as one party ("clients")."""
    out = collections.Counter()
    for (a, b), n in self.bytes.items():
      out[a + "_sent"] += n
      out[b + "_received"] += n
    return dict(out)

  def links(self) -> Dict[str, int]:
    """Bytes per direction, e.g. {'S0->S1': ...}."""
    return {f"{a}->{b}": n for (a, b), n in sorted(self.bytes.items())}
