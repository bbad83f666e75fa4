"""PAFed (Miao et al., IEEE TIFS 2024), plaintext server.

Client: the FedADMM client (Eqs. 8-10, 16; ``fedadmm``), its upload normalised to unit
length (Alg. 3 line 8). Server: the mean m of this round's online uploads, DUCC on the delayed
uploads that arrived this round (Alg. 4, Eqs. 12-14), then Eq. 17:

  w <- w + alpha_0 m + alpha_1 m1 + alpha_2 m2.

The server reads the uploads in one pass, as running sums (``DuccSums``): the online rows
first, then each delayed row weighed against their mean, so a chunked round folds each
chunk in as it is trained and never holds the round's ``[K, d]`` uploads.

``ducc`` is public so that the CKKS implementation (``fedjax_async.crypto``) can be checked
against it with the same Min function (exact ``jnp.minimum`` or Cheon et al.'s polynomial).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_async.algorithms import base
from fedjax_async.algorithms import fedadmm

MinFn = Callable[[jax.Array, jax.Array], jax.Array]
# Eq. 13's Min(s, 1/2), s in [0, 1]: an approximate Min (Cheon's Alg. 1) iterates on y =
# (s - 1/2) / 2, |y| <= 1/4; scaled by c it needs (c y)^2 <= 1.
DUCC_MAX_SCALE = 4.0


def check_ducc_scale(scale: float) -> None:
  """ValueError naming crypto.ckks_min_scale unless 0 < scale <= DUCC_MAX_SCALE."""
  if not 0.0 < float(scale) <= DUCC_MAX_SCALE:
    raise ValueError(f"crypto.ckks_min_scale: must be in (0, {DUCC_MAX_SCALE:g}] (DUCC's Min "
                     f"input y = cos / 4 times it must stay in [-1, 1]), got {scale}")


def alpha_default(dataset: str) -> float:
  """Eq. 17's alphas by data set. Eq. 17 adds alpha times unit vectors, a step of fixed
  length whatever the model's size: the paper's alpha = 0.8 suits its 1.66M-parameter CNN,
  but the 610-parameter logistic regression of the synthetic data sets then keeps jumping
  by ~0.8 around its optimum (main job, 3 seeds: final accuracy 0.65 +- 0.10 at 0.8,
  0.80 +- 0.01 at 0.4; docs/design.md)."""
  return 0.4 if str(dataset).lower().startswith("synthetic") else 0.8


# The class DUCC projects (Eq. 14; ``hp["ducc_project_conflicting"]`` 1 for the first).
DUCC_PROJECTION = base.Option(
    "ducc_projection", "conflicting", "PAFed's class projected (Eq. 14): conflicting (m . u_j "
    "< 0) | non_conflicting (Sec. V-A; docs/design.md).", ("conflicting", "non_conflicting"),
    enum=True)
OPTIONS = (fedadmm.ADMM_UPLOAD, DUCC_PROJECTION)

_BY_DATASET = "by data set"
HPARAMS = (
    fedadmm.RHO,
    base.HParam("alpha0", 0.8, f"Eq. 17's weight of m; {_BY_DATASET}.",
                bounds="[0, inf)", by_dataset=alpha_default),
    base.HParam("alpha1", 0.8, f"Eq. 17's weight of m1; {_BY_DATASET}.", bounds="[0, inf)", by_dataset=alpha_default),
    base.HParam("alpha2", 0.8, f"Eq. 17's weight of m2; {_BY_DATASET}.", bounds="[0, inf)", by_dataset=alpha_default),
    base.HParam("alpha_decay", 1.0, "gamma of alpha_t = alpha gamma^t (1: as printed).", bounds="(0, 1]"),
)


def normalise(v, eps=1e-12):
  """v / ||v|| (Alg. 3 line 8); a zero vector stays zero."""
  norm = jnp.linalg.norm(v)
  return v / jnp.maximum(norm, eps)


class DuccSums(NamedTuple):
  """DUCC's running sums over a round's uploads (Alg. 4), folded in chunk by chunk."""

  online_sum: jax.Array  # [d] sum of the online uploads
  online_sq: jax.Array  # ||online_sum||^2 (for m / ||m||)
  online_count: jax.Array  # n, the number of online uploads
  class_sums: jax.Array  # [2, d] sum_j w1_j u_j, sum_j w2_j u_j over delayed uploads
  class_weights: jax.Array  # [2] n1 = sum_j w1_j, n2 = sum_j w2_j (<= 0)
  conflicting: jax.Array  # int32: delayed uploads with m . u_j < 0


def ducc_init(w) -> DuccSums:
  """Empty sums for uploads shaped like ``w``."""
  d = jnp.zeros(jnp.shape(w), jnp.float32)
  zero = jnp.float32(0.0)
  return DuccSums(d, zero, zero, jnp.zeros((2,) + d.shape, jnp.float32),
                  jnp.zeros(2, jnp.float32), jnp.int32(0))


def ducc_add(sums: DuccSums, updates, online_mask, delayed_mask,
             min_fn: MinFn = jnp.minimum, weights=None) -> DuccSums:
  """Folds in a chunk of unit-vector uploads [G, d]: its online rows first, then its
  delayed rows, weighed against the mean m of the online rows folded in so far. That m is
  the round's online mean once every online row is in: the caller folds in all online
  rows before any delayed one (one call with all rows does).

  Each part runs only when the chunk has such rows (``lax.cond``): a chunk of one client
  reads and writes the online sum, or the two class sums, not both (the sums are the
  carry of the engine's scan over chunks, updated in place).

  ``weights`` (optional, [G]): each row's client weight p_k (``client_weighting``), a
  factor of its term in every sum and count (None: 1, Alg. 4 as printed).

  Args:
    sums: the sums so far.
    updates: [G, d] the chunk's unit-vector uploads.
    online_mask: [G] bool, its online rows.
    delayed_mask: [G] bool, its delayed rows.
    min_fn: Min(a, b) on [0, 1] (``jnp.minimum`` or the Cheon polynomial).
    weights: [G] the rows' client weights (None: 1).
  """
  updates = jnp.asarray(updates, jnp.float32)
  om, dm = jnp.asarray(online_mask, bool), jnp.asarray(delayed_mask, bool)
  p = jnp.ones(om.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)

  def add_online(c: DuccSums) -> DuccSums:
    po = jnp.where(om, p, 0.0)
    total = c.online_sum + jnp.einsum("g,gd->d", po, updates)
    return c._replace(online_sum=total, online_sq=jnp.vdot(total, total),
                      online_count=c.online_count + jnp.sum(po))

  def add_delayed(c: DuccSums) -> DuccSums:
    # Alg. 4 line 3 gives the mean m; the Min's input uses m / ||m|| ("We first
    # normalize w_m and w_j", Sec. V-A): the mean of unit vectors is shorter than 1, and
    # the class weights would shrink with it (the exact Min's m1, m2 do not change;
    # Cheon's would). m / ||m|| = online_sum / ||online_sum||.
    norm = jnp.sqrt(c.online_sq)
    dots = jnp.where(norm > 0, (updates @ c.online_sum) / jnp.where(norm > 0, norm, 1.0),
                     0.0)
    s = (dots + 1.0) / 2.0  # (m . u_j / ||m|| + 1) / 2, in [0, 1] for unit vectors
    x = min_fn(s, jnp.full_like(s, 0.5))  # Eq. 13: x = Min(s, 1/2)
    w1 = jnp.where(dm, (s - x) * p, 0.0)  # > 0 iff m . u_j > 0 (non-conflicting)
    w2 = jnp.where(dm, (x - 0.5) * p, 0.0)  # < 0 iff m . u_j < 0 (conflicting)
    weights = jnp.stack([w1, w2], axis=1)  # [G, 2]: both classes in one pass
    return c._replace(class_sums=c.class_sums + jnp.einsum("gk,gd->kd", weights, updates),
                      class_weights=c.class_weights + jnp.sum(weights, axis=0),
                      conflicting=c.conflicting + jnp.sum(dm & (dots < 0)).astype(jnp.int32))

  sums = jax.lax.cond(jnp.any(om), add_online, lambda c: c, sums)
  return jax.lax.cond(jnp.any(dm), add_delayed, lambda c: c, sums)


def ducc_result(sums: DuccSums, empty_class_tol: float = 0.0, project_conflicting=True):
  """(m, m1, m2) from the running sums (Alg. 4 lines 3, 11; Eq. 12 / 14).

  ``project_conflicting`` (a bool, or a traced scalar): which delayed class is projected
  onto the normal plane of m. True: m2, the conflicting class (m . u_j < 0), as Eq. 13's
  weights and Eq. 14 define it and Eq. 17 labels alpha_2; False: m1, the non-conflicting
  class, the reading of Sec. V-A's prose, whose labels of m1 and m2 are swapped
  (docs/design.md). Either way alpha_1 weighs the non-conflicting mean."""
  m = base.mean_from_sum(sums.online_sum, sums.online_count)
  n1, n2 = sums.class_weights[0], sums.class_weights[1]
  m1 = base.mean_from_sum(sums.class_sums[0], n1, empty_class_tol)  # Alg. 4 lines 5-6, 11
  m2 = base.mean_from_sum(sums.class_sums[1], n2, empty_class_tol)  # Alg. 4 lines 7-8, 11
  m_sq = jnp.vdot(m, m)

  def project(v):  # Eq. 14: v onto the normal plane of m (unchanged when m = 0)
    return v - jnp.where(m_sq > 0, jnp.vdot(v, m) / jnp.where(m_sq > 0, m_sq, 1.0), 0.0) * m

  if isinstance(project_conflicting, bool):
    return (m, m1, project(m2)) if project_conflicting else (m, project(m1), m2)
  flag = jnp.asarray(project_conflicting) > 0
  return m, jnp.where(flag, m1, project(m1)), jnp.where(flag, project(m2), m2)


def ducc(online_updates, delayed_updates, min_fn: MinFn = jnp.minimum,
         online_mask=None, delayed_mask=None, empty_class_tol: float = 0.0):
  """Delayed Update Classification and Correction (Alg. 4).

  Args:
    online_updates: [n, d] unit vectors uploaded by this round's online clients.
    delayed_updates: [k, d] unit vectors of the stale uploads that arrived this round.
    min_fn: Min(a, b) for a, b in [0, 1], a JAX function (it is traced): ``jnp.minimum``
      or the Cheon polynomial.
    online_mask, delayed_mask: optional bool [n] / [k] marking real rows (padding is False).
    empty_class_tol: a class whose |total weight| is at most this counts as empty. 0 for
      the exact Min; with an approximate Min (error eps per weight) an empty class has a
      total of up to k * eps, and dividing by it would turn approximation error into a
      full-length (unprojected) direction (see ``docs/crypto.md``).

  Returns:
    (m, m1, m2): the online mean, the mean of non-conflicting delayed updates and the
    projected mean of conflicting ones. A class whose total weight is zero gives zero.
  """
  online_updates = jnp.asarray(online_updates, jnp.float32)
  delayed_updates = jnp.asarray(delayed_updates, jnp.float32)
  n, k = online_updates.shape[0], delayed_updates.shape[0]
  om = jnp.ones((n,), bool) if online_mask is None else jnp.asarray(online_mask, bool)
  dm = jnp.ones((k,), bool) if delayed_mask is None else jnp.asarray(delayed_mask, bool)
  sums = ducc_init(jnp.zeros(online_updates.shape[1:], jnp.float32))
  sums = ducc_add(sums, online_updates, om, jnp.zeros((n,), bool), min_fn)
  sums = ducc_add(sums, delayed_updates, jnp.zeros((k,), bool), dm, min_fn)
  return ducc_result(sums, empty_class_tol)


def client_final(w_start, w_end, client_state, num_steps, hp):
  """FedADMM's upload (Eq. 16) as a unit vector (Alg. 3 line 8).

  Args:
    w_start: [d] the model the client started from.
    w_end: [d] its model after local training.
    client_state: its persistent state.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  out = fedadmm.admm_client_final(w_start, w_end, client_state, num_steps, hp)
  return base.ClientOutput(upload=normalise(out.upload), state=out.state)


def make_streamed_server(min_fn: Optional[MinFn] = None, empty_class_tol_per_update=0.0
                         ) -> base.StreamedServer:
  """The plaintext server, folding the uploads in chunk by chunk (online ones first);
  ``min_fn`` / ``empty_class_tol_per_update`` (times the number of delayed arrivals gives
  ``ducc``'s ``empty_class_tol``) reproduce the encrypted server's arithmetic in
  plaintext (``make_algorithm``)."""
  min_fn = jnp.minimum if min_fn is None else min_fn

  def add(sums, uploads, rows, hp):
    return ducc_add(sums, uploads, rows.online, rows.delayed, min_fn,
                    base.client_weights(rows, hp, "uniform"))

  def finish(w, server_state, sums, arrivals, round_index, hp):
    """DUCC's result (Alg. 4) applied with Eq. 17's alphas.

    Args:
      w: [d] the global model.
      server_state: the server's state.
      sums: the round's ``DuccSums``.
      arrivals: the round's ``Arrivals`` [K].
      round_index: the round (0-based).
      hp: the hyper-parameters.
    """
    tol = empty_class_tol_per_update * jnp.sum(arrivals.delayed)
    m, m1, m2 = ducc_result(sums, tol, hp["ducc_project_conflicting"])
    # alpha_t = alpha * gamma^t (hp alpha_decay; 1 = Eq. 17's constant weights)
    decay = jnp.power(jnp.asarray(hp["alpha_decay"], jnp.float32), round_index)
    new_w = w + decay * (hp["alpha0"] * m + hp["alpha1"] * m1 + hp["alpha2"] * m2)  # Eq. 17
    return new_w, server_state, {"conflicting": sums.conflicting}

  return base.StreamedServer(init=lambda w, server_state: ducc_init(w), add=add,
                             finish=finish, online_first=True)


def make_algorithm(min_fn: Optional[MinFn] = None, empty_class_tol_per_update=0.0,
                   name: str = "pafed", upload: str = "received") -> base.Algorithm:
  """PAFed with the given Min (default exact), empty-class tolerance (default 0) and
  reading of Eq. 16 (``fedadmm.UPLOADS``; default the model received, as Gong et al.'s
  FedADMM code)."""
  fedadmm.make_algorithm(upload)  # validates ``upload``
  streamed = make_streamed_server(min_fn, empty_class_tol_per_update)
  return base.Algorithm(
      name=name,
      local_penalty=fedadmm.admm_penalty,
      client_final=client_final,
      server_update=base.streamed_server_update(streamed),
      streamed_server=streamed,
      client_state_keys=fedadmm.state_keys(upload),
      init_client_state=fedadmm.make_init_client_state(upload),
      separable_penalty=True,  # FedADMM's (Eq. 8)
      hparams=HPARAMS,
  )


ALGORITHM = make_algorithm()
