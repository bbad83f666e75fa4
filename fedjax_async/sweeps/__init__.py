"""Vmapped sweeps: a grid of hyperparameters and seeds run as stacked runs of one compiled
program (``sweep``), their files, the stored runs read back and a computation's
checkpoints (``store``).
"""
