"""Sequence labels: the masked per-token loss and accuracy (against plain numpy counts),
the LSTM cell (against haiku's formula written in numpy), the models' configurations
(fedjax's parameter counts), and the character LSTM learning from a Shakespeare file in
fedjax's format, on both engines."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_async as fa
from fedjax_async import models, text_models
from fedjax_async.core import client as client_lib
from fedjax_async.core import device, tokens

import natural_files as nf

V = 6  # ids: 0 PAD, 1 BOS, 2 EOS, 3 and 4 words, 5 OOV
SPECIAL = (0, 1, 2, 5)


def hand_batch():
  """A [3, 4] batch: row 0 ends with EOS and PAD, row 1 starts with BOS and has an OOV,
  row 2 is a padding row (masked out). Row 1 position 2: the raw argmax is OOV, the best
  allowed prediction the target."""
  labels = np.array([[3, 4, 2, 0], [1, 5, 4, 3], [4, 4, 0, 0]], np.int32)
  rows = np.array([True, True, False])
  logits = np.full((3, 4, V), -1.0, np.float32)
  logits[0, 0, 3] = 2.0  # right
  logits[0, 1, 2], logits[0, 1, 3] = 3.0, 1.0  # EOS blocked; 3 is wrong
  logits[0, 2, 2] = 5.0  # target EOS: not counted
  logits[1, 0, 4] = 1.0  # target BOS: not counted
  logits[1, 1, 5] = 4.0  # target OOV: not counted
  logits[1, 2, 5], logits[1, 2, 4] = 4.0, 2.0  # OOV blocked; 4 right
  logits[1, 3, 3] = 1.5  # right
  logits[2, :, 4] = 9.0  # the padding row: all "right", never counted
  return logits, labels, rows


def numpy_accuracy(logits, labels, rows, special):
  right = counted = 0
  for b in range(labels.shape[0]):
    if not rows[b]:
      continue
    for t in range(labels.shape[1]):
      if labels[b, t] in special:
        continue
      allowed = [v for v in range(logits.shape[-1]) if v not in special]
      pred = allowed[int(np.argmax(logits[b, t, allowed]))]
      counted += 1
      right += int(pred == labels[b, t])
  return right, counted


def numpy_token_loss(logits, labels, rows):
  total = count = 0.0
  for b in range(labels.shape[0]):
    for t in range(labels.shape[1]):
      if rows[b] and labels[b, t] != 0:
        z = logits[b, t].astype(np.float64)
        total += np.log(np.exp(z - z.max()).sum()) + z.max() - z[labels[b, t]]
        count += 1
  return total, count


def test_token_accuracy_is_a_plain_count_without_pads_bos_eos_and_oov():
  logits, labels, rows = hand_batch()
  right, counted = tokens.accuracy_counts(jnp.asarray(logits), jnp.asarray(labels),
                                          jnp.asarray(rows), SPECIAL)
  assert (int(right), int(counted)) == numpy_accuracy(logits, labels, rows, SPECIAL) == (3, 4)
  assert tokens.special_tokens(V) == SPECIAL


def test_token_loss_and_training_loss_leave_out_pads_and_padding_rows():
  logits, labels, rows = hand_batch()
  total, count = numpy_token_loss(logits, labels, rows)
  got_total, got_count = tokens.loss_sum(jnp.asarray(logits), jnp.asarray(labels),
                                         jnp.asarray(rows))
  assert int(got_count) == count == 7  # 3 + 4 non-PAD tokens of the real rows
  np.testing.assert_allclose(float(got_total), total, rtol=1e-6)
  mean = client_lib.masked_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                         jnp.asarray(rows))
  np.testing.assert_allclose(float(mean), total / count, rtol=1e-6)
  # the image path: [B] labels, a mean over the real rows
  flat = client_lib.masked_cross_entropy(jnp.asarray(logits[:, 0]), jnp.asarray(labels[:, 0]),
                                         jnp.asarray(rows))
  z = logits[:2, 0].astype(np.float64)
  want = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(2), labels[:2, 0]])
  np.testing.assert_allclose(float(flat), want, rtol=1e-6)


class _Fixed:
  """An apply_flat returning the stored logits of its examples (x holds row indices),
  for a model whose masked_targets are SPECIAL."""

  class model:  # noqa: N801
    masked_targets = SPECIAL

  def __init__(self, logits):
    self.logits = jnp.asarray(logits)

  def __call__(self, w, x, train=False):
    return self.logits[x[:, 0].astype(jnp.int32)]


def test_evaluation_of_sequence_labels_counts_tokens_across_batches():
  logits, labels, rows = hand_batch()
  n = 2  # the real rows are the test set; the evaluation pads its last batch itself
  test_x = np.repeat(np.arange(n)[:, None], 4, 1).astype(np.int32)
  acc, loss = device.evaluate(_Fixed(logits), None, jnp.asarray(test_x),
                              jnp.asarray(labels[:n]), batch=12)  # 3 sequences: 1 padded
  right, counted = numpy_accuracy(logits, labels, rows, SPECIAL)
  total, count = numpy_token_loss(logits, labels, rows)
  assert float(acc) == pytest.approx(right / counted)
  assert float(loss) == pytest.approx(total / count, rel=1e-6)


def numpy_lstm(x, kernel, bias, hidden):
  """haiku hk.LSTM (forget bias 1) unrolled from zeros: x [B, T, E] -> [B, T, H]."""
  b, t, e = x.shape
  sig = lambda v: 1 / (1 + np.exp(-v))
  h, c, out = np.zeros((b, hidden)), np.zeros((b, hidden)), []
  for s in range(t):
    z = np.concatenate([x[:, s], h], 1) @ kernel + bias
    i, g, f, o = np.split(z, 4, axis=1)
    c = sig(f + 1) * c + sig(i) * np.tanh(g)
    h = sig(o) * np.tanh(c)
    out.append(h)
  return np.stack(out, 1)


def test_the_lstm_layer_is_haikus_lstm():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 3)).astype(np.float32)
  layer = text_models.LSTM(4)
  params = layer.init(jax.random.PRNGKey(0), x)
  kernel = rng.normal(size=(7, 16)).astype(np.float32)
  bias = rng.normal(size=16).astype(np.float32)
  got = layer.apply({"params": {"kernel": kernel, "bias": bias}}, x)
  np.testing.assert_allclose(np.asarray(got), numpy_lstm(x, kernel, bias, 4), rtol=1e-5,
                             atol=1e-6)
  assert params["params"]["kernel"].shape == (7, 16)


@pytest.mark.parametrize("name,classes,vocab,params", [
    # fedjax models/shakespeare.py: Embed(90, 8); LSTM 256 on [8 + 256]; LSTM 256 on
    # [256 + 256]; Linear(256 -> 90)
    ("shakespeare_lstm", 90, 90, 90 * 8 + (264 * 1024 + 1024) + (512 * 1024 + 1024)
     + 256 * 90 + 90),
    # fedjax models/stackoverflow.py: Embed(10004, 96); LSTM 670; Linear(670 -> 96);
    # Linear(96 -> 10004)
    ("stackoverflow_lstm", 10004, 10004, 10004 * 96 + (766 * 2680 + 2680) + 670 * 96 + 96
     + 96 * 10004 + 10004),
    # LEAF models/sent140/stacked_lstm.py: embedding [vocab + 1, 100], 2 x LSTM 100, dense
    # 128, dense 2
    ("sent140_lstm", 2, 51, 51 * 100 + 2 * (200 * 400 + 400) + 100 * 128 + 128 + 128 * 2 + 2),
])
def test_the_text_models_have_their_sources_configuration(name, classes, vocab, params):
  model = models.get_model(name, classes, (20,), input_vocab=vocab)
  assert models.count_params(model, (20,)) == params
  w0, apply_flat = models.flat_model(model, (3,), jax.random.PRNGKey(0))
  out = apply_flat(w0, jnp.array([[1, 4, 2]], jnp.int32))
  assert out.shape == ((1, 3, classes) if name != "sent140_lstm" else (1, classes))
  if name != "sent140_lstm":
    assert tokens.masked_targets(apply_flat) == (0, 1, 2, classes - 1)


def shakespeare_files(d):
  """fedjax's Shakespeare files (snippets per speaking role) with a repetitive text."""
  verse = [b"To be, or not to be, that is the question:", b"Whether 'tis nobler in the mind",
           b"to suffer the slings and arrows", b"Or to take arms against a sea of troubles"]
  train = [(f"PLAY_{i}_ROLE".encode(), {"snippets": np.array(verse[i:] + verse[:i], object)})
           for i in range(4)]
  nf.write_fedjax(os.path.join(d, "shakespeare_train.sqlite"), train)
  nf.write_fedjax(os.path.join(d, "shakespeare_test.sqlite"),
                  [(b"TEST", {"snippets": np.array(verse[1:3], object)})])
  return train


ACC_NOTE = "; acc: next-character accuracy (per target token)"  # the run's header line


def test_the_character_lstm_learns_a_shakespeare_file_on_the_round_engine(tmp_path, capsys):
  train = shakespeare_files(str(tmp_path))
  result = fa.simulate(algorithm="fedavg", dataset="fedjax_shakespeare",
                       data_dir=str(tmp_path), rounds=3, participation=1.0,
                       delay_fraction=0, batch_size=2, local_epochs=2, lr=1.0, momentum=0.0)
  out = capsys.readouterr().out
  assert out.count(ACC_NOTE) == 1 and f"{ACC_NOTE}\n" in out, out[-2000:]
  rows = result.runs["fedavg"].rows
  assert result.runs["fedavg"].model[0] == "shakespeare_lstm"
  # each role's snippets joined (BOS + bytes + EOS each), cut into sequences of 80
  sizes = [-(-(sum(len(s) + 2 for s in ex["snippets"]) - 1) // 80) for _, ex in train]
  assert [r["client_steps"] for r in rows] == [2 * sum(-(-n // 2) for n in sizes)] * 3
  train_loss = [r["train_loss"] for r in rows]
  test_loss = [r["test_loss"] for r in rows]
  assert train_loss[0] > train_loss[1] > train_loss[2], train_loss
  assert test_loss[2] < test_loss[0] < np.log(90) + 0.2, test_loss


def test_the_character_lstm_runs_on_the_virtual_clock(tmp_path, capsys):
  shakespeare_files(str(tmp_path))
  result = fa.simulate(algorithm="fedasync", dataset="fedjax_shakespeare",
                       data_dir=str(tmp_path), num_updates=2, concurrency=2, batch_size=2)
  out = capsys.readouterr().out
  assert out.count(ACC_NOTE) == 1 and f"{ACC_NOTE}\n" in out, out[-2000:]
  run = result.runs["fedasync"]
  assert run.model[0] == "shakespeare_lstm" and len(run.rows) >= 1
  assert np.isfinite(run.summary["final_accuracy"])


def test_the_accuracy_kind_is_named_for_sequence_labels_only():
  """``tokens.accuracy_kind``: what the console's ``acc`` is where it is no plain share of
  examples classified right."""
  import types  # pylint: disable=g-import-not-at-top
  data = lambda name, shape: types.SimpleNamespace(name=name, test_y=np.zeros(shape, np.int32))
  assert tokens.accuracy_kind(data("leaf_shakespeare", (4, 80))) == "next-character"
  assert tokens.accuracy_kind(data("tff_stackoverflow", (4, 30))) == "next-word"
  assert tokens.accuracy_kind(data("arrays", (4, 7))) == "next-token"
  assert tokens.accuracy_kind(data("leaf_sent140", (4,))) == ""  # a class per example
  assert tokens.accuracy_note(data("fashion_mnist", (4,))) == ""
  assert tokens.accuracy_note(data("fedjax_shakespeare", (4, 80))) == ACC_NOTE


# ------------------------------------------------- the loss conventions (--token_loss)

def numpy_fedjax_losses(logits, labels, rows):
  """fedjax's reductions of ``metrics.unreduced_cross_entropy_loss`` times ``targets !=
  pad`` (``core/metrics.py``, ``models/shakespeare.py``, ``models/stackoverflow.py``), in
  float64: {setting: value}."""
  z = logits.astype(np.float64)
  zmax = z.max(-1)
  lse = np.log(np.exp(z - zmax[..., None]).sum(-1)) + zmax
  ce = lse - np.take_along_axis(z, labels[..., None], -1)[..., 0]
  w = (labels != 0) & rows[:, None]
  counted = w.any(1)  # SequenceCrossEntropyLoss's weight: jnp.any(target_weight)
  per_seq = (ce * w).sum(1)
  return {"per_token": (ce * w).sum() / w.sum(),  # SequenceTokenCrossEntropyLoss
          "per_sequence": per_seq[counted].mean(),  # SequenceCrossEntropyLoss; SO train_loss
          # Shakespeare's train_loss: jnp.mean(per_token_loss, axis=-1), mean over the batch
          "per_position": np.mean(ce * w, axis=1)[counted].mean()}


def test_each_token_loss_setting_is_fedjaxs_formula():
  logits, labels, rows = hand_batch()
  # a fourth row, real but all PAD: SequenceCrossEntropyLoss gives it no weight
  logits = np.concatenate([logits, logits[:1] * 2.0])
  labels = np.concatenate([labels, np.zeros((1, 4), np.int32)])
  rows = np.concatenate([rows, [True]])
  want = numpy_fedjax_losses(logits, labels, rows)
  assert set(want) == set(tokens.TOKEN_LOSSES)
  from fedjax_async import config as config_lib
  field = config_lib.DataConfig.__dataclass_fields__["token_loss"]
  assert field.metadata["choices"] == tokens.TOKEN_LOSSES and field.default == "per_token"
  test_x = np.repeat(np.array([0, 1, 3])[:, None], 4, 1).astype(np.int32)
  for kind, value in want.items():
    total, count = tokens.loss_sum(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(rows),
                                   kind)
    np.testing.assert_allclose(float(total / count), value, rtol=1e-6, err_msg=kind)
    mean = client_lib.masked_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                           jnp.asarray(rows), kind)
    np.testing.assert_allclose(float(mean), value, rtol=1e-6, err_msg=kind)
    fixed = _Fixed(logits)
    fixed.model = type("model", (), {"masked_targets": SPECIAL, "token_loss": kind})
    _, loss = device.evaluate(fixed, None, jnp.asarray(test_x), jnp.asarray(labels[[0, 1, 3]]),
                              batch=8)  # 2 sequences a batch: 2 batches
    np.testing.assert_allclose(float(loss), value, rtol=1e-6, err_msg=kind)
    # [B] labels (images, LEAF's last-character models): unchanged
    flat = client_lib.masked_cross_entropy(jnp.asarray(logits[:, 0]),
                                           jnp.asarray(labels[:, 0]), jnp.asarray(rows), kind)
    z = logits[rows, 0].astype(np.float64)
    np.testing.assert_allclose(float(flat), np.mean(np.log(np.exp(z).sum(1))
                                                    - z[np.arange(3), labels[rows, 0]]),
                               rtol=1e-6)
  with pytest.raises(ValueError, match="token_loss"):
    fa.simulate(algorithm="fedavg", dataset="synthetic", rounds=1, token_loss="per_word")


PEER_FEDJAX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "peers",
                           "fedjax")


def test_token_loss_reaches_training_and_test_loss_on_both_engines(tmp_path):
  """fedjax's own Shakespeare file (tests/fixtures/peers): run.py (round engine) with
  fedjax Shakespeare's per_position, fa.simulate on the virtual clock with per_sequence;
  lr 1e-30 keeps the model at w0, whose losses numpy reduces as fedjax does."""
  import subprocess
  import sys
  import run_script
  out = str(tmp_path / "out")
  proc = subprocess.Popen(
      [sys.executable, os.path.join(os.path.dirname(PEER_FEDJAX), "..", "..", "..",
                                    "experiments", "run.py"),
       "--algorithm=fedavg", "--dataset=fedjax_shakespeare", f"--data_dir={PEER_FEDJAX}",
       "--rounds=1", "--participation=1.0", "--delay_fraction=0", "--batch_size=8",
       "--local_epochs=1", "--lr=1e-30", "--momentum=0", "--token_loss=per_position",
       f"--output_dir={out}", "--quiet"], env=run_script.env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  try:
    result = fa.simulate(algorithm="fedasync", dataset="fedjax_shakespeare",
                         data_dir=PEER_FEDJAX, num_updates=2, concurrency=2, batch_size=8,
                         local_epochs=1, lr=1e-30, token_loss="per_sequence")
  finally:
    _, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  run = result.runs["fedasync"]
  with np.load(os.path.join(os.path.dirname(PEER_FEDJAX), "expected",
                            "fedjax_shakespeare.npz")) as e:  # fedjax's own arrays
    e = {k: e[k] for k in e.files}
  apply = run.model[2]
  logit = lambda x: np.asarray(apply(run.state.w, jnp.asarray(x)), np.float64)
  kept = e["counts"] > 0
  offsets = np.concatenate([[0], np.cumsum(e["counts"][kept])])
  clients = [numpy_fedjax_losses(logit(e["x"][a:b]), e["y"][a:b], np.ones(b - a, bool))
             for a, b in zip(offsets[:-1], offsets[1:])]
  test = numpy_fedjax_losses(logit(e["test_x"]), e["test_y"], np.ones(len(e["test_y"]), bool))
  # the virtual clock: each task one step on its client's data; the final evaluation
  for row in run.rows:
    np.testing.assert_allclose(row["train_loss"], clients[row["client"]]["per_sequence"],
                               rtol=1e-5)
  np.testing.assert_allclose(run.rows[-1]["test_loss"], test["per_sequence"], rtol=1e-5)
  # run.py: the round's clients' mean (uniform) and the test loss after it
  (row,) = run_script.read_rows(os.path.join(out, "fedavg", "metrics.jsonl"))
  np.testing.assert_allclose(row["train_loss_uniform"],
                             np.mean([c["per_position"] for c in clients]), rtol=1e-5)
  np.testing.assert_allclose(row["test_loss"], test["per_position"], rtol=1e-5)
  # fedjax's Shakespeare test split here is 92% non-PAD targets (fedjax's whole one: the
  # 0.92x of per_position against per_token); the two differ by the rows' fill
  fill = (e["test_y"] != 0).mean(1)
  assert 0.9 < fill.mean() < 0.93 and test["per_position"] < test["per_token"]
