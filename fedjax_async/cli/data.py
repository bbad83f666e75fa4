"""``python -m fedjax_async.cli.data ...``: one data set's partition, its label histogram
per client printed (``--png``: drawn); ``commands.data_main``.

``python -m fedjax_async.cli.data download NAME [--data_dir=DIR] [--mirror=URL]
[--sha256=HEX]``: a natural data set's published files, fetched and checked
(``data.download``).

``python -m fedjax_async.cli.data describe NAME=DIR [NAME=DIR ...] [--npz=FOLDER]``:
several natural data sets loaded in one process, a line each (clients, examples, test
size); ``--npz``: each one's arrays written to FOLDER/NAME.npz (``ids``, ``counts``, the
clients' examples concatenated as ``x``, ``y``, and ``test_x``, ``test_y``)."""

import os
import sys
import traceback

import numpy as np

from fedjax_async import data
from fedjax_async.cli import commands
from fedjax_async.cli import errors
from fedjax_async.data import download, natural


def describe_main(argv) -> int:
  """``describe``: 0 when every NAME=DIR loaded, else 1 (an ``error:`` or ``internal
  error:`` line each, ``cli.errors``)."""
  npz, pairs = None, []
  for a in argv:
    if a.startswith("--npz="):
      npz = a.split("=", 1)[1]
    elif a.startswith("-") or "=" not in a:
      print(f"error: describe: {a!r}: expected NAME=DIR (e.g. tff_emnist=~/data) or "
            "--npz=FOLDER", file=sys.stderr)
      return 1
    else:
      pairs.append(tuple(a.split("=", 1)))
  if not pairs:
    print("error: describe: no NAME=DIR given", file=sys.stderr)
    return 1
  if npz and not os.path.isdir(npz):
    print(f"error: --npz: folder {npz} does not exist", file=sys.stderr)
    return 1
  failed = 0
  for name, folder in pairs:
    try:
      fed = data.load(name, data_dir=os.path.expanduser(folder))
    except Exception as e:  # pylint: disable=broad-except
      if errors.wants_traceback():
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
      # error: naming the file or the flag; else internal error: (cli.errors)
      print(errors.message(e).replace("error: ", f"error: {name}: ", 1), file=sys.stderr)
      failed += 1
      continue
    print(f"{fed.name}: {fed.num_clients} clients, {int(fed.counts.sum())} train "
          f"examples (max {fed.max_examples} per client), {len(fed.test_y)} test, "
          f"features {fed.feature_shape}, {fed.num_classes} classes", flush=True)
    if npz:
      x, y = natural.padded_rows(fed, range(fed.num_clients))
      real = np.arange(x.shape[1])[None, :] < np.asarray(fed.counts)[:, None]
      np.savez(os.path.join(npz, name + ".npz"), ids=np.array(natural.client_ids(fed)),
               counts=np.asarray(fed.counts), x=x[real], y=y[real],
               test_x=np.asarray(fed.test_x), test_y=np.asarray(fed.test_y))
  return 1 if failed else 0


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "download":
    sys.exit(download.main(sys.argv[2:]))
  if len(sys.argv) > 1 and sys.argv[1] == "describe":
    sys.exit(describe_main(sys.argv[2:]))
  commands.data_main()
