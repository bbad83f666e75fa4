"""``python -m fedjax_async.cli.data ...``: one data set's partition, its label histogram
per client printed (``--png``: drawn); ``commands.data_main``."""

from fedjax_async.cli import commands

if __name__ == "__main__":
  commands.data_main()
