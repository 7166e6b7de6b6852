"""The reports a judged result leaves (``mamba2_guard.flows.nightly.write_reports``): the Markdown report's trend
chart, drawn by matplotlib from a real history (SQLite) of earlier runs, linked from the report and copied
with it; none for a run whose timings mean nothing."""

from __future__ import annotations

import dataclasses
import datetime
import json

from mamba2_guard import cli
from mamba2_guard.adapters import charts
from mamba2_guard.adapters.history import History
from mamba2_guard.core import report
from mamba2_guard.core.results import BenchResult
from mamba2_guard.core.verdicts import Policy
from mamba2_guard.flows import baselines, check, nightly
from tests.guard import sample

NOW = datetime.datetime(2026, 9, 9, tzinfo=datetime.timezone.utc)


def night(day: int, scale: float) -> BenchResult:
    """The sample result of 2026-09-<day>, Helion's times scaled by ``scale``."""
    doc = sample.result(f"2026-09-{day:02d}T03:17:00+00:00")
    for case in doc["cases"]:
        case["samples_ms"]["helion"] = [ms * scale for ms in case["samples_ms"]["helion"]]
    return BenchResult.from_dict(doc)


def test_the_report_shows_each_kernels_speedup_over_the_history_window(tmp_path):
    baselines.update(tmp_path / "baseline.yaml", night(1, 1.0))
    baseline = baselines.load(tmp_path / "baseline.yaml")
    policy = Policy()
    with History(tmp_path / "history.sqlite") as history:
        for day, scale in ((2, 1.02), (3, 0.98)):
            tonight = night(day, scale)
            result, verdicts = check.run_check(tonight, baseline, check.history_windows(tonight, history, policy),
                                               policy)
            history.record(result, verdicts, NOW, job="nightly", status="pass")
        tonight = night(4, 1.3)
        windows = check.history_windows(tonight, history, policy)
        result, verdicts = check.run_check(tonight, baseline, windows, policy)
        earlier = check.earlier_speedups(result, windows)
    assert all(len(speedups) == 2 for speedups in earlier.values()) and len(earlier) == len(sample.CASES)
    paths = nightly.write_reports(tmp_path, "20260904T031700Z", result, verdicts, baseline, policy, earlier=earlier)
    chart = tmp_path / "reports" / "20260904T031700Z-trend.svg"
    assert paths["trend_chart"] == str(chart)
    series = report.speedup_trends(result, verdicts, baseline, earlier)
    assert charts.drawn_from(chart) == charts.digest({"band": policy.threshold, "series": series})
    assert all(len(case["points"]) == 3 for cases in series.values() for case in cases)
    assert any(case["regression"] for cases in series.values() for case in cases)  # 30 % slower: marked
    svg = chart.read_text()
    assert all(f">{kernel}<" in svg for kernel, *_ in sample.CASES)  # a panel per kernel
    assert "](20260904T031700Z-trend.svg)" in (tmp_path / "reports" / "20260904T031700Z-report.md").read_text()
    copies = nightly.copy_reports(paths, tmp_path / "out")
    assert (tmp_path / "out" / chart.name).read_text() == svg and "](20260904T031700Z-trend.svg)" in (
        tmp_path / "out" / "report.md").read_text()
    assert copies["out_trend_chart"] == str(tmp_path / "out" / chart.name)


def test_a_cpu_run_has_no_trend_chart(tmp_path):
    cpu = night(2, 1.0)
    cpu = dataclasses.replace(cpu, cases=tuple(dataclasses.replace(c, timings_meaningful=False) for c in cpu.cases))
    result, verdicts = check.run_check(cpu, None, None, Policy())
    paths = nightly.write_reports(tmp_path, "s", result, verdicts, None, Policy(), earlier={})
    assert "trend_chart" not in paths and "trend.svg" not in (tmp_path / "reports" / "s-report.md").read_text()


def test_check_links_the_chart_of_the_result_it_judged(tmp_path, capsys):
    baselines.update(tmp_path / "baseline.yaml", night(1, 1.0))
    for day in (2, 3):
        result = tmp_path / f"result-{day}.json"
        result.write_text(json.dumps(night(day, 1.0).to_dict()))
        assert cli.main(["check", "--result", str(result), "--baseline", str(tmp_path / "baseline.yaml"),
                         "--state-dir", str(tmp_path / "state")]) == cli.EXIT_OK
    printed = capsys.readouterr().out.split("report: ")[-1].split()[0]
    report_path = tmp_path / "state" / "reports" / printed.rsplit("/", 1)[-1]
    name = report_path.name.replace("-report.md", "-trend.svg")
    assert f"]({name})" in report_path.read_text() and charts.drawn_from(report_path.with_name(name))
