"""Stub of pfl.algorithm: FedAvg's loop over rounds and cohorts, calling the model's loss on
each client's minibatches; each client's training is a 25 ms sleep (tests/stub_peers)."""

import dataclasses
import time

CLIENT_S = 0.025  # 2 timed rounds of 2 clients stand above the set-up's noise under load


@dataclasses.dataclass
class NNAlgorithmParams:
  central_num_iterations: int
  evaluation_frequency: int
  train_cohort_size: int
  val_cohort_size: int


class FederatedAveraging:

  def run(self, algorithm_params, backend, model, model_train_params, model_eval_params,
          callbacks, send_metrics_to_platform=True):
    del model_eval_params, callbacks, send_metrics_to_platform
    fed = backend.training_data
    bs = model_train_params.local_batch_size
    for _ in range(algorithm_params.central_num_iterations):
      for _ in range(algorithm_params.train_cohort_size):
        x, y = fed.make_dataset_fn(fed.user_sampler()).raw_data
        opt = model.local_optimizer_create(model.model.parameters(),
                                           lr=model_train_params.local_learning_rate)
        for _ in range(model_train_params.local_num_epochs):
          for b in range(0, len(y), bs):
            opt.zero_grad()
            model.model.loss(x[b:b + bs], y[b:b + bs]).backward()
            opt.step()
        time.sleep(CLIENT_S)
      model.central_optimizer.step()
