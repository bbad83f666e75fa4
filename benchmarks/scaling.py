"""Time and peak memory per round as clients per round K, and total clients N, grow.

Each configuration runs in its own subprocess (so its peak RSS, ``getrusage`` maxrss, is
its own); the data is drawn on the device (``jax.random``, no host copy). In the N sweep
the algorithm is PAFed, whose per-client state is two ``[N, d]`` float32 arrays (the ADMM
dual y_i and the last local model w_i) kept in ``SimState.client_state`` on the device
(host RAM on CPU), next to the padded client data ``[N, M, ...]``.

* ``--sweep=k``: N = K, K in ``--k_logreg`` / ``--k_cnn``, FedAvg (no per-client state,
  so the growth is the per-slot cost of a round: with one vmap of K, K copies of the start
  model, local model, optimiser trace, gradient and upload; in chunks, the clients' data
  and a chunk's copies): seconds per round, peak RSS;
* ``--sweep=n``: K fixed, N in ``--n_logreg`` / ``--n_cnn``: a least-squares slope of
  peak RSS over N gives the measured bytes per simulated client, compared with what its
  state strictly needs: 2 d x 4 B (dual, last local) + M x (features + 1) x 4 B (data,
  labels), and the largest N that fits in ``--budget_gib`` is (budget - intercept) /
  slope (every N at least the fixed K, ``--k_fixed_logreg`` / ``--k_fixed_cnn``).
  ``--verify=model:N:K`` (N >= K) runs one configuration near that limit.

The round runs as the engine would run it by default (``--client_chunk=-1``: the CNN one
client at a time on CPU, logistic regression in one vmap of K); ``--client_chunk=0``
forces one vmap of all K. With chunks, every algorithm with a streamed server
(``Algorithm.streamed_server``: FedAvg, FedProx, FedNova, FedADMM, and PAFed through
DUCC's running sums) folds its uploads in chunk by chunk (``EngineConfig.stream_uploads``,
the default), so neither the K sweep's FedAvg nor the N sweep's PAFed holds a ``[K, d]``
uploads block; ``--nostream_uploads`` keeps it (the layout before), and
``--sweep=k_fit`` runs the K sweep both ways, fits peak memory over K for each and
reports the largest K per round that fits in ``--budget_gib``. (On an
accelerator the CNN's default is one vmap of K, which keeps the block: give
``--client_chunk`` to stream there.)

The children run on the parent's platform (JAX's default, or ``JAX_PLATFORMS``). On an
accelerator the memory that counts is the device's: each row also has
``peak_device_bytes`` (``memory_stats()['peak_bytes_in_use']``), the N fit uses it instead
of the host's peak RSS, and ``--budget_gib=0`` means the device's ``bytes_limit`` (the
host's RAM on CPU).

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/scaling.py --sweep=k,n
"""

import json
import os
import subprocess
import sys
import time


from absl import app, flags  # noqa: E402

from benchmarks import flagcheck  # noqa: E402

FLAGS = flags.FLAGS
flagcheck.choice_list("sweep", ["k", "n"], ["k", "n", "k_fit"],
                       "k: grow clients per round; n: grow total clients; k_fit: k, and "
                       "again with the uploads kept as [K, d], each fitted for the largest "
                       "K per round in the budget.")
flagcheck.int_list("k_logreg", ["10", "100", "1000", "10000"], "K for logreg (N = K).")
flagcheck.int_list("k_cnn", ["10", "50", "200", "1000"], "K for the CNN (N = K).")
flagcheck.int_list("n_logreg", ["1000", "10000", "100000", "1000000"], "N for logreg.")
flagcheck.int_list("n_cnn", ["20", "100", "300"], "N for the CNN.")
flags.DEFINE_integer("k_fixed_logreg", 100, "K in the N sweep (logreg).", lower_bound=1)
flags.DEFINE_integer("k_fixed_cnn", 10, "K in the N sweep (CNN).", lower_bound=1)
flagcheck.choice_list("models", ["logreg", "cnn"], ["logreg", "cnn"], "Models.")
flags.DEFINE_integer("examples", 60, "Examples per client M.", lower_bound=1)
flags.DEFINE_integer("batch", 10, "Local minibatch size.", lower_bound=1)
flags.DEFINE_integer("cnn_examples_big_k", 20, "M for the CNN when K >= 1000 (fewer steps).",
                     lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Rounds fused per timed call.", lower_bound=1)
flags.DEFINE_float("budget_gib", 24.0, "Memory to fit in (0: the device's memory; the "
                   "host's RAM on CPU).", lower_bound=0.0)
flags.DEFINE_string("verify", "", "model:N:K to run once near the limit, e.g. logreg:500000:100.")


def parse_verify(spec: str):
  """``--verify``'s ``model:N:K`` as (model, N, K); ValueError naming the flag."""
  parts = spec.split(":")
  ok = (len(parts) == 3 and parts[0] in ("logreg", "cnn")
        and all(p.isdigit() and int(p) >= 1 for p in parts[1:]))
  if not ok:
    raise ValueError(f"--verify: expected model:N:K with model logreg or cnn and N, K "
                     f"integers >= 1 (e.g. logreg:500000:100), got {spec!r}")
  model, n, k = parts[0], int(parts[1]), int(parts[2])
  if n < k:
    raise ValueError(f"--verify: expected model:N:K with N >= K (a round samples K of the "
                     f"N clients), got N = {n} < K = {k} in {spec!r}")
  return model, n, k


def _check_verify(spec: str) -> bool:
  if spec:
    try:
      parse_verify(spec)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from None
  return True


flags.register_validator("verify", _check_verify)


def _check_n_sweep(v) -> bool:
  """The N sweep's N (``--n_logreg`` / ``--n_cnn``) must be >= its fixed K, for each model
  it runs on."""
  if "n" not in (v["sweep"] or ()):
    return True
  for model in v["models"] or ():
    ns_flag, k_flag = f"n_{model}", f"k_fixed_{model}"
    if ns_flag not in v:  # an unknown model: --models's own check names it
      continue
    try:
      small = [n for n in v[ns_flag] if int(n) < v[k_flag]]
    except (TypeError, ValueError):  # not integers: --n_<model>'s own check names it
      return True
    if small:
      raise flags.ValidationError(
          f"--{ns_flag}: each N must be >= --{k_flag}={v[k_flag]} (the N sweep samples "
          f"K = {v[k_flag]} of the N clients per round), got {','.join(small)}")
  return True


flags.register_multi_flags_validator(
    ["sweep", "models", "n_logreg", "n_cnn", "k_fixed_logreg", "k_fixed_cnn"],
    _check_n_sweep)

flags.DEFINE_string("child", "", "Internal: model:K:N:M:algorithm to run in this process.")
flags.DEFINE_integer("client_chunk", -1, "Engine: clients per vmapped chunk (-1: the "
                     "engine's automatic choice, 1 for models of >= 100k parameters on CPU; "
                     "0: all K in one vmap).", lower_bound=-1)
flags.DEFINE_boolean("stream_uploads", True, "Engine: with client chunks, fold the "
                     "uploads in chunk by chunk (no [K, d] block) for every algorithm with a "
                     "streamed server (Algorithm.streamed_server: FedAvg, FedProx, FedNova, "
                     "FedADMM, and PAFed through DUCC's running sums).")
flags.DEFINE_integer("reps", 1, "Timed repetitions after the warm-up (best is reported).",
                     lower_bound=1)
flags.DEFINE_string("tag", "", "Free-form label stored with the rows.")


def child(spec):
  """Runs one configuration; prints a RESULT json line."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  from fedjax_async.rounds import engine  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  model, k, n, m, alg = spec.split(":")
  k, n, m = int(k), int(n), int(m)
  jax.numpy.zeros(1).block_until_ready()
  rss0 = common.peak_rss_bytes()
  t0 = time.perf_counter()
  wl = common.Workload(model, k, num_clients=n, examples=m, batch=FLAGS.batch,
                       rounds=FLAGS.rounds, algorithm=alg, jax_data=True)
  build_s = time.perf_counter() - t0
  rss_built = common.peak_rss_bytes()
  chunk = common.client_chunk(FLAGS.client_chunk, wl.dim)
  cfg = wl.engine_config(client_chunk=chunk, stream_uploads=FLAGS.stream_uploads)
  prep, run, _ = common.engine_runner(wl, cfg)
  t = common.timed(prep, run, reps=FLAGS.reps)
  rss = common.peak_rss_bytes()
  device_peak = common.device_peak_bytes()  # None on CPU
  feat = 1
  for s in wl.input_shape:
    feat *= s
  strict_state = len(wl.alg.client_state_keys) * wl.dim * 4
  strict_data = m * (feat + 1) * 4
  print("RESULT " + json.dumps(dict(
      model=model, clients_per_round=k, num_clients=n, examples=m, params=wl.dim,
      local_steps=wl.steps, client_chunk=chunk,
      stream_uploads=engine.streams_uploads(wl.alg, cfg, k), s_per_round=t / FLAGS.rounds,
      build_s=build_s,
      rss_base=rss0, rss_after_build=rss_built, peak_rss=rss,
      peak_device_bytes=device_peak,
      strict_bytes_per_client=strict_state + strict_data,
      strict_state_bytes_per_client=strict_state)), flush=True)


def run_child(model, k, n, m, alg, stream=None):
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  env = common.child_env()  # the parent's platform: a GPU run measures the GPU
  stream = FLAGS.stream_uploads if stream is None else stream
  cmd = [sys.executable, os.path.abspath(__file__), f"--child={model}:{k}:{n}:{m}:{alg}",
         f"--rounds={FLAGS.rounds}", f"--batch={FLAGS.batch}", f"--reps={FLAGS.reps}",
         f"--client_chunk={FLAGS.client_chunk}",
         "--stream_uploads" if stream else "--nostream_uploads"]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    msg = (proc.stderr.strip().splitlines() or ["?"])[-1]
    print(f"[scaling] {model} K={k} N={n}: FAILED rc={proc.returncode}: {msg}", flush=True)
    return dict(model=model, clients_per_round=k, num_clients=n, failed=msg)
  r = json.loads(lines[-1][len("RESULT "):])
  dev = ("" if r.get("peak_device_bytes") is None
         else f", peak device memory {r['peak_device_bytes'] / 2**20:.0f} MiB")
  how = " streamed" if r.get("stream_uploads") else ""
  print(f"[scaling] {model} {alg}{how} K={k} N={n} M={m}: {r['s_per_round']:.4g} s/round, peak RSS "
        f"{r['peak_rss'] / 2**20:.0f} MiB (base {r['rss_base'] / 2**20:.0f} MiB){dev}",
        flush=True)
  return r


def m_for(model, k):
  return FLAGS.cnn_examples_big_k if model == "cnn" and k >= 1000 else FLAGS.examples


def k_sweep(model, mach, keep, budget, budget_gib, fit):
  """N = K, FedAvg, K in ``--k_logreg`` / ``--k_cnn``; with ``fit`` (``--sweep=k_fit``) the
  same K also with the uploads kept as ``[K, d]`` (``sweep: k_kept`` rows), and for each
  way a fit peak memory = intercept + slope x K and the largest K per round in the budget
  (the two ways differ only where the round runs in chunks: the CNN on CPU by default;
  where no K streamed, the kept pass would repeat the same rounds and is not run)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  pts = []
  ks = list(map(int, FLAGS.k_logreg if model == "logreg" else FLAGS.k_cnn))
  for stream in ((True, False) if fit else (FLAGS.stream_uploads,)):
    if fit and not stream and pts and not any(p[3] for p in pts):
      # one vmap of K (no chunks) keeps the [K, d] block either way: the same rounds again
      print(f"[scaling] {model}: no K streamed its uploads (--client_chunk="
            f"{FLAGS.client_chunk}), so the K sweep with the uploads kept as [K, d] would "
            "repeat the same rounds: not run", flush=True)
      break
    pts = []
    for k in ks:
      r = run_child(model, k, k, m_for(model, k), "fedavg", stream=stream)
      keep(dict(bench="scaling", sweep="k_kept" if fit and not stream else "k",
                tag=FLAGS.tag, **mach, **r))
      if "failed" not in r:
        pts.append((k, common.peak_memory(r), r["params"], bool(r["stream_uploads"])))
    if not fit or len(pts) < 2:
      continue
    kk = np.array([p[0] for p in pts], float)
    mem = np.array([p[1] for p in pts], float)
    slope, icpt = np.polyfit(kk, mem, 1)
    k_max = int((budget - icpt) / slope) if slope > 0 else None
    streamed = pts[-1][3]
    keep(dict(bench="scaling", sweep="k_fit", model=model, stream_uploads=streamed,
              bytes_per_slot=slope, intercept_bytes=icpt, upload_bytes=pts[-1][2] * 4,
              max_k_in_budget=k_max, budget_gib=budget_gib, ks=[p[0] for p in pts],
              tag=FLAGS.tag, **mach))
    how = "summed chunk by chunk" if streamed else "kept as [K, d]"
    print(f"[scaling] {model}, uploads {how}: {slope / 2**20:.3f} MiB per client slot "
          f"(an upload is {pts[-1][2] * 4 / 2**20:.2f} MiB); intercept "
          f"{icpt / 2**20:.0f} MiB; largest K per round in {budget_gib:.3g} GiB ~ "
          f"{k_max if k_max is not None else 'unbounded by memory'}", flush=True)


def main(_):
  if FLAGS.child:
    child(FLAGS.child)
    return
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  mach = common.machine()

  def keep(row):  # written as soon as it is measured: an interrupted sweep keeps its rows
    common.write_rows("scaling", [row])

  budget = FLAGS.budget_gib * 2**30 or common.device_memory_bytes()
  if not budget:
    sys.exit("error: --budget_gib=0 asks for the device's memory, which JAX does not report "
             "here; give the budget in GiB")
  budget_gib = budget / 2**30
  if "k" in FLAGS.sweep or "k_fit" in FLAGS.sweep:
    for model in FLAGS.models:
      k_sweep(model, mach, keep, budget, budget_gib, fit="k_fit" in FLAGS.sweep)
  if "n" in FLAGS.sweep:
    import numpy as np  # pylint: disable=g-import-not-at-top
    for model in FLAGS.models:
      k = FLAGS.k_fixed_logreg if model == "logreg" else FLAGS.k_fixed_cnn
      pts = []
      for n in map(int, FLAGS.n_logreg if model == "logreg" else FLAGS.n_cnn):
        r = run_child(model, k, n, FLAGS.examples, "pafed")
        keep(dict(bench="scaling", sweep="n", tag=FLAGS.tag, **mach, **r))
        if "failed" not in r:
          pts.append((n, common.peak_memory(r), r["strict_bytes_per_client"],
                      r.get("peak_device_bytes") is not None))
      if len(pts) >= 2:
        ns = np.array([p[0] for p in pts], float)
        rss = np.array([p[1] for p in pts], float)
        slope, icpt = np.polyfit(ns, rss, 1)
        strict = pts[0][2]
        n_max = int((budget - icpt) / slope)
        fit = dict(bench="scaling", sweep="n_fit", model=model, clients_per_round=k,
                   bytes_per_client=slope, intercept_bytes=icpt,
                   strict_bytes_per_client=strict, ratio_to_strict=slope / strict,
                   max_clients_in_budget=n_max, budget_gib=budget_gib, tag=FLAGS.tag,
                   memory="device peak" if pts[-1][3] else "process peak RSS", **mach)
        keep(fit)
        print(f"[scaling] {model}: {slope:.0f} B/client measured vs {strict} B strict "
              f"(x{slope / strict:.2f}); intercept {icpt / 2**20:.0f} MiB; largest N in "
              f"{budget_gib:.3g} GiB ~ {n_max}", flush=True)
  if FLAGS.verify:
    model, n, k = parse_verify(FLAGS.verify)
    r = run_child(model, k, n, FLAGS.examples, "pafed")
    keep(dict(bench="scaling", sweep="verify", tag=FLAGS.tag, **mach, **r))


if __name__ == "__main__":
  app.run(main, flags_parser=flagcheck.parse_flags)
