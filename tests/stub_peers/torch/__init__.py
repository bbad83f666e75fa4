"""Stub of torch: the API that benchmarks/peers.py's children use, on numpy, computing
nothing of a network (tests/stub_peers/README.md)."""

import functools
import os
import sys

import numpy as np

__version__ = "0+stub"

# Both peer children import torch: the peer script's folder must not be on their path
# (a module there named like one of the peers' dependencies would be imported instead).
_MAIN = getattr(sys.modules.get("__main__"), "__file__", None)
if _MAIN and os.path.dirname(os.path.abspath(_MAIN)) in {
    os.path.abspath(p or os.curdir) for p in sys.path}:
  raise ImportError(f"the peer script's folder {os.path.dirname(os.path.abspath(_MAIN))} is "
                    "on the peer child's sys.path: a module there named like one of the "
                    "peers' dependencies would be imported instead")


class Tensor:
  """An array with the few methods the children call."""

  def __init__(self, a):
    self.a = np.asarray(a)

  def __len__(self):
    return len(self.a)

  def __getitem__(self, index):
    return Tensor(self.a[index])

  def numpy(self):
    return self.a

  def detach(self):
    return self

  def copy_(self, other):
    if other.a.shape != self.a.shape:
      raise ValueError(f"copy_: shape {other.a.shape} into {self.a.shape}")
    self.a[...] = other.a
    return self

  def backward(self):
    pass

  def item(self):
    return float(self.a)


def from_numpy(a):
  if not isinstance(a, np.ndarray):
    raise TypeError(f"from_numpy: expected np.ndarray, got {type(a).__name__}")
  return Tensor(a)


def tensor(a):
  return Tensor(np.array(a))


def get_num_threads():
  return 1


class no_grad:  # pylint: disable=invalid-name
  """A context manager and a decorator, as torch's."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def __call__(self, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      with self:
        return fn(*args, **kwargs)
    return wrapped


from torch import nn  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from torch import optim  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
