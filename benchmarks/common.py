"""Shared pieces of the performance benchmarks (not a test, not a package module).

* ``best_time``: best wall time of a blocking call over a few repetitions (the machine is
  shared, so the best of 3 is the figure that means something);
* ``matmul_peak``: GFLOP/s of a large float32 matmul, measured in the same process, taken
  as this machine's attainable peak (``matmul_runner``: the same matmul as a runner that
  takes turns with the timed workloads, so that a VM slowing down mid-run is seen);
* ``Workload``: random federated data, a model, an algorithm and a timeline in which every
  round has exactly K online arrivals (no delays), built without any data download;
* ``engine_runner`` (``sharded_engine_runner``: clients split over several devices) /
  ``loop_runner`` / ``fedjax_loop_runner``: the same rounds run by
  the vmapped engine (``engine.make_runner``: several rounds fused into one ``lax.scan``),
  by a per-client jit loop (one jitted call trains a whole client, then a jitted server
  step), and by fedjax's own ``ForEachClientJitBackend`` pattern (jitted ``client_init``,
  one jitted ``client_step`` call per minibatch, jitted ``client_final``);
* ``write_rows``: JSON lines and a CSV under ``benchmarks/results/`` (or the folder named
  by ``FEDJAX_ASYNC_BENCH_RESULTS``: ``run_all.py --results_dir`` sets it);
* ``child_env``: the environment of a benchmark's child process, on the same platform as
  its parent (a GPU run's children run on the GPU).

Every benchmark prints its figures; none of them asserts a timing.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional

# The benchmarks run on JAX's default platform (the GPU where there is one); on a machine
# without a TPU its INFO line "Unable to initialize backend 'tpu'" is noise.
logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_async.core import client as client_lib  # noqa: E402
from fedjax_async.rounds import engine  # noqa: E402
from fedjax_async import models  # noqa: E402
from fedjax_async import sharding  # noqa: E402
from fedjax_async.core import timeline as timeline_lib  # noqa: E402
from fedjax_async.algorithms import base  # noqa: E402
from fedjax_async.algorithms import get as get_algorithm  # noqa: E402

from benchmarks import host  # noqa: E402
from benchmarks import paths  # noqa: E402
from benchmarks.host import allocator, cpu_model, find_tcmalloc  # noqa: E402,F401

ROOT = paths.ROOT
RESULTS_DIR = paths.RESULTS_DIR  # $FEDJAX_ASYNC_BENCH_RESULTS, else benchmarks/results

# (each workload's algorithm's other hyper-parameters at their declared defaults:
# ``base.with_defaults``; DUCC projects the conflicting class, PAFed's default)
HP = dict(lr=0.05, momentum=0.0, rho=0.1, mu=0.01, alpha0=1.0, alpha1=0.5, alpha2=0.5,
          ducc_project_conflicting=1.0, **base.server_hparams())

# (model name, per-example input shape, classes)
MODELS = {
    "cnn": ("cnn", (28, 28, 1), 10),  # PAFed's Fashion-MNIST CNN, 1.66M parameters
    "logreg": ("logreg", (60,), 10),  # Synthetic(alpha, beta)-style logistic regression
    "simple_cnn": ("simple_cnn", (32, 32, 3), 10),  # pfl-research's CIFAR-10 CNN
}


def machine() -> Dict[str, Any]:
  """What the figures were measured on and how to run them again: ``host.host()`` (CPU,
  load, allocator, command, git commit, versions, time) and JAX's side of it.

  ``device_kind`` names the accelerator (``"NVIDIA H100 80GB HBM3"``; ``"cpu"`` on CPU).
  """
  import jaxlib  # pylint: disable=g-import-not-at-top
  return {**host.host(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "backend": jax.default_backend(),
          "devices": len(jax.devices()), "device_kind": jax.devices()[0].device_kind,
          # float32 dots and convolutions: JAX's "default" is TF32 on recent NVIDIA GPUs
          "matmul_precision": str(jax.config.jax_default_matmul_precision or "default")}


def child_env(**extra: str) -> Dict[str, str]:
  """Environment of a benchmark's child process: this checkout first on ``PYTHONPATH``
  (then the parent's entries) and the parent's platform (``JAX_PLATFORMS`` passed on when
  set, never forced to CPU), plus ``extra``."""
  return dict(os.environ, PYTHONPATH=paths.pythonpath(), **extra)


def device_peak_bytes() -> Optional[int]:
  """Peak bytes allocated on the first device (``memory_stats()['peak_bytes_in_use']``),
  or None where the backend does not report it (XLA:CPU: use ``peak_rss_bytes``)."""
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return int(peak) if peak is not None else None


def peak_memory(row: Dict[str, Any]) -> int:
  """The memory a configuration used, from its row: the device's peak
  (``peak_device_bytes``) on an accelerator, the process's peak RSS on CPU (where the
  device memory is the host's)."""
  dev = row.get("peak_device_bytes")
  return int(dev) if dev is not None else int(row["peak_rss"])


def scaling_efficiency(kind: str, d0: int, t0: float, d: int, t: float) -> float:
  """Efficiency of D devices taking ``t`` s per round against D0 devices taking ``t0``:
  strong scaling (K fixed) ideally takes ``t0 * D0 / D``, weak scaling (K per device
  fixed) ``t0``; efficiency = ideal / measured."""
  ideal = t0 * d0 / d if kind == "strong" else t0
  return ideal / t


def device_memory_bytes() -> Optional[int]:
  """Memory JAX may allocate on the first device (``bytes_limit``), or the host's RAM
  (``MemTotal``) on CPU; None if neither is known."""
  stats = jax.devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def best_time(fn: Callable[[], Any], reps: int = 3, warmup: int = 1) -> float:
  """Best wall time of ``fn()`` (which must block until its result is ready)."""
  for _ in range(warmup):
    fn()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_runner(n: int = 2048):
  """``(prepare, run, flops)`` of one n^3 float32 matmul, for ``timed_interleaved``."""
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  mm = jax.jit(jnp.matmul)
  return (lambda: None), (lambda: mm(a, b).block_until_ready()), 2.0 * n**3


def matmul_peak(n: int = 2048, reps: int = 3) -> float:
  """GFLOP/s of an n^3 float32 matmul (best of ``reps``)."""
  _, run, flops = matmul_runner(n)
  return flops / best_time(run, reps) / 1e9


def compiled_flops(compiled) -> float:
  """FLOPs from XLA's cost analysis of a compiled computation (dict or list of dicts)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    return float(sum(c.get("flops", 0.0) for c in cost if c))
  return float((cost or {}).get("flops", 0.0))


def peak_rss_bytes() -> int:
  """This process's peak resident set size (Linux reports KiB)."""
  import resource  # pylint: disable=g-import-not-at-top
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclasses.dataclass
class Workload:
  """K clients per round, each with exactly ``examples`` random examples."""

  model: str
  clients_per_round: int
  num_clients: int
  examples: int
  batch: int
  epochs: int = 1
  rounds: int = 3
  algorithm: str = "fedavg"
  impl: str = "vjp"
  dense: str = "fast"  # the conv models' dense layers: layers.DENSE_IMPLS
  seed: int = 0
  jax_data: bool = False  # draw the data on the device (no host copy; for memory runs)
  precision: str = "float32"  # the local training's (client.LocalConfig.precision)

  def __post_init__(self):
    name, self.input_shape, self.num_classes = MODELS[self.model]
    net = models.get_model(name, self.num_classes, self.input_shape, impl=self.impl,
                           dense=self.dense)
    self.w0, self.apply_flat = models.flat_model(net, self.input_shape,
                                                 jax.random.key(self.seed))
    self.dim = int(self.w0.shape[0])
    self.alg = get_algorithm(self.algorithm)
    self.local = client_lib.LocalConfig(self.batch, self.epochs, self.examples,
                                        momentum=HP["momentum"] > 0,
                                        precision=self.precision)
    self.steps = self.local.max_steps
    rng = np.random.default_rng(self.seed)
    n, m = self.num_clients, self.examples
    tx = rng.standard_normal((16,) + tuple(self.input_shape), dtype=np.float32)
    ty = rng.integers(0, self.num_classes, 16).astype(np.int32)
    if self.jax_data:
      shape = (n, m) + tuple(self.input_shape)
      kx, ky = jax.random.split(jax.random.key(self.seed))
      chunk = max(c for c in range(1, min(n, 256) + 1) if n % c == 0)

      def gen(k):  # chunk by chunk, so that no [N, ...]-sized temporary exists
        parts = jax.lax.map(lambda kk: jax.random.normal(kk, (chunk,) + shape[1:]),
                            jax.random.split(k, n // chunk))
        return parts.reshape(shape)

      x = jax.jit(gen)(kx)
      y = jax.jit(lambda k: jax.random.randint(k, (n, m), 0, self.num_classes))(ky)
    else:
      x = rng.standard_normal((n, m) + tuple(self.input_shape), dtype=np.float32)
      y = rng.integers(0, self.num_classes, (n, m)).astype(np.int32)
    counts = np.full(n, m, np.int32)
    self.data = engine.DeviceData(*map(jnp.asarray, (x, y, counts, tx, ty)))
    self.timeline = timeline_lib.build(
        n, self.rounds, self.clients_per_round / n, timeline_lib.DelayConfig(0.0), self.seed,
        min_slots=self.clients_per_round)
    self.hp = {k: jnp.float32(v) for k, v in base.with_defaults(self.alg, HP).items()}

  @property
  def client_steps_per_round(self) -> int:
    return self.clients_per_round * self.steps

  @property
  def examples_per_round(self) -> int:
    return self.clients_per_round * self.steps * self.batch

  def engine_config(self, **kw) -> engine.EngineConfig:
    return engine.EngineConfig(self.local, ring_size=2, eval_batch=16, **kw)

  def init_state(self):
    return engine.init_state(self.alg, self.w0, self.num_clients, 2, self.seed)


def without_split(apply_flat: Callable) -> Callable:
  """``apply_flat`` without ``split``: local training then carries the flat ``[d]`` vector
  through its steps (the layout before ``models.FlatApply``), for A/B timings."""
  return lambda w, x, train=False, rng=None: apply_flat(w, x, train=train, rng=rng)


def engine_runner(wl: Workload, cfg: Optional[engine.EngineConfig] = None,
                  state_fn: Optional[Callable] = None):
  """(run, compiled): ``run()`` runs all ``wl.rounds`` rounds in ONE jitted scan and blocks.

  The donated state is re-created (outside the timed region would be nicer, but creating
  it is a broadcast of w0 and costs microseconds to milliseconds next to a round).
  """
  cfg = cfg or wl.engine_config()
  runner = engine.make_runner(wl.apply_flat, wl.alg, cfg)
  slots = jax.tree.map(jnp.asarray, wl.timeline.slice(0, wl.rounds))
  evals = jnp.zeros((wl.rounds,), bool)
  state_fn = state_fn or wl.init_state
  compiled = runner.lower(state_fn(), slots, evals, wl.hp, wl.data).compile()
  holder = {}

  def prepare():
    holder["s"] = jax.block_until_ready(state_fn())

  def run():
    s, m = compiled(holder.pop("s"), slots, evals, wl.hp, wl.data)
    jax.block_until_ready((s.w, m["train_loss"]))
    return s, m

  return prepare, run, compiled


def client_chunk(flag: int, num_params: int) -> Optional[int]:
  """``EngineConfig.client_chunk`` for a benchmark's ``--client_chunk``: -1 the engine's
  automatic choice (``engine.auto_client_chunk``: 1 for models of >= 100k parameters on
  CPU, as the experiments run them), 0 all K in one vmap, G >= 1 chunks of G."""
  if flag < 0:
    return engine.auto_client_chunk(num_params)
  return flag or None


def sharded_engine_runner(wl: Workload, devices, chunk: Optional[int] = None):
  """``engine_runner`` with each round's clients split over ``devices`` (each device's
  share in chunks of ``chunk``, as ``EngineConfig.client_chunk``).

  ``sharding.shard_clients``: K padded to a multiple of the device count, data and state
  replicated, the client-slot axis constrained to a ``("clients",)`` mesh.
  """
  swl = copy.copy(wl)
  cfg, swl.timeline, _, swl.data = sharding.shard_clients(
      wl.engine_config(client_chunk=chunk), wl.timeline, (), wl.data, devices)
  if cfg.client_sharding is None:
    return engine_runner(swl, cfg)
  mesh = cfg.client_sharding.mesh
  return engine_runner(swl, cfg, state_fn=lambda: sharding.replicate(wl.init_state(), mesh))


def _server_fn(wl: Workload):
  """The loops' jitted server step: all uploads of a round arrive fresh (staleness 0)."""

  @jax.jit
  def server_fn(w, server_state, uploads, n, steps, t):
    k = uploads.shape[0]
    valid = jnp.ones((k,), bool)
    arr = engine.base.Arrivals(valid=valid, online=valid, delayed=~valid,
                               staleness=jnp.zeros((k,), jnp.int32),
                               num_examples=n.astype(jnp.float32),
                               num_steps=steps.astype(jnp.float32),
                               start_params=jnp.broadcast_to(w, uploads.shape))
    new_w, ss, _ = wl.alg.server_update(w, server_state, uploads, arr, t, wl.hp)
    return new_w, ss

  return server_fn


def _client_loop(wl: Workload, train_client: Callable):
  """(prepare, run): rounds as a Python loop over each round's arrivals.

  ``train_client(w, client_state, x, y, n, t, c) -> (upload, new_client_state,
  num_steps)`` trains client ``c`` (its data ``x``, ``y``, ``n`` examples) in round ``t``
  from global model ``w``; then one jitted server step folds the stacked uploads in.
  Per-client data and state live in host lists of per-client device arrays (sliced once,
  outside the clock, as a per-client loop would hold them).
  """
  server_fn = _server_fn(wl)
  tl, data = wl.timeline, wl.data
  xs = [data.x[i] for i in range(wl.num_clients)]
  ys = [data.y[i] for i in range(wl.num_clients)]
  ns_all = [data.counts[i] for i in range(wl.num_clients)]
  holder = {}

  def prepare():
    s = wl.init_state()
    cstate = {k: [v[i] for i in range(wl.num_clients)] for k, v in s.client_state.items()}
    holder["s"] = jax.block_until_ready((s.w, s.server_state, cstate))

  def run():
    w, ss, cstate = holder.pop("s")
    for t in range(wl.rounds):
      ups, ns, steps = [], [], []
      for j in range(tl.client.shape[1]):
        if not tl.valid[t, j]:
          continue
        c = int(tl.client[t, j])
        st = {k: v[c] for k, v in cstate.items()}
        up, new_st, nstep = train_client(w, st, xs[c], ys[c], ns_all[c], np.int32(t),
                                         np.int32(c))
        for k in cstate:
          cstate[k][c] = new_st[k]
        ups.append(up)
        ns.append(ns_all[c])
        steps.append(nstep)
      w, ss = server_fn(w, ss, jnp.stack(ups), jnp.stack(ns), jnp.stack(steps), t)
    jax.block_until_ready(w)
    return w

  return prepare, run


def loop_runner(wl: Workload):
  """(prepare, run): the same rounds, one jitted call per client (train + client_final).

  Each arrival's whole local training (its steps in a ``lax.scan``) and ``client_final``
  are one jitted call on that client's data (sliced on the host side of the call). This
  is a stronger baseline than fedjax's own pattern (``fedjax_loop_runner``: one call per
  step). Same ``client.train`` and server step as the engine: identical arithmetic.
  """
  alg, cfg, hp = wl.alg, wl.local, wl.hp
  base_key = jax.random.key_data(jax.random.PRNGKey(wl.seed))

  @jax.jit
  def client_fn(w_start, cstate, x, y, n, t, c):
    key = engine.client_key(base_key, t, c)
    res = client_lib.train(wl.apply_flat, alg, w_start, cstate, x, y, n, key, hp, cfg)
    out = alg.client_final(w_start, res.w_end, cstate, res.num_steps, hp)
    return out.upload, out.state, res.num_steps

  return _client_loop(wl, client_fn)


def fedjax_loop_runner(wl: Workload):
  """(prepare, run): the same rounds in fedjax's ``ForEachClientJitBackend`` pattern.

  fedjax (``fedjax/core/for_each_client.py``) jits ``client_init``, ``client_step`` and
  ``client_final`` separately and loops in Python over the clients and, per client, over
  its minibatches: one jitted call per local step. Here the three are this package's
  (``client.client_init`` + ``minibatches``, ``make_client_step``, the algorithm's
  ``client_final``), so the arithmetic equals the engine's and ``loop_runner``'s; the
  minibatches are gathered in ``client_init`` and sliced per step on the host side of the
  call, as fedjax feeds each batch.
  """
  alg, cfg, hp = wl.alg, wl.local, wl.hp
  base_key = jax.random.key_data(jax.random.PRNGKey(wl.seed))

  @jax.jit
  def init_fn(w_start, x, y, n, t, c):
    k_init, k_drop = jax.random.split(engine.client_key(base_key, t, c))
    init = client_lib.client_init(k_init, n, cfg, hp.get("local_epochs"))
    budget = init.num_epochs * init.spe
    _, rows, masks = client_lib.minibatches(init, n, cfg)
    opt = client_lib.local_optimizer(hp, cfg)
    carry = (w_start, opt.init(w_start), jnp.float32(0.0))
    return carry, (x[rows], y[rows], masks), budget, k_drop

  @jax.jit
  def step_fn(carry, w_start, cstate, budget, k_drop, s, xb, yb, mb):
    _, client_step = client_lib.make_client_step(wl.apply_flat, alg, w_start, cstate, hp,
                                                 cfg, budget, k_drop)
    return client_step(carry, (s, xb, yb, mb))

  @jax.jit
  def final_fn(w_start, cstate, w_end, budget):
    out = alg.client_final(w_start, w_end, cstate, budget, hp)
    return out.upload, out.state, budget

  def train_client(w, st, x, y, n, t, c):
    carry, (xb, yb, mb), budget, k_drop = init_fn(w, x, y, n, t, c)
    for s in range(cfg.max_steps):
      carry = step_fn(carry, w, st, budget, k_drop, np.int32(s), xb[s], yb[s], mb[s])
    return final_fn(w, st, carry[0], budget)

  return _client_loop(wl, train_client)


def timed(prepare: Callable, run: Callable, reps: int = 3) -> float:
  """Best of ``reps`` of ``run()`` after one warm-up, ``prepare()`` outside the clock."""
  return timed_interleaved({"run": (prepare, run)}, reps)["run"]


def take_turns(turns: Dict[str, Callable[[], Optional[float]]], reps: int = 3,
               progress: Optional[Callable[[int, str, float], None]] = None
               ) -> Dict[str, float]:
  """Best (smallest) of ``reps`` values per name, the turns taken in order each repetition.

  ``turns``: name -> ``turn()``, which measures once and returns its figure (seconds), or
  None when it cannot run; a name that returned None takes no further turns and is left out
  of the result. ``progress(rep, name, value)`` is called after each turn that ran.
  Taking turns keeps a change of machine speed during the measurement from landing on one
  side of a ratio only.
  """
  best: Dict[str, float] = {}
  dropped = set()
  for rep in range(reps):
    for name, turn in turns.items():
      if name in dropped:
        continue
      value = turn()
      if value is None:
        dropped.add(name)
        best.pop(name, None)
        continue
      best[name] = min(best.get(name, float("inf")), value)
      if progress is not None:
        progress(rep, name, value)
  return best


def clocked(prepare: Callable, run: Callable) -> Callable[[], float]:
  """A turn for ``take_turns``: ``prepare()`` off the clock, then the wall time of ``run()``.

  What ``run()`` returns is freed after the clock stops: an experiment passes the state on
  to its next call, and freeing (unmapping) a large ``[N, d]`` client state is not a round's
  work (it made the logreg round at N = 1,000,000 look 12x slower with 2 rounds per call).
  """

  def turn():
    prepare()
    t0 = time.perf_counter()
    out = run()
    elapsed = time.perf_counter() - t0
    del out
    return elapsed

  return turn


def timed_interleaved(runners: Dict[str, tuple], reps: int = 3) -> Dict[str, float]:
  """Best of ``reps`` per runner, the runners taking turns in each repetition.

  ``runners``: name -> (prepare, run); each is run once first (compilation), off the clock.
  """
  for prepare, run in runners.values():  # warm-up (compilation)
    prepare()
    run()
  return take_turns({name: clocked(*r) for name, r in runners.items()}, reps)


_ANNOUNCED: set = set()


def write_rows(name: str, rows: List[Dict[str, Any]]) -> None:
  """Appends ``rows`` to results/NAME.jsonl and rewrites results/NAME.csv from all of it."""
  os.makedirs(RESULTS_DIR, exist_ok=True)
  jpath = os.path.join(RESULTS_DIR, f"{name}.jsonl")
  with open(jpath, "a") as f:
    for r in rows:
      f.write(json.dumps(r, default=float) + "\n")
  with open(jpath) as f:
    everything = [json.loads(l) for l in f if l.strip()]
  keys = []
  for r in everything:
    keys += [k for k in r if k not in keys and not isinstance(r[k], (dict, list))]
  cpath = os.path.join(RESULTS_DIR, f"{name}.csv")
  with open(cpath, "w", newline="") as f:
    w = csv.DictWriter(f, keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(everything)
  if name not in _ANNOUNCED:  # benchmarks write row by row: say where once
    _ANNOUNCED.add(name)
    print(f"[{name}] rows go to {paths.shown(jpath)} (and {os.path.basename(cpath)})")


def fmt_row(r: Dict[str, Any], keys) -> str:
  out = []
  for k in keys:
    v = r.get(k)
    out.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
  return " ".join(out)
