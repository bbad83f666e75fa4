"""Communication counted: bytes up and down per round (metrics rows) and in total (summary),
from the model's size and the round's arrivals in plaintext runs (one message: d float32
parameters), measured on the wire under CKKS, with each server's view named."""

import json

import flax.linen as nn
import numpy as np
import pytest

import fedjax_async as fa

D_IN, CLASSES = 4, 3
MESSAGE = (D_IN * CLASSES + CLASSES) * 4  # a Dense(3) on 4 features: 15 float32 parameters


class Linear(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(CLASSES)(x)


def tiny_data(num_clients=4):
  rng = np.random.default_rng(0)
  clients = [(rng.normal(size=(6, D_IN)).astype(np.float32), rng.integers(0, CLASSES, 6))
             for _ in range(num_clients)]
  test = (rng.normal(size=(8, D_IN)).astype(np.float32), rng.integers(0, CLASSES, 8))
  return fa.data.from_clients(clients, test)


def test_the_round_engine_counts_each_arrival_up_and_each_dispatch_down(tmp_path):
  # every client every round, none delayed: 4 uploads and 4 models a round
  run = fa.simulate(algorithm="fedavg", data=tiny_data(), model=Linear(), rounds=3,
                    participation=1.0, delay_fraction=0.0, quiet=True,
                    output_dir=str(tmp_path)).runs["fedavg"]
  assert [(r["bytes_up"], r["bytes_down"]) for r in run.rows] == [(4 * MESSAGE,
                                                                   4 * MESSAGE)] * 3
  assert (run.summary["bytes_up_total"], run.summary["bytes_down_total"]) == (
      12 * MESSAGE, 12 * MESSAGE)
  with open(tmp_path / "fedavg" / "summary.json") as f:
    assert json.load(f)["bytes_up_total"] == 12 * MESSAGE
  with open(tmp_path / "fedavg" / "metrics.jsonl") as f:
    assert [json.loads(line)["bytes_down"] for line in f] == [4 * MESSAGE] * 3


def test_delayed_uploads_count_in_the_round_they_arrive():
  run = fa.simulate(algorithm="fedavg", data=tiny_data(), model=Linear(), rounds=4,
                    participation=0.5, delay_fraction=0.5, quiet=True).runs["fedavg"]
  # up: the uploads that arrived in the round (online and delayed); down: the 2 sampled
  assert [r["bytes_up"] for r in run.rows] == [(r["online"] + r["delayed"]) * MESSAGE
                                               for r in run.rows]
  assert sum(r["delayed"] for r in run.rows) > 0
  assert all(r["bytes_down"] <= 2 * MESSAGE for r in run.rows)
  assert run.summary["bytes_up_total"] == sum(r["bytes_up"] for r in run.rows)


def test_the_virtual_clock_counts_each_arrival_and_every_dispatch():
  run = fa.simulate(fa.AsyncRunConfig(), algorithm="fedasync", data=tiny_data(),
                    model=Linear(), num_updates=5, concurrency=2, quiet=True
                    ).runs["fedasync"]
  s = run.summary
  assert (s["arrivals"], s["dropped"]) == (5, 0)
  assert all((r["bytes_up"], r["bytes_down"]) == (MESSAGE, MESSAGE) for r in run.rows)
  # 5 uploads; 5 + 2 models: the 2 first dispatches and one after each arrival
  assert (s["bytes_up_total"], s["bytes_down_total"]) == (5 * MESSAGE, 7 * MESSAGE)


def test_a_ckks_rounds_bytes_are_the_wires_measured_messages(monkeypatch, tmp_path):
  pytest.importorskip("openfhe", exc_type=ImportError)
  from fedjax_async.crypto import wire  # pylint: disable=g-import-not-at-top
  sizes = {}  # (sender, receiver) -> the serialised ciphertexts' bytes, as sent
  send, serialise = wire.Wire.send, wire.ciphertext_bytes
  link = [None]

  def counted_send(self, sender, receiver, message, deliver=True):
    link[0] = (sender, receiver)
    return send(self, sender, receiver, message, deliver)

  def counted_serialise(ct):
    data = serialise(ct)
    sizes[link[0]] = sizes.get(link[0], 0) + len(data)
    return data

  monkeypatch.setattr(wire.Wire, "send", counted_send)
  monkeypatch.setattr(wire, "ciphertext_bytes", counted_serialise)
  result = fa.simulate(algorithm="pafed", dataset="synthetic", num_clients=6, rounds=1,
                       participation=0.5, secure_aggregation="ckks",
                       ckks_preset="insecure_test", ckks_min_depth=4,
                       allow_insecure_ckks=True, quiet=True, output_dir=str(tmp_path))
  run = result.runs["pafed"]
  row, s = run.rows[0], run.summary
  assert row["bytes_up"] == sizes[("clients", "S0")] > 0
  assert row["bytes_down"] == sizes[("S0", "clients")] > 0
  assert row["bytes_s0_to_s1"] >= sizes[("S0", "S1")] > 0  # (and its plain numbers)
  assert s["bytes_up_total"] == row["bytes_up"]
  assert s["bytes_s1_to_s0_total"] == row["bytes_s1_to_s0"] > 0
  assert s["bytes_measured"].startswith("on the wire")
  assert s["server_views"]["S0"].endswith("(docs/crypto.md, Leakage, row S0)")
  assert s["server_views"]["S1"].endswith("(docs/crypto.md, Leakage, rows S1)")
