"""Stub of flwr.server.strategy (tests/stub_peers/README.md)."""

import numpy as np

from flwr.common import ndarrays_to_parameters


class FedAvg:

  def __init__(self, *, fraction_fit, fraction_evaluate, min_fit_clients,
               min_evaluate_clients, min_available_clients, initial_parameters):
    del fraction_fit, fraction_evaluate, min_evaluate_clients
    self.min_fit_clients = min_fit_clients
    self.min_available_clients = min_available_clients
    self.initial_parameters = initial_parameters

  def configure_fit(self, server_round, parameters, client_manager):
    del server_round, client_manager
    return parameters

  def aggregate_fit(self, server_round, results, failures):
    """``results``: (arrays, examples) of each client; their weighted mean."""
    del server_round, failures
    total = sum(n for _, n in results)
    mean = [sum(a[i] * n for a, n in results) / total for i in range(len(results[0][0]))]
    return ndarrays_to_parameters([np.asarray(m) for m in mean]), {}
