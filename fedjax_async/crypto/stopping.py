"""A stop asked for during a CKKS round, answered between two chunks.

Within ``interrupts.graceful()`` (a run that checkpoints) the first Ctrl-C / SIGTERM is
only recorded, for the driver to stop at its next round boundary; a CKKS round of a large
model takes minutes, so its chunk loops (client encryption, S0's products, Alg. 5's
encryptions per chunk and recipient) call ``between_chunks``, which raises that signal's
``Interrupted`` at once. The round in progress is then discarded
(``rounds.host_server.run_host_rounds`` saves the rounds before it).
"""

from __future__ import annotations

from fedjax_async import interrupts


def between_chunks():
  """``interrupts.Interrupted`` if a signal was recorded and not raised yet."""
  interrupts.check_interrupted()
