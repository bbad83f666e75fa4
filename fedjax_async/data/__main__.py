"""``python -m fedjax_async.data ...``: the data command (``cli.data_main``)."""

from fedjax_async import cli

cli.data_main()
