"""Client weighting (examples | uniform) of every round rule and the example-weighted
training loss, against full-batch gradients computed here; the new server and clock
options from the command line give what Python gives."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
import run_script

SIZES = (2, 5, 9)  # unequal n_k: the two weightings differ


class Linear(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(3)(x)


def three_clients():
  rng = np.random.default_rng(4)
  clients = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n))
             for n in SIZES]
  test = (rng.normal(size=(12, 4)).astype(np.float32), rng.integers(0, 3, 12))
  return clients, fa.data.from_clients(clients, test)


def one_round(algorithm, **kw):
  """One round of every client, one full-batch step each (B > n_k, momentum 0)."""
  clients, data = three_clients()
  result = fa.simulate(algorithm=algorithm, data=data, model=Linear(), rounds=1,
                       participation=1.0, delay_fraction=0.0, local_epochs=1,
                       batch_size=16, lr=0.5, momentum=0.0, quiet=True, **kw)
  run = result.runs[algorithm]
  _, w0, apply_flat = run.model
  return clients, np.asarray(w0), apply_flat, run


def full_batch(apply_flat, w, x, y):
  """(mean cross-entropy, its gradient) of one client's examples, computed here."""
  def loss(w):
    logp = jax.nn.log_softmax(apply_flat(w, jnp.asarray(x)))
    return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(y)[:, None], 1))
  value, grad = jax.value_and_grad(loss)(jnp.asarray(w))
  return float(value), np.asarray(grad)


# (rule, client_weighting) -> the client weights p_k and the step's multiple of the mean
# upload (FedADMM's first upload, y = 0: Delta + (y+ - y) / rho = 2 Delta, Eq. 16; PAFed's
# is that upload made a unit vector, Alg. 3 line 8, and its step alpha_0 m, Eq. 17).
CASES = [
    ("fedavg", "auto", "n", 1.0), ("fedavg", "uniform", "1", 1.0),
    ("fedprox", "uniform", "1", 1.0), ("fednova", "auto", "n", 1.0),
    ("fednova", "uniform", "1", 1.0), ("fedadmm", "auto", "1", 2.0),
    ("fedadmm", "examples", "n", 2.0), ("pafed", "auto", "1", "unit"),
    ("pafed", "examples", "n", "unit"),
]


@pytest.mark.parametrize("algorithm,weighting,p,multiple", CASES)
def test_round_step_is_the_weighted_mean_of_the_clients_deltas(algorithm, weighting, p,
                                                               multiple):
  clients, w0, apply_flat, run = one_round(algorithm, client_weighting=weighting,
                                           alpha0=0.3)
  deltas = np.stack([-0.5 * full_batch(apply_flat, w0, x, y)[1] for x, y in clients])
  if multiple == "unit":
    deltas, multiple = deltas / np.linalg.norm(deltas, axis=1, keepdims=True), 0.3
  weights = np.asarray(SIZES, np.float64) if p == "n" else np.ones(len(SIZES))
  want = w0 + multiple * (weights @ deltas) / weights.sum()
  np.testing.assert_allclose(np.asarray(run.state.w), want, rtol=1e-5, atol=1e-6)


def test_train_loss_is_example_weighted_and_the_uniform_one_kept():
  clients, w0, apply_flat, run = one_round("fedavg")
  losses = np.array([full_batch(apply_flat, w0, x, y)[0] for x, y in clients])
  row = run.rows[-1]
  assert row["train_loss"] == pytest.approx(np.dot(SIZES, losses) / sum(SIZES), rel=1e-5)
  assert row["train_loss_uniform"] == pytest.approx(losses.mean(), rel=1e-5)
  assert abs(row["train_loss"] - row["train_loss_uniform"]) > 1e-3  # they differ here


def _summary_and_rows(out):
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l]
  return json.loads((out / "summary.json").read_text()), rows  # (one run's folder)


ROUND_FLAGS = {"server_optimizer": "adagrad", "server_lr": 0.05, "server_tau": 0.01,
               "server_accumulator": 0.1, "client_weighting": "uniform", "rounds": 2,
               "num_clients": 10, "participation": 0.5}
CLOCK_FLAGS = {"staleness_fn": "threshold", "threshold_cutoff": 1, "threshold_value": 0.25,
               "example_weight": "sqrt", "avg_num_examples": 100, "num_updates": 8,
               "num_clients": 10, "concurrency": 3}


@pytest.mark.parametrize("algorithm,fields", [("fednova", ROUND_FLAGS),
                                              ("fedasync", CLOCK_FLAGS)])
def test_the_new_options_from_the_cli_give_what_python_gives(tmp_path, algorithm, fields):
  proc = run_script.run([f"--algorithm={algorithm}", f"--output_dir={tmp_path}", "--quiet"]
                        + [f"--{k}={v}" for k, v in fields.items()])
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary, rows = _summary_and_rows(tmp_path / algorithm)
  for k, v in fields.items():
    assert summary["config"][k] == v, k
  config = None if algorithm == "fednova" else fa.AsyncRunConfig()
  run = fa.simulate(config, algorithm=algorithm, quiet=True, **fields).runs[algorithm]
  assert summary["final_accuracy"] == pytest.approx(run.summary["final_accuracy"], abs=1e-6)
  key = "train_loss"
  assert [r[key] for r in rows] == pytest.approx([r[key] for r in run.rows], rel=1e-5)


@pytest.mark.parametrize("split", ["test", "clients"])
def test_a_label_the_model_cannot_output_names_its_split_index_and_num_classes(split):
  """A label past the model's outputs: the error names its split, value and index, the
  data's num_classes= and the fixes; a label in the test split only says so."""
  clients, _ = three_clients()
  test = (clients[2][0], np.zeros(len(clients[2][1]), np.int64))
  if split == "test":
    test[1][3] = 7
  else:
    clients[1][1][4] = 7
  data = fa.data.from_clients(clients, test)
  want = ("test split: label 7 at index 3 (in the test split only: the clients' labels go "
          "up to 2) is outside the model's 3" if split == "test" else
          "train split: label 7 at client 1's example 4 (the test split's labels go up to "
          "0) is outside the model's 3")
  with pytest.raises(ValueError) as e:
    fa.simulate(algorithm="fedavg", data=data, model=Linear(), rounds=1, quiet=True)
  assert str(e.value) == (
      "model: Linear gives 3 outputs per example, but the data have num_classes=8 (labels "
      f"0..7): {want}; fix the label if it is wrong (fa.data.from_arrays / from_clients "
      "with num_classes=3 refuse it) or give the model's last layer 8 outputs ([batch, 8] "
      "logits)")


@pytest.mark.parametrize("split", ["test", "clients", "arrays"])
def test_a_label_outside_the_given_num_classes_names_its_split_value_and_index(split):
  clients, _ = three_clients()
  test = (clients[2][0], np.zeros(len(clients[2][1]), np.int64))
  if split == "test":
    test[1][3] = 9
  else:
    clients[1][1][4] = 9
  with pytest.raises(ValueError) as e:
    if split == "arrays":  # x and y as given: the index is y's
      x, y = np.concatenate([c[0] for c in clients]), np.concatenate([c[1] for c in clients])
      fa.data.from_arrays(x, y, test, num_clients=3, num_classes=3)
    else:
      fa.data.from_clients(clients, test, num_classes=3)
  where = {"test": "test split: label 9 at index 3",
           "clients": "train split (clients): label 9 at client 1's example 4",
           "arrays": f"train split (y): label 9 at index {SIZES[0] + 4}"}[split]
  assert str(e.value) == (f"num_classes=3: {where} is outside [0, 3); pass num_classes=10 "
                          "(and give the model's last layer 10 outputs), or fix the label")
