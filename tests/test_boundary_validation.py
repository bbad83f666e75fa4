"""Bad input at the boundary (issue "Nothing silent", findings 1-3 and 8's data and model
parts): each replayed as the issue writes it ends in a one-line error naming the argument;
a non-finite test loss is a divergence of its own; hypothesis draws bad arrays for
``from_arrays`` and ``from_clients``."""

import dataclasses
import re

import flax.linen as nn
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedjax_async as fa
from fedjax_async.config import ConfigError
from fedjax_async import data as data_lib
from fedjax_async import models
from fedjax_async.core import divergence

RUN = dict(algorithm="fedavg", rounds=1, quiet=True)


def _arrays(n=60, test=20, d=4, k=5, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, d)).astype(np.float32), np.arange(n) % k,
          rng.normal(size=(test, d)).astype(np.float32), np.arange(test) % k)


def _one_line(excinfo):
  text = str(excinfo.value)
  assert "\n" not in text, text
  return text


class Outputs(nn.Module):  # a flax module with ``n`` logits, as a user writes one
  n: int

  @nn.compact
  def __call__(self, h):
    return nn.Dense(self.n)(h)


# ------------------------------------------------------------------ the findings


def test_finding_1_a_model_with_3_outputs_for_5_classes_is_refused_before_training():
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=4)
  assert fed.num_classes == 5
  with pytest.raises(ConfigError) as e:
    fa.simulate(data=fed, model=Outputs(3), **RUN)
  msg = _one_line(e)
  assert msg.startswith(
      "model: Outputs gives 3 outputs per example, but the data have num_classes=5 (labels "
      "0..4): "), msg
  assert msg.endswith(" or give the model's last layer 5 outputs ([batch, 5] logits)"), msg
  # the virtual clock builds the module itself: the same check
  with pytest.raises(ConfigError, match=r"^model: Outputs gives 3 outputs per example"):
    fa.simulate(fa.AsyncRunConfig(), data=fed, model=Outputs(3), algorithm="fedbuff",
                quiet=True)
  # an input_shape the data's examples do not fit is named as such
  with pytest.raises(ConfigError) as e:
    fa.simulate(data=fed, model=Outputs(5), input_shape=(7,), **RUN)
  assert _one_line(e).startswith("input_shape=(7,): Outputs built for it does not take the "
                                 "data's examples of shape (4,)")


def test_a_users_module_on_a_named_data_set_is_checked_on_the_round_engine_and_its_sweeps():
  # synthetic(1, 1): 10 classes, 60 features; the module gives 3 logits
  for extra in ({}, {"seeds": [0, 1]}):
    with pytest.raises(ConfigError, match=r"^model: Outputs gives 3 outputs per example, "
                       r"but the data have num_classes=10 \(labels 0\.\.9\)"):
      fa.simulate(dataset="synthetic", num_clients=6, model=Outputs(3), **RUN, **extra)


def test_a_module_with_the_right_outputs_passes_the_check_and_its_output_shapes_are_named():
  models.check_module(Outputs(5), (4,), 5)  # no error: [2, 5] logits
  with pytest.raises(ValueError, match=r"^model: Outputs gives 5 outputs per example, but "
                     r"the data have num_classes=10 "):
    models.check_module(Outputs(5), (4,), 10)

  class Pair(nn.Module):
    @nn.compact
    def __call__(self, h):
      return nn.Dense(5)(h), h

  with pytest.raises(ValueError, match=r"^model: Pair gives tuple for a batch of 2, but"):
    models.check_module(Pair(), (4,), 5)
  # the engines' build of a module (the virtual clock's, for any data set) checks the same
  assert models.user_model(Outputs(5), (4,), 0, num_classes=5)[0] == "Outputs"
  with pytest.raises(ValueError, match=r"^model: Outputs gives 3 outputs per example, but "
                     r"the data have num_classes=5 "):
    models.user_model(Outputs(3), (4,), 0, num_classes=5)


def test_a_named_model_that_does_not_take_the_data_is_named_at_build_time():
  x = np.random.default_rng(0).normal(size=(24, 4, 4, 1)).astype(np.float32)
  fed = fa.data.from_arrays(x, np.arange(24) % 3, (x[:6], np.arange(6) % 3), num_clients=2)
  with pytest.raises(ValueError) as e:  # two VALID 3x3 convolutions and a pool: 4x4 is too small
    fa.simulate(data=fed, model="simple_cnn", **RUN)
  text = _one_line(e)  # (the initialiser's division by zero, or a zero-size dense layer)
  assert text.startswith("model.name=simple_cnn: ") and "(4, 4, 1)" in text, text
  assert text.endswith("the examples are too small for it"), text


def test_finding_2_nan_or_inf_features_are_refused_by_from_arrays_and_from_clients():
  x, y, tx, ty = _arrays()
  bad = x.copy()
  bad[3, 1] = np.nan
  with pytest.raises(ValueError) as e:
    fa.data.from_arrays(bad, y, (tx, ty), num_clients=4)
  assert _one_line(e) == ("x: 1 example with NaN or Inf features (the first is example 3); "
                          "drop or impute them")
  bad_test = tx.copy()
  bad_test[[2, 5], 0] = [np.inf, -np.inf]
  with pytest.raises(ValueError) as e:
    fa.data.from_arrays(x, y, (bad_test, ty), num_clients=4)
  assert _one_line(e) == ("test: 2 examples with NaN or Inf features (the first is example "
                          "2); drop or impute them")
  big = x.astype(np.float64)
  big[7, 0] = 1e39  # finite in float64, Inf as the engine's float32
  with pytest.raises(ValueError, match=r"^x: 1 example with NaN or Inf features \(the first "
                     r"is example 7\)"):
    fa.data.from_arrays(big, y, (tx, ty), num_clients=4)
  with pytest.raises(ValueError, match=r"^clients\[1\] x: 1 example with NaN or Inf features "
                     r"\(the first is example 1\)"):
    fa.data.from_clients([(x[:10], y[:10]), (bad[2:12], y[2:12])], (tx, ty))


def test_a_nonfinite_test_loss_is_a_divergence_of_its_own_and_the_advice_fits_the_data():
  """A FederatedData made by hand skips the constructors' checks: the engine then names
  what is not finite. The advice on the step sizes comes only with finite data."""
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=4)
  run = dict(RUN, model="logreg", participation=1.0, delay_fraction=0.0)
  test_x = fed.test_x.copy()
  test_x[0, 0] = np.nan
  with pytest.raises(divergence.Diverged) as e:
    fa.simulate(data=dataclasses.replace(fed, test_x=test_x), **run)
  assert e.value.kind == "test_loss" and e.value.round == 1
  assert _one_line(e).startswith("algorithm fedavg: round 1: the test loss is nan (the "
                                 "global model is finite);")
  assert e.value.args[0].endswith("the test features hold NaN/Inf: drop or impute those "
                                  "examples (fa.data.from_arrays and from_clients refuse them)")
  train_x = fed.x.copy()
  train_x[:, 0, 0] = np.nan
  with pytest.raises(divergence.Diverged) as e:
    fa.simulate(data=dataclasses.replace(fed, x=train_x), **run)
  assert e.value.kind == "model" and "local.lr" not in str(e.value)
  assert "round 1: the global model is not finite (NaN/Inf)" in _one_line(e)
  assert str(e.value).endswith("the training features hold NaN/Inf: drop or impute those "
                               "examples (fa.data.from_arrays and from_clients refuse them)")
  with pytest.raises(divergence.Diverged) as e:  # finite data, a local step too large
    fa.simulate(data=fed, lr=1e38, **run)
  assert e.value.kind == "model" and str(e.value).endswith(divergence.LOCAL_ADVICE)
  assert "the first non-finite client result: client " in str(e.value)
  assert "alpha" not in str(e.value) and "server_lr" not in str(e.value)


def test_an_evaluated_nan_test_loss_stays_in_the_row_and_a_skipped_evaluation_is_none():
  from fedjax_async.rounds import engine  # pylint: disable=g-import-not-at-top
  rows = engine.metrics_to_rows({
      "round": np.array([1, 2, 3]), "nonfinite": np.zeros(3, bool),
      "test_accuracy": np.array([0.5, np.nan, 0.25], np.float32),
      "test_loss": np.array([np.nan, np.nan, 1.5], np.float32)})
  assert np.isnan(rows[0]["test_loss"]) and rows[1]["test_loss"] is None
  assert rows[1]["test_accuracy"] is None and rows[2]["test_loss"] == 1.5
  assert divergence.first_nonfinite(rows) == 0
  assert str(divergence.diverged(rows, 0)) == ("round 1: the test loss is nan (the global "
                                               "model is finite)")


def test_finding_3_test_labels_that_do_not_match_the_test_features_are_refused():
  x, y, tx, ty = _arrays(n=500, test=500)
  with pytest.raises(ValueError) as e:
    fa.data.from_arrays(x, y, (tx, ty[:-3]), num_clients=4)
  assert _one_line(e) == "test: 500 examples against 497 labels; give one label per example"
  with pytest.raises(ValueError, match=r"^test: 500 examples against 497 labels"):
    fa.data.from_clients([(x, y)], (tx, ty[:-3]))


def test_finding_8_own_data_without_a_model_names_the_models():
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=4)
  with pytest.raises(ValueError) as e:
    fa.simulate(data=fed, **RUN)
  text = _one_line(e)
  assert text.startswith("model.name: no default model for data set 'arrays'; name one of ")
  for name in ("logreg", "mlp", "cnn", "cnn_fedadmm", "cifar10_cnn", "cifar100_cnn",
               "simple_cnn", "resnet18"):
    assert re.search(rf"\b{name}\b", text), name
  assert "flax.linen.Module" in text and "fashion_mnist" not in text


def test_finding_8_a_hyper_parameter_that_is_no_number_is_named_with_its_type():
  x, y, tx, ty = _arrays()
  fed = fa.data.from_arrays(x, y, (tx, ty), num_clients=4)
  with pytest.raises(ConfigError) as e:
    fa.simulate(data=fed, model="logreg", hp={"beta": "high"}, **RUN)
  assert _one_line(e) == ("algorithm.hp.beta: expected a number (float), got 'high' (str); "
                          "e.g. hp={'beta': 0.5}")
  assert e.value.path == "algorithm.hp.beta"


def test_finding_8_from_arrays_names_its_own_arguments_not_the_cli_flags():
  x, y, tx, ty = _arrays()
  with pytest.raises(ValueError) as e:
    fa.data.from_arrays(x, y, (tx, ty), num_clients=4, partition="dirichlet", alpha=-1)
  assert _one_line(e) == "alpha: the Dirichlet concentration must be a number > 0, got -1"
  with pytest.raises(ValueError) as e:  # a draw that never fits: the partition's own message
    fa.data.from_arrays(x, y, (tx, ty), num_clients=20, partition="dirichlet", alpha=1e-3,
                        min_size=3)
  assert _one_line(e).startswith("alpha=0.001: no Dirichlet draw in 1000 tries gave every "
                                 "one of the 20 clients (num_clients) at least 3 examples")
  assert "--" not in str(e.value) and "data." not in str(e.value)


def test_the_loaders_run_the_same_checks_naming_the_data_set():
  x, y, tx, ty = _arrays()
  parts = [np.arange(0, 30), np.arange(30, 60), np.zeros(0, np.int64)]
  with pytest.raises(ValueError) as e:
    data_lib.federate(x, y, parts, tx, ty, 5, "toy")
  assert _one_line(e) == ("data.num_clients=3: 1 client (the first is client 2) would have "
                          "no examples; use fewer clients")
  with pytest.raises(ValueError, match=r"^toy training labels: label 5 \(example 5\) is "
                     r"outside \[0, num_classes=5\)"):
    data_lib.federate(x, np.arange(60) % 6, parts[:2], tx, ty, 5, "toy")
  bad = tx.copy()
  bad[4, 2] = np.nan
  with pytest.raises(ValueError, match=r"^toy test features: 1 example with NaN or Inf "
                     r"features \(the first is example 4\)"):
    data_lib.federate(x, y, parts[:2], bad, ty, 5, "toy")
  with pytest.raises(ValueError, match=r"^toy test set: 20 examples against 19 labels"):
    data_lib.federate(x, y, parts[:2], tx, ty[1:], 5, "toy")
  with pytest.raises(ValueError, match=r"^--min_size: must be >= 1"):
    data_lib.load("fashion_mnist", partition="dirichlet", min_size=0, num_clients=3)


# ---------------------------------------------------------- hypothesis: bad arrays

NAN, INF = float("nan"), float("inf")


@st.composite
def _valid(draw):
  n = draw(st.integers(8, 24))
  d = draw(st.sampled_from([(1,), (3,), (2, 2)]))
  k = draw(st.integers(2, 4))
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
  x = rng.normal(size=(n,) + d).astype(np.float32)
  y = np.arange(n) % k
  test = draw(st.integers(1, 8))
  return x, y, rng.normal(size=(test,) + d).astype(np.float32), np.arange(test) % k


def _nan_at(a, draw, value):
  a = np.array(a, np.float64)
  a.reshape(-1)[draw(st.integers(0, a.size - 1))] = value
  return a


ARRAY_CASES = [
    "none", "x_nan", "x_inf", "x_overflow", "x_short", "x_1d", "x_str", "x_ragged",
    "x_complex", "x_none", "x_empty", "y_negative", "y_float", "y_bool", "y_2d", "y_long",
    "y_huge", "y_str", "test_not_pair", "test_triple", "test_nan", "test_short",
    "test_shape", "test_empty", "test_negative", "test_str", "num_clients", "partition",
    "alpha", "shards_per_client", "min_size", "seed", "num_classes", "name"]


def _corrupt(draw, what, x, y, tx, ty, kw):
  """Argument ``what`` made bad (or none: "none"); returns the call's arguments."""
  bad_scalar = st.sampled_from([0, -1, 2.5, True, "4", None, NAN, INF, 10 ** 6])
  if what == "x_nan":
    x = _nan_at(x, draw, NAN)
  elif what == "x_inf":
    x = _nan_at(x, draw, draw(st.sampled_from([INF, -INF])))
  elif what == "x_overflow":
    x = _nan_at(x, draw, 1e39)
  elif what == "x_short":
    x = x[:draw(st.integers(0, len(x) - 1))]
  elif what == "x_1d":
    x = x.reshape(len(x), -1)[:, 0]
  elif what == "x_str":
    x = x.astype(str)
  elif what == "x_ragged":
    x = [list(r.reshape(-1)) for r in x[:-1]] + [[1.0]]
  elif what == "x_complex":
    x = x.astype(np.complex64)
  elif what == "x_none":
    x = None
  elif what == "x_empty":
    x, y = x[:0], y[:0]
  elif what == "y_negative":
    y = y.copy()
    y[draw(st.integers(0, len(y) - 1))] = -draw(st.integers(1, 5))
  elif what == "y_float":
    y = y + draw(st.sampled_from([0.0, 0.5]))
  elif what == "y_bool":
    y = y % 2 == 0
  elif what == "y_2d":
    y = y[:, None]
  elif what == "y_long":
    y = np.concatenate([y, y[:1]])
  elif what == "y_huge":
    y = y.astype(np.int64)
    y[0] = 2 ** 40
  elif what == "y_str":
    y = y.astype(str)
  elif what == "test_not_pair":
    kw["test"] = draw(st.sampled_from([tx, "ab", None, 3, {"x": tx}]))
  elif what == "test_triple":
    kw["test"] = (tx, ty, ty)
  elif what == "test_nan":
    kw["test"] = (_nan_at(tx, draw, draw(st.sampled_from([NAN, INF]))), ty)
  elif what == "test_short":
    kw["test"] = (tx, ty[:-1])
  elif what == "test_shape":
    kw["test"] = (np.zeros((len(ty), 5), np.float32), ty)
  elif what == "test_empty":
    kw["test"] = (tx[:0], ty[:0])
  elif what == "test_negative":
    kw["test"] = (tx, ty - 1)
  elif what == "test_str":
    kw["test"] = (tx.astype(str), ty)
  elif what == "num_clients":
    kw["num_clients"] = draw(st.one_of(bad_scalar, st.just(len(y) + 1)))
  elif what == "partition":
    kw["partition"] = draw(st.sampled_from(["bogus", None, 3, ["iid"], np.array([1])]))
  elif what == "alpha":
    kw["partition"], kw["alpha"] = "dirichlet", draw(st.sampled_from(
        [-1, 0, NAN, INF, "x", True, None, 1e-300, 1e300]))
  elif what == "shards_per_client":
    kw["partition"] = "shards"
    kw["shards_per_client"] = draw(st.sampled_from([0, -2, 1.5, None, 10 ** 4]))
  elif what == "min_size":
    kw["partition"], kw["min_size"] = "dirichlet", draw(st.sampled_from(
        [0, -1, 1.5, None, 10 ** 4, 3]))
  elif what == "seed":
    kw["seed"] = draw(st.sampled_from([-1, 1.5, "a", None, 2 ** 70]))
  elif what == "num_classes":
    kw["num_classes"] = draw(st.sampled_from([1, 0, -1, 2.5, "3", True, 10 ** 3]))
  elif what == "name":
    kw["name"] = draw(st.sampled_from(["", 3, None]))
  return x, y, kw


NAMES = {"x": ("x",), "y": ("y",), "test": ("test", "test labels"),
         "num_clients": ("num_clients",), "partition": ("partition",),
         "alpha": ("alpha", "num_clients", "min_size"),
         "shards_per_client": ("shards_per_client",),
         "min_size": ("min_size", "alpha", "num_clients"), "seed": ("seed",),
         "num_classes": ("num_classes",), "name": ("name",), "clients": ("clients",)}


def _check_outcome(call, argument):
  """``call()`` returns a FederatedData meeting the checks, or raises a one-line
  ValueError whose head (before its first ': ') names ``argument``."""
  try:
    fed = call()
  except ValueError as e:
    text = str(e)
    assert "\n" not in text and text, repr(text)
    head = text.split(": ")[0]
    names = NAMES[argument]
    assert any(re.search(rf"(^|\W){re.escape(n)}(\W|$)", head) for n in names), (
        f"{argument}: {text}")
    return None
  assert isinstance(fed, data_lib.FederatedData)
  assert np.isfinite(fed.x).all() and np.isfinite(fed.test_x).all()
  assert fed.counts.min() >= 1 and fed.y.dtype == np.int32
  assert fed.x.shape[2:] == fed.test_x.shape[1:] and len(fed.test_x) == len(fed.test_y) >= 1
  real = np.concatenate([fed.y[i, :c] for i, c in enumerate(fed.counts)])
  assert real.min() >= 0 and max(real.max(), fed.test_y.max()) < fed.num_classes
  return fed


@pytest.mark.parametrize("what", ARRAY_CASES)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_from_arrays_ends_in_data_or_a_one_line_error_naming_the_argument(what, data):
  x, y, tx, ty = data.draw(_valid())
  kw = {"test": (tx, ty), "num_clients": data.draw(st.integers(1, 3)),
        "partition": data.draw(st.sampled_from(["iid", "shards", "dirichlet"]))}
  x, y, kw = _corrupt(data.draw, what, x, y, tx, ty, kw)
  argument = what.split("_")[0] if what.split("_")[0] in ("x", "y", "test") else what
  test = kw.pop("test")
  fed = _check_outcome(lambda: fa.data.from_arrays(x, y, test, **kw), argument)
  assert fed is not None or what != "none"
  if fed is not None:  # every example on exactly one client
    assert int(fed.counts.sum()) == len(y)
    got = np.sort(np.concatenate([fed.y[i, :c] for i, c in enumerate(fed.counts)]))
    np.testing.assert_array_equal(got, np.sort(np.asarray(y)))


@st.composite
def _clients(draw):
  x, y, tx, ty = draw(_valid())
  cuts = sorted(draw(st.sets(st.integers(1, len(y) - 1), max_size=3)))
  bounds = [0] + cuts + [len(y)]
  clients = [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
  return clients, tx, ty


@pytest.mark.parametrize("what", [
    "none", "not_list", "empty", "not_pair", "no_examples", "mismatch", "nan", "shape",
    "labels", "str", "test", "num_classes", "name"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_from_clients_ends_in_data_or_a_one_line_error_naming_the_argument(what, data):
  clients, tx, ty = data.draw(_clients())
  kw = {"test": (tx, ty)}
  i = data.draw(st.integers(0, len(clients) - 1))
  cx, cy = clients[i]
  argument = what if what in ("test", "num_classes", "name", "none") else "clients"
  if what == "not_list":
    clients = data.draw(st.sampled_from([None, 3, "ab", np.zeros((2, 2)), {"a": 1}]))
  elif what == "empty":
    clients = []
  elif what == "not_pair":
    clients[i] = data.draw(st.sampled_from([(cx,), (cx, cy, cy), cx[0, ..., 0], None]))
  elif what == "no_examples":
    clients[i] = (cx[:0], cy[:0])
  elif what == "mismatch":
    clients[i] = (cx, cy[1:])
  elif what == "nan":
    clients[i] = (_nan_at(cx, data.draw, data.draw(st.sampled_from([NAN, INF, 1e39]))), cy)
  elif what == "shape":
    clients[i] = (np.zeros((len(cy), 7), np.float32), cy)
  elif what == "labels":
    clients[i] = (cx, data.draw(st.sampled_from([cy - 1, cy + 0.5, cy[:, None], cy > 0])))
  elif what == "str":
    clients[i] = (cx.astype(str), cy)
  elif what == "test":
    kw["test"] = data.draw(st.sampled_from([tx, (tx, ty[1:]), (tx[:0], ty[:0]),
                                            (_nan_at(tx, data.draw, NAN), ty)]))
  elif what == "num_classes":
    kw["num_classes"] = data.draw(st.sampled_from([1, 0, 2.5, "3", True]))
  elif what == "name":
    kw["name"] = data.draw(st.sampled_from(["", 3, None]))
  if what == "shape" and len(clients) == 1:
    argument = "test"  # one client: its shape is the data's, the test set's differs
  test = kw.pop("test")
  fed = _check_outcome(lambda: fa.data.from_clients(clients, test, **kw),
                       argument if argument != "none" else "clients")
  if what == "none":
    assert fed is not None and [int(c) for c in fed.counts] == [len(c[1]) for c in clients]
