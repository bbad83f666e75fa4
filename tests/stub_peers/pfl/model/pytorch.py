"""Stub of pfl.model.pytorch (tests/stub_peers/README.md)."""


class PyTorchModel:

  def __init__(self, model, local_optimizer_create, central_optimizer):
    self.model = model
    self.local_optimizer_create = local_optimizer_create
    self.central_optimizer = central_optimizer
