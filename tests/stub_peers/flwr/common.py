"""Stub of flwr.common (tests/stub_peers/README.md)."""

import dataclasses
from typing import Any, Dict, List

import numpy as np


@dataclasses.dataclass
class Parameters:
  tensors: List[np.ndarray]


@dataclasses.dataclass
class Context:
  node_config: Dict[str, Any]


def ndarrays_to_parameters(arrays):
  return Parameters([np.asarray(a) for a in arrays])


def parameters_to_ndarrays(parameters):
  return [a.copy() for a in parameters.tensors]
