"""FedEDS's Alg. 1 in chunks that a Ctrl-C stops between, keeping what they finished.

``generation.generate_encrypted`` is Alg. 1 for every client in one compiled call: at the
paper's size minutes in which a signal waits. ``Alg1`` runs the same steps one chunk per
``step()``: one epoch of pre-training (Eq. 2) or of the encryptor's training (Eq. 3) of
one client (``client_loop="map"``, CPU) or of all clients at once (``"vmap"``), then the
client's encryption (Eq. 4). Its progress is numpy arrays (``arrays`` /
``restore``), so ``run`` can save it to a file when a signal arrives and continue from
that file on resumption, to the results of an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_async import console
from fedjax_async import interrupts
from fedjax_async import outputs
from fedjax_async.fededs.generation import (
    Generation, SharedData, Training, encrypt, encryptor_loss, encryptor_optimizer,
    pretrain_loss, sgd, train_chunk)

PHASES = ("pre-training", "encryptor", "encryption")


class _Fns(NamedTuple):
  start_pretrain: Any  # (theta0, n) -> Training
  pretrain: Any  # (training, x, y, n, keys, chunk) -> Training
  start_encryptor: Any  # (x, keys) -> Training
  encryptor: Any  # (training, theta, layer, x, y, n, keys, chunk) -> Training
  encrypt: Any  # (theta, phi, layer, x) -> (encrypted x, soft labels)


@functools.lru_cache(maxsize=16)
def _functions(model, encryptor, cfg, share_rows, use_layer, client_loop) -> _Fns:
  """Alg. 1's parts for one client, jitted (vmapped over a group of clients with
  ``client_loop="vmap"``), cached so that repeated jobs do not recompile."""

  def start_pretrain(theta0, n):
    del n  # (gives vmap its axis)
    return Training.start(sgd(cfg), theta0, cfg.pretrain_epochs)

  def pretrain(tr, x, y, n, keys, chunk):
    """One chunk (epoch) of Alg. 1's pre-training (lines 1-4).

    Args:
      tr: the training so far.
      x: the client's padded inputs.
      y: its labels.
      n: its real rows.
      keys: [2] keys: pre-training's, the encryptor's.
      chunk: the epoch to run.
    """
    return train_chunk(pretrain_loss(model), sgd(cfg), tr, x, y, n, keys[0],
                       cfg.pretrain_epochs, cfg.batch_size, chunk)

  def start_encryptor(x, keys):
    k_init, _ = jax.random.split(keys[1])
    phi = encryptor.init(k_init, x[:1])["params"]
    return Training.start(encryptor_optimizer(cfg), phi, cfg.encryptor_epochs)

  def train_encryptor(tr, theta, layer, x, y, n, keys, chunk):
    """One chunk (epoch) of Alg. 1's encryptor training (lines 5-7).

    Args:
      tr: the training so far.
      theta: the client's pre-trained (theta_g, theta_c).
      layer: its stochastic layer.
      x: its padded inputs.
      y: its labels.
      n: its real rows.
      keys: [2] keys: pre-training's, the encryptor's.
      chunk: the epoch to run.
    """
    _, k_train = jax.random.split(keys[1])
    loss_fn = encryptor_loss(model, encryptor, theta, layer if use_layer else None)
    return train_chunk(loss_fn, encryptor_optimizer(cfg), tr, x, y, n, k_train,
                       cfg.encryptor_epochs, cfg.batch_size, chunk)

  def encrypt_rows(theta, phi, layer, x):
    rows = x if share_rows is None else x[:share_rows]
    return encrypt(model, encryptor, theta, phi, layer if use_layer else None, rows)

  if client_loop not in ("vmap", "map"):
    raise ValueError(f"client_loop must be 'vmap' or 'map', got {client_loop!r}")
  fns = (start_pretrain, pretrain, start_encryptor, train_encryptor, encrypt_rows)
  axes = ((None, 0), (0, 0, 0, 0, 0, None), (0, 0), (0, 0, 0, 0, 0, 0, 0, None),
          (0, 0, 0, 0))
  if client_loop == "vmap":
    return _Fns(*(jax.jit(jax.vmap(f, in_axes=a)) for f, a in zip(fns, axes)))
  return _Fns(*(jax.jit(f) for f in fns))


class _Progress(NamedTuple):
  """Where a job is (one attribute, replaced whole: a signal never finds it half set)."""
  group: int  # the group of clients in progress (len(groups): every group is done)
  phase: int  # index into PHASES
  chunk: int  # the next epoch of the phase
  training: Optional[Training]  # the phase's training so far
  pretrained: Optional[Tuple[Any, Any]]  # (theta, pre-training losses) of the group
  done: Tuple  # per finished group: (x_enc, soft, pre_loss, enc_loss, theta, phi)


class Alg1:
  """Alg. 1 for every client (``generation.generate_encrypted``'s arguments and result)
  run one chunk per ``step()``; ``result()`` once ``finished``."""

  def __init__(self, model, encryptor, theta0, layers, x, y, counts, key, cfg, *,
               share_rows: Optional[int] = None, use_layer: bool = True,
               client_loop: str = "vmap"):
    self.theta0, self.layers, self.cfg = theta0, layers, cfg
    self.x, self.y, self.counts = x, y, counts
    self.share_rows, self.client_loop = share_rows, client_loop
    k = int(x.shape[0])
    self.num_clients = k
    self.keys = jax.random.split(key, 2 * k).reshape(k, 2, -1)
    self.groups = ([np.arange(k)] if client_loop == "vmap"
                   else [np.array([i]) for i in range(k)])
    self.fns = _functions(model, encryptor, cfg, share_rows, use_layer, client_loop)
    self.epochs = (cfg.pretrain_epochs, cfg.encryptor_epochs, 1)
    self.progress = _Progress(0, 0, 0, None, None, ())
    self._encryptor = encryptor

  @property
  def finished(self) -> bool:
    return self.progress.group == len(self.groups)

  def _args(self, group):
    """The group's (layer, x, y, n, keys): all clients' with vmap (one group), one
    client's with map."""
    pick = (lambda a: a) if self.client_loop == "vmap" else (lambda a: a[group[0]])
    return (jax.tree.map(pick, self.layers), pick(self.x), pick(self.y),
            pick(self.counts), pick(self.keys))

  def step(self):
    """One chunk (computed before it returns)."""
    p, f = self.progress, self.fns
    layer, x, y, n, keys = self._args(self.groups[p.group])
    if p.phase == 0:
      tr = p.training if p.training is not None else f.start_pretrain(self.theta0, n)
      tr = f.pretrain(tr, x, y, n, keys, p.chunk)
      new = (p._replace(chunk=p.chunk + 1, training=tr) if p.chunk + 1 < self.epochs[0] else
             p._replace(phase=1, chunk=0, training=None,
                        pretrained=(tr.params, tr.epoch_losses())))
    elif p.phase == 1:
      tr = p.training if p.training is not None else f.start_encryptor(x, keys)
      tr = f.encryptor(tr, p.pretrained[0], layer, x, y, n, keys, p.chunk)
      new = p._replace(chunk=p.chunk + 1, training=tr)
      if p.chunk + 1 == self.epochs[1]:
        new = new._replace(phase=2, chunk=0)
    else:
      theta, pre_loss = p.pretrained
      phi = p.training.params
      xe, soft = f.encrypt(theta, phi, layer, x)
      new = _Progress(p.group + 1, 0, 0, None, None, p.done + (
          (xe, soft, pre_loss, p.training.epoch_losses(), theta, phi),))
    self.progress = jax.block_until_ready(new)

  def where(self) -> str:
    """The chunk next to run, in words ('client 2 of 5, encryptor epoch 4 of 20')."""
    p = self.progress
    if self.finished:
      return "the end"
    who = (f"all {self.num_clients} clients" if self.client_loop == "vmap"
           else f"client {p.group + 1} of {self.num_clients}")
    if p.phase == 2:
      return f"{who}, encryption"
    return f"{who}, {PHASES[p.phase]} epoch {p.chunk + 1} of {self.epochs[p.phase]}"

  def run(self):
    """Every chunk left; the ``Generation``."""
    while not self.finished:
      self.step()
    return self.result()

  def result(self) -> Generation:
    """``generate_encrypted``'s result, once ``finished``."""
    assert self.finished, self.where()
    done = self.progress.done
    if self.client_loop == "map":  # one client per group: stack them
      done = (jax.tree.map(lambda *v: jnp.stack(v), *done),)
    xe, soft, pre_loss, enc_loss, theta, phi = done[0]
    cnt = self.counts if self.share_rows is None else jnp.minimum(self.counts,
                                                                  self.share_rows)
    shared = SharedData(xe, soft, jnp.asarray(cnt).astype(jnp.int32), self.layers)
    return Generation(shared, pre_loss, enc_loss, theta, phi)

  # ---------------------------------------------------------------- saved progress

  def _treedefs(self):
    """The pytree structures of the progress (from abstract evaluation: no compute)."""
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                        (self.x, self.keys))
    pre = jax.eval_shape(lambda t: Training.start(sgd(self.cfg), t,
                                                  self.cfg.pretrain_epochs), self.theta0)
    enc = jax.eval_shape(_start_encryptor(self), *args)
    return {"training0": jax.tree.structure(pre), "training1": jax.tree.structure(enc),
            "pretrained": jax.tree.structure((self.theta0, 0)),
            "done": jax.tree.structure((0, 0, 0, 0, self.theta0, enc.params))}

  def layout(self) -> dict:
    """What a saved progress must match besides the configuration."""
    return {"client_loop": self.client_loop, "num_clients": self.num_clients,
            "share_rows": self.share_rows, "epochs": list(self.epochs)}

  def arrays(self) -> dict:
    """The progress as named numpy arrays (``restore`` reads them back)."""
    p = self.progress
    out = {"group": np.asarray(p.group), "phase": np.asarray(p.phase),
           "chunk": np.asarray(p.chunk)}
    parts = {"training": p.training, "pretrained": p.pretrained}
    parts.update({f"done{i}": d for i, d in enumerate(p.done)})
    for name, tree in parts.items():
      if tree is None:
        continue
      for j, leaf in enumerate(jax.tree.leaves(jax.device_get(tree))):
        out[f"{name}.{j}"] = np.asarray(leaf)
    return out

  def restore(self, arrays: dict):
    """Continues from ``arrays`` (of a job with the same arguments and ``layout``)."""
    defs = self._treedefs()
    group, phase = int(arrays["group"]), int(arrays["phase"])

    def tree(name, treedef):
      leaves = [jnp.asarray(arrays[f"{name}.{j}"]) for j in range(treedef.num_leaves)]
      return jax.tree.unflatten(treedef, leaves)

    training = (tree("training", defs[f"training{min(phase, 1)}"])
                if "training.0" in arrays else None)
    pretrained = tree("pretrained", defs["pretrained"]) if "pretrained.0" in arrays else None
    done = tuple(tree(f"done{i}", defs["done"]) for i in range(group))
    self.progress = _Progress(group, phase, int(arrays["chunk"]), training, pretrained, done)


def _start_encryptor(job: Alg1):
  """One client's encryptor start (the treedef of its training)."""

  def start(x, keys):
    k_init, _ = jax.random.split(keys[1])
    phi = job._encryptor.init(k_init, x[:1])["params"]  # pylint: disable=protected-access
    return Training.start(encryptor_optimizer(job.cfg), phi, job.cfg.encryptor_epochs)

  return start


# ------------------------------------------------------------------- with a file


def save(path: str, job: Alg1, config: dict):
  """The job's progress to ``path`` (written under a temporary name, then renamed)."""
  tmp = path + ".tmp.npz"
  np.savez(tmp, config=np.asarray(json.dumps(config)),
           layout=np.asarray(json.dumps(job.layout())), **job.arrays())
  os.replace(tmp, path)


def load(path: str, job: Alg1, config: dict, label: str) -> bool:
  """Restores ``job`` from ``save``'s file when it was made with ``config`` and the job's
  layout; says why not (and returns False) otherwise."""
  if not os.path.exists(path):
    return False
  try:
    with np.load(path) as z:
      arrays = {n: z[n] for n in z.files}
    same = (json.loads(str(arrays.pop("config"))) == config
            and json.loads(str(arrays.pop("layout"))) == job.layout())
    if same:
      job.restore(arrays)
  except (OSError, ValueError, KeyError, EOFError) as e:
    console.say(f"{label} {path} cannot be read ({type(e).__name__}: {e}): Alg. 1 starts over")
    return False
  if not same:
    console.say(f"{label} {path} was made with other settings: Alg. 1 starts over")
  return same


def run(job: Alg1, path: str, config: dict, label: str, resume: bool) -> Generation:
  """``job`` to its end, continued from ``path`` with ``resume``. A signal (Ctrl-C,
  SIGTERM; within ``interrupts.graceful`` the first one is only recorded) stops it at the
  end of the chunk it arrives in: the chunks done are saved to ``path``, a line says
  where, and the signal's ``Interrupted`` (or ``KeyboardInterrupt``) goes on. The file
  is removed once the job ends.

  Args:
    job: the Alg. 1 job.
    path: the partial file its finished chunks are saved to.
    config: the setting's configuration (checked against the file's).
    label: the lines' prefix.
    resume: continue from ``path`` when it holds this job.
  """
  if resume and load(path, job, config, label):
    console.say(f"{label} Alg. 1 continues from {path} at {job.where()}")
  else:
    console.say(f"{label} Alg. 1 for {job.num_clients} clients ({job.epochs[0]} pre-training "
                f"and {job.epochs[1]} encryptor epochs each) ...")
  try:
    while not job.finished:
      group = job.progress.group
      job.step()
      if job.progress.group > group and job.client_loop == "map":
        console.say(f"{label} Alg. 1: client {group + 1} of {job.num_clients} done",
                    console.PROGRESS)
      interrupts.check_interrupted()
  except KeyboardInterrupt:
    try:
      with interrupts.deferred():
        save(path, job, config)
    finally:
      console.warn(outputs.name_fields(
                 f"{label} Alg. 1 stopped before {job.where()}: the epochs before it are saved in "
                 f"{path}; run again with output.resume to continue from there"))
    raise
  if os.path.exists(path):
    os.remove(path)
  return job.result()
