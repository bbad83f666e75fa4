"""DP-FedAsync: FedAsync with PrivaAsyncFed's client-side DP (the seed's baseline).

PrivaAsyncFed Sec. IV-B.3: "Gaussian noise is injected during local training". The client
runs Alg. 1 lines 15-24 (clip each step's gradient to norm C, SGD step, add
N(0, sigma^2) with sigma = Delta f / epsilon, Delta f = lr 2C / |D_k|) on the full model;
the server is FedAsync's w_t = (1 - a_t) w_{t-1} + a_t w_new (``fedasync.server_step``).
Hyperparameters: FedAsync's plus ``dp_epsilon``, ``dp_clip`` (and ``dp_noise_multiplier``
> 0 for noise calibrated to a total budget, see ``fedjax_async.privacy``).
"""

from __future__ import annotations

import dataclasses

from fedjax_async.algorithms import fedasync

ALGORITHM = dataclasses.replace(fedasync.ALGORITHM, name="dp_fedasync", dp=True,
                                hparams=fedasync.HPARAMS)
