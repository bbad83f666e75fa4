"""FedEDS: federated learning with encrypted data sharing (Li et al., "Efficient Federated
Learning with Encrypted Data Sharing for Data-Heterogeneous Edge Devices").

The parts, each a small pure function (see docs/fededs.md for the full story):

* the split client model f(x; theta_g, theta_c, theta_l) (``SplitModel``): a feature
  extractor theta_g, a classifier theta_c and a frozen, client-specific **stochastic layer**
  theta_l between them that can be switched off (``forward(..., stochastic_layer=None)``);
* encrypted data generation (Alg. 1): pre-train the client model on local data with the
  stochastic layer off (Eq. 2, ``pretrain_clients``), freeze it, switch the layer on and
  train a UNet data encryptor g(x; phi_k) so that f(g(x)) still classifies x (Eq. 3,
  ``train_encryptors``), then share D_k^F = {(g(x), softmax f(g(x)))} with theta_l^k
  (Eq. 4, ``encrypt``); ``generate_encrypted`` runs all of it vmapped over clients;
* piecewise epoch annealing (Eq. 5, ``annealed_epochs``) and the transfer weights
  lambda_c, lambda_dis (Eqs. 9-10, ``transfer_weights``); ``round_hparams`` turns them into
  the engine's per-round ``hp``;
* knowledge transfer (Alg. 2, Eqs. 6-8): ``wrap(base_algorithm, model, shared)`` returns an
  ``Algorithm`` whose ``local_penalty`` adds lambda_dis * KL(soft label || f(x; theta_k,
  theta_l^i)) on encrypted data of another client i (with *client i's* stochastic layer);
* ``run`` drives the round engine round by round with those per-round hyperparameters;
* ``save_encryption_grid`` / ``privacy_report`` (PSNR, Gaussian-window SSIM): Fig. 3.

One module a part: ``schedule`` (Eqs. 5, 9-10, ``FedEDSConfig``), ``model`` (the split
model, the stochastic layer, the UNet encryptor), ``generation`` (Alg. 1), ``transfer``
(Alg. 2, ``wrap``), ``engine`` (``run`` on the round engine), ``privacy`` (Fig. 3). The
experiment of the paper's tables: ``config`` (``FedEDSRunConfig``), ``experiment``
(``simulate`` of a configuration), ``store`` (what resumption reads back), ``report``
(tables, Fig. 3, shared.md); imported by their module names. The parts'
public names are imported here: ``fededs.wrap``, ``fededs.run``, ...
"""

# pylint: disable=g-importing-member
from fedjax_async.fededs.engine import (  # noqa: F401
    hp_schedule, init_state, run, accuracy, shared_set_utility, rounds_to_target)
from fedjax_async.fededs.generation import (  # noqa: F401
    train_epochs, sgd, pretrain_client, train_encryptor, encrypt, SharedData, Generation,
    generate_encrypted)
from fedjax_async.fededs.model import (  # noqa: F401
    CNNFeatures, MLPFeatures, Classifier, SplitModel, forward, make_stochastic_layer,
    client_stochastic_layers, apply_stochastic_layer, UNet, make_encryptor)
from fedjax_async.fededs.privacy import (  # noqa: F401
    psnr, ssim, privacy_report, save_encryption_grid)
from fedjax_async.fededs.schedule import (  # noqa: F401
    annealed_epochs, transfer_weights, equal_work_epochs, FedEDSConfig, round_hparams)
from fedjax_async.fededs.transfer import (  # noqa: F401
    ID_KEY, kl_soft, transfer_loss, sample_sender, step_key, take_layer,
    transfer_penalty, wrap, client_id_rows, install_client_ids)

__all__ = [
    "annealed_epochs",
    "transfer_weights",
    "equal_work_epochs",
    "FedEDSConfig",
    "round_hparams",
    "CNNFeatures",
    "MLPFeatures",
    "Classifier",
    "SplitModel",
    "forward",
    "make_stochastic_layer",
    "client_stochastic_layers",
    "apply_stochastic_layer",
    "UNet",
    "make_encryptor",
    "train_epochs",
    "sgd",
    "pretrain_client",
    "train_encryptor",
    "encrypt",
    "SharedData",
    "Generation",
    "generate_encrypted",
    "ID_KEY",
    "kl_soft",
    "transfer_loss",
    "sample_sender",
    "step_key",
    "take_layer",
    "transfer_penalty",
    "wrap",
    "client_id_rows",
    "install_client_ids",
    "hp_schedule",
    "init_state",
    "run",
    "accuracy",
    "shared_set_utility",
    "rounds_to_target",
    "psnr",
    "ssim",
    "privacy_report",
    "save_encryption_grid",
]
