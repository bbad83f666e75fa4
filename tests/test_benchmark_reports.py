"""The committed benchmark reports rebuilt from the stored rows: each
``benchmarks/results/logs/<folder>/report.md`` equals what ``run_all.report_text`` (the
tables of ``benchmarks/report.py``) makes of its suite run's rows, as
``benchmarks/results/logs/reports.json`` says where they are: ``tag``, the rows of the
top-level ``benchmarks/results/*.jsonl`` with that tag, or with ``"rows": "logs.jsonl"``
the folder's own ``*.jsonl`` packed in ``logs/logs.jsonl``; for a device suite also
``device`` and its ``steps`` (part, result, seconds, log: ``run_all.summary``), and
``table_v``, the computations of its Table V rows in
``experiments/results/pafed_table_paper/rows.jsonl``."""

import json
import os
import shutil

import pytest

from benchmarks import report
from benchmarks import run_all
from fedjax_async import results_table
import run_script

pytestmark = pytest.mark.benchmarks  # benchmarks/report.py, run_all.py
LOGS = os.path.join(run_script.ROOT, "benchmarks", "results", "logs")
with open(os.path.join(LOGS, "reports.json")) as _f:
  REPORTS = json.load(_f)


def text(path):
  with open(path) as f:
    return f.read()


def table_v_markdown(computations) -> str:
  """``table_v.py``'s table of the Table V rows of these computations."""
  from benchmarks import table_v  # pylint: disable=g-import-not-at-top
  import test_results_tables  # pylint: disable=g-import-not-at-top
  test_results_tables.pafed_table()  # (the module table_v imports, loaded once)
  rows = [r for r in table_v.read_rows(table_v.ROWS) if r["computation_id"] in computations]
  assert rows, computations
  return table_v.table_markdown(rows, table_v.all_runs(list(table_v.FLAGFILES), {}))


def stored_rows(folder, spec, tmp) -> list:
  if spec.get("rows") == results_table.LOGS:  # the folder's rows files, packed
    shutil.copy(os.path.join(LOGS, results_table.LOGS), tmp)
    assert results_table.unpack(str(tmp), under=folder, name=results_table.LOGS)
    rows = report.load(os.path.join(str(tmp), folder))
  else:
    rows = report.load(os.path.dirname(LOGS))
  return report.select(rows, tag=spec["tag"])


def rebuilt(folder, tmp, spec=None) -> str:
  spec = spec or REPORTS[folder]
  rows = stored_rows(folder, spec, tmp)
  assert rows, folder
  table_v_md = table_v_markdown(spec["table_v"]) if spec.get("table_v") else ""
  return run_all.report_text(rows, spec["tag"], spec.get("device"),
                             [tuple(s) for s in spec.get("steps", ())], table_v_md)


@pytest.mark.parametrize("folder", sorted(REPORTS))
def test_each_benchmark_report_is_rebuilt_from_its_stored_rows(folder, tmp_path):
  assert rebuilt(folder, tmp_path) == text(os.path.join(LOGS, folder, "report.md"))


def test_every_report_is_checked_and_a_changed_number_is_seen(tmp_path, monkeypatch):
  found = sorted(d for d in os.listdir(LOGS) if os.path.isfile(os.path.join(LOGS, d,
                                                                            "report.md")))
  assert found == sorted(REPORTS) and len(found) == 6
  committed = text(os.path.join(LOGS, "epyc512_run_all", "report.md"))
  load = report.load

  def planted(results_dir):  # one stored number changed
    rows = load(results_dir)
    for r in rows:
      if r.get("tag") == "epyc512_run_all" and r["bench"] == "throughput":
        r["engine_steps_per_s"] *= 1.01
        break
    return rows

  monkeypatch.setattr(report, "load", planted)
  assert rebuilt("epyc512_run_all", tmp_path) != committed


def _profiles():
  return sorted(d for d in os.listdir(LOGS)
                if os.path.isfile(os.path.join(LOGS, d, "paper_shapes_profile.md")))


@pytest.mark.parametrize("folder", _profiles())
def test_each_profile_summary_is_rebuilt_from_its_stored_rows(folder):
  """``paper_shapes_profile.md``: ``profile_summary.format_file`` of the rows beside it
  (each op's device time and count; the shares recomputed from them), and a changed time
  is seen."""
  from benchmarks import profile_summary  # pylint: disable=g-import-not-at-top
  with open(os.path.join(LOGS, folder, "paper_shapes_profile.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  assert profile_summary.format_file(rows) == text(os.path.join(LOGS, folder,
                                                                "paper_shapes_profile.md"))
  rows[0]["by_name"][0][1] *= 1.01
  assert profile_summary.format_file(rows) != text(os.path.join(LOGS, folder,
                                                                "paper_shapes_profile.md"))


def test_profile_summaries_are_checked():
  assert _profiles() == ["nvidia_h200_2026-11-28"]
