"""FedEDS's experiment configuration: ``FedEDSRunConfig``, one frozen dataclass a part
(the grid, model, data, training, Alg. 1, run, outputs); ``experiments/fededs_table.py``'s
flags are made from its fields (``cli.define_config_flags``), as the round engine's are
from ``config.RunConfig``. ``fededs.experiment.run_fededs_grid`` runs it.

  cfg = FedEDSRunConfig().replace(**QUICK, rounds=2)   # QUICK = {"quick": True}

``quick=True`` in ``replace`` (or ``simulate``) presets ``QUICK_FIELDS`` (``--quick``),
the fields given beside it winning.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fedjax_async.config import SHARED_HELP, check_finite
from fedjax_async.flatkeys import ConfigError, FlatKeys, check, check_types, option

VARIANTS = {"base": (False, False), "equal": (False, False), "s1": (True, False),
            "s2": (False, True), "fededs": (True, True)}  # (annealing, sharing)
BASES = ("fedavg", "fedprox", "fednova")
# Few rounds on a data subset (minutes on 2 CPU cores): ``--quick``'s presets.
QUICK_FIELDS = dict(alphas="0.1", num_clients="5", bases="fedavg",
                    variants="base,s1,s2,fededs", rounds=5, train_subset=1000,
                    test_subset=500, encryptor_epochs=3, pretrain_epochs=2, unet_width=4,
                    hidden=64, model="mlp", target_accuracy=0.6, utility_epochs=1)
QUICK = {"quick": True}  # replace(**QUICK, rounds=2): the presets under the fields given


@dataclasses.dataclass(frozen=True)
class Grid:
  """The settings (alpha, K) and the runs of each (base algorithm x variant)."""
  alphas: str = option("0.1,0.5,10", "Dirichlet concentrations alpha.")
  num_clients: str = option("5,10,20", "Numbers of clients K.")
  bases: str = option(",".join(BASES), "Base algorithms.")
  variants: str = option("base,equal,fededs", "Any of base (--base_epochs a round), equal "
                         "(FedEDS's local steps spread evenly), s1 (annealing only), s2 "
                         "(sharing only), fededs.")


@dataclasses.dataclass(frozen=True)
class SplitModelConfig:
  name: str = option("cnn", "cnn (PAFed CNN, split after FC 512) | mlp | resnet18 (the "
                     "paper's ResNet-18 without BatchNorm, split after the global pool; slow "
                     "on CPU).", flag="model")
  hidden: int = option(512, "Feature width (the stochastic layer's size).")


@dataclasses.dataclass(frozen=True)
class FashionMNIST:
  train_subset: int = option(0, "Use n random training examples (0 = all 60000).")
  test_subset: int = option(0, "Evaluate on the first n test examples (0 = all).")
  data_dir: Optional[str] = option(None, "Fashion-MNIST IDX directory (default: the system "
                                   "one).")


@dataclasses.dataclass(frozen=True)
class FederatedTraining:
  """The federated runs (every variant: SGD, momentum 0.9, weight decay 1e-4)."""
  rounds: int = option(30, "T, communication rounds.")  # the paper's on Fashion-MNIST
  lr: float = option(0.01, "Local learning rate.")
  mu: float = option(0.1, "Proximal coefficient (Eq. 2).")  # FedProx's
  base_epochs: int = option(1, "Local epochs without annealing (base, s2).")
  batch_size: int = option(50, "B, local minibatch size.")
  target_accuracy: float = option(0.8, "Target for rounds-to-target (fraction).")
  rounds_per_call: int = option(1, "Rounds fused into one jitted scan between host visits.")


@dataclasses.dataclass(frozen=True)
class Alg1Config:
  """Encrypted data generation (Alg. 1) and what its shared sets are measured by."""
  pretrain_epochs: int = option(5, "E_c of Alg. 1.")
  encryptor_epochs: int = option(20, "E_g of Alg. 1 (paper: 20).")
  unet_width: int = option(16, "Channels of the UNet's first level.")
  utility_epochs: int = option(5, "Epochs on the shared encrypted sets alone (and on the "
                               "raw data) to measure what they teach (0: off).")
  share_rows: int = option(0, "Share at most n encrypted rows per client (0 = all).")
  transfer_mode: str = option("sample", "sample (Eq. 8) | all (Eq. 7).")


@dataclasses.dataclass(frozen=True)
class FedEDSRunOptions:
  seed: int = option(0, SHARED_HELP["seed"])
  # (trains a second set of encryptors without the layer, on the first setting)
  privacy: bool = option(True, "Save the encryption grid and privacy report.")


@dataclasses.dataclass(frozen=True)
class FedEDSOutput:
  output_dir: Optional[str] = option(
      None, "Where tables, metrics, figures and checkpoints go (from Python, None: a "
      "temporary folder, deleted at the end; nothing kept).", cli_default="out/fededs")
  quiet: bool = option(False, SHARED_HELP["quiet"])
  # every k rounds, at the end of a --rounds_per_call call, under
  # runs/<setting>/<run>/checkpoints
  checkpoint_every: int = option(5, SHARED_HELP["checkpoint_every"])
  # (Alg. 1's encrypted sets are read back too)
  resume: bool = option(False, SHARED_HELP["resume"])
  overwrite: bool = option(False, SHARED_HELP["overwrite"])


@dataclasses.dataclass(frozen=True)
class FedEDSRunConfig(FlatKeys):
  """One FedEDS invocation (``experiments/fededs_table.py``'s defaults: the paper's grid,
  Table II)."""
  grid: Grid = Grid()
  model: SplitModelConfig = SplitModelConfig()
  data: FashionMNIST = FashionMNIST()
  training: FederatedTraining = FederatedTraining()
  alg1: Alg1Config = Alg1Config()
  run: FedEDSRunOptions = FedEDSRunOptions()
  output: FedEDSOutput = FedEDSOutput()

  def replace(self, quick: bool = False, **flat) -> "FedEDSRunConfig":
    """``FlatKeys.replace``; ``quick=True`` first presets ``QUICK_FIELDS``."""
    return FlatKeys.replace(self, **({**QUICK_FIELDS, **flat} if quick else flat))


# ------------------------------------------------------------------- validation


def _numbers(text: str, field: str, kind):
  try:
    return [kind(v) for v in text.split(",") if v]
  except ValueError as e:
    raise ConfigError(field, f"comma-separated {'integers' if kind is int else 'numbers'} "
                      f"expected ({e})") from None


def validate(cfg: FedEDSRunConfig):
  """(alphas, Ks, bases, variants); ``ConfigError`` naming the field at fault."""
  check_types(cfg)
  check_finite(cfg)
  g, t, a = cfg.grid, cfg.training, cfg.alg1
  alphas, ks = _numbers(g.alphas, "grid.alphas", float), _numbers(g.num_clients,
                                                                  "grid.num_clients", int)
  check(alphas and all(x > 0 for x in alphas), "grid.alphas",
        f"must be positive numbers, got {g.alphas!r}")
  check(ks and all(k >= 2 for k in ks), "grid.num_clients",
        f"must be integers >= 2, got {g.num_clients!r}")
  bases = [b for b in g.bases.split(",") if b]
  variants = [v for v in g.variants.split(",") if v]
  for b in bases:
    check(b in BASES, "grid.bases", f"{b!r} is not one of {', '.join(BASES)}")
  for v in variants:
    check(v in VARIANTS, "grid.variants", f"{v!r} is not one of {', '.join(VARIANTS)}")
  check(bases and variants, "grid.bases", "grid.bases and grid.variants must not be empty")
  for path, value, ok, expected in [
      ("training.rounds", t.rounds, t.rounds >= 1, ">= 1"),
      ("model.hidden", cfg.model.hidden, cfg.model.hidden >= 1, ">= 1"),
      ("data.train_subset", cfg.data.train_subset, cfg.data.train_subset >= 0, ">= 0"),
      ("data.test_subset", cfg.data.test_subset, cfg.data.test_subset >= 0, ">= 0"),
      ("training.target_accuracy", t.target_accuracy, 0 < t.target_accuracy <= 1,
       "in (0, 1]"),
      ("training.lr", t.lr, t.lr > 0, "> 0"), ("training.mu", t.mu, t.mu >= 0, ">= 0"),
      ("training.base_epochs", t.base_epochs, t.base_epochs >= 1, ">= 1"),
      ("training.batch_size", t.batch_size, t.batch_size >= 1, ">= 1"),
      ("alg1.pretrain_epochs", a.pretrain_epochs, a.pretrain_epochs >= 1, ">= 1"),
      ("alg1.encryptor_epochs", a.encryptor_epochs, a.encryptor_epochs >= 1, ">= 1"),
      ("alg1.unet_width", a.unet_width, a.unet_width >= 1, ">= 1"),
      ("alg1.share_rows", a.share_rows, a.share_rows >= 0, ">= 0"),
      ("alg1.utility_epochs", a.utility_epochs, a.utility_epochs >= 0, ">= 0 (0: off)"),
      ("training.rounds_per_call", t.rounds_per_call, t.rounds_per_call >= 1, ">= 1"),
      ("output.checkpoint_every", cfg.output.checkpoint_every,
       cfg.output.checkpoint_every >= 0, ">= 0 (0: off)"),
      ("run.seed", cfg.run.seed, cfg.run.seed >= 0, ">= 0")]:
    check(ok, path, f"must be {expected}, got {value!r}")
  m = cfg.model
  check(m.name in ("cnn", "mlp", "resnet18"), "model.name",
        f"must be cnn, mlp or resnet18, got {m.name!r}")
  check(m.name != "resnet18" or m.hidden == 512, "model.hidden",
        f"must be 512 with model.name=resnet18 (its pooled features), got {m.hidden}")
  check(a.transfer_mode in ("sample", "all"), "alg1.transfer_mode",
        f"must be sample or all, got {a.transfer_mode!r}")
  check(not cfg.output.resume or cfg.output.output_dir is not None, "output.resume",
        "continues the runs in output.output_dir, and none is given")
  check(not (cfg.output.resume and cfg.output.overwrite), "output.overwrite",
        "cannot be combined with output.resume (output.resume continues the runs in "
        "output.output_dir, output.overwrite deletes them)")
  return alphas, ks, bases, variants
