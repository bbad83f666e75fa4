"""The checks a natural data set's files get when loaded, before any training: a damaged,
truncated or wrong file is refused with one ValueError line naming the file and the fix.

* SQLite files (fedjax's, TFF's): the 100-byte header (``SQLite format 3``; else what the
  file looks like: LZMA / xz / gzip / bzip2 still compressed, JSON, an HTML page), the file
  size against the header's page count (a truncated download), SQLite's
  ``PRAGMA quick_check`` (b-tree pages, cells, freelist) for files up to
  :data:`QUICK_CHECK_MAX_BYTES`, then the format's own decode of every client
  (``fedjax_sqlite.check_file``, ``tff_sqlite.check_file``);
* JSON files (LEAF's): parsed whole when read (``leaf.read_split``).

A file that passed is not checked again in the same process while its size and
modification time stay the same (:func:`checked_once`).
"""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
from typing import Callable, Dict, Tuple

# quick_check reads every page; above this size (a 50 GB Stack Overflow file) only the
# header, the size and the per-client decode are checked at load, every client read still
# checks its own examples.
QUICK_CHECK_MAX_BYTES = 8 << 30

SQLITE_MAGIC = b"SQLite format 3\x00"
_MAGICS = ((b"\xfd7zXZ\x00", "xz-compressed (decompress it: xz -dk FILE)"),
           (b"\x5d\x00\x00", "LZMA-compressed (decompress it: xz -dk FILE, or unxz)"),
           (b"\x1f\x8b", "gzip-compressed (decompress it: gunzip -k FILE)"),
           (b"BZh", "bzip2-compressed (decompress it: bunzip2 -k FILE)"),
           (b"PK\x03\x04", "a zip archive (unzip it)"),
           (SQLITE_MAGIC, "a SQLite database"))

_checked: Dict[Tuple[str, int, int, str], bool] = {}
_lock = threading.Lock()


class DamagedFile(ValueError):
  """A file that is not what its data set reads (one line: the file, what, the fix)."""


def looks_like(head: bytes) -> str:
  """What a file beginning with ``head`` looks like, for messages."""
  for magic, what in _MAGICS:
    if head.startswith(magic):
      return what
  stripped = head.lstrip()
  if stripped[:1] in (b"{", b"["):
    return "JSON text"
  if stripped[:1] == b"<":
    return "an HTML / XML page (an error page saved by a download?)"
  if not head:
    return "empty"
  return "not a SQLite database"


def sqlite_file(path: str, fix: str) -> None:
  """The header, size and ``quick_check`` of the SQLite file ``path``; DamagedFile naming
  it with ``fix`` (what to do: re-download, decompress)."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(100)
  if not head.startswith(SQLITE_MAGIC):
    what = looks_like(head)
    raise DamagedFile(f"{path}: not a SQLite file ({what}); {fix}")
  if len(head) < 100:
    raise DamagedFile(f"{path}: truncated ({size} bytes, less than a SQLite header); {fix}")
  page_size = struct.unpack(">H", head[16:18])[0]
  page_size = 65536 if page_size == 1 else page_size
  change, pages, valid_for = struct.unpack(">I", head[24:28])[0], struct.unpack(
      ">I", head[28:32])[0], struct.unpack(">I", head[92:96])[0]
  if page_size < 512 or page_size & (page_size - 1):
    raise DamagedFile(f"{path}: damaged (its SQLite header says page size {page_size}); "
                      f"{fix}")
  if pages and change == valid_for and size < pages * page_size:
    raise DamagedFile(f"{path}: truncated: {size} bytes, its SQLite header says "
                      f"{pages * page_size} ({pages} pages of {page_size}); {fix}")
  if size % page_size:
    raise DamagedFile(f"{path}: truncated: {size} bytes, not a whole number of "
                      f"{page_size}-byte SQLite pages; {fix}")
  if size > QUICK_CHECK_MAX_BYTES:
    return
  try:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
      rows = con.execute("PRAGMA quick_check(1)").fetchall()
    finally:
      con.close()
  except sqlite3.DatabaseError as e:
    raise DamagedFile(f"{path}: damaged (SQLite: {e}); {fix}") from None
  if rows != [("ok",)]:
    first = " ".join(str(rows[0][0]).replace("*** in database main ***", "").split()
                     ) if rows else "no answer"
    raise DamagedFile(f"{path}: damaged (SQLite quick_check: {first}); {fix}")


def checked_once(path: str, kind: str, check: Callable[[], None]) -> None:
  """``check()`` unless ``path`` (same size and mtime) passed it for ``kind`` already."""
  st = os.stat(path)
  key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, kind)
  with _lock:
    if key in _checked:
      return
  check()
  with _lock:
    _checked[key] = True


def database_error(path: str, e: Exception, fix: str) -> DamagedFile:
  """The DamagedFile of a ``sqlite3.DatabaseError`` met while reading ``path``."""
  return DamagedFile(f"{path}: damaged (SQLite: {' '.join(str(e).split())}); {fix}")
