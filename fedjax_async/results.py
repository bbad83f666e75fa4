"""What every engine's ``Result`` gives besides its runs: their rows and summaries as
plain records (one dict per row, scalar values only), a pandas DataFrame of them, and the
summaries' accuracy metrics in one shape."""

from __future__ import annotations

from typing import Dict, List

import numpy as np


class Records:
  """Mixed into a ``Result`` whose ``all_runs()`` maps a run's name to an object with
  ``summary`` and ``rows``."""

  def all_runs(self) -> Dict[str, object]:
    raise NotImplementedError

  def to_records(self) -> List[dict]:
    """One dict per row of every run: ``run`` (its name), ``algorithm``, then the row's
    scalar values (per-arrival arrays left out)."""
    out = []
    for name, run in self.all_runs().items():
      algorithm = run.summary.get("algorithm", name)
      for row in run.rows:
        rec = {"run": name, "algorithm": algorithm}
        rec.update({k: (v.item() if isinstance(v, np.generic) else v)
                    for k, v in row.items() if np.ndim(v) == 0})
        out.append(rec)
    return out

  def summary_records(self) -> List[dict]:
    """One dict per run: its name and the summary's scalar values (``final_accuracy``,
    ``last10_mean_accuracy``, ``average_best_accuracy``, ...)."""
    return [{"run": name, **{k: v for k, v in run.summary.items()
                             if isinstance(v, (int, float, str, bool)) or v is None}}
            for name, run in self.all_runs().items()]

  def to_pandas(self, summaries: bool = False):
    """``to_records()`` (or ``summary_records()``) as a pandas DataFrame (pandas is not a
    dependency: ImportError saying how to install it)."""
    try:
      import pandas as pd  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("to_pandas needs pandas: pip install pandas (to_records() gives "
                        "the same rows as dicts)") from e
    return pd.DataFrame(self.summary_records() if summaries else self.to_records())
