"""FedEDS on the round engine: the per-round hp schedule, the state with client ids,
``run``, and the evaluation helpers (accuracy, the shared set's utility)."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async.algorithms import base
from fedjax_async.core import building
from fedjax_async.fededs.generation import SharedData, Training, sgd, train_chunk
from fedjax_async.fededs.model import SplitModel
from fedjax_async.fededs.schedule import FedEDSConfig, round_hparams
from fedjax_async.fededs.transfer import ID_KEY, install_client_ids, take_layer, transfer_loss
from fedjax_async.rounds import engine

Array = jax.Array


# ------------------------------------------------------------------- the engine


def hp_schedule(base_hp, num_rounds: int, cfg: FedEDSConfig, *, anneal: bool, share: bool,
                fixed_epochs: int = 1):
  """(hp, round_hp): the hp of round 1 and, for the keys that change from round to round,
  their values over engine rounds 0 .. num_rounds - 1 (paper round t = engine round + 1):
  E_t (Eq. 5), lambda_c, lambda_dis (Eqs. 9-10) and lr * lambda_c (``round_hparams``).

  Args:
    base_hp: the hyper-parameters every round starts from.
    num_rounds: the rounds.
    cfg: the ``FedEDSConfig``.
    anneal: E_t by Eq. 5 (else ``fixed_epochs``).
    share: the transfer weights of Eqs. 9-10 (else (1, 0)).
    fixed_epochs: the epochs without ``anneal``: an int, or one per round.
  """
  per_round = [round_hparams(base_hp, r + 1, cfg, anneal=anneal, share=share,
                             fixed_epochs=fixed_epochs) for r in range(num_rounds)]
  keys = ("local_epochs", "fededs_lambda_c", "fededs_lambda_dis", "lr")
  return per_round[0], {k: np.asarray([hp[k] for hp in per_round], np.float32)
                        for k in keys}


def init_state(algorithm: base.Algorithm, w0, num_clients: int, ring_size: int = 2,
               seed: int = 0):
  """``engine.init_state`` with the client ids a wrapped algorithm keeps installed: the
  state ``run`` starts from, and the template a checkpoint is restored into.

  Args:
    algorithm: the (wrapped) algorithm.
    w0: [d] the initial model.
    num_clients: N.
    ring_size: R, the ring buffer's slots.
    seed: the base PRNG key's seed.
  """
  state = engine.init_state(algorithm, w0, num_clients, ring_size, seed)
  if ID_KEY in state.client_state:
    state = install_client_ids(state)
  return state


def run(apply_flat, algorithm: base.Algorithm, w0, data, timeline, base_hp,
        cfg: FedEDSConfig, *, anneal: bool, share: bool, fixed_epochs: int = 1,
        ring_size: int = 2, seed: int = 0, eval_every: int = 1, rounds_per_call: int = 10,
        on_chunk=None, state=None):
  """Runs the round engine with per-round hp (Eq. 5, Eqs. 9-10) passed as
  ``engine.run_rounds``'s ``round_hp``: one runner, compiled for the largest E_t (the
  local loop runs each round's traced E_t * ceil(n_i / B) steps, not the largest), so
  the schedule does not recompile. Returns (state, rows) of the rounds it ran.

  ``state``: where to start (default ``init_state``); a state restored from a checkpoint
  of round t continues with round t, as the uninterrupted run would. Each row carries the
  round's ``local_epochs`` (E_t) and ``lambda_dis`` already when ``on_chunk(state, rows)``
  sees it (so a checkpoint stores them).

  Args:
    apply_flat: the model's forward pass on flat parameters.
    algorithm: the (wrapped) algorithm.
    w0: [d] the initial model.
    data: the device data.
    timeline: the timeline.
    base_hp: the hyper-parameters every round starts from.
    cfg: the ``FedEDSConfig``.
    anneal: E_t by Eq. 5 (else ``fixed_epochs``).
    share: the transfer weights of Eqs. 9-10 (else (1, 0)).
    fixed_epochs: the epochs without ``anneal``: an int, or one per round.
    ring_size: R, the ring buffer's slots.
    seed: the base PRNG key's seed.
    eval_every: evaluate every this many rounds (and in the last 10).
    rounds_per_call: the rounds of a chunk.
    on_chunk: called as ``on_chunk(state, rows)`` after every chunk.
    state: the state to start from (None: ``init_state``).
  """
  num_clients = int(data.counts.shape[0])
  max_examples = int(data.x.shape[1])
  if state is None:
    state = init_state(algorithm, w0, num_clients, ring_size, seed)
  hp, round_hp = hp_schedule(base_hp, timeline.num_rounds, cfg, anneal=anneal, share=share,
                             fixed_epochs=fixed_epochs)
  ecfg = engine.EngineConfig(
      local=building.local_config(batch_size=cfg.batch_size,
                                  max_epochs=int(round_hp["local_epochs"].max()),
                                  max_examples=max_examples), ring_size=ring_size)
  runner = engine.make_runner(apply_flat, algorithm, ecfg)

  def annotated(chunk_state, rows):
    for r in rows:
      r["local_epochs"] = int(round_hp["local_epochs"][r["round"] - 1])  # rows count from 1
      r["lambda_dis"] = float(round_hp["fededs_lambda_dis"][r["round"] - 1])
    if on_chunk is not None:
      on_chunk(chunk_state, rows)

  annotated.stops_on_divergence = engine.host_stops_on_divergence(on_chunk)

  return engine.run_rounds(runner, state, timeline, hp, data, eval_every=eval_every,
                         rounds_per_call=rounds_per_call, on_chunk=annotated,
                         round_hp=round_hp)


def accuracy(model: SplitModel, theta, x, y, chunk: int = 1000) -> float:
  """Top-1 accuracy of f(x; theta_g, theta_c) with the stochastic layer off.

  Args:
    model: the split model.
    theta: (theta_g, theta_c).
    x: the inputs.
    y: the labels.
    chunk: the rows scored at a time.
  """
  fn = jax.jit(lambda th, xb: jnp.argmax(model.forward(th[0], th[1], xb), -1))
  hits = sum(int(jnp.sum(fn(theta, x[i:i + chunk]) == y[i:i + chunk]))
             for i in range(0, len(y), chunk))
  return hits / max(len(y), 1)


def shared_set_utility(model: SplitModel, shared: SharedData, theta0, test_x, test_y, key,
                       cfg: FedEDSConfig, epochs: int) -> float:
  """What the shared sets teach on their own: test accuracy (layer off) of a model trained
  from ``theta0`` on the union of every client's D_i^F alone, each row scored with its
  sender's theta_l^i under L_dis (Eq. 6, as a receiving client uses it in Eq. 8), for
  ``epochs`` epochs of the clients' SGD (lr, momentum, weight decay of ``cfg``).

  Args:
    model: the split model.
    shared: every client's shared set and layer.
    theta0: the (theta_g, theta_c) to train from.
    test_x: the test inputs.
    test_y: the test labels.
    key: the shuffles' key.
    cfg: the ``FedEDSConfig``.
    epochs: the epochs trained.
  """
  num, rows = shared.x.shape[:2]
  valid = np.flatnonzero((np.arange(rows)[None, :] < np.asarray(shared.counts)[:, None])
                         .reshape(-1))
  x = jnp.asarray(shared.x).reshape((num * rows,) + shared.x.shape[2:])[valid]
  soft = jnp.asarray(shared.soft).reshape(num * rows, -1)[valid]
  sender = jnp.asarray(np.repeat(np.arange(num), rows)[valid])

  def loss_fn(th, xb, ib, mask):
    return transfer_loss(model, th[0], th[1], xb, soft[ib], take_layer(shared.layers,
                                                                        sender[ib]), mask)

  run = jax.jit(lambda tr, k, c: train_chunk(
      loss_fn, sgd(cfg), tr, x, jnp.arange(len(valid)), len(valid), k, epochs,
      cfg.batch_size, c))
  tr = Training.start(sgd(cfg), theta0, epochs)
  for c in range(epochs):  # an epoch per call: a Ctrl-C waits for one epoch at most
    tr = jax.block_until_ready(run(tr, key, c))
  return accuracy(model, tr.params, test_x, test_y)


def rounds_to_target(accuracies, target: float) -> Optional[int]:
  """The first (1-based) round whose test accuracy reaches ``target`` (None if never)."""
  for i, a in enumerate(accuracies):
    if a is not None and a >= target:
      return i + 1
  return None
