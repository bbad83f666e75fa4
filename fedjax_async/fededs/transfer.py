"""FedEDS's knowledge transfer (Alg. 2, Eqs. 6-8): the KL term on another client's
encrypted data, and ``wrap``, which adds it to a base algorithm's local objective."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.fededs.generation import SharedData
from fedjax_async.fededs.model import SplitModel

Array = jax.Array
ID_KEY = "fededs_id"  # client-state key holding a one-hot of the client's own index



# -------------------------------------------------------------- knowledge transfer


def kl_soft(p, logits, mask=None):
  """Mean over rows of KL(p || softmax(logits)) = sum_c p_c (log p_c - log q_c) (Eq. 6);
  0 log 0 = 0; rows with ``mask`` False are left out."""
  logq = jax.nn.log_softmax(logits, -1)
  per_row = jnp.sum(jax.scipy.special.xlogy(p, p) - p * logq, -1)
  if mask is None:
    return jnp.mean(per_row)
  mask = mask.astype(per_row.dtype)
  return jnp.sum(per_row * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def transfer_loss(model: SplitModel, theta_g, theta_c, x_enc, soft, theta_l, mask=None):
  """L_dis (Eq. 6): KL between sender i's soft labels and f(x; theta_k, theta_l^i).

  Args:
    model: the split model.
    theta_g: the receiving client's feature extractor.
    theta_c: its classifier.
    x_enc: the sender's encrypted rows.
    soft: their soft labels.
    theta_l: the sender's stochastic layer.
    mask: the real rows (None: all).
  """
  return kl_soft(soft, model.forward(theta_g, theta_c, x_enc, theta_l), mask)


def sample_sender(key, own, num_clients):
  """i* ~ U({0..N-1} \\ {own}) (Eq. 8): draw j in 0..N-2 and skip over ``own``."""
  j = jax.random.randint(key, (), 0, num_clients - 1)
  return jnp.where(j >= own, j + 1, j)


def step_key(w, own, seed: int = 0):
  """A PRNG key that changes every local step: ``local_penalty`` gets no key, so one is
  derived from (seed, client, a hash of the current parameters w). Workaround until the
  engine passes the step key to ``local_penalty`` (docs/fededs.md)."""
  bits = jax.lax.bitcast_convert_type(jax.lax.stop_gradient(w), jnp.uint32)
  mult = jnp.arange(bits.shape[0], dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
  h = jnp.sum(bits * mult, dtype=jnp.uint32)
  k = jax.random.fold_in(jax.random.PRNGKey(seed), own)
  return jax.random.fold_in(k, h)


def take_layer(layers, i):
  return jax.tree.map(lambda a: a[i], layers)


def transfer_penalty(model: SplitModel, split: Callable, shared: SharedData, w, own, key,
                     batch: int, mode: str = "sample"):
  """The knowledge-transfer term for client ``own`` at parameters w.

  mode "sample" (Eq. 8): one sender i* != own, ``batch`` rows of D_{i*}^F drawn
  uniformly from its real rows, scored with theta_l^{i*}. mode "all" (Eq. 7): the sum of
  that term over every sender i != own.

  Args:
    model: the split model.
    split: flat parameters -> (theta_g, theta_c).
    shared: every client's shared set and layer.
    w: the client's flat parameters.
    own: the client's index.
    key: the draws' key.
    batch: the rows drawn per sender.
    mode: ``sample`` (Eq. 8) or ``all`` (Eq. 7).
  """
  theta_g, theta_c = split(w)
  num_clients = shared.counts.shape[0]

  def one_sender(i, k):
    rows = jax.random.randint(k, (batch,), 0, jnp.maximum(shared.counts[i], 1))
    return transfer_loss(model, theta_g, theta_c, shared.x[i][rows], shared.soft[i][rows],
                         take_layer(shared.layers, i))

  if mode == "sample":
    k_i, k_rows = jax.random.split(key)
    return one_sender(sample_sender(k_i, own, num_clients), k_rows)
  if mode == "all":
    ids = jnp.arange(num_clients)
    per = jax.vmap(one_sender)(ids, jax.random.split(key, num_clients))
    return jnp.sum(jnp.where(ids != own, per, 0.0))
  raise ValueError(f"transfer mode must be 'sample' or 'all', got {mode!r}")


def wrap(base_algorithm: base.Algorithm, model: Optional[SplitModel] = None,
         split: Optional[Callable] = None, shared: Optional[SharedData] = None, *,
         batch: int = 50, mode: str = "sample", seed: int = 0,
         name: Optional[str] = None) -> base.Algorithm:
  """FedEDS on top of ``base_algorithm`` (Alg. 2; Alg. 3 for FedAvg/FedProx, Alg. 4 for
  FedNova: uploads and server update are the base algorithm's).

  ``local_penalty`` = (base penalty + lambda_dis * L_dis + wd/2 ||w||^2) / lambda_c with
  lambda_c, lambda_dis, wd from hp (``fededs_lambda_c``, ``fededs_lambda_dis``,
  ``weight_decay``); together with ``round_hparams``'s lr * lambda_c this is Eq. 8 / 11.
  With ``shared=None`` there is no transfer term (baselines and ablation S1 keep the same
  weight decay). The shared data is closed over (device arrays); the client's own index
  comes from the per-client state ``fededs_id`` (a one-hot, see ``install_client_ids``).

  Args:
    base_algorithm: FedAvg, FedProx or FedNova.
    model: the split model (needed with ``shared``).
    split: flat parameters -> (theta_g, theta_c) (needed with ``shared``).
    shared: every client's shared set and layer (None: no transfer term).
    batch: the rows drawn per sender.
    mode: ``sample`` (Eq. 8) or ``all`` (Eq. 7).
    seed: the transfer draws' seed.
    name: the algorithm's name (None: ``fededs+<base>``).
  """
  if shared is not None and (model is None or split is None):
    raise ValueError("wrap: shared data needs the SplitModel and its split function")
  if mode not in ("sample", "all"):
    raise ValueError(f"wrap: mode must be 'sample' or 'all', got {mode!r}")
  base_keys = tuple(base_algorithm.client_state_keys)
  num_clients = 0 if shared is None else int(shared.counts.shape[0])

  def base_state(cs):
    return {k: cs[k] for k in base_keys + base_algorithm.client_reads_server}

  def init_client_state(w0):
    st = dict(base_algorithm.init_client_state(w0))
    st[ID_KEY] = jnp.zeros_like(w0)
    return st

  def local_penalty(w, w_start, cs, hp):
    lam_c = hp.get("fededs_lambda_c", 1.0)
    pen = base_algorithm.local_penalty(w, w_start, base_state(cs), hp)
    pen = pen + 0.5 * hp.get("weight_decay", 0.0) * jnp.vdot(w, w)
    if shared is not None:
      lam_dis = hp.get("fededs_lambda_dis", 0.0)
      own = jnp.argmax(cs[ID_KEY][:num_clients])
      key = step_key(w, own, seed)
      kl = jax.lax.cond(
          jnp.asarray(lam_dis) > 0,
          lambda: transfer_penalty(model, split, shared, w, own, key, batch, mode),
          lambda: jnp.float32(0.0))
      pen = pen + lam_dis * kl
    return pen / lam_c

  def client_final(w_start, w_end, cs, num_steps, hp):
    """The base algorithm's upload and state, the client's id kept.

    Args:
      w_start: [d] the model the client started from.
      w_end: [d] its model after local training.
      cs: its persistent state (with ``fededs_id``).
      num_steps: the local steps it took.
      hp: the hyper-parameters.
    """
    out = base_algorithm.client_final(w_start, w_end, base_state(cs), num_steps, hp)
    st = dict(out.state)
    st[ID_KEY] = cs[ID_KEY]
    return base.ClientOutput(upload=out.upload, state=st, correction=out.correction)

  return base.Algorithm(
      name=name or f"fededs+{base_algorithm.name}",
      local_penalty=local_penalty,
      client_final=client_final,
      server_update=base_algorithm.server_update,
      client_state_keys=base_keys + (ID_KEY,),
      init_client_state=init_client_state,
      init_server_state=base_algorithm.init_server_state,
      streamed_server=base_algorithm.streamed_server,
      client_reads_server=base_algorithm.client_reads_server,
  )


def client_id_rows(num_clients: int, dim: int) -> Array:
  """[N, d] with row k the one-hot e_k (needs d >= N)."""
  if dim < num_clients:
    raise ValueError(f"client ids need d >= N, got d={dim} < N={num_clients}")
  return jnp.eye(num_clients, dim, dtype=jnp.float32)


def install_client_ids(state):
  """``engine.SimState`` with ``client_state['fededs_id']`` set to each client's one-hot
  (``init_state`` broadcasts one initial state to all clients, so this runs after it)."""
  cs = dict(state.client_state)
  n, d = cs[ID_KEY].shape
  cs[ID_KEY] = client_id_rows(n, d)
  return state._replace(client_state=cs)
