"""Token ids of the text data sets, as fedjax and LEAF make them (reserved ids: PAD 0,
BOS 1, EOS 2; ``core.tokens``).

* Shakespeare (fedjax ``datasets/shakespeare.py``, for fedjax's and TFF's files): every
  byte of a snippet maps through a fixed 86-character vocabulary to 3 + its position (a
  byte listed twice: its last position), any other byte to OOV = 89; 90 ids. A client's
  snippets are joined, each as BOS + bytes + EOS, and cut into input / target pairs of
  ``sequence_length`` (80) tokens, the target the input shifted by one, the last pair
  padded with PAD (:func:`shakespeare_sequences`).
* Stack Overflow (fedjax ``StackoverflowTokenizer``, TFF ``load_word_counts``): the
  vocabulary is the first ``vocab_size`` (10,000) words of ``stackoverflow.word_count``
  (``word count`` per line, most frequent first); a sentence's ``tokens`` split on ' ',
  word j -> 3 + j, other words -> OOV = 3 + len(vocab) (one OOV bucket); BOS + ids + EOS,
  input = all but the last, target = all but the first, each padded with PAD or cut to
  ``max_length``: 20 for training, 30 for the test set (fedjax ``stackoverflow.load_data``:
  ``train_max_length, eval_max_length = 20, 30``); ``len(vocab) + 4`` ids
  (:class:`WordTokenizer`).
* LEAF Shakespeare (``models/utils/language_utils.py``): an 80-character string ->
  the positions of its characters in ``ALL_LETTERS`` (an unknown character: 80, an id of
  its own here; LEAF's -1), the next character -> its position (unknown: 79, where LEAF's
  one-hot of -1 puts it).
* LEAF Sent140: ``split_line``'s words of the tweet (``x[4]``), the first 25 as vocabulary
  ids, unknown words and the padding to 25 as ``len(vocab)`` (``line_to_indices``).
"""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

PAD, BOS, EOS = 0, 1, 2
RESERVED = 3

# fedjax datasets/shakespeare.py: the vocabulary of TFF's text generation tutorial
SHAKESPEARE_VOCAB = (b'dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\n'
                     b'aeimquyAEIMQUY]!%)-159\r')
SHAKESPEARE_SEQUENCE_LENGTH = 80
STACKOVERFLOW_VOCAB_SIZE = 10_000
STACKOVERFLOW_MAX_LENGTH = 20  # training sequences (fedjax's train_max_length)
STACKOVERFLOW_EVAL_MAX_LENGTH = 30  # test sequences (fedjax's eval_max_length)
STACKOVERFLOW_WORD_COUNT = "stackoverflow.word_count"


def _shakespeare_table() -> Tuple[np.ndarray, int]:
  oov = RESERVED + len(SHAKESPEARE_VOCAB)
  table = np.full(256, oov, np.int32)
  for position, byte in enumerate(SHAKESPEARE_VOCAB):
    table[byte] = RESERVED + position  # later positions overwrite earlier ones
  return table, oov + 1


SHAKESPEARE_TABLE, SHAKESPEARE_NUM_CLASSES = _shakespeare_table()  # 90 ids, OOV 89


def shakespeare_sequences(snippets: Iterable[bytes],
                          sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH
                          ) -> Tuple[np.ndarray, np.ndarray]:
  """(x, y) int32 [m, sequence_length] of a client's snippets (module docstring)."""
  pieces = []
  for snippet in snippets:
    raw = np.frombuffer(bytes(snippet), np.uint8)
    pieces.append(np.concatenate([[BOS], SHAKESPEARE_TABLE[raw], [EOS]]).astype(np.int32))
  joined = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  n = max(len(joined) - 1, 0)  # pairs (input, next token)
  m = -(-n // sequence_length)
  x = np.zeros(m * sequence_length, np.int32)
  y = np.zeros(m * sequence_length, np.int32)
  x[:n], y[:n] = joined[:-1], joined[1:]
  return x.reshape(m, sequence_length), y.reshape(m, sequence_length)


def shakespeare_count(snippets: Iterable[bytes],
                      sequence_length: int = SHAKESPEARE_SEQUENCE_LENGTH) -> int:
  """The number of sequences ``shakespeare_sequences`` makes of ``snippets``."""
  total = sum(len(s) + 2 for s in snippets)
  return -(-max(total - 1, 0) // sequence_length)


def read_vocabulary(data_dir: str, vocab_size: int = STACKOVERFLOW_VOCAB_SIZE,
                    name: str = STACKOVERFLOW_WORD_COUNT) -> List[str]:
  """The first ``vocab_size`` words of ``data_dir/stackoverflow.word_count``."""
  path = os.path.join(data_dir, name)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path}: no such file; Stack Overflow's vocabulary is TFF's {name} (in "
        "https://storage.googleapis.com/tff-datasets-public/stackoverflow.word_count.tar.bz2"
        f", or fedjax's gs://gresearch/fedjax/stackoverflow/{name}): put it in data.data_dir")
  words = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if len(words) >= vocab_size:
        break
      parts = line.split()
      if len(parts) != 2:
        raise ValueError(f"{path}:{number}: expected 'word count', got {line.strip()!r}")
      words.append(parts[0])
  if not words:
    raise ValueError(f"{path}: no words")
  return words


class WordTokenizer:
  """Stack Overflow's word ids (module docstring)."""

  def __init__(self, vocab: Sequence[str], max_length: int = STACKOVERFLOW_MAX_LENGTH):
    self.ids: Dict[str, int] = {}
    for j, word in enumerate(vocab):
      self.ids.setdefault(word, RESERVED + j)  # (TF's table keeps a word's first id)
    self.oov = RESERVED + len(vocab)
    self.num_classes = self.oov + 1
    self.max_length = int(max_length)

  def __call__(self, sentences: Iterable) -> Tuple[np.ndarray, np.ndarray]:
    """(x, y) int32 [n, max_length] of ``sentences`` (bytes or str)."""
    sentences = list(sentences)
    length = self.max_length
    x = np.zeros((len(sentences), length), np.int32)
    y = np.zeros((len(sentences), length), np.int32)
    for i, s in enumerate(sentences):
      text = s.decode("utf-8") if isinstance(s, bytes) else str(s)
      ids = [BOS] + [self.ids.get(w, self.oov) for w in text.split(" ")] + [EOS]
      seq_x, seq_y = ids[:-1][:length], ids[1:][:length]
      x[i, :len(seq_x)], y[i, :len(seq_y)] = seq_x, seq_y
    return x, y


# LEAF models/utils/language_utils.py
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_LEAF_INDEX = {c: i for i, c in enumerate(LEAF_LETTERS)}


def leaf_shakespeare(x: Sequence[str], y: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
  """(x int32 [n, len], y int32 [n]) of LEAF Shakespeare's strings (module docstring)."""
  unknown = len(LEAF_LETTERS)
  xs = np.array([[_LEAF_INDEX.get(c, unknown) for c in s] for s in x], np.int32)
  ys = np.array([_LEAF_INDEX.get(c, unknown - 1) for c in y], np.int32)
  return xs.reshape(len(x), -1), ys


SENT140_MAX_WORDS = 25
_WORDS = re.compile(r"[\w']+|[.,!?;]")


def sent140_words(line: str) -> List[str]:
  return _WORDS.findall(line)


def sent140_vocabulary(texts: Iterable[str], embeddings: Optional[str] = None) -> List[str]:
  """``embeddings``' (LEAF's ``embs.json``) vocabulary when given, else the training
  texts' words, most frequent first (ties by word)."""
  if embeddings is not None:
    with open(embeddings, encoding="utf-8") as f:
      return list(json.load(f)["vocab"])
  counts = collections.Counter(w for t in texts for w in sent140_words(t))
  return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def sent140_ids(texts: Iterable[str], vocab: Sequence[str],
                max_words: int = SENT140_MAX_WORDS) -> np.ndarray:
  """int32 [n, max_words]: ``line_to_indices`` of every text."""
  index = {w: i for i, w in enumerate(vocab)}
  unknown = len(vocab)
  rows = []
  for t in texts:
    ids = [index.get(w, unknown) for w in sent140_words(t)[:max_words]]
    rows.append(ids + [unknown] * (max_words - len(ids)))
  return np.array(rows, np.int32).reshape(-1, max_words)
