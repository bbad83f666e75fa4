"""PAFed against FedAvg with delayed clients, from Python (docs/api.md).

  python examples/quickstart.py          # 30 rounds, about 20 s on 2 CPU cores
  python examples/quickstart.py 5        # 5 rounds
"""

import sys

import fedjax_async as fa

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
config = fa.RunConfig(
    algorithm=fa.AlgorithmConfig(names="pafed,fedavg"),
    data=fa.DataConfig(dataset="synthetic"),   # Synthetic(1,1), 30 clients
    delay=fa.DelayConfig(fraction=0.5, distribution="uniform", max_delay=3),
    run=fa.RunOptions(rounds=rounds),
    output=fa.OutputConfig(quiet=True))        # no per-round lines
# the same by flat keys (the flags' names): fa.RunConfig().replace(algorithm="pafed,fedavg",
# delay_fraction=0.5, max_delay=3, rounds=rounds, quiet=True)
result = fa.simulate(config)                   # in memory; output_dir=... writes files

print(result.table())
for name, run in result.runs.items():
  accuracy = [row["test_accuracy"] for row in run.rows]
  print(f"{name}: accuracy by round {[round(a, 3) for a in accuracy[-5:]]} (last 5), "
        f"global model of {run.state.w.size} parameters")
