"""Client-axis sharding over 4 forced host devices gives the unsharded engine's rounds.

JAX fixes its device count at start-up, so the checks run in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``; it prints one JSON line that the
tests read.
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fedjax_async import sharding
from fedjax_async.core import timeline as timeline_lib
import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
  import dataclasses, functools, json
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import PartitionSpec
  from fedjax_async import sharding
  from fedjax_async.core import client as client_lib
  from fedjax_async.rounds import engine
  from fedjax_async.core import timeline as timeline_lib
  from fedjax_async.algorithms import get

  N, M, D, C = 12, 24, 6, 3
  HP = dict(lr=0.1, momentum=0.5, rho=0.5, mu=0.3, alpha0=0.8, alpha1=0.6, alpha2=0.4,
            server_lr=1.0, server_lr2=1.0, server_lr_switch_round=-1, client_weighting=0.0,
            ducc_project_conflicting=1.0, alpha_decay=1.0)

  def apply_flat(w, xb, train=False, rng=None):
    return xb @ w[:D * C].reshape(D, C) + w[D * C:]

  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, M, D)).astype(np.float32)
  y = rng.integers(0, C, (N, M)).astype(np.int32)
  counts = rng.integers(5, M + 1, N).astype(np.int32)
  tx = rng.normal(size=(32, D)).astype(np.float32)
  ty = rng.integers(0, C, 32).astype(np.int32)
  data = engine.DeviceData(*map(jnp.asarray, (x, y, counts, tx, ty)))
  w0 = rng.normal(scale=0.1, size=D * C + C).astype(np.float32)
  tl = timeline_lib.build(N, 6, 0.4, timeline_lib.DelayConfig(0.4, "uniform", 2), seed=3)
  alg = get("pafed")
  cfg = engine.EngineConfig(client_lib.LocalConfig(4, 2, M), ring_size=3, eval_batch=16)

  def run(cfg, tl, data, state):
    runner = engine.make_runner(apply_flat, alg, cfg)
    return engine.run_rounds(runner, state, tl, HP, data, eval_every=2, rounds_per_call=3)

  ref_state, ref_rows = run(cfg, tl, data, engine.init_state(alg, w0, N, 3, 0))

  mesh = sharding.client_mesh()
  scfg = dataclasses.replace(cfg, client_sharding=sharding.client_sharding(mesh))
  stl = sharding.pad_timeline(tl, mesh.size)
  sdata = sharding.replicate(data, mesh)
  sstate0 = sharding.replicate(engine.init_state(alg, w0, N, 3, 0), mesh)
  s_state, s_rows = run(scfg, stl, sdata, sstate0)

  # One round's client phase, jitted, to look at how its per-client outputs are placed.
  hp = {k: jnp.float32(v) for k, v in HP.items()}
  slots = jax.tree.map(lambda a: jnp.asarray(a[0]), stl.slice(0, 1))
  phase = jax.jit(functools.partial(engine.client_phase, apply_flat=apply_flat,
                                    algorithm=alg, cfg=scfg))(
      sharding.replicate(engine.init_state(alg, w0, N, 3, 0), mesh), slots, hp, sdata)
  up = phase.uploads
  # What experiments/run.py --devices does: one call places everything.
  # With 100 MB more data: its copies take long enough to still be in flight if
  # shard_clients did not wait for them.
  big = jnp.ones((25_000_000,), jnp.float32).block_until_ready()
  cfg4, tl4, st4, dt4 = sharding.shard_clients(cfg, tl, engine.init_state(alg, w0, N, 3, 0),
                                               (data, big), jax.devices())
  placed = jax.tree.leaves((st4, dt4))
  # FedAvg with client_chunk over the mesh: the uploads summed chunk by chunk
  # (stream_uploads) on each device, against the unsharded one-vmap engine.
  fa = get("fedavg")
  fcfg = dataclasses.replace(scfg, client_chunk=2)
  fa_runner = engine.make_runner(apply_flat, fa, fcfg)
  fa_state, _ = engine.run_rounds(fa_runner, sharding.replicate(
      engine.init_state(fa, w0, N, 3, 0), mesh), stl, HP, sdata, rounds_per_call=3)
  fa_ref, _ = engine.run_rounds(engine.make_runner(apply_flat, fa, cfg),
                              engine.init_state(fa, w0, N, 3, 0), tl, HP, data,
                              rounds_per_call=3)
  out = {
      "shard_clients": {
          "k_padded": int(tl4.client.shape[1]),
          "spec_is_clients": cfg4.client_sharding.spec == PartitionSpec("clients"),
          "mesh_size": int(cfg4.client_sharding.mesh.size),
          "all_ready": all(a.is_ready() for a in placed),
          "all_replicated_on_4": all(a.sharding.is_fully_replicated
                                     and len(a.sharding.device_set) == 4 for a in placed),
      },
      "devices": len(jax.devices()),
      "k": int(tl.client.shape[1]), "k_padded": int(stl.client.shape[1]),
      "w_ref": np.asarray(ref_state.w).tolist(), "w_sharded": np.asarray(s_state.w).tolist(),
      "dual_ref": np.asarray(ref_state.client_state["dual"]).tolist(),
      "dual_sharded": np.asarray(s_state.client_state["dual"]).tolist(),
      "loss_ref": [r["train_loss"] for r in ref_rows],
      "loss_sharded": [r["train_loss"] for r in s_rows],
      "steps_ref": [r["client_steps"] for r in ref_rows],
      "steps_sharded": [r["client_steps"] for r in s_rows],
      "upload_spec": str(sharding.shard_spec(up)),
      "upload_spec_is_clients": sharding.shard_spec(up) == PartitionSpec("clients"),
      "upload_shards": [list(s.data.shape) for s in up.addressable_shards],
      "upload_shard_devices": sorted(str(s.device) for s in up.addressable_shards),
      "upload_shape": list(up.shape),
      "w_fully_replicated": bool(s_state.w.sharding.is_fully_replicated),
      "fedavg_streams": engine.streams_uploads(fa, fcfg, int(stl.client.shape[1])),
      "w_fedavg_streamed_sharded": np.asarray(fa_state.w).tolist(),
      "w_fedavg_ref": np.asarray(fa_ref.w).tolist(),
  }
  print("RESULT " + json.dumps(out))
""")


@functools.lru_cache(maxsize=None)
def child_result():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=run_script.xla_flags("--xla_force_host_platform_device_count=4"))
  proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


@pytest.mark.xdist_group("sharding_child")  # one child process, cached
def test_sharded_round_equals_unsharded():
  r = child_result()
  assert r["devices"] == 4
  assert r["k_padded"] % 4 == 0 and r["k_padded"] >= r["k"]
  np.testing.assert_allclose(r["w_sharded"], r["w_ref"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(r["dual_sharded"], r["dual_ref"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(r["loss_sharded"], r["loss_ref"], rtol=1e-5, atol=1e-6)
  assert r["steps_sharded"] == r["steps_ref"]


@pytest.mark.xdist_group("sharding_child")  # one child process, cached
def test_streamed_uploads_over_the_mesh_equal_unsharded():
  r = child_result()
  assert r["fedavg_streams"]
  np.testing.assert_allclose(r["w_fedavg_streamed_sharded"], r["w_fedavg_ref"], rtol=1e-5,
                             atol=1e-6)


@pytest.mark.xdist_group("sharding_child")  # one child process, cached
def test_client_axis_is_actually_split_over_the_devices():
  r = child_result()
  assert r["upload_spec_is_clients"], r["upload_spec"]
  k, d = r["upload_shape"]
  assert r["upload_shards"] == [[k // 4, d]] * 4
  assert len(set(r["upload_shard_devices"])) == 4
  assert r["w_fully_replicated"]


@pytest.mark.xdist_group("sharding_child")  # one child process, cached
def test_shard_clients_places_a_run_on_all_devices():
  r = child_result()["shard_clients"]
  assert r["k_padded"] == child_result()["k_padded"] and r["mesh_size"] == 4
  assert r["spec_is_clients"] and r["all_replicated_on_4"]
  assert r["all_ready"]  # copies finished before the first round (no late device)


def test_shard_clients_on_one_device_changes_nothing():
  cfg, tl, state, data = object(), object(), object(), object()
  assert sharding.shard_clients(cfg, tl, state, data, [None]) == (cfg, tl, state, data)


def test_select_devices_names_the_flag():
  import jax  # pylint: disable=g-import-not-at-top
  n = len(jax.devices())
  assert sharding.select_devices(0) == list(jax.devices())
  assert sharding.select_devices(n) == list(jax.devices())
  with pytest.raises(ValueError, match=rf"--engine_devices: asked for {n + 1} devices but "
                     rf"JAX sees {n} \(cpu\); on CPU, --cpu_devices={n + 1}"):
    sharding.select_devices(n + 1, "engine_devices")
  with pytest.raises(ValueError, match="--devices: must be >= 0"):
    sharding.select_devices(-1)


def test_set_cpu_devices_after_jax_started_names_the_flag():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  jnp.zeros(1).block_until_ready()  # JAX has started in this process
  with pytest.raises(ValueError, match="--cpu_devices: JAX has already started"):
    sharding.set_cpu_devices(2)
  sharding.set_cpu_devices(0)  # 0: nothing to set, no error
  with pytest.raises(ValueError, match="--cpu_devices: must be >= 0"):
    sharding.set_cpu_devices(-1)


def test_pad_timeline_keeps_rounds_and_pads_invalid_slots():
  tl = timeline_lib.build(10, 5, 0.3, timeline_lib.DelayConfig(0.3, "uniform", 2), seed=1)
  padded = sharding.pad_timeline(tl, 4)
  k = tl.client.shape[1]
  assert padded.client.shape[1] % 4 == 0 and padded.client.shape[1] >= k
  np.testing.assert_array_equal(padded.client[:, :k], tl.client)
  np.testing.assert_array_equal(padded.valid[:, :k], tl.valid)
  assert not padded.valid[:, k:].any() and not padded.online[:, k:].any()
  np.testing.assert_array_equal(padded.dispatch[:, k:],
                                np.broadcast_to(np.arange(5)[:, None], (5, padded.client.shape[1] - k)))
  assert sharding.pad_timeline(padded, 4) is padded
  assert sharding.padded_size(5, 4) == 8 and sharding.padded_size(8, 4) == 8


@pytest.mark.parametrize("k,mult,want", [(1, 4, 4), (4, 4, 4), (9, 2, 10), (3, 1, 3)])
def test_padded_size(k, mult, want):
  assert sharding.padded_size(k, mult) == want
