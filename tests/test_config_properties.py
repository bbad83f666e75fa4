"""Issue 59, Build 9 (configurations and hyper-parameters): hypothesis draws bad fields
(wrong types, negative, NaN and infinite numbers, unknown names), algorithm names and
``hp`` values for ``RunConfig``, ``AsyncRunConfig``, ``FedEDSRunConfig`` and ``simulate``.
Each ends in a run or in a one-line ``ConfigError`` / ``ValueError`` naming the argument,
never in an exception from inside the engine. Derandomised (the same examples on every
run); the simulate properties draw mostly values that validation refuses, so that few
examples compile anything."""

import dataclasses
import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fedjax_async as fa
from fedjax_async import config as config_lib
from fedjax_async.algorithms import base
from fedjax_async.asynchronous import config as async_config
from fedjax_async.core import divergence
from fedjax_async.fededs import config as fededs_config

_SETTINGS = dict(derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

# Wrong types, out-of-range and non-finite numbers, odd strings: most are refused.
_ODD = [-1, 0, 1, 2, 3, -10 ** 9, -0.5, 0.5, 1.5, 1e30, math.nan, math.inf, -math.inf,
        "", "x", "0.1", "none", None, True, False, [1], {"a": 1}]
BAD = st.one_of(st.sampled_from(_ODD), st.integers(-3, 3),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5))

_VALIDATORS = {
    config_lib.RunConfig: config_lib.validate,
    async_config.AsyncRunConfig: async_config.validate,
    fededs_config.FedEDSRunConfig: fededs_config.validate,
}


def _optional(cls, key) -> bool:
  part, name = cls.keys()[key]
  declared = {f.name: str(f.type) for f in dataclasses.fields(getattr(cls(), part))}
  return declared[name].startswith("Optional[")


def _kind_fits(cls, key, spec, value) -> bool:
  """Whether ``value`` has the field's declared type (``flatkeys.check_part_types``)."""
  if value is None:
    return _optional(cls, key)
  if isinstance(value, (bool, np.bool_)):
    return spec.kind == "bool"
  return {"int": isinstance(value, int), "float": isinstance(value, (int, float)),
          "str": isinstance(value, str), "bool": False}.get(spec.kind, True)


def _names_the_argument(error: Exception, *names: str):
  message = str(error)
  assert "\n" not in message, message
  assert any(n and n in message for n in names), (names, message)


@settings(max_examples=300, **_SETTINGS)
@given(cls=st.sampled_from(list(_VALIDATORS)), data=st.data(), value=BAD)
def test_a_drawn_field_value_is_accepted_or_refused_by_name(cls, data, value):
  """Every field of every engine's configuration: a wrong type and a non-finite number are
  always refused, naming the field's path (or its flat key); nothing raises anything but
  a ``ValueError`` (``ConfigError`` mostly)."""
  specs = config_lib.flag_specs(cls)
  key = data.draw(st.sampled_from(sorted(specs)))
  spec = specs[key]
  try:
    _VALIDATORS[cls](cls().replace(**{key: value}))
  except ValueError as e:  # ConfigError, or a parser's ValueError naming the field
    _names_the_argument(e, spec.path, key)
    return
  assert _kind_fits(cls, key, spec, value), f"{key}={value!r} accepted by {cls.__name__}"
  if isinstance(value, float) and not math.isfinite(value):
    assert key == "dp_epsilon" and value == math.inf, f"{key}={value!r} accepted"


@settings(max_examples=100, **_SETTINGS)
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True), value=BAD)
def test_an_unknown_field_name_is_refused_by_name(name, value):
  """``replace`` / ``simulate`` with a name no configuration has: ``ConfigError`` naming
  it, before any data or model is built."""
  reserved = set(config_lib.RunConfig.keys()) | {
      "data", "dataset", "model", "input_shape", "seeds", "sweep", "hp", "algorithm",
      "config", "callbacks", "local", "delay", "crypto", "run", "output"}
  if name in reserved:
    return
  with pytest.raises(config_lib.ConfigError) as e:
    fa.simulate(algorithm="fedavg", **{name: value})
  assert str(e.value).startswith(f"{name}: not a RunConfig field"), str(e.value)
  assert "\n" not in str(e.value)


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(120, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int64)
  return fa.data.from_arrays(x, y, (x[:40], y[:40]), num_clients=6)


class _Linear(nn.Module):
  @nn.compact
  def __call__(self, h, train: bool = False):
    return nn.Dense(2)(h)


_DATA = _data()
# Every RunConfig field but output_dir (a drawn string would be a folder to write in) and
# model (given as a module).
_SIMULATE_KEYS = sorted(k for k in config_lib.RunConfig.keys() if k not in ("output_dir",
                                                                           "model"))


def _ends_in_a_run_or_a_named_error(fields: dict, *names: str):
  try:
    result = fa.simulate(data=_DATA, model=_Linear(), **{"quiet": True, **fields})
  except divergence.Diverged as e:  # a run that says where it stopped
    assert "\n" not in str(e) and "round" in str(e), str(e)
    return "diverged"
  except ValueError as e:  # ConfigError among them
    _names_the_argument(e, *names)
    return "refused"
  assert all(run.rows for run in result.all_runs().values()), fields
  return "ran"


@settings(max_examples=20, **_SETTINGS)
@given(key=st.sampled_from(_SIMULATE_KEYS), value=BAD)
@example(key="lr", value=math.inf)
@example(key="server_lr2", value=math.nan)
@example(key="rounds", value="1")
@example(key="num_clients", value=50)
def test_simulate_with_a_drawn_field_runs_or_names_it(key, value):
  path = config_lib.path(key)
  _ends_in_a_run_or_a_named_error(
      {"algorithm": "fedavg", "rounds": 1, "eval_every": 1, key: value}, path, key)


def _server_update(w, server_state, uploads, arrivals, round_index, hp):
  n = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
  return w + hp["beta"] * jnp.einsum("k,kd->d", n, uploads) / jnp.sum(n), server_state, {}


_TOY = base.Algorithm(name="property_fedavg", local_penalty=base.no_penalty,
                      client_final=base.delta_upload, server_update=_server_update,
                      hparams=(base.HParam("beta", 1.0),))


@settings(max_examples=15, **_SETTINGS)
@given(name=st.one_of(st.just("beta"), st.text(min_size=1, max_size=6)), value=BAD)
@example(name="beta", value=math.nan)
@example(name="beta", value=-math.inf)
@example(name="beta", value="high")
@example(name="beta", value=None)
@example(name="gamma", value=0.5)
def test_simulate_with_drawn_hyper_parameters_runs_or_names_them(name, value):
  """``hp={name: value}`` of an algorithm declaring ``beta``: a name it does not declare,
  or a value that is no finite number, is refused naming ``algorithm.hp``."""
  outcome = _ends_in_a_run_or_a_named_error(
      {"algorithm": _TOY, "rounds": 1, "hp": {name: value}}, "algorithm.hp")
  finite = (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
  if name != "beta" or not finite:
    assert outcome == "refused", (name, value, outcome)


@settings(max_examples=30, **_SETTINGS)
@given(names=st.lists(st.one_of(st.sampled_from(fa.algorithms.names()),
                                st.text(max_size=8)), min_size=1, max_size=3))
@example(names=["fedavg", "fedavg"])
@example(names=["fedasync", "pafed"])
@example(names=["fedasnyc"])
@example(names=[""])
def test_simulate_with_drawn_algorithm_names_runs_or_names_them(names):
  """Unknown names, repeats, empty names and both engines' names mixed: refused naming
  ``algorithm`` (or, for the virtual clock's own, the round engine's ``rounds`` they do
  not take) before anything is built."""
  algorithm = ",".join(names)
  known = set(fa.algorithms.names())
  if set(names) <= set(fa.algorithms.names("rounds")) and len(set(names)) == len(names):
    return  # runs of the round engine's algorithms: the other tests run them
  outcome = _ends_in_a_run_or_a_named_error(
      {"algorithm": algorithm, "rounds": 1}, "algorithm", "rounds")
  if not set(names) <= known or len(set(names)) < len(names):
    assert outcome == "refused", (algorithm, outcome)
