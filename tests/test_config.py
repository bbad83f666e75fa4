"""The nested configuration: its parts, flat keys, errors by field path, and the CLI's flags
made from it (the same names, types and defaults; the errors mapped to flags)."""

import dataclasses
import os
import subprocess
import sys

import pytest

from fedjax_async import cli
from fedjax_async import config
from fedjax_async.asynchronous import config as async_config
from fedjax_async.core.timeline import DelayConfig
import run_script


def test_a_field_is_set_by_its_part_or_by_its_flat_key_alike():
  nested = config.RunConfig(algorithm=config.AlgorithmConfig(names="fedprox", mu=0.3),
                            local=config.LocalTraining(lr=0.05, batch_size=7),
                            delay=DelayConfig(0.5, "fixed", 2), run=config.RunOptions(rounds=4))
  flat = config.RunConfig().replace(algorithm="fedprox", mu=0.3, lr=0.05, batch_size=7,
                                    delay_fraction=0.5, delay_distribution="fixed",
                                    max_delay=2, rounds=4)
  assert nested == flat
  assert flat.local.lr == 0.05 and flat.get("lr") == 0.05 and flat.delay.max_delay == 2
  assert flat.get("delay_fraction") == 0.5 and flat.algorithm.name_list() == ["fedprox"]
  # the stored view has the old flat keys (summaries and checkpoints of earlier runs)
  stored = config.config_dict(flat)
  assert stored["lr"] == 0.05 and stored["algorithm"] == "fedprox"
  assert stored["delay"] == {"fraction": 0.5, "distribution": "fixed", "max_delay": 2,
                             "mean": 2.0, "buffer_size": 0, "train_dropped": False}
  assert config.RunConfig.from_flat(stored) == flat


def test_pafeds_alphas_follow_the_data_set_unless_given():
  assert config.RunConfig().algorithm.alpha0 == 0.4  # synthetic
  image = config.RunConfig().replace(dataset="fashion_mnist")
  assert (image.algorithm.alpha0, image.algorithm.alpha2) == (0.8, 0.8)
  given = config.RunConfig().replace(dataset="fashion_mnist", alpha1=0.1)
  assert (given.algorithm.alpha0, given.algorithm.alpha1) == (0.8, 0.1)


@pytest.mark.parametrize("fields, path, flag", [
    ({"lr": -1.0}, "local.lr", "--lr"),
    ({"rounds": 0}, "run.rounds", "--rounds"),
    ({"algorithm": "fedsgd"}, "algorithm.names", "--algorithm"),
    ({"model": "vgg"}, "model.name", "--model"),
    ({"resume": True}, "output.resume", "--resume"),
    ({"ckks_design": "two"}, "crypto.ckks_design", "--ckks_design"),
])
def test_an_error_names_the_field_by_its_path_and_the_cli_by_its_flag(fields, path, flag):
  with pytest.raises(config.ConfigError) as e:
    config.validate(config.RunConfig().replace(**fields))
  assert e.value.path == path and str(e.value).startswith(f"{path}: ")
  assert cli.as_flags(str(e.value)).startswith(f"{flag}: ")
  assert config.flag_specs(config.RunConfig)[flag[2:]].path == path


def test_a_delay_error_and_an_unknown_key_name_their_field():
  with pytest.raises(ValueError, match=r"^delay\.fraction: must be in \[0, 1\], got 2"):
    config.RunConfig().replace(delay_fraction=2.0)
  assert cli.as_flags("delay.fraction: must be in [0, 1]") == (
      "--delay_fraction: must be in [0, 1]")
  with pytest.raises(config.ConfigError, match="^lrr: not a RunConfig field; did you mean"):
    config.RunConfig().replace(lrr=0.1)


def test_every_field_is_one_flag_with_its_default_and_type():
  specs = config.flag_specs(config.RunConfig)
  paths = [s.path for s in specs.values()]
  fields = {f"{part.name}.{f.name}" for part in dataclasses.fields(config.RunConfig)
            for f in dataclasses.fields(type(part.default))}
  assert len(paths) == len(set(paths)) and set(paths) == fields  # one flag per field
  cfg = config.RunConfig()
  for flag, spec in specs.items():
    part, name = spec.path.split(".")
    value = getattr(type(getattr(cfg, part))(), name) if part != "delay" else None
    if part != "delay" and flag != "output_dir":
      assert spec.default == value, flag  # the part's own default (alphas: None)
  assert specs["delay_fraction"].default == 0.3 and specs["max_delay"].default == 3
  assert specs["output_dir"].default == "runs/latest"  # the CLI writes by default
  assert (specs["lr"].kind, specs["rounds"].kind, specs["quiet"].kind,
          specs["data_dir"].kind) == ("float", "int", "bool", "str")


def _config_class(engine):
  from fedjax_async.fededs import config as fededs_config  # pylint: disable=g-import-not-at-top
  return {"rounds": config.RunConfig, "virtual_clock": async_config.AsyncRunConfig,
          "fededs": fededs_config.FedEDSRunConfig}[engine]


@pytest.mark.parametrize("engine", ["rounds", "virtual_clock", "fededs"])
def test_every_field_of_every_engine_is_one_flag_with_help(engine):
  """A field added to a configuration gets its flag: no two fields share a flag name, each
  flag has its help, a kind the CLI parses and, with choices, a default among them."""
  cls = _config_class(engine)
  specs = config.flag_specs(cls)
  fields = [f"{part.name}.{f.name}" for part in dataclasses.fields(cls)
            for f in dataclasses.fields(type(part.default))]
  assert sorted(s.path for s in specs.values()) == sorted(fields)
  for flag, spec in specs.items():
    assert flag.isidentifier() and spec.help.strip(), flag
    # algorithm.hp, a registered algorithm's own values, is no flag: each entry is one
    assert spec.kind in ("str", "int", "float", "bool") or (flag, spec.kind) == (
        "hp", "tuple"), (flag, spec.kind)
    assert not spec.choices or spec.default in spec.choices, (flag, spec.default)


def test_the_cli_reports_a_library_error_under_the_flag(tmp_path):
  out = run_script.run(["--max_delay=0", "--rounds=1", f"--output_dir={tmp_path}"],
                       timeout=120)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1] == "error: --max_delay: must be >= 1, got 0"


def test_the_virtual_clocks_flags_are_made_from_its_config():
  specs = config.flag_specs(async_config.AsyncRunConfig)
  assert (specs["concurrency"].path, specs["concurrency"].default) == ("clock.concurrency", 5)
  assert specs["dp_epsilon"].path == "privacy.dp_epsilon" and specs["dp_epsilon"].default == (
      float("inf"))
  assert (specs["num_clients"].default, specs["partition"].default) == (30, "shards")
  assert specs["algorithm"].path == "algorithm.names" and "random_local_epochs" not in specs
  out = subprocess.run([sys.executable, os.path.join(run_script.ROOT, "experiments",
                                                     "async_family.py"), "--helpfull"],
                       env=run_script.env(), capture_output=True, text=True, timeout=120)
  assert "--concurrency: C, clients in flight." in out.stdout
  assert "--dp_clip_mode: example (Eq. 17) | batch" in out.stdout


def test_the_virtual_clock_and_fededs_configs_take_flat_keys_and_name_their_fields():
  from fedjax_async.asynchronous import experiment as async_experiment  # pylint: disable=g-import-not-at-top
  from fedjax_async.fededs import config as fededs_config  # pylint: disable=g-import-not-at-top
  from fedjax_async.fededs import experiment, store  # pylint: disable=g-import-not-at-top
  clock = async_config.AsyncRunConfig().replace(concurrency=3, dp_epsilon=2.0)
  assert (clock.clock.concurrency, clock.get("dp_epsilon")) == (3, 2.0)
  with pytest.raises(config.ConfigError, match="^concurency: not a AsyncRunConfig field; "
                     "did you mean concurrency"):
    clock.replace(concurency=4)
  with pytest.raises(config.ConfigError) as e:
    async_experiment.validate(clock.replace(concurrency=40))
  assert str(e.value) == "clock.concurrency: must be in [1, data.num_clients=30], got 40"
  assert cli.as_flags(str(e.value)) == ("--concurrency: must be in [1, --num_clients=30], "
                                           "got 40")
  # FedEDS: the flags of experiments/fededs_table.py (besides --quick), one per field
  # (each with its help: test_every_field_of_every_engine_is_one_flag_with_help)
  fededs = fededs_config.FedEDSRunConfig
  specs = config.flag_specs(fededs)
  assert "quick" not in specs and {"alphas", "variants", "transfer_mode"} <= set(specs)
  quick = fededs().replace(**fededs_config.QUICK)
  assert (quick.training.rounds, quick.model.name, quick.grid.alphas) == (5, "mlp", "0.1")
  for fields, message in [({"rounds": 0}, "training.rounds: must be >= 1, got 0"),
                          ({"variants": "base,s3"}, "grid.variants: 's3' is not one of"),
                          ({"model": "resnet18", "hidden": 64}, "model.hidden: must be 512")]:
    with pytest.raises(config.ConfigError, match="^" + message.replace(".", r"\.")):
      experiment.validate(fededs().replace(**fields))
  said = store.mismatch({"lr": 0.01, "alphas": "0.1"}, {"lr": 0.02, "alphas": "0.5"})
  assert said == "training.lr=0.01 (now 0.02)"  # the grid may change on resumption
  assert cli.as_flags(said) == "--lr=0.01 (now 0.02)"
  assert cli.as_flags("alg1.unet_width=4 (now 16)") == "--unet_width=4 (now 16)"
  with pytest.raises(config.ConfigError, match=r"^algorithm\.names: lists an algorithm more"):
    async_experiment.validate(clock.replace(algorithm="fedasync,fedbuff,fedasync"))
  with pytest.raises(config.ConfigError, match=r"^algorithm\.mix_alpha: needs distinct"):
    async_experiment.validate(clock.replace(mix_alpha="0.5,0.50"))


@pytest.mark.parametrize("fields,message", [
    ({"rounds": "5"}, r"^run\.rounds: expected int, got '5' \(str\)"),
    ({"rounds": 2.5}, r"^run\.rounds: expected int, got 2\.5 \(float\)"),
    ({"rounds": True}, r"^run\.rounds: expected int, got True \(bool\)"),
    ({"lr": "0.1"}, r"^local\.lr: expected float, got '0\.1' \(str\)"),
    ({"quiet": 1}, r"^output\.quiet: expected bool, got 1 \(int\)"),
    ({"delay_fraction": "0.3"}, r"^delay\.fraction: expected float, got '0\.3' \(str\)"),
])
def test_a_value_of_the_wrong_type_is_an_error_naming_its_field(fields, message):
  with pytest.raises(ValueError, match=message):
    config.validate(config.RunConfig().replace(**fields))


def test_numbers_of_any_width_are_accepted():
  import numpy as np  # pylint: disable=g-import-not-at-top
  cfg = config.RunConfig().replace(rounds=np.int64(5), lr=np.float32(0.1), mu=1)
  config.validate(cfg)


def test_a_part_built_alone_has_runconfigs_defaults():
  cfg = config.RunConfig()
  by_engine = {config.RunConfig.keys()[k] for k in config.ENGINE_DEFAULTS}
  for part in dataclasses.fields(config.RunConfig):
    if part.name == "algorithm":  # PAFed's alphas: filled in by data set (None alone)
      continue
    alone = type(getattr(cfg, part.name))()
    for field in dataclasses.fields(alone):  # the engine's own (None alone)
      if (part.name, field.name) in by_engine:
        assert getattr(alone, field.name) is None
        alone = dataclasses.replace(alone, **{field.name: getattr(getattr(cfg, part.name),
                                                                  field.name)})
    assert alone == getattr(cfg, part.name), part.name
  assert config.RunConfig(delay=DelayConfig(max_delay=2)).delay.fraction == 0.3


def test_rho_has_one_meaning_across_the_engines():
  """--rho is FedADMM's / PAFed's penalty; double compensation's FedProx weight is
  --dc_rho, so a flag file of one engine cannot set the other's by the same name."""
  rounds, clock = config.flag_specs(config.RunConfig), config.flag_specs(async_config.AsyncRunConfig)
  assert rounds["rho"].path == "algorithm.rho" and "rho" not in clock
  assert clock["dc_rho"].default == 1.0 and "dc_rho" not in rounds
  # a flag of both engines: the same field, or (the DP target) the same meaning, (epsilon,
  # delta) of the run's accountant on either engine
  for name in set(rounds) & set(clock) - {"dp_epsilon", "dp_delta"}:
    assert rounds[name].path == clock[name].path, name


def test_a_flag_of_both_engines_has_one_default_and_each_engine_fills_its_own():
  rounds, clock = config.flag_specs(config.RunConfig), config.flag_specs(async_config.AsyncRunConfig)
  shared = set(rounds) & set(clock)
  assert {"lr", "momentum", "mu", "local_epochs", "num_clients", "partition", "eval_every",
          "checkpoint_every", "algorithm", "seed", "output_dir"} <= shared
  for name in shared:
    assert rounds[name].default == clock[name].default, name
  # None: each engine's own (config.ENGINE_DEFAULTS), filled in by its configuration
  r, c = config.RunConfig(), async_config.AsyncRunConfig()
  assert [r.get(k) for k in ("algorithm", "eval_every", "checkpoint_every", "momentum")] == [
      "pafed,fedadmm,fedavg,fedprox", 1, 10, 0.5]
  assert [c.get(k) for k in ("algorithm", "eval_every", "checkpoint_every", "momentum")] == [
      "fedasync", 20, 1, 0.5]
  dp = c.replace(algorithm="dp_fedasync", dp_epsilon=5.0)  # plain SGD for the accountant
  assert dp.local.momentum == 0.0 and dp.replace(dp_epsilon=float("inf")).local.momentum == 0.5
  assert c.replace(algorithm="dp_fedasync", dp_epsilon=5.0, momentum=0.3).local.momentum == 0.3


def test_the_defaults_by_engine_and_data_set_are_filled_before_construction():
  """A configuration is built of its resolved parts (``resolve_parts``, once): the given
  parts that need nothing are kept as they are, those that do are new; no instance is
  changed after construction (no ``object.__setattr__`` in the configuration files)."""
  local = config.LocalTraining(lr=0.05)  # momentum None: the engine's 0.5
  run = config.RunOptions(eval_every=3)
  data = config.DataConfig(dataset="fashion_mnist")
  cfg = config.RunConfig(local=local, run=run, data=data)
  assert cfg.run is run and cfg.data is data and local.momentum is None
  assert cfg.local is not local and cfg.local == dataclasses.replace(local, momentum=0.5)
  assert (cfg.algorithm.names, cfg.algorithm.alpha0, cfg.run.eval_every) == (
      config.MAIN_JOB_ALGORITHMS, 0.8, 3)  # (PAFed's alphas on image data)
  assert dataclasses.replace(cfg, data=config.DataConfig()).algorithm.alpha0 == 0.8  # given
  clock = async_config.AsyncRunConfig(privacy=async_config.PrivacyConfig(dp_epsilon=2.0),
                                      algorithm=async_config.AsyncAlgorithmConfig(
                                          names="privaasyncfed", hp=(("beta", 0.5),)))
  assert clock.local.momentum == 0.0 and clock.algorithm.hp == (("beta", 0.5),)
  for part in ("config.py", os.path.join("asynchronous", "config.py"), "flatkeys.py"):
    with open(os.path.join(run_script.ROOT, "fedjax_async", part)) as f:
      assert "object.__setattr__" not in f.read(), part


def test_a_virtual_clock_run_stored_with_rho_reads_as_dc_rho():
  from fedjax_async.asynchronous import experiment as async_experiment  # pylint: disable=g-import-not-at-top
  assert async_experiment.renamed({"rho": 0.5, "lr": 0.1}) == {"dc_rho": 0.5, "lr": 0.1}
