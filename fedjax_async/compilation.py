"""JAX's persistent compilation cache, on by default: a second process running the same
shapes loads its compiled programs from disk instead of compiling them.

The cache lives in ``$FEDJAX_ASYNC_COMPILATION_CACHE`` (default
``~/.cache/fedjax_async/jax``); ``FEDJAX_ASYNC_COMPILATION_CACHE=0`` turns it off, and a
``jax_compilation_cache_dir`` set by the caller is left as it is.
"""

from __future__ import annotations

import os

import jax

ENV = "FEDJAX_ASYNC_COMPILATION_CACHE"


def cache_dir() -> str:
  """Where the cache lives ("" when turned off)."""
  value = os.environ.get(ENV, "")
  if value == "0":
    return ""
  return value or os.path.join(os.path.expanduser("~"), ".cache", "fedjax_async", "jax")


def enable() -> str:
  """Turns the persistent cache on (once per process); returns its directory, or "" when
  turned off or when the caller chose one already."""
  directory = cache_dir()
  if not directory or jax.config.jax_compilation_cache_dir:
    return ""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError:  # a read-only home: run without the cache
    return ""
  jax.config.update("jax_compilation_cache_dir", directory)
  # Programs that compile in under a second are not worth a disk round trip.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  return directory
