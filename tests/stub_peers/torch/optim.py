"""Stub of torch.optim (tests/stub_peers/README.md)."""


class SGD:

  def __init__(self, params, lr):
    self.params = list(params)
    self.lr = lr

  def zero_grad(self):
    pass

  def step(self):
    pass
