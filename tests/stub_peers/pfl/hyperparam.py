"""Stub of pfl.hyperparam (tests/stub_peers/README.md)."""

import dataclasses


@dataclasses.dataclass
class NNTrainHyperParams:
  local_num_epochs: int
  local_learning_rate: float
  local_batch_size: int


@dataclasses.dataclass
class NNEvalHyperParams:
  local_batch_size: int
