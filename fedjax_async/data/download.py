"""``python -m fedjax_async.cli.data download NAME [--data_dir=DIR] [--mirror=URL]
[--sha256=HEX]``: the files a natural data set reads, fetched from where its peer publishes
them, into ``data_dir`` (default ``~/.cache/fedjax``, where fedjax keeps them).

* resumable: a file is fetched into ``FILE.partial`` and continued from its size (an HTTP
  ``Range`` request) when the command is run again; renamed once whole;
* checked: the size against the server's ``Content-Length``, the SHA-256 where the peer
  publishes one (:data:`SOURCES`; ``--sha256`` gives one for a single-file set), then the
  file's load-time check (``integrity``); a mismatch removes the file and says so;
* ``.lzma`` (TFF's) decompressed next to it, ``.tar.bz2`` (TFF's word count) unpacked;
* a progress bar on stderr.

The URLs and checksums are the peers' own, taken from their source: fedjax
``datasets/{emnist,shakespeare,stackoverflow,cifar100}.py`` (``storage.googleapis.com/
gresearch/fedjax/...``; fedjax publishes a checksum only for TFF's ``cifar100.sqlite.lzma``,
``_TFF_SQLITE_COMPRESSED_HEXDIGEST``), TFF ``simulation/datasets/*.py``
(``storage.googleapis.com/tff-datasets-public/NAME.sqlite.lzma``; TFF checks no checksum).
LEAF publishes no prepared files (its ``preprocess.sh`` downloads and builds them).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Tuple

from fedjax_async import console
from fedjax_async.data import loader

FEDJAX = "https://storage.googleapis.com/gresearch/fedjax"
TFF = "https://storage.googleapis.com/tff-datasets-public"
WORD_COUNT = f"{TFF}/stackoverflow.word_count.tar.bz2"

# fedjax datasets/cifar100.py: _TFF_SQLITE_COMPRESSED_HEXDIGEST, _NUM_BYTES
CHECKSUMS: Dict[str, Tuple[str, int]] = {
    f"{TFF}/cifar100.sqlite.lzma": (
        "23d3916c9caa33395737ee560cc7cb77bbd05fc7b73647ee7be3a7e764172939", 153019920),
}


def _fedjax(stem: str, folder: str) -> List[str]:
  return [f"{FEDJAX}/{folder}/{stem}_{split}.sqlite" for split in ("train", "test")]


# name -> the URLs of its files
SOURCES: Dict[str, List[str]] = {
    "fedjax_emnist": _fedjax("federated_emnist", "emnist"),
    "fedjax_emnist_digits": _fedjax("federated_emnist_digitsonly", "emnist"),
    "fedjax_shakespeare": _fedjax("shakespeare", "shakespeare"),
    "fedjax_stackoverflow": _fedjax("stackoverflow", "stackoverflow")
                            + [f"{FEDJAX}/stackoverflow/stackoverflow.word_count"],
    "tff_emnist": [f"{TFF}/emnist_all.sqlite.lzma"],
    "tff_emnist_digits": [f"{TFF}/emnist_all.sqlite.lzma"],
    "tff_shakespeare": [f"{TFF}/shakespeare.sqlite.lzma"],
    "tff_stackoverflow": [f"{TFF}/stackoverflow.sqlite.lzma", WORD_COUNT],
    "tff_cifar100": [f"{TFF}/cifar100.sqlite.lzma"],
}
NOT_PUBLISHED = {
    "fedjax_cifar100": "fedjax builds federated_cifar100_{train,test}.sqlite from TFF's "
                       "cifar100.sqlite.lzma on the first load (fedjax.datasets.cifar100."
                       "load_data); download tff_cifar100 (the same clients) and read it as "
                       "--dataset=tff_cifar100, or let fedjax build them",
}
LEAF_HOW = ("LEAF publishes no prepared files: run leaf/data/{short}/preprocess.sh (its "
            "README's flags), then --data_dir=leaf/data/{short}/data")
DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "fedjax")


class DownloadError(RuntimeError):
  """One line: the URL or file and what went wrong."""


def _bar(done: int, total: int, start: float, name: str) -> None:
  width = 30
  frac = done / total if total else 0.0
  rate = done / max(time.time() - start, 1e-6)
  fill = int(frac * width)
  console.err(f"\r{name} [{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% "
              f"{done / 2 ** 20:.1f}/{total / 2 ** 20:.1f} MiB {rate / 2 ** 20:.1f} MiB/s", end="")


def fetch(url: str, path: str, sha256: Optional[str] = None, size: Optional[int] = None,
          timeout: float = 60.0, chunk: int = 1 << 16) -> str:
  """``url`` into ``path`` (resumed from ``path.partial``), checked; returns ``path``.

  Args:
    url: the file's URL.
    path: where to write it.
    sha256: its published SHA-256 (None: unchecked).
    size: its published size in bytes (None: unchecked).
    timeout: the connection's timeout, seconds.
    chunk: the bytes read at a time.
  """
  if os.path.isfile(path):
    console.err(f"{path}: already there")
    return path
  partial = path + ".partial"
  have = os.path.getsize(partial) if os.path.isfile(partial) else 0
  request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
  try:
    response = urllib.request.urlopen(request, timeout=timeout)
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:  # the partial file is already whole
      response = None
    else:
      raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    raise DownloadError(f"{url}: cannot connect ({getattr(e, 'reason', e)}); is there a "
                        "network? (--mirror=URL fetches the same file names from "
                        "elsewhere)") from None
  if response is not None:
    with response:
      resumed = response.status == 206
      if not resumed:
        have = 0
      length = response.headers.get("Content-Length")
      total = have + int(length) if length is not None else (size or 0)
      if have:
        console.err(f"{path}: resuming at {have} bytes")
      start = time.time()
      done = have
      try:
        with open(partial, "ab" if resumed else "wb") as f:
          while True:
            block = response.read(chunk)
            if not block:
              break
            f.write(block)
            done += len(block)
            _bar(done, total, start, os.path.basename(path))
      except OSError as e:
        console.err()
        raise DownloadError(f"{url}: interrupted at {done} bytes ({e}); run the command "
                            f"again to resume ({partial})") from None
      console.err()
      if total and done < total:
        raise DownloadError(f"{url}: interrupted at {done} of {total} bytes; run the command "
                            f"again to resume ({partial})")
  got = os.path.getsize(partial)
  if size is not None and got != size and not sha256:
    os.remove(partial)
    raise DownloadError(f"{path}: {got} bytes, the published size is {size}: removed; "
                        "run the command again")
  if sha256:
    digest = hashlib.sha256()
    with open(partial, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    if digest.hexdigest() != sha256.lower():
      os.remove(partial)
      sizes = f" ({got} bytes, published {size})" if size is not None else ""
      raise DownloadError(f"{path}: SHA-256 {digest.hexdigest()}{sizes}, the published one "
                          f"is {sha256.lower()}: checksum mismatch, removed; run the command "
                          "again (or check --mirror)")
  os.replace(partial, path)
  return path


def unpack(path: str) -> str:
  """``FILE.lzma`` -> ``FILE``, ``X.tar.bz2`` -> its members next to it; the file to use."""
  if path.endswith(".lzma"):
    out = path[:-len(".lzma")]
    if not os.path.isfile(out):
      console.err(f"decompressing {path}")
      try:
        with lzma.open(path, "rb") as fi, open(out + ".partial", "wb") as fo:
          shutil.copyfileobj(fi, fo, 1 << 20)
      except (lzma.LZMAError, EOFError) as e:
        os.remove(out + ".partial")
        raise DownloadError(f"{path}: not whole LZMA data ({e}): delete it and run the "
                            "command again") from None
      os.replace(out + ".partial", out)
    return out
  if path.endswith(".tar.bz2"):
    folder = os.path.dirname(path)
    try:
      with tarfile.open(path, "r:bz2") as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        for m in tar.getmembers():
          if m.isfile() and not os.path.isfile(os.path.join(folder, os.path.basename(m.name))):
            with tar.extractfile(m) as fi, open(os.path.join(folder, os.path.basename(m.name)),
                                                "wb") as fo:
              shutil.copyfileobj(fi, fo)
    except (tarfile.TarError, OSError, EOFError) as e:
      raise DownloadError(f"{path}: not a whole .tar.bz2 ({e}): delete it and run the "
                          "command again") from None
    return os.path.join(folder, os.path.basename(names[0])) if names else path
  return path


def download(name: str, data_dir: Optional[str] = None, mirror: Optional[str] = None,
             sha256: Optional[str] = None, check: bool = True) -> List[str]:
  """The files of data set ``name`` in ``data_dir`` (module docstring); returns their
  paths. ``mirror``: a URL prefix the files' names are fetched under instead.

  Args:
    name: the data set (``SOURCES``).
    data_dir: where the files go (None: ``DEFAULT_DIR``).
    mirror: a URL prefix to fetch the files' names under.
    sha256: the checksum of a single-file data set (overrides the published one).
    check: load the data set once downloaded.
  """
  if name.startswith("leaf_") and name in loader.NATURAL_DATASETS:
    raise DownloadError(f"{name}: " + LEAF_HOW.format(short=name[len("leaf_"):]))
  if name in NOT_PUBLISHED:
    raise DownloadError(f"{name}: {NOT_PUBLISHED[name]}")
  if name not in SOURCES:
    raise DownloadError(f"{name}: no published files to download; choose from "
                        f"{sorted(SOURCES)} (LEAF's: run its preprocess.sh)")
  urls = SOURCES[name]
  if sha256 and len(urls) != 1:
    raise DownloadError(f"--sha256: {name} has {len(urls)} files; give a checksum only for "
                        "a single-file data set")
  data_dir = data_dir or DEFAULT_DIR
  os.makedirs(data_dir, exist_ok=True)
  out = []
  for url in urls:
    base = os.path.basename(url)
    source = f"{mirror.rstrip('/')}/{base}" if mirror else url
    digest, size = CHECKSUMS.get(url, (None, None))
    if sha256:
      digest, size = sha256, None
    if digest is None:
      console.err(f"{base}: no checksum published by the peer; checked by its size and, once "
                  "there, by the data set's load-time check")
    path = fetch(source, os.path.join(data_dir, base), digest, size)
    out.append(unpack(path))
  if check:
    try:
      loader.load_natural(name, data_dir, max_test_examples=1)
    except (ValueError, OSError) as e:
      raise DownloadError(f"downloaded, but {e}") from None
    console.err(f"{name}: ready in {data_dir} (--dataset={name} --data_dir={data_dir})")
  return out


def main(argv: List[str]) -> int:
  """``download NAME [--data_dir=DIR] [--mirror=URL] [--sha256=HEX] [--no_check]``."""
  args = [a for a in argv if not a.startswith("--")]
  opts = {}
  for a in argv:
    if a.startswith("--"):
      key, _, value = a[2:].partition("=")
      opts[key] = value
  unknown = set(opts) - {"data_dir", "mirror", "sha256", "no_check"}
  if unknown or len(args) != 1:
    what = f"unknown flag --{sorted(unknown)[0]}" if unknown else "expected one data set name"
    console.err(f"error: download: {what}; usage: python -m fedjax_async.cli.data download NAME "
                "[--data_dir=DIR] [--mirror=URL] [--sha256=HEX] [--no_check] (NAME one of "
                f"{', '.join(sorted(SOURCES))})")
    return 1
  try:
    download(args[0], opts.get("data_dir") or None, opts.get("mirror") or None,
             opts.get("sha256") or None, check="no_check" not in opts)
  except (DownloadError, OSError) as e:
    console.err(f"error: {e}")
    return 1
  return 0
