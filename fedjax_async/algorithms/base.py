"""The one contract every algorithm module fills in, for both engines.

An algorithm is a plain dataclass of pure functions over flat parameter vectors
(``jax.flatten_util.ravel_pytree`` of the model's params), in the style of fedjax's
``FederatedAlgorithm``: an engine owns the loop, the ring buffer of past global models
and the vmap over clients; an algorithm only says

* what the client adds to its minibatch loss (``local_penalty``),
* what the client uploads and keeps after local training (``client_final``),
* and a server rule of either kind:

  - ``server_update``: the arrivals of one round folded into the global model (the round
    engine, ``fedjax_async.rounds``; on the virtual clock each arrival is a round of one,
    ``asynchronous.engine.server_rule``), and, for rules that can read the uploads in one
    pass (FedAvg, FedProx, FedNova and FedADMM through one weighted sum, PAFed through
    DUCC's running sums), how to fold them in chunk by chunk (``streamed_server``: the
    engine then never holds a round's ``[K, d]`` uploads);
  - ``server_step``: one arrival applied to the model current at its arrival (the virtual
    clock only, ``fedjax_async.asynchronous``: FedAsync, FedBuff, ...).

The client side is shared: both engines train with ``local_penalty`` and upload what
``client_final`` returns. Hyperparameters travel as a dict of scalars (``hp``) so that
sweeps can ``vmap`` over them; an algorithm declares its own (``HParam``: name, default,
bounds, help) beside its update, and the flags, ``--helpfull``, validation, the sweepable
names and docs/api.md's table are made from those declarations.

Server state the clients read (SCAFFOLD's c): a round rule names the ``[d]`` entries of
its server state (a dict) that its clients read, ``client_reads_server=("c",)``; the round
engine hands each client those of its dispatch round (kept in a ring beside the model's,
``SimState.server_ring``: a delayed client reads what it was sent) merged into
``client_state``, so ``local_penalty`` and ``client_final`` read ``client_state["c"]``
beside the client's own keys (it keeps only ``client_state_keys``). ``client_final``
may also return a per-client ``correction`` ([d], SCAFFOLD's Delta c_i); the server reads
the round's in ``arrivals.correction`` ([K, d]; a chunk's in a streamed rule's ``add``),
and N in ``arrivals.num_clients``. Rules with either run on the round engine only.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array
HParams = Dict[str, Any]


_BOUNDS = re.compile(r"^([\[(])\s*(-?inf|[-+0-9.e]+)\s*,\s*(-?inf|[-+0-9.e]+)\s*([\])])$")


@dataclasses.dataclass(frozen=True)
class HParam:
  """One of an algorithm's own hyper-parameters, declared beside its update.

  ``name``: its key in ``hp``, its flag (``--name``), its sweep (``--sweep_name``) and its
  result column; ``default``: its value when none is given (``by_dataset(dataset)`` instead
  where it depends on the data set); ``bounds``: the allowed interval, ``"[0, inf)"``;
  ``kind``: ``float`` (traced), ``bool`` (traced as 0/1; not swept); ``help``: one line for
  ``--helpfull`` and docs/api.md.
  """

  name: str
  default: float
  help: str = ""
  bounds: str = "(-inf, inf)"
  kind: str = "float"
  by_dataset: Optional[Callable[[str], float]] = None

  def __post_init__(self):
    if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name or ""):
      raise ValueError(f"HParam: a name is lower-case letters, digits and _, got "
                       f"{self.name!r}")
    if self.kind not in ("float", "bool"):
      raise ValueError(f"HParam {self.name}: kind is float or bool, got {self.kind!r}")
    if not _BOUNDS.match(self.bounds):
      raise ValueError(f"HParam {self.name}: bounds are an interval such as '[0, 1)', got "
                       f"{self.bounds!r}")
    problem = self.check(self.default)
    if problem:
      raise ValueError(f"HParam {self.name}: the default {problem}")

  def default_for(self, dataset: str = "") -> float:
    """The default on ``dataset`` (``by_dataset``'s when given)."""
    return self.by_dataset(str(dataset)) if self.by_dataset else self.default

  def check(self, value) -> Optional[str]:
    """None when ``value`` is allowed, else what is wrong (``must be in (0, inf), got 0``)."""
    if self.kind == "bool":
      return None if value in (True, False, 0, 1) else f"must be true or false, got {value!r}"
    try:
      v = float(value)
    except (TypeError, ValueError):
      return f"must be a number, got {value!r}"
    left, lo, hi, right = _BOUNDS.match(self.bounds).groups()
    lo, hi = float(lo), float(hi)
    inside = ((v > lo if left == "(" else v >= lo) and (v < hi if right == ")" else v <= hi))
    if not math.isfinite(v) and not (inside and v == hi):  # "(0, inf]" allows inf
      return f"must be a finite number, got {value}"
    if not inside:
      return f"must be in {self.bounds}, got {value}"
    return None


@dataclasses.dataclass(frozen=True)
class Option:
  """One of an algorithm's options that is a word or a list, not a number (FedADMM's
  reading of Eq. 16, FedAsync's staleness function), declared beside its update: the
  configurations make its field, flag, help and check from it.

  ``choices``: the words allowed (its ``hp`` entry, where it has one, is the index of the
  one given: ``code``); ``enum``: the flag lists them; ``check``: ``value -> problem or
  None`` in their place (a comma list).
  """

  name: str
  default: str
  help: str
  choices: Tuple[str, ...] = ()
  enum: bool = False
  check: Optional[Callable[[str], Optional[str]]] = None

  def problem(self, value) -> Optional[str]:
    """None when ``value`` is allowed, else what is wrong (``must be a or b, got 'c'``)."""
    if self.check is not None:
      return self.check(value)
    if value in self.choices:
      return None
    allowed = (" or ".join(self.choices) if len(self.choices) == 2
               else "one of " + ", ".join(self.choices))
    return f"must be {allowed}, got {value!r}"

  def code(self, value) -> float:
    """``value``'s ``hp`` entry: its index among ``choices``."""
    return float(self.choices.index(value))


class Arrivals(NamedTuple):
  """What the server knows about the (padded) batch of updates arriving in one step.

  All fields have a leading axis of size K (the padded number of arrivals).
  """

  valid: Array  # bool [K]: a real arrival (False for padding slots)
  online: Array  # bool [K]: valid and trained from the current global model (staleness 0)
  delayed: Array  # bool [K]: valid and stale (staleness >= 1)
  staleness: Array  # int32 [K]: server versions between dispatch and arrival
  num_examples: Array  # float32 [K]: the client's example count n_i
  num_steps: Array  # float32 [K]: local optimiser steps the client took (tau_i)
  start_params: Array  # float32 [K, d]: the global model the client trained from
  # [K, d]: ``ClientOutput.correction`` of each arrival (None when the rule returns none,
  # and in a streamed rule's ``finish``: its ``add`` got each chunk's)
  correction: Any = None
  num_clients: Any = None  # float32 [K]: N, the federation's clients, in every slot


class Arrival(NamedTuple):
  """What a ``server_step`` knows about one arriving update (scalars and [d] vectors)."""

  valid: Array  # bool: a real arrival (False in padding slots)
  # int32: server versions between dispatch and arrival (0: trained from the current
  # model); the t - tau of FedAsync's and PrivaAsyncFed's staleness functions
  staleness: Array
  flush: Array  # bool: this arrival creates a new server version (always, but FedBuff)
  w_start: Array  # [d] the (masked) model the client trained from, w_tau
  mask: Array  # [d] 1 where the client holds the parameter (pruned sub-model)
  num_examples: Array  # float32 n_i
  num_steps: Array  # float32 local steps taken


class StreamedServer(NamedTuple):
  """A server rule that reads a round's uploads in one pass, a chunk of G rows at a time.

  ``init(w, server_state) -> carry`` (``w``: the global model, for its shape; the
  server's state at the round's start, e.g. DP-FedAvg's adaptive clip norm);
  ``add(carry, uploads [G, d], rows, hp) -> carry``, where ``rows`` is the chunk's
  ``Arrivals`` (``start_params=None``; padding rows have ``valid`` False);
  ``finish(w, server_state, carry, arrivals [K], round, hp)
  -> (new_w, new_server_state, metrics dict)``.
  ``online_first``: across calls of ``add``, every online upload must come before any
  delayed one (PAFed: DUCC weighs a delayed update by its inner product with the mean of
  all online ones); the engine then orders each round's slots online first. Within one
  call ``add`` orders the rows itself.
  """

  init: Callable[[Array], Any]
  add: Callable[..., Any]
  finish: Callable[..., Any]
  online_first: bool = False


def streamed_server_update(rule: StreamedServer) -> Callable[..., Any]:
  """The ``server_update`` of a streamed rule: the K uploads folded in as one chunk."""

  def server_update(w, server_state, uploads, arrivals, round_index, hp):
    """The rule's carry from all K uploads at once, then its ``finish``.

    Args:
      w: [d] the global model.
      server_state: the server's state.
      uploads: [K, d] the round's uploads.
      arrivals: their ``Arrivals``.
      round_index: the round (0-based).
      hp: the hyper-parameters.
    """
    carry = rule.add(rule.init(w, server_state), uploads, arrivals, hp)
    return rule.finish(w, server_state, carry, arrivals, round_index, hp)

  return server_update


class LinearServer(NamedTuple):
  """A server rule that reads the round's uploads only through S = sum_k weight_k upload_k.

  ``weight(arrivals, hp) -> [K]``: each arrival's weight, zero for padding slots, from the
  per-client scalar fields of ``arrivals`` only (not ``start_params``; it is also called
  on a chunk of G clients, with ``start_params=None``).
  ``apply(w, server_state, upload_sum [d], weights [K], arrivals, round, hp)
  -> (new_w, new_server_state, metrics dict)``.
  """

  weight: Callable[..., Array]
  apply: Callable[..., Any]


def streamed_linear(rule: LinearServer) -> StreamedServer:
  """A linear rule as a streamed one: the carry is the running weighted sum S [d]."""

  def add(upload_sum, uploads, rows, hp):
    return upload_sum + jnp.einsum("g,gd->d", rule.weight(rows, hp), uploads)

  def finish(w, server_state, upload_sum, arrivals, round_index, hp):
    """``rule.apply`` of the running sum S with the round's weights.

    Args:
      w: [d] the global model.
      server_state: the server's state.
      upload_sum: [d] the running sum S.
      arrivals: the round's ``Arrivals`` [K].
      round_index: the round (0-based).
      hp: the hyper-parameters.
    """
    return rule.apply(w, server_state, upload_sum, rule.weight(arrivals, hp), arrivals,
                      round_index, hp)

  return StreamedServer(init=lambda w, server_state: jnp.zeros_like(w), add=add,
                        finish=finish)


class ClientOutput(NamedTuple):
  upload: Array  # [d] what is sent to the server
  state: Dict[str, Array]  # new persistent per-client state (``client_state_keys``)
  correction: Any = ()  # [d] a second upload the server folds in (``Arrivals.correction``)


def _check_hparam_items(name: str, hparams):
  """A TypeError naming the algorithm and the fix unless ``hparams`` is a tuple of
  ``HParam``s (a tuple keeps the frozen ``Algorithm`` hashable)."""
  if not isinstance(hparams, tuple):
    raise TypeError(f"algorithm {name!r}: hparams is a {type(hparams).__name__}, not a "
                    "tuple: write hparams=(base.HParam(name, default), ...)")
  for item in hparams:
    if not isinstance(item, HParam):
      fix = (f"base.HParam({', '.join(map(repr, item))})"
             if isinstance(item, tuple) and len(item) == 2 else "base.HParam(name, default)")
      raise TypeError(f"algorithm {name!r}: hparams item {item!r} is not an HParam: "
                      f"write {fix}")


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A federated algorithm as the engines see it (all functions pure, jit/vmap-safe).

  Attributes:
    name: registry name (``--algorithm``).
    local_penalty: ``(w, w_start, client_state, hp) -> scalar`` added to the minibatch loss.
    client_final: ``(w_start, w_end, client_state, num_steps, hp) -> ClientOutput``.
    server_update: ``(w, server_state, uploads [K, d], arrivals, round, hp)
      -> (new_w, new_server_state, metrics dict)``: a round's arrivals (``Arrivals``).
    server_step: ``(w, server_state, upload [d], arrival, hp) -> (new_w, new_server_state)``:
      one arrival (``Arrival``); give it or ``server_update``, not both.
    client_state_keys: names of persistent per-client vectors (each stored ``[N, d]``),
      e.g. ``("dual", "last_local")`` for ADMM-type methods (the round engine only).
    init_client_state: ``(w0) -> {key: [d]}`` initial per-client state for one client.
    init_server_state: ``(w0) -> pytree`` (e.g. a server optimiser's momentum).
    client_reads_server: keys of the server state (then a dict) its clients read, each
      ``[d]``: merged into their ``client_state`` from their dispatch round (the module
      docstring).
    streamed_server: optional ``StreamedServer`` for rules that can read the uploads in
      one pass, chunk by chunk; ``server_update`` must then be ``streamed_server_update``
      of it (``streamed_linear`` turns a ``LinearServer`` into one).
    separable_penalty: ``local_penalty`` is a sum over coordinates (FedProx's and ADMM's
      are), so it may be evaluated on pieces of ``w``, ``w_start`` and the ``[d]`` client
      state and summed: the local steps then never concatenate their per-leaf pieces
      into ``[d]`` for it (``core.client.make_client_step``).
    dp, early_stop, pruned, buffered: the virtual clock's client hooks
      (``asynchronous.engine.train_local``): clip + noise in local training (PrivaAsyncFed
      Alg. 1), stop once the loss is <= ``hp['loss_threshold']`` (double compensation),
      train the sub-model of the device class's scale, and server versions every
      ``buffer_k`` arrivals (FedBuff).
    hparams: the algorithm's own hyper-parameters, a tuple of ``HParam``s, kept as given
      (a list, or a ``(name, default)`` pair in it, is a TypeError saying what to write):
      they reach its functions in ``hp`` (traced, so a new value needs no
      recompilation); each is a flag ``--name``, a sweepable name and a result column, set
      from Python by ``simulate(name=value)``.
  """

  name: str
  local_penalty: Callable[..., Array]
  client_final: Callable[..., ClientOutput]
  server_update: Optional[Callable[..., Any]] = None
  server_step: Optional[Callable[..., Any]] = None
  client_state_keys: tuple = ()
  init_client_state: Callable[[Array], Dict[str, Array]] = lambda w0: {}
  init_server_state: Callable[[Array], Any] = lambda w0: ()
  streamed_server: Optional[StreamedServer] = None
  separable_penalty: bool = False
  dp: bool = False
  early_stop: bool = False
  pruned: bool = False
  buffered: bool = False
  hparams: Tuple[HParam, ...] = ()
  client_reads_server: tuple = ()

  def __post_init__(self):
    _check_hparam_items(self.name, self.hparams)
    names = [h.name for h in self.hparams]
    if len(set(names)) != len(names):
      raise ValueError(f"algorithm {self.name!r}: hparams declares "
                       f"{', '.join(sorted({n for n in names if names.count(n) > 1}))} twice")
    if (self.server_update is None) == (self.server_step is None):
      raise ValueError(f"algorithm {self.name!r}: give server_update (a round's arrivals) "
                       "or server_step (one arrival), exactly one")
    both = set(self.client_reads_server) & set(self.client_state_keys)
    if both:
      raise ValueError(f"algorithm {self.name!r}: {', '.join(sorted(both))} named both a "
                       "client's own state and server state its clients read")
    if self.client_reads_server and self.server_update is None:
      raise ValueError(f"algorithm {self.name!r}: client_reads_server needs a round rule "
                       "(server_update)")
    hooks = [k for k in ("dp", "early_stop", "pruned", "buffered") if getattr(self, k)]
    if self.server_update is not None and hooks:
      raise ValueError(f"algorithm {self.name!r}: {', '.join(hooks)} are the virtual "
                       "clock's client hooks; give a server_step with them")

  def hparam(self, name: str) -> Optional[HParam]:
    """The declared ``HParam`` called ``name``, or None."""
    return next((h for h in self.hparams if h.name == name), None)

  @property
  def engine(self) -> str:
    """``"rounds"`` (a ``server_update``) or ``"virtual_clock"`` (a ``server_step``
    only). A round rule also runs on the virtual clock, one arrival a round."""
    return "rounds" if self.server_update is not None else "virtual_clock"


def server_reads(algorithm: Algorithm, server_state) -> Dict[str, Array]:
  """``{key: [d]}``: the entries of ``server_state`` that ``algorithm``'s clients read."""
  keys = algorithm.client_reads_server
  if keys and not (isinstance(server_state, dict) and all(k in server_state for k in keys)):
    raise ValueError(f"algorithm {algorithm.name!r}: its clients read {', '.join(keys)} of "
                     f"the server state, which must be a dict holding them")
  return {k: server_state[k] for k in keys}


def no_penalty(w, w_start, client_state, hp):
  del w, w_start, client_state, hp
  return jnp.float32(0.0)


def delta_upload(w_start, w_end, client_state, num_steps, hp):
  """FedAvg-style upload: the model delta w_end - w_start.

  Args:
    w_start: [d] the model the client started from.
    w_end: [d] its model after local training.
    client_state: its persistent state.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  del num_steps, hp
  return ClientOutput(upload=w_end - w_start, state=client_state)


def model_upload(w_start, w_end, client_state, num_steps, hp):
  """FedAsync-style upload: the trained model w_end itself.

  Args:
    w_start: [d] the model the client started from.
    w_end: [d] its model after local training.
    client_state: its persistent state.
    num_steps: the local steps it took.
    hp: the hyper-parameters.
  """
  del w_start, num_steps, hp
  return ClientOutput(upload=w_end, state=client_state)


def weighted_mean(vectors: Array, weights: Array, tol: float = 0.0) -> Array:
  """sum_k weights_k vectors_k / sum_k weights_k, zero when |sum of weights| <= tol.

  The weights may all be negative (DUCC's conflicting class, whose total n2 < 0)."""
  return mean_from_sum(jnp.einsum("k,kd->d", weights, vectors), weights, tol)


def mean_from_sum(summed: Array, weights: Array, tol: float = 0.0) -> Array:
  """``weighted_mean`` given the weighted sum sum_k weights_k vectors_k already formed."""
  total = jnp.sum(weights)
  nonzero = jnp.abs(total) > tol
  return jnp.where(nonzero, summed / jnp.where(nonzero, total, 1.0), 0.0)


# How a round rule weighs its arrivals (``hp["client_weighting"]``, an index into this):
# auto, the rule's own (FedAvg's n_k, FedADMM's and PAFed's 1); examples, n_k; uniform, 1.
CLIENT_WEIGHTINGS = ("auto", "examples", "uniform")


def client_weights(arrivals, hp: HParams, own: str = "examples") -> Array:
  """p_k [K] of each valid arrival (0 for padding slots) by ``hp["client_weighting"]``
  (``CLIENT_WEIGHTINGS``' index); ``own``, the rule's auto weighting:
  ``examples`` (n_k) or ``uniform`` (1)."""
  valid = jnp.asarray(arrivals.valid)
  n = (jnp.ones(valid.shape, jnp.float32) if arrivals.num_examples is None  # none given
       else jnp.asarray(arrivals.num_examples, jnp.float32))
  ones = jnp.ones_like(n)
  code = jnp.asarray(hp["client_weighting"])
  p = jnp.select([code == 1, code == 2], [n, ones], n if own == "examples" else ones)
  return jnp.where(valid, p, 0.0)


def server_hparams(server_lr=1.0, server_lr2=-1.0, switch_round=-1,
                   client_weighting: str = "auto") -> HParams:
  """The round rules' server hyper-parameters that ``client_weights`` and ``server_lr``
  read, as ``hp`` entries (every engine supplies them): eta_2 < 0 is eta."""
  return {"client_weighting": float(CLIENT_WEIGHTINGS.index(client_weighting)),
          "server_lr": server_lr, "server_lr2": server_lr if server_lr2 < 0 else server_lr2,
          "server_lr_switch_round": switch_round}


def with_defaults(algorithm: Algorithm, hp: HParams, dataset: str = "") -> HParams:
  """``hp`` with what ``algorithm``'s functions read and it lacks at the declared defaults
  (on ``dataset``): its ``hparams``, and a round rule's ``server_hparams`` (eta_2 = eta).
  For calls by hand: an engine's ``hp`` (``RunConfig.hparams``) has them all."""
  out = {h.name: h.default_for(dataset) for h in algorithm.hparams}
  if algorithm.server_update is not None:
    out.update(server_hparams(*[hp[k] for k in ("server_lr",) if k in hp]))
  return {**out, **hp}


def server_lr(hp: HParams, round_index) -> Array:
  """Global learning rate eta, switched to eta_2 from round ``server_lr_switch_round`` on
  (FedADMM authors' schedule; the switch is off when the round is negative)."""
  switch = hp["server_lr_switch_round"]
  lr2 = hp["server_lr2"]
  use2 = jnp.logical_and(jnp.asarray(switch) >= 0, round_index >= switch)
  return jnp.where(use2, lr2, hp["server_lr"])
