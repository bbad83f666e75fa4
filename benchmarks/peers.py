"""pfl-research's CIFAR-10 benchmark workload, scaled down, run by four systems in ONE call
(five rows: the engine also with flax's ``nn.Dense``, ``engine_flax_dense``).

Workload (pfl-research benchmarks/image_classification, CIFAR-10 IID): 32x32x3 inputs,
its two-conv ``simple_cnn`` (conv3x3x32 VALID, ReLU, conv3x3x64 VALID, ReLU, maxpool 2,
dropout .25, Dense 128, ReLU, dropout .5, Dense 10), 50 clients per round, 1 local epoch,
batch 10, plain SGD, FedAvg. Scaled to this machine: ``--examples`` random examples per
client (CIFAR-10 has ~1000 per client in pfl's split), ``--rounds`` rounds.

(a) ``engine``: this project's vmapped engine (all rounds in one jitted scan);
(b) ``loop``: a sequential per-client ``jit`` loop (one call per client: stronger than
    fedjax's own per-step calls, see ``common.fedjax_loop_runner``) on the same data;
(c) ``pfl``: ``pfl`` (PyPI) with its PyTorch CPU model and ``SimulatedBackend``;
(d) ``flower``: Flower's Ray simulation engine (``flwr.simulation.start_simulation``),
    PyTorch CPU clients.

(c) and (d) run as subprocesses of the peers' own venv (``--peers_python``, default
``.venv-peers/bin/python``; see ``benchmarks/requirements-peers.txt``), isolated (``-I``:
this folder is not on their path); the project never depends on them. Each peer reports
seconds per round over the timed rounds after a 1-round warm-up run (set-up excluded). If
a peer cannot be installed or run, the row says why. The systems take turns: each
repetition runs every system once (and a 2048^3 matmul, the peak), and each figure is the
best of its ``--reps`` turns, so a change of this machine's speed during the run reaches
every ratio alike. Rows go to
``benchmarks/results/peers.jsonl`` / ``.csv``.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/peers.py
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- peers (own venv)


def torch_simple_cnn():
  """pfl-research's ``simple_cnn`` for CIFAR-10 in PyTorch, NCHW."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class SimpleCNN(nn.Module):

    def __init__(self):
      super().__init__()
      self.net = nn.Sequential(
          nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
          nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(14 * 14 * 64, 128),
          nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))

    def forward(self, x):
      return self.net(x)

    def loss(self, x, y, eval=False):  # pylint: disable=redefined-builtin
      self.eval() if eval else self.train()
      return nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # pylint: disable=redefined-builtin
      from pfl.metrics import Weighted  # pylint: disable=g-import-not-at-top
      self.eval() if eval else self.train()
      loss = nn.functional.cross_entropy(self(x), y, reduction="sum").item()
      return {"loss": Weighted(loss, len(y))}

  return SimpleCNN()


def peer_data(args):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.standard_normal((args.clients, args.examples, 3, 32, 32), dtype=np.float32)
  y = rng.integers(0, 10, (args.clients, args.examples)).astype(np.int64)
  return x, y


def run_pfl(args, rounds):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from pfl.aggregate.simulate import SimulatedBackend  # pylint: disable=g-import-not-at-top
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # pylint: disable=g-import-not-at-top
  from pfl.data.dataset import Dataset  # pylint: disable=g-import-not-at-top
  from pfl.data.federated_dataset import FederatedDataset  # pylint: disable=g-import-not-at-top
  from pfl.data.sampling import get_user_sampler  # pylint: disable=g-import-not-at-top
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # pylint: disable=g-import-not-at-top
  from pfl.model.pytorch import PyTorchModel  # pylint: disable=g-import-not-at-top

  x, y = peer_data(args)
  xs = [torch.from_numpy(x[i]) for i in range(args.clients)]
  ys = [torch.from_numpy(y[i]) for i in range(args.clients)]
  ids = list(range(args.clients))

  def make(uid):
    return Dataset(raw_data=[xs[uid], ys[uid]], user_id=uid)

  fed = FederatedDataset(make, get_user_sampler("random", ids))
  val = FederatedDataset(make, get_user_sampler("random", ids))
  net = torch_simple_cnn()
  model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(net.parameters(), 1.0))
  backend = SimulatedBackend(training_data=fed, val_data=val)
  params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=10**6,
                             train_cohort_size=args.clients, val_cohort_size=0)
  train = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=0.05,
                             local_batch_size=args.batch)
  evalp = NNEvalHyperParams(local_batch_size=args.batch)
  t0 = time.perf_counter()
  FederatedAveraging().run(algorithm_params=params, backend=backend, model=model,
                           model_train_params=train, model_eval_params=evalp, callbacks=[],
                           send_metrics_to_platform=False)
  del np
  return time.perf_counter() - t0


def run_flower(args, rounds):
  import flwr  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from flwr.common import ndarrays_to_parameters  # pylint: disable=g-import-not-at-top

  x, y = peer_data(args)
  net0 = torch_simple_cnn()
  init = [p.detach().numpy() for p in net0.parameters()]

  class Client(flwr.client.NumPyClient):

    def __init__(self, cid):
      self.cid = cid
      self.net = torch_simple_cnn()

    def get_parameters(self, config):
      return [p.detach().numpy() for p in self.net.parameters()]

    def fit(self, parameters, config):
      with torch.no_grad():
        for p, v in zip(self.net.parameters(), parameters):
          p.copy_(torch.from_numpy(np.asarray(v)))
      opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
      xt, yt = torch.tensor(x[self.cid]), torch.tensor(y[self.cid])
      self.net.train()
      for b in range(0, len(yt), args.batch):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.net(xt[b:b + args.batch]),
                                                 yt[b:b + args.batch])
        loss.backward()
        opt.step()
      return self.get_parameters({}), len(yt), {}

    def evaluate(self, parameters, config):
      return 0.0, 1, {}

  def client_fn(context):
    return Client(int(context.node_config["partition-id"])).to_client()

  marks = []  # (round, start, end) of each round's fit, on the server

  class TimedFedAvg(flwr.server.strategy.FedAvg):

    def configure_fit(self, server_round, parameters, client_manager):
      marks.append([server_round, time.perf_counter(), None])
      return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
      out = super().aggregate_fit(server_round, results, failures)
      marks[-1][2] = time.perf_counter()
      if failures:
        raise RuntimeError(f"{len(failures)} Flower clients failed: {failures[:1]}")
      return out

  strategy = TimedFedAvg(
      fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=args.clients,
      min_evaluate_clients=0, min_available_clients=args.clients,
      initial_parameters=ndarrays_to_parameters(init))
  t0 = time.perf_counter()
  flwr.simulation.start_simulation(
      client_fn=client_fn, num_clients=args.clients,
      config=flwr.server.ServerConfig(num_rounds=rounds), strategy=strategy,
      client_resources={"num_cpus": 1, "num_gpus": 0.0},
      ray_init_args={"num_cpus": os.cpu_count(), "include_dashboard": False,
                     "logging_level": 40})
  total = time.perf_counter() - t0
  return total, [end - start for _, start, end in marks if end is not None]


def seconds_per_round(t_warm: float, t_all: float, rounds: int) -> float:
  """Seconds per round from a run of set-up + 1 round (``t_warm``) and one of set-up +
  1 + ``rounds`` rounds (``t_all``); ValueError when the second was not the longer (the
  timed rounds vanished in the run-to-run noise of the set-up)."""
  if t_all <= t_warm:
    raise ValueError(f"the run with {rounds} more round(s) took {t_all:.3g} s, no longer "
                     f"than set-up and one round ({t_warm:.3g} s): too short to time; use "
                     "more --rounds")
  return (t_all - t_warm) / rounds


def peer_main(argv):
  p = argparse.ArgumentParser()
  p.add_argument("--child", required=True)
  p.add_argument("--clients", type=int, default=50)
  p.add_argument("--examples", type=int, default=20)
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--rounds", type=int, default=2)
  args, _ = p.parse_known_args(argv)
  fn = {"pfl": run_pfl, "flower": run_flower}[args.child]
  import torch  # pylint: disable=g-import-not-at-top
  if args.child == "flower":
    # Ray's start-up (~30 s here) is excluded: the server times each round's fit (sending
    # the model, training the cohort in Ray actors, aggregating); round 1 (actor warm-up)
    # is dropped.
    t_all, per = fn(args, 1 + args.rounds)
    t_warm = per[0] if per else float("nan")
    per_round = sum(per[1:]) / max(len(per) - 1, 1)
  else:
    t_warm = fn(args, 1)  # set-up and one round
    t_all = fn(args, 1 + args.rounds)
    try:
      per_round = seconds_per_round(t_warm, t_all, args.rounds)
    except ValueError as e:
      sys.exit(str(e))
  print("RESULT " + json.dumps(dict(
      s_per_round=per_round, t_warmup=t_warm, t_run=t_all,
      torch=torch.__version__, torch_threads=torch.get_num_threads(),
      version=__import__("pfl" if args.child == "pfl" else "flwr").__version__ if hasattr(
          __import__("pfl" if args.child == "pfl" else "flwr"), "__version__") else "?")),
        flush=True)


# ---------------------------------------------------------------- driver (project venv)


def peer_command(py, name, args):
  """The peer child's command line. ``-I`` (isolated): neither this script's folder nor the
  user's site-packages on its ``sys.path``, PYTHON* variables ignored. Run as a plain
  script, the child would have ``benchmarks/`` first on its path, where a module named like
  one of the peers' dependencies would be imported in its place (pfl imports
  ``multiprocess``); tests/test_name_clash.py keeps such names out of the script folders
  as well."""
  return [py, "-I", os.path.abspath(__file__), f"--child={name}", f"--clients={args.clients}",
          f"--examples={args.examples}", f"--batch={args.batch}", f"--rounds={args.rounds}"]


def run_peer(name, args):
  """Runs a peer in its venv; (row fields, error or None)."""
  py = args.peers_python
  if not os.path.exists(py):
    return None, (f"{py} not found: create it with `python3.11 -m venv .venv-peers && "
                  ".venv-peers/bin/pip install -r benchmarks/requirements-peers.txt`")
  cmd = peer_command(py, name, args)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_timeout,
                          env=env)
  except subprocess.TimeoutExpired:
    return None, f"did not finish within --peer_timeout={args.peer_timeout}s"
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    tail = [l for l in proc.stderr.strip().splitlines() if l.strip()][-3:]
    return None, f"exit {proc.returncode}: " + " | ".join(tail)
  return json.loads(lines[-1][len("RESULT "):]), None


SYSTEMS = ("engine", "engine_flax_dense", "loop", "pfl", "flower")


def parse_args(argv):
  """The driver's flags, checked (argparse: one error line naming the flag; a flag's
  prefix is not taken for it, so a misspelt flag is refused)."""
  p = argparse.ArgumentParser(allow_abbrev=False)
  p.add_argument("--clients", type=int, default=50)
  p.add_argument("--examples", type=int, default=20)
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--engine_rounds", type=int, default=4)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--systems", default=",".join(SYSTEMS))
  p.add_argument("--peers_python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"))
  p.add_argument("--peer_timeout", type=int, default=900)
  p.add_argument("--client_chunk", type=int, default=-1,
                 help="engine: clients per vmapped chunk (0: all; -1: engine's auto rule)")
  p.add_argument("--tag", default="")
  p.add_argument("--only_check_args", action="store_true",
                 help="check the flags and exit (as absl's flag of that name)")
  args = p.parse_args(argv)
  for flag in ("clients", "examples", "batch", "rounds", "engine_rounds", "reps",
               "peer_timeout"):
    if getattr(args, flag) < 1:
      p.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
  if args.client_chunk < -1:
    p.error(f"--client_chunk: must be -1 (auto), 0 (all) or a chunk size, got "
            f"{args.client_chunk}")
  if not args.systems or "" in args.systems.split(","):
    p.error(f"--systems: expected a non-empty comma-separated list of {','.join(SYSTEMS)}, "
            f"got {args.systems!r}")
  unknown = sorted(set(args.systems.split(",")) - set(SYSTEMS))
  if unknown:
    p.error(f"--systems: unknown {','.join(unknown)}; choose from {','.join(SYSTEMS)}")
  return args


def add_engine_turns(args, systems, notes, turns):
  """The turns of the engine (fast and flax dense layers) and the per-client loop, each
  compiled and run once before it is timed."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  if {"engine", "engine_flax_dense", "loop"} & set(systems):
    wl = common.Workload("simple_cnn", args.clients, num_clients=args.clients,
                         examples=args.examples, batch=args.batch,
                         rounds=args.engine_rounds)
    chunk = common.client_chunk(args.client_chunk, wl.dim)
    runners = {}
    # "engine_flax_dense": the engine with flax's nn.Dense (autodiff backward) instead of
    # layers.Dense, both timed in the same run.
    for name, dense in (("engine", "fast"), ("engine_flax_dense", "flax")):
      if name in systems:
        wl_e = wl if dense == wl.dense else dataclasses.replace(wl, dense=dense)
        notes[name] = {"client_chunk": chunk, "dense": dense}
        prep, run, _ = common.engine_runner(wl_e, wl_e.engine_config(client_chunk=chunk))
        runners[name] = (prep, run)
    if "loop" in systems:
      runners["loop"] = common.loop_runner(wl)
    for name, (prep, run) in runners.items():
      print(f"[peers] {name}: compiling and one warm-up run of {args.engine_rounds} "
            "rounds", flush=True)
      prep()
      run()
      clock = common.clocked(prep, run)
      turns[name] = lambda clock=clock: clock() / args.engine_rounds


def report(args, systems, res, seen, notes, steps, step_flops, peak, peak_start, peak_turns,
           mach):
  """Each system's row and line (speed, fraction of the matmul peak, against the engine)."""
  rows = []
  peers = [res[n] for n in ("pfl", "flower") if n in res]
  fastest_peer = min(peers) if peers else float("nan")
  for name in systems:
    t = res.get(name, float("nan"))
    gflops = steps * step_flops / t / 1e9
    row = dict(bench="peers", system=name, model="simple_cnn", clients_per_round=args.clients,
               examples_per_client=args.examples, batch=args.batch, local_epochs=1,
               s_per_round=t, turns_s_per_round=json.dumps(seen.get(name, [])),
               client_steps_per_s=steps / t, gflops=gflops, peak_gflops=peak,
               peak_start_gflops=peak_start, peak_interleaved_gflops=peak_turns,
               fraction_of_peak=gflops / peak,
               engine_speedup=t / res["engine"] if "engine" in res else float("nan"),
               note=json.dumps(notes.get(name, "")), tag=args.tag, **mach)
    rows.append(row)
    if name not in res:  # it could not run (its turn returned None): say so, no nan figures
      print(f"[peers] {name:7s} did not run: {notes.get(name, '') or 'no time'}", flush=True)
      continue
    vs_engine = ("" if name == "engine" or "engine" not in res
                 else f"engine is {row['engine_speedup']:.3g}x faster   "
                 if row["engine_speedup"] >= 1 else
                 f"engine is {1 / row['engine_speedup']:.3g}x slower   ")
    print(f"[peers] {name:7s} {t:.4g} s/round  {steps / t:.4g} client-steps/s  "
          f"{gflops:.1f} GFLOP/s ({100 * gflops / peak:.1f} % of peak)  "
          f"{vs_engine}{notes.get(name, '')}", flush=True)
  if "engine" in res and peers:
    need = 10 * steps * step_flops / fastest_peer / 1e9
    print(f"[peers] engine vs fastest peer: {fastest_peer / res['engine']:.3g}x; 10x the "
          f"fastest peer would take {need:.0f} GFLOP/s = {need / peak:.2f}x this CPU's "
          "matmul peak", flush=True)
  return rows


def main_driver(argv):
  args = parse_args(argv)
  if args.only_check_args:
    sys.exit(0)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  mach = common.machine()
  systems = args.systems.split(",")
  steps = args.clients * -(-args.examples // args.batch)
  notes = {}
  # Every system takes one turn per repetition (engine, engine_flax_dense, loop, the
  # matmul peak, pfl, Flower; then again), so that this machine's speed changing during
  # the run cannot land on one side of a ratio only; each figure is the best of its turns.
  turns = {}
  add_engine_turns(args, systems, notes, turns)
  peak_start = common.matmul_peak()
  mm_prepare, mm_run, mm_flops = common.matmul_runner()
  turns["matmul_peak"] = common.clocked(mm_prepare, mm_run)

  def peer_turn(name):
    def turn():
      out, err = run_peer(name, args)
      if err:
        notes[name] = err
        print(f"[peers] {name}: NOT RUN: {err}", flush=True)
        return None
      notes[name] = {k: v for k, v in out.items() if k != "s_per_round"}
      return out["s_per_round"]
    return turn

  for name in ("pfl", "flower"):
    if name in systems:
      turns[name] = peer_turn(name)
  seen = {name: [] for name in turns}

  def progress(rep, name, value):
    seen[name].append(value)
    unit = "s" if name == "matmul_peak" else "s/round"
    print(f"[peers] turn {rep + 1}/{args.reps}: {name} {value:.4g} {unit}", flush=True)

  res = common.take_turns(turns, args.reps, progress)
  peak_turns = mm_flops / res.pop("matmul_peak") / 1e9
  peak = max(peak_start, peak_turns)
  # Work per round, the same for every system: forward+backward FLOPs of one batch step
  # of the model (XLA's cost analysis of the impl="lax" model), against a 2048^3 matmul
  # timed at the start and in turn with the systems (the larger is the peak), so each
  # system's speed also reads as a fraction of this CPU's peak.
  from fedjax_async import models  # pylint: disable=g-import-not-at-top
  name_, shape, classes = common.MODELS["simple_cnn"]
  step_flops = models.train_step_flops(models.get_model(name_, classes, shape, impl="lax"),
                                       shape, args.batch)
  print(f"[peers] {mach}; simple_cnn fwd+bwd {step_flops / 1e6:.1f} MFLOP per step of "
        f"{args.batch}; matmul peak {peak:.1f} GFLOP/s (at start {peak_start:.1f}, in turn "
        f"{peak_turns:.1f})", flush=True)
  rows = report(args, systems, res, seen, notes, steps, step_flops, peak, peak_start,
                peak_turns, mach)
  common.write_rows("peers", rows)


if __name__ == "__main__":
  if any(a.startswith("--child") for a in sys.argv[1:]):
    peer_main(sys.argv[1:])
  else:
    main_driver(sys.argv[1:])
