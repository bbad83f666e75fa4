r"""S runs as one vmapped computation versus S sequential runs, in one invocation.

  python benchmarks/sweep_vs_sequential.py --algorithm=pafed --runs=8 --rounds=20

Both sides run the same S configurations (seeds --seed..--seed+S-1, all else shared) on the
same data: the sequential side uses ``engine.run_rounds`` with one jitted runner (compiled
once, reused for every run); the sweep side one ``jit(vmap(run_chunk))``. Times exclude
data loading and are reported with and without the first (compiling) pass; the last line
is JSON.
"""

from __future__ import annotations

import json
import sys
import time


from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import flagcheck  # noqa: E402
from fedjax_async import algorithms  # noqa: E402
from fedjax_async import cli  # noqa: E402
from fedjax_async.core import client as client_lib  # noqa: E402
from fedjax_async.rounds import engine  # noqa: E402
from fedjax_async.rounds import experiment  # noqa: E402
from fedjax_async.sweeps import sweep  # noqa: E402
from fedjax_async.core import timeline as timeline_lib  # noqa: E402

cli.define_run_flags()
flags.adopt_module_key_flags(cli.run_flags)  # --help lists --algorithm, --rounds ... too
flags.DEFINE_integer("runs", 8, "S, runs (seeds) on each side.", lower_bound=1)
flags.DEFINE_integer("repeats", 1, "Timed passes after the compiling one.", lower_bound=1)
flags.register_validator(
    "algorithm", lambda v: v is None or all(n in algorithms.names("rounds")
                                            for n in v.split(",")),
    message=f"--algorithm: expected one of {', '.join(algorithms.names('rounds'))} (or a "
            "comma-separated list of them: the first is run)")
FLAGS = flags.FLAGS


def sequential_runner(cfgs, name, fed, model):
  """One jitted ``run_chunk`` shared by the sequential runs (and their passes)."""
  c0 = cfgs[0]
  ecfg = engine.EngineConfig(client_lib.LocalConfig(c0.local.batch_size, c0.local.local_epochs,
                                                    fed.max_examples), c0.delay.ring_size)
  return engine.make_runner(model[2], algorithms.get(name), ecfg), ecfg


def sequential(cfgs, name, fed, runner, ecfg):
  """S runs one after another with a single compiled runner; final models."""
  alg = algorithms.get(name)
  data = engine.DeviceData.from_federated(fed)
  ws = []
  for c in cfgs:
    _, w0, _ = experiment.build_model(c, fed)
    tl = timeline_lib.build(fed.num_clients, c.run.rounds, c.run.participation, c.delay, c.run.seed)
    state = engine.init_state(alg, w0, fed.num_clients, ecfg.ring_size, c.run.seed)
    state, _ = engine.run_rounds(runner, state, tl, c.hparams(), data,
                               eval_every=c.run.eval_every, rounds_per_call=c.run.rounds_per_call)
    ws.append(np.asarray(jax.block_until_ready(state.w)))
  return np.stack(ws)


def vmapped(cfgs, name, fed, runner=None):
  """The S runs as one vmapped computation (``runner`` reused across passes)."""
  prep = sweep.prepare(cfgs, name, fed)
  res = sweep.simulate_sweep(runner or prep.runner, prep.states, prep.slots, prep.hp, prep.data,
                             num_rounds=cfgs[0].run.rounds, eval_every=cfgs[0].run.eval_every,
                             rounds_per_call=cfgs[0].run.rounds_per_call, mesh=sweep.run_mesh())
  return np.asarray(res.states.w)


def timed(fn):
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def main(argv):
  del argv
  try:  # a bad run flag: one line naming it (as experiments/run.py says it), no traceback
    base = cli.config_from_flags(FLAGS)
    name = base.algorithm.name_list()[0]
    base = base.replace(algorithm=name)
    cfgs = sweep.grid(base, {}, FLAGS.runs)
    fed = experiment.load_data(base)
    model = experiment.build_model(base, fed)
  except ValueError as e:
    sys.exit(f"error: {cli.as_flags(str(e))}")
  # Sequential timelines may have different K (one compile each): that is what separate
  # runs cost. Runners are built once: pass 0 compiles, passes 1.. are steady state.
  seq_runner, ecfg = sequential_runner(cfgs, name, fed, model)
  vm_runner = sweep.prepare(cfgs[:1], name, fed).runner
  seq_times, vm_times = [], []
  for _ in range(1 + FLAGS.repeats):
    w_seq, t = timed(lambda: sequential(cfgs, name, fed, seq_runner, ecfg))
    seq_times.append(t)
    w_vm, t = timed(lambda: vmapped(cfgs, name, fed, vm_runner))
    vm_times.append(t)
  err = float(np.max(np.abs(w_seq - w_vm)))
  steady_seq, steady_vm = min(seq_times[1:] or seq_times), min(vm_times[1:] or vm_times)
  result = {
      "algorithm": name, "dataset": fed.name, "runs": FLAGS.runs, "rounds": base.run.rounds,
      "num_clients": fed.num_clients, "participation": base.run.participation,
      "local_epochs": base.local.local_epochs, "devices": [str(d) for d in jax.devices()],
      "sequential_first_s": seq_times[0], "vmapped_first_s": vm_times[0],
      "sequential_s": steady_seq, "vmapped_s": steady_vm,
      "speedup_first": seq_times[0] / vm_times[0], "speedup": steady_seq / steady_vm,
      "max_abs_diff_final_params": err,
  }
  print(f"{FLAGS.runs} runs x {base.run.rounds} rounds of {name} on {fed.name} "
        f"({jax.devices()[0].platform}):")
  print(f"  sequential: {seq_times[0]:.1f}s first pass (compiles), {steady_seq:.1f}s steady")
  print(f"  vmapped:    {vm_times[0]:.1f}s first pass (compiles), {steady_vm:.1f}s steady")
  print(f"  speedup (sequential / vmapped): {result['speedup_first']:.2f}x first, "
        f"{result['speedup']:.2f}x steady; max |w_seq - w_vmap| = {err:.2e}")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
