"""Stub of torch.nn: modules with parameters of the real shapes; every layer passes its
input through (tests/stub_peers/README.md)."""

import numpy as np

from torch import Tensor
from torch.nn import functional  # noqa: F401  pylint: disable=unused-import


class Module:
  """Parameters found in the attributes (tensors, modules, lists of modules)."""

  training = True

  def __init__(self):
    pass

  def _children(self):
    for v in vars(self).values():
      if isinstance(v, Module):
        yield v
      elif isinstance(v, (list, tuple)):
        yield from (m for m in v if isinstance(m, Module))

  def parameters(self):
    out = [v for v in vars(self).values() if isinstance(v, Tensor)]
    for child in self._children():
      out += list(child.parameters())
    return iter(out)

  def train(self, mode=True):
    self.training = mode
    for child in self._children():
      child.train(mode)
    return self

  def eval(self):
    return self.train(False)

  def __call__(self, *args):
    return self.forward(*args)

  def forward(self, x):
    return x


class Sequential(Module):

  def __init__(self, *layers):
    super().__init__()
    self.layers = list(layers)

  def forward(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


class Conv2d(Module):

  def __init__(self, in_channels, out_channels, kernel_size):
    super().__init__()
    self.weight = Tensor(np.zeros((out_channels, in_channels, kernel_size, kernel_size),
                                  np.float32))
    self.bias = Tensor(np.zeros(out_channels, np.float32))


class Linear(Module):

  def __init__(self, in_features, out_features):
    super().__init__()
    self.weight = Tensor(np.zeros((out_features, in_features), np.float32))
    self.bias = Tensor(np.zeros(out_features, np.float32))


class ReLU(Module):
  pass


class Flatten(Module):
  pass


class MaxPool2d(Module):

  def __init__(self, kernel_size):
    super().__init__()
    self.kernel_size = kernel_size


class Dropout(Module):

  def __init__(self, p=0.5):
    super().__init__()
    self.p = p
