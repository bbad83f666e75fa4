"""The clients' health in every round (engine.health_metrics), the console line naming a
client far outside its round, the divergence error's cause and advice, and the remedies
(local.client_grad_clip, algorithm.drop_nonfinite_uploads)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async.algorithms import get
from fedjax_async.core import client as client_lib
from fedjax_async.core import divergence
from fedjax_async.core import timeline as timeline_lib
from fedjax_async.core.device import client_key
from fedjax_async.rounds import engine

N, M, D, C = 10, 16, 5, 3
HP = dict(lr=0.1, momentum=0.5, rho=0.5, mu=0.3, alpha0=0.8, alpha1=0.6, alpha2=0.4,
          server_lr=1.0, server_lr2=1.0, server_lr_switch_round=-1, client_weighting=0.0,
          ducc_project_conflicting=1.0, alpha_decay=1.0)
W0 = np.random.default_rng(1).normal(scale=0.1, size=D * C + C).astype(np.float32)


def apply_flat(w, xb, train=False, rng=None):
  del train, rng
  return xb @ w[:D * C].reshape(D, C) + w[D * C:]


def toy_data(nan_client=None):
  """Client i's features scaled by 1 + 3 i (losses far apart); the last client, never an
  arrival (the timeline has N - 1 clients) but the one padding slots train, by 100 more."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, M, D)).astype(np.float32)
  x *= (1.0 + 3.0 * np.arange(N, dtype=np.float32))[:, None, None]
  x[-1] *= 100.0
  y = rng.integers(0, C, (N, M)).astype(np.int32)
  counts = rng.integers(6, M + 1, N).astype(np.int32)
  if nan_client is not None:
    x[nan_client, 0, 0] = np.nan
  tx, ty = rng.normal(size=(32, D)).astype(np.float32), rng.integers(0, C, 32).astype(np.int32)
  return engine.DeviceData(*map(jnp.asarray, (x, y, counts, tx, ty)))


def timeline(rounds=3):
  return timeline_lib.build(N - 1, rounds, 0.6, timeline_lib.DelayConfig(0.4, "uniform", 2),
                            seed=4)


def reference(alg, cfg, pres, tl, data):
  """Per round, per arrival (client, loss, ||Delta||, state norm), trained one by one from
  the state before the round (``pres``)."""
  hp = {k: jnp.float32(v) for k, v in HP.items()}
  train = jax.jit(lambda *a: client_lib.train(apply_flat, alg, *a, hp=hp, cfg=cfg.local))
  final = jax.jit(lambda *a: alg.client_final(*a, hp))
  return [_arrivals(train, final, cfg, pre, t, tl, data) for t, pre in enumerate(pres)]


def _arrivals(train, final, cfg, pre, t, tl, data):
  out = []
  for j in np.flatnonzero(tl.valid[t]):
    c, disp = int(tl.client[t, j]), int(tl.dispatch[t, j])
    w0 = pre.ring[disp % cfg.ring_size]
    cs = {k: v[c] for k, v in pre.client_state.items()}
    res = train(w0, cs, data.x[c], data.y[c], data.counts[c],
                client_key(pre.key, jnp.int32(disp), jnp.int32(c)))
    fin = final(w0, res.w_end, cs, res.num_steps)
    state = np.linalg.norm(np.asarray(fin.state["dual"])) if "dual" in fin.state else None
    out.append((c, float(res.mean_loss),
                float(np.linalg.norm(np.asarray(res.w_end) - np.asarray(w0))), state))
  return out


@pytest.mark.parametrize("chunk", [None, 3])
def test_health_fields_equal_the_per_client_values_computed_one_by_one(chunk):
  """Each round's largest and median loss and ||Delta||, the worst client, its loss and
  dual norm (FedADMM) equal numpy's over that round's arrivals, each client trained by
  hand; the padding slots (they train the last client, whose features are 100x larger)
  are left out, and chunks of 3 of the round's slots (a remainder chunk) give the same."""
  name = "fedadmm"
  tl, alg, data = timeline(), get(name), toy_data()
  cfg = engine.EngineConfig(client_lib.LocalConfig(4, 1, M), 3, client_chunk=chunk)
  assert (~tl.valid).any()  # padding slots exist
  runner = engine.make_runner(apply_flat, alg, cfg)
  state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
  pres, rows = [], []
  for t in range(tl.num_rounds):
    pres.append(jax.tree.map(jnp.copy, state))
    state, (row,) = engine.run_rounds(runner, state, tl, HP, data, stop_round=t + 1)
    rows.append(row)
  assert tl.valid.shape[1] % 3 and max(r["client_loss_max"] for r in rows) < 1e3
  for row, ref in zip(rows, reference(alg, cfg, pres, tl, data)):
    clients, losses, deltas, states = zip(*ref)
    worst = int(np.argmax(deltas))
    np.testing.assert_allclose(row["client_loss_max"], max(losses), rtol=1e-5)
    np.testing.assert_allclose(row["client_loss_median"], np.median(losses), rtol=1e-5)
    np.testing.assert_allclose(row["delta_norm_max"], max(deltas), rtol=1e-4)
    np.testing.assert_allclose(row["delta_norm_median"], np.median(deltas), rtol=1e-4)
    assert row["worst_client"] == clients[worst]
    np.testing.assert_allclose(row["worst_client_loss"], losses[worst], rtol=1e-5)
    assert row["client_nonfinite_share"] == 0.0 and row["dropped_nonfinite"] == 0
    np.testing.assert_allclose(row["client_state_norm_max"], max(states), rtol=1e-4)
    np.testing.assert_allclose(row["worst_client_state_norm"], states[worst], rtol=1e-4)


class KeepNonfinite:
  stops_on_divergence = True  # run_rounds then hands the non-finite rows over

  def __call__(self, state, rows):
    pass


@pytest.mark.parametrize("chunk", [None, 2])
def test_drop_nonfinite_keeps_the_model_finite_and_the_clients_state(chunk):
  """A client whose data holds a NaN trains to NaN (the reproduction below: the model
  then turns non-finite); with ``drop_nonfinite`` its upload is no arrival (counted), the
  model stays finite and the client keeps its dual (zero: never trained before). The
  streamed rule (``client_chunk``) leaves it out of its running sum too."""
  tl, alg = timeline(2), get("pafed")
  bad = int(tl.client[0][tl.valid[0]][0])
  data = toy_data(nan_client=bad)
  for drop in (True,):
    cfg = engine.EngineConfig(client_lib.LocalConfig(4, 1, M), 3, client_chunk=chunk,
                              drop_nonfinite=drop)
    state = engine.init_state(alg, W0, N, cfg.ring_size, 0)
    runner = engine.make_runner(apply_flat, alg, cfg)
    state, rows = engine.run_rounds(runner, state, tl, HP, data, stop_round=1,
                                    on_chunk=KeepNonfinite())
    row = rows[0]
    assert row["worst_client"] == bad and divergence.outlier(row) == "nonfinite"
    assert row["client_nonfinite_share"] == pytest.approx(1 / tl.valid[0].sum())
    assert row["nonfinite"] is (not drop)
    assert row["dropped_nonfinite"] == int(drop)
    assert row["online"] + row["delayed"] == tl.valid[0].sum() - int(drop)
    dual = np.asarray(state.client_state["dual"][bad])
    assert (np.all(dual == 0) if drop else not np.all(np.isfinite(dual)))


def test_the_cause_found_in_the_rows_fits_the_advice():
  """A client non-finite first: the local advice, naming it, never PAFed's alphas; every
  client finite and none far out: the server step."""
  ok = dict(round=1, worst_client=3, worst_client_loss=2.0, client_loss_median=1.5,
            delta_norm_max=4.0, delta_norm_median=3.0, client_nonfinite_share=0.0,
            nonfinite=False)
  out = dict(ok, round=2, worst_client=7, worst_client_loss=3e5, delta_norm_max=900.0,
             worst_client_state_norm=9.0)
  bad = dict(ok, round=4, worst_client=7, worst_client_loss=None, delta_norm_max=np.inf,
             client_nonfinite_share=0.25, nonfinite=True)
  assert [divergence.outlier(r) for r in (ok, out, bad)] == [None, "outlier", "nonfinite"]
  data = toy_data()
  text = divergence.advice(data, [ok, out, ok, bad])
  assert text.startswith("the first non-finite client result: client 7 (local loss nan, "
                         "||Delta|| inf) in round 4; it was first far outside its round in "
                         "round 2: client 7 (local loss 3e+05, ||Delta|| 900, its dual ||y|| "
                         "9); the cause is local training")
  assert "alpha" not in text and text.endswith(divergence.LOCAL_ADVICE)
  assert divergence.advice(data, [ok, dict(ok, round=2, nonfinite=True)]).endswith(
      "the server step made the model non-finite; " + divergence.SERVER_ADVICE)
  assert divergence.advice(data, [{"round": 1, "nonfinite": True}]) == (
      divergence.SERVER_ADVICE)  # rows without health fields
  # every client of the round non-finite, none far out before: the model they started from
  allbad = dict(bad, client_nonfinite_share=1.0)
  assert divergence.advice(data, [ok, allbad]) == (
      "the first non-finite client result: client 7 (local loss nan, ||Delta|| inf) in "
      "round 4; no client was far out before it, nor any of its round finite: the likelier "
      f"cause is the model they started from; {divergence.SERVER_ADVICE}")
  assert divergence.advice(data, [ok, out, allbad]).endswith(divergence.LOCAL_ADVICE)


# The reproduction: PAFed with an MLP on Synthetic(1,1), heavy-ball momentum 0.9 and lr
# 0.2. Client 21's local training blows up in round 3 (its dual keeps it), again in
# later rounds, and is NaN in round 9, which Eq. 17 carries into the global model.
BLOW_UP = dict(algorithm="pafed", model="mlp", rounds=9, lr=0.2, momentum=0.9,
               rounds_per_call=9)


def test_a_local_blow_up_is_named_when_it_happens_and_by_the_divergence_error(tmp_path,
                                                                              capsys):
  with pytest.raises(divergence.Diverged) as e:
    fa.simulate(output_dir=str(tmp_path), checkpoint_every=0, tensorboard=False, **BLOW_UP)
  console = capsys.readouterr().out
  # (the blow-up is chaotic: which round and client depend on the CPU's float kernels, so
  # the expectations are read from the rows the run wrote, by the outlier rule's ratio)
  rows = [json.loads(l) for l in open(tmp_path / "pafed" / "metrics.jsonl")]
  ratio = divergence.OUTLIER_RATIO
  first = next(r for r in rows if r["client_loss_max"] > ratio * r["client_loss_median"]
               or r["delta_norm_max"] > ratio * r["delta_norm_median"])
  t, c = first["round"], first["worst_client"]
  named = f"round {t}: client {c} (local loss {first['client_loss_max']:.4g}"
  assert f"[pafed] {named}" in console and (
      "normalised by PAFed (Alg. 3 line 8): the server does not see it; its dual now holds "
      f"||y|| = {first['client_state_norm_max']:.4g}") in console, console
  message = str(e.value)
  assert e.value.round == len(rows) + 1 and "alpha" not in message, message
  assert (f"[pafed] round {e.value.round}: client " in console and "(local loss nan, "
          "||Delta|| inf): a non-finite result; taken in by the server: the global model is "
          "not finite" in console), console
  assert "the first non-finite client result: client " in message, message
  assert f"in round {e.value.round}; it was first far outside its round in {named}" in (
      message), message
  assert message.endswith(divergence.LOCAL_ADVICE)
  assert all(np.isfinite(r["model_norm"]) for r in rows)  # normalised: the model looks fine


def test_client_grad_clip_keeps_the_reproduction_finite(capsys):
  run = fa.simulate(client_grad_clip=10.0, **BLOW_UP).runs["pafed"]
  assert len(run.rows) == 9 and not any(r["nonfinite"] for r in run.rows)
  assert max(r["client_loss_max"] for r in run.rows) < 100
  assert "far outside the round" not in capsys.readouterr().out


# ------------------------------------------------------------------ the virtual clock


def arrivals(losses, deltas, group=0):
  return [{"group": group, "event": i, "client": 10 + i, "train_loss": l, "delta_norm": d}
          for i, (l, d) in enumerate(zip(losses, deltas))]


def test_an_arrival_is_compared_with_the_medians_of_the_arrivals_before_it(monkeypatch):
  rows = arrivals([1.0, 2.0, 3.0, 500.0, np.nan], [0.1, 0.2, 0.3, 50.0, 0.4])
  health = divergence.arrival_health(rows)
  # row 3: median loss of (1, 2, 3, 500) is 2.5, of ||Delta|| 0.25: 500 > 100 x 2.5
  assert health[3]["client_loss_median"] == 2.5 and health[3]["delta_norm_median"] == 0.25
  assert health[3]["worst_client"] == 13 and health[3]["worst_client_loss"] == 500.0
  assert [divergence.outlier(h) for h in health] == [None, None, None, "outlier", "nonfinite"]
  assert health[4]["client_loss_median"] == 2.5  # (NaN left out of the median)
  monkeypatch.setattr(divergence, "ARRIVAL_WINDOW", 2)
  # row 3 beside row 2 only: median loss 251.5, so 500 is not 100 x outside it
  assert divergence.outlier(divergence.arrival_health(rows)[3]) is None
  monkeypatch.setattr(divergence, "ARRIVAL_WINDOW", 100)
  before = arrivals([400.0] * 3, [40.0] * 3)  # an earlier chunk of large losses
  assert divergence.outlier(divergence.arrival_health(rows[3:4], before)[0]) is None
  assert divergence.arrival_health([{"event": 0, "client": 1, "train_loss": 1.0}]) == []


# FedAsync with an MLP on Synthetic(1,1), lr 0.2 and heavy-ball momentum 0.9: client 15's
# local training blows up in group 6, others later; the model is NaN in group 26.
CLOCK_BLOW_UP = dict(algorithm="fedasync", model="mlp", num_updates=30, lr=0.2,
                     momentum=0.9, eval_every=10)


def test_the_virtual_clock_names_a_local_blow_up_and_the_divergence_its_cause(capsys):
  result = fa.simulate(**CLOCK_BLOW_UP)
  console = capsys.readouterr().out
  assert ("[fedasync] group 6: client 15 (local loss 1643, ||Delta|| 692.6): far outside "
          "the arrivals before it (the last 100) (median loss 5.42" in console
          and "mixed into the global model at its size" in console), console
  message = result.diverged["fedasync (seed 0)"]
  assert message.startswith("group 26: the global model is not finite"), message
  assert ("the first non-finite client result: client 3 (local loss nan, ||Delta|| nan) in "
          "group 26; the first client far outside the arrivals before it: client 15 "
          "(local loss 1643") in message, message
  assert message.endswith(divergence.CLOCK_LOCAL_ADVICE), message
  clipped = fa.simulate(client_grad_clip=10.0, **CLOCK_BLOW_UP)
  rows = clipped.runs["fedasync"].rows
  assert not clipped.diverged and len(rows) == 30
  assert all(np.isfinite(r["delta_norm"]) and r["delta_norm"] < 1e3 for r in rows)
  assert "far outside" not in capsys.readouterr().out


def test_a_sweeps_diverged_run_carries_its_cause_in_its_summary(capsys):
  result = fa.simulate(algorithm="fedavg", rounds=3, sweep={"server_lr": [1.0, 1e38]})
  calm, blown = (result.runs[f"fedavg/server_lr={v}_seed=0"].summary for v in ("1", "1e+38"))
  assert calm["diverged_round"] is None and "diverged_cause" not in calm
  assert blown["diverged_round"] == 1, blown
  cause = ("every client's result was finite and none far outside its round: the server "
           "step made the model non-finite")
  assert blown["diverged_cause"] == cause
  assert f"[fedavg/server_lr=1e+38_seed=0] diverged in round 1: {cause}" in (
      capsys.readouterr().out)


def test_the_clock_comparison_has_a_line_for_a_diverged_run():
  from fedjax_async.asynchronous import report
  summary = {"run": "fedbuff", "final_accuracy": 0.5, "best_accuracy": 0.6, "arrivals": 40,
             "server_updates": 10, "mean_staleness": 1.5, "updates_per_virtual_second": 2.0,
             "wall_time_s": 3.0}
  table = report.clock_table([summary], {"fedasync": "group 26: the global model is not "
                                         "finite (NaN/Inf); the first non-finite client"})
  assert "| fedasync | diverged (group 26) | – | – | – | – | – | – | – |" in table.splitlines()
  assert "| fedbuff | 0.5000 | 0.6000 | 40 | 10 | 1.50 | 2.000 |  | 3.0 |" in table.splitlines()
