"""An algorithm owns its hyper-parameters: each ``base.HParam`` declared beside its update
is a configuration field or ``hp`` entry, a flag with its help, a sweepable name, a result
column and a row of docs/api.md's table; a new algorithm with a new hyper-parameter takes
its file and one registration line."""

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import algorithms
from fedjax_async import config
from fedjax_async.algorithms import base
from fedjax_async.asynchronous import config as async_config
from fedjax_async.sweeps import sweep
import run_script

ROOT = run_script.ROOT

# The hp keys every engine gives every algorithm (the local optimiser, the server's step
# size and schedule, the round rules' client weighting, FedAsync's mixing weight, staleness
# function and example weight, DUCC's projected class, the DP calibration; DP-FedAvg's
# expected clients a round and noise seed, dp_fedavg.run_hparams):
# config.RunConfig.hparams and asynchronous.experiment.hparams.
COMMON = {"lr", "momentum", "server_lr", "server_lr2", "server_lr_switch_round", "mix_alpha",
          "staleness_fn", "example_weight", "client_weighting", "ducc_project_conflicting",
          "dp_epsilon", "dp_clip", "dp_delta", "dp_noise_multiplier",
          "dp_clients_per_round", "dp_seed"}


def test_every_hyper_parameter_a_built_in_reads_is_declared_by_it():
  """The ``hp`` keys an algorithm's traced functions compute with (``jax.make_jaxpr``, given
  every key any algorithm file names), minus the common ones, are among those it declares
  (``hparams=``): no undeclared knob, wherever the function reading it lives."""
  folder = os.path.dirname(inspect.getfile(base))
  named = set()
  for file in os.listdir(folder):
    if file.endswith(".py"):
      with open(os.path.join(folder, file)) as f:
        named |= set(re.findall(r"""hp(?:\[|\.get\()["']([a-z_0-9]+)["']""", f.read()))
  hp = dict.fromkeys(named | COMMON, 0.5)
  for name in [n for n in algorithms.names()  # the built-in ones
               if n not in algorithms._REGISTERED]:  # pylint: disable=protected-access
    read = sweep.hparams_read(algorithms.get(name), hp)
    declared = {h.name for h in algorithms.get(name).hparams}
    assert read is not None and read - COMMON <= declared, (name, sorted(read - COMMON -
                                                                        declared))
    with open(os.path.join(folder, f"{name}.py")) as f:  # declared in its own file
      assert bool(declared) == ("hparams=" in f.read()), name


def test_kernels_index_hp_and_with_defaults_fills_the_declared_defaults():
  """No ``hp.get(name, default)`` in algorithms/ (a second default beside the declared
  one): the functions read ``hp[name]``. ``base.with_defaults`` gives a hand-built ``hp``
  what it lacks: the declarations' defaults, a round rule's server entries from its eta."""
  folder = os.path.dirname(inspect.getfile(base))
  for file in sorted(os.listdir(folder)):
    if file.endswith(".py"):
      with open(os.path.join(folder, file)) as f:
        assert "hp.get(" not in f.read(), file
  filled = base.with_defaults(algorithms.get("fedasync"), {"hinge_a": 2.0})
  assert (filled["hinge_a"], filled["hinge_b"], filled["poly_a"]) == (2.0, 4.0, 0.5)
  assert "server_lr2" not in filled  # a per-arrival rule: no round rule's server entries
  fedavg = base.with_defaults(algorithms.get("fedavg"), {"server_lr": 0.5, "lr": 0.1})
  assert fedavg == {"lr": 0.1, "client_weighting": 0.0, "server_lr": 0.5, "server_lr2": 0.5,
                    "server_lr_switch_round": -1}
  pafed = base.with_defaults(algorithms.get("pafed"), {}, "synthetic")
  assert pafed["alpha0"] == algorithms.get("pafed").hparam("alpha0").default_for(
      "synthetic") != algorithms.get("pafed").hparam("alpha0").default


@pytest.mark.parametrize("cls", [config.RunConfig, async_config.AsyncRunConfig])
def test_the_options_that_are_words_are_declared_in_their_algorithms_files(cls):
  """FedADMM's and PAFed's admm_upload and ducc_projection, FedAsync's mix_alpha,
  staleness_fn and example_weight: ``base.Option``s of their algorithm files, whose
  default, help and choices the configuration's field and flag take and whose check
  validates it; no configuration file spells them."""
  from fedjax_async.algorithms import fedasync, pafed  # pylint: disable=g-import-not-at-top
  options = pafed.OPTIONS if cls is config.RunConfig else fedasync.OPTIONS
  assert {o.name for o in options} == ({"admm_upload", "ducc_projection"} if cls is
                                       config.RunConfig else
                                       {"mix_alpha", "staleness_fn", "example_weight"})
  specs, validate = config.flag_specs(cls), (
      config.validate if cls is config.RunConfig else async_config.validate)
  for o in options:
    spec = specs[o.name]
    assert (spec.default, spec.help, spec.kind) == (o.default, o.help, "str"), o.name
    assert spec.choices == (o.choices if o.enum else None), o.name
    for folder in ("config.py", os.path.join("asynchronous", "config.py")):
      with open(os.path.join(ROOT, "fedjax_async", folder)) as f:
        text = f.read()
      assert o.help not in text and f'("{o.name}", "str"' not in text, o.name
    with pytest.raises(config.ConfigError, match=rf"^algorithm\.{o.name}: must be"):
      validate(cls().replace(**{o.name: "0,2" if o.name == "mix_alpha" else "no_such"}))
    validate(cls().replace(**{o.name: o.default}))


def _outside(h: base.HParam):
  """A value just outside ``h``'s bounds (None when it has none), from the bounds text."""
  left, lo, hi, right = re.match(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])", h.bounds).groups()
  if lo != "-inf":
    return float(lo) - (0.0 if left == "(" else 0.5)
  if hi != "inf":
    return float(hi) + (0.0 if right == ")" else 0.5)
  return None


@pytest.mark.parametrize("engine,cls", [("rounds", config.RunConfig),
                                        ("virtual_clock", async_config.AsyncRunConfig)])
def test_each_declaration_is_a_flag_with_its_help_and_its_bounds(engine, cls):
  validate = config.validate if engine == "rounds" else async_config.validate
  specs = config.flag_specs(cls)
  base_cfg = cls().replace(algorithm="fedavg" if engine == "rounds" else "fedasync")
  everywhere = algorithms.declared(built_in=True)
  for name, pairs in algorithms.declared(engine, built_in=True).items():
    h = everywhere[name][0][1]  # the first declaration's help, the same on every engine
    assert name in specs and specs[name].path == f"algorithm.{name}", name
    assert h.help in specs[name].help and pairs[0][0] in specs[name].help, name
    bad = _outside(h)
    if bad is None or h.kind == "bool":
      continue
    with pytest.raises(config.ConfigError) as e:
      validate(base_cfg.replace(**{name: bad}))
    assert e.value.path == f"algorithm.{name}" and f"must be in {h.bounds}" in str(e.value)
    validate(base_cfg.replace(**{name: h.default}))  # the default is inside


def test_a_name_declared_with_two_defaults_takes_each_algorithms_own():
  """``mu``: FedProx declares 0.01, FedAsync 0; the flag's default is None on both
  engines, and a run gets its algorithm's default unless the flag is given."""
  assert config.flag_specs(config.RunConfig)["mu"].default is None
  assert config.flag_specs(async_config.AsyncRunConfig)["mu"].default is None
  clock = async_config.AsyncRunConfig()
  from fedjax_async.asynchronous import experiment  # pylint: disable=g-import-not-at-top
  assert experiment.hparams(clock, 0.6, algorithms.get("fedprox"))["mu"] == 0.01
  assert experiment.hparams(clock, 0.6, algorithms.get("fedasync"))["mu"] == 0.0
  given = clock.replace(mu=0.3)
  assert experiment.hparams(given, 0.6, algorithms.get("fedprox"))["mu"] == 0.3
  assert config.RunConfig().hparams(algorithms.get("fedprox"))["mu"] == 0.01


def test_a_clash_with_a_common_field_or_another_kind_is_refused_at_registration():
  def algo(h):
    return base.Algorithm(name="clashing", local_penalty=base.no_penalty,
                          client_final=base.delta_upload,
                          server_update=algorithms.get("fedavg").server_update, hparams=(h,))
  for name in ("lr", "rounds", "seed", "concurrency", "dp_clip"):
    with pytest.raises(ValueError, match=f"hyper-parameter '{name}' clashes with the common "
                       f"field {name}"):
      algorithms.register(algo(base.HParam(name, 1.0)))
  with pytest.raises(ValueError, match="'fedbuff_staleness' is a float, fedbuff's of that "
                     "name a bool"):
    algorithms.register(algo(base.HParam("fedbuff_staleness", 0.5)))
  assert "clashing" not in algorithms.names()
  with pytest.raises(ValueError, match=r"bounds are an interval"):
    base.HParam("x", 1.0, bounds="0..1")
  with pytest.raises(ValueError, match=r"the default must be in \(0, 1\], got 2"):
    base.HParam("x", 2.0, bounds="(0, 1]")


def test_docs_api_holds_the_table_made_from_the_declarations():
  with open(os.path.join(ROOT, "docs", "api.md")) as f:
    assert algorithms.hparams_table() in f.read()


# A new algorithm: this file and its last line, nothing else.
PLUGIN = '''"""FedAvg whose server step is scaled by its own beta_m."""
import jax.numpy as jnp

from fedjax_async import algorithms
from fedjax_async.algorithms import base


def server_update(w, server_state, uploads, arrivals, round_index, hp):
  del round_index
  n = jnp.where(arrivals.valid, arrivals.num_examples, 0.0)
  return w + hp["beta_m"] * jnp.einsum("k,kd->d", n, uploads) / jnp.sum(n), server_state, {}


ALGORITHM = base.Algorithm(
    name="scaled_fedavg", local_penalty=base.no_penalty, client_final=base.delta_upload,
    server_update=server_update,
    hparams=(base.HParam("beta_m", 1.0, "Scale of the server step.", bounds="(0, 2]"),))
algorithms.register(ALGORITHM)
'''
SMALL = dict(rounds=2, num_clients=10, participation=0.3, quiet=True)


def _cli(script, tmp_path, *args):
  env = dict(run_script.env(), PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
  return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", script),
                         "--import_modules=scaled_algo", *args], env=env,
                        capture_output=True, text=True, timeout=600)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  (tmp_path / "scaled_algo.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  __import__("scaled_algo")
  yield tmp_path
  algorithms._REGISTERED.pop("scaled_fedavg", None)  # pylint: disable=protected-access
  sys.modules.pop("scaled_algo", None)


def test_a_new_algorithm_is_set_swept_and_listed_from_python_and_the_cli(plugin):
  tmp_path = plugin
  # Python: set (a keyword of its own), against FedAvg with that server step
  run = fa.simulate(algorithm="scaled_fedavg", beta_m=0.5, **SMALL).runs["scaled_fedavg"]
  twin = fa.simulate(algorithm="fedavg", server_lr=0.5, **SMALL).runs["fedavg"]
  np.testing.assert_allclose(np.asarray(run.state.w), np.asarray(twin.state.w), atol=1e-5)
  assert run.summary["config"]["beta_m"] == 0.5  # a column
  # Python: swept, one vmapped computation
  swept = fa.simulate(algorithm="scaled_fedavg", sweep={"beta_m": [0.5, 1.0]}, **SMALL)
  assert sorted(swept.runs) == ["scaled_fedavg/beta_m=0.5_seed=0",
                                "scaled_fedavg/beta_m=1_seed=0"]
  np.testing.assert_allclose(np.asarray(swept.runs["scaled_fedavg/beta_m=0.5_seed=0"].state.w),
                             np.asarray(run.state.w), atol=1e-5)
  flags = [f"--{k}={v}" for k, v in SMALL.items() if k != "quiet"] + ["--quiet"]
  # CLI: set
  out = _cli("run.py", tmp_path, "--algorithm=scaled_fedavg", "--beta_m=0.5",
             f"--output_dir={tmp_path / 'run'}", *flags)
  assert out.returncode == 0, out.stderr
  with open(tmp_path / "run" / "scaled_fedavg" / "summary.json") as f:
    summary = json.load(f)
  assert summary["config"]["beta_m"] == 0.5 and summary["config"]["hp"] == {"beta_m": 0.5}
  assert summary["final_accuracy"] == pytest.approx(run.summary["final_accuracy"], abs=1e-6)
  # CLI: swept
  out = _cli("sweep.py", tmp_path, "--algorithm=scaled_fedavg", "--sweep_beta_m=0.5,1",
             f"--output_dir={tmp_path / 'sweep'}", *flags)
  assert out.returncode == 0, out.stderr
  with open(tmp_path / "sweep" / "runs" / "scaled_fedavg" / "beta_m=0.5_seed=0" /
            "summary.json") as f:
    assert json.load(f)["final_accuracy"] == pytest.approx(run.summary["final_accuracy"],
                                                           abs=1e-6)
  # CLI: listed (sweep.py has run.py's flags and the sweeps), its bounds refused by name
  out = _cli("sweep.py", tmp_path, "--helpfull")
  assert out.returncode == 0, out.stderr
  assert "--beta_m: Scale of the server step. [scaled_fedavg; (0, 2]] (default: 1)" in (
      " ".join(out.stdout.split())) and "--sweep_beta_m:" in out.stdout
  out = _cli("run.py", tmp_path, "--algorithm=scaled_fedavg", "--beta_m=3")
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1] == "error: --beta_m: must be in (0, 2], got 3.0"


def test_a_stored_run_without_hp_as_a_mapping_still_matches():
  """Runs stored when ``hp`` was ``name=value`` text (``""`` empty) resume."""
  now = config.run_config_for(config.RunConfig(), "fedavg")
  old = dict(now, hp="")
  assert config.config_mismatch(old, now) == []
  assert config.config_mismatch(dict(now, hp="beta=1"), now) == ["hp"]
  assert dataclasses.is_dataclass(config.AlgorithmConfig)
