"""The round engine: clients sampled per round, delayed ones arriving rounds later.

``engine`` runs the rounds drawn by ``core.timeline`` (ring buffer of past models, one
vmap of the round's clients, rounds fused in a ``lax.scan``); ``host_server`` runs them
around a server step on the host (the CKKS server); ``experiment`` drives one algorithm's run on the host
(``loop.py``'s checkpoints, metrics and signals, divergence, progress).
"""
