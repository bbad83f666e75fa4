"""Stub of flwr.simulation (tests/stub_peers/README.md)."""

import time

from flwr.common import Context, parameters_to_ndarrays

CLIENT_S = 0.025  # 2 timed rounds of 2 clients stand above the set-up's noise under load


def start_simulation(*, client_fn, num_clients, config, strategy, client_resources,
                     ray_init_args):
  del client_resources, ray_init_args
  if num_clients < strategy.min_available_clients:
    raise ValueError(f"{num_clients} clients, fewer than min_available_clients")
  params = strategy.initial_parameters
  for rnd in range(1, config.num_rounds + 1):
    strategy.configure_fit(rnd, params, None)
    results = []
    for cid in range(num_clients):
      c = client_fn(Context(node_config={"partition-id": cid}))
      arrays, n, _ = c.fit(parameters_to_ndarrays(params), {})
      results.append((arrays, n))
      time.sleep(CLIENT_S)
    params, _ = strategy.aggregate_fit(rnd, results, [])
