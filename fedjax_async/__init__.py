"""fedjax_async: a vectorised JAX/Flax simulator of privacy-preserving asynchronous FL."""

__version__ = "0.1.0"
