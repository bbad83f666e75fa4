"""The round engine: clients sampled per round, delayed ones arriving rounds later.

``timeline`` draws who is sampled, delayed and when each update arrives (before the run);
``engine`` runs the rounds (ring buffer of past models, one vmap of the round's clients,
rounds fused in a ``lax.scan``); ``experiment`` drives one algorithm's run on the host
(``loop.py``'s checkpoints, metrics and signals, divergence, progress).
"""
