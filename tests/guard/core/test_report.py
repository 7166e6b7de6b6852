"""mamba2_guard.core.report: Markdown size and order, JSON round trip, the rich table."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mamba2_guard.core.report import (
    REPORT_SCHEMA_VERSION,
    bench_table,
    layer_shares,
    parse_json,
    render_json,
    render_markdown,
    rich_table,
    speedup_trends,
)
from mamba2_guard.core.results import BenchResult, CaseResult
from mamba2_guard.core.verdicts import FAILING, Policy, Verdict, check

from .factories import FINGERPRINT, GOOD, baseline_of, make_case


def _big_run(n_kernels=25, n_shapes=20, seed=0):
    """500 cases; a handful fail in different ways, placed late so that order matters."""
    rng = np.random.default_rng(seed)
    base_cases, cur_cases = [], []
    for k in range(n_kernels):
        for s in range(n_shapes):
            kw = dict(kernel=f"kernel_{k:02d}", shape=f"b{s}_l{1024 * (s + 1)}", n=12,
                      phase="bwd" if k % 2 else "fwd")
            base_cases.append(make_case(rng, **kw))
            shift, extra = 1.0, {}
            if (k, s) == (24, 19):
                shift = 1.25
            elif (k, s) == (23, 3):
                extra = {"precision": replace(GOOD, allclose=False)}
            elif (k, s) == (22, 7):
                extra = {"error": "RuntimeError: | pipes | and\nnewlines " + "x" * 500}
            elif (k, s) == (21, 0):
                extra = {"missing": True}
            cur_cases.append(make_case(rng, helion_shift=shift, **kw, **extra))
    result = BenchResult({**FINGERPRINT, "hostname": "node-1"}, tuple(cur_cases), suite="nightly")
    baseline = baseline_of(*base_cases)
    return result, check(result, baseline), baseline


@pytest.fixture(scope="module")
def big():
    return _big_run()


def test_markdown_500_cases_under_64kb_failures_first(big):
    result, verdicts, baseline = big
    assert len(verdicts) == 500
    failing = [v for v in verdicts if v.status in FAILING]
    assert {v.status for v in failing} == {"regression", "precision-fail", "error", "missing-kernel"}
    md = render_markdown(result, verdicts, baseline)
    assert len(md.encode("utf-8")) <= 64_000
    assert "4 of 500 cases failing" in md.splitlines()[0]
    # the failures table comes before any per-kernel table, and lists every failure
    fail_at = md.index("### Failures")
    assert fail_at < md.index("### kernel_")
    fail_table = md[fail_at: md.index("### kernel_")]
    for v in failing:
        assert f"| {v.kernel} | {v.shape} |" in fail_table
    # precision failure ranks first
    assert fail_table.index("kernel_23") < fail_table.index("kernel_24")
    # kernels with failures get their tables first
    first_kernel_table = md[md.index("### kernel_"):].splitlines()[0]
    assert first_kernel_table in {f"### {v.kernel}" for v in failing}
    # cells are escaped and capped
    line = next(li for li in md.splitlines() if "RuntimeError" in li)
    assert "\\|" in line and "\n" not in line and len(line) < 600


def test_markdown_truncation_keeps_failures_and_says_what_was_cut(big):
    result, verdicts, baseline = big
    md = render_markdown(result, verdicts, baseline, max_bytes=8_000)
    assert len(md.encode("utf-8")) <= 8_000
    for v in verdicts:
        if v.status in FAILING:
            assert f"| {v.kernel} | {v.shape} |" in md
    assert "_Truncated to fit 8000 bytes" in md and "passing rows" in md and "JSON report" in md


def test_markdown_untruncated_when_it_fits():
    rng = np.random.default_rng(1)
    base = make_case(rng)
    result = BenchResult(FINGERPRINT, (make_case(rng),))
    baseline = baseline_of(base)
    md = render_markdown(result, check(result, baseline), baseline)
    assert "Truncated" not in md and "all 1 cases pass" in md
    assert "<details><summary>Fingerprint</summary>" in md
    assert "100%*" in md  # estimated share of the layer (only kernel of its shape)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 20_000))
def test_markdown_never_exceeds_the_limit(limit):
    result, verdicts, baseline = _small_run()
    md = render_markdown(result, verdicts, baseline, max_bytes=limit)
    assert len(md.encode("utf-8")) <= limit


_SMALL = None


def _small_run():
    global _SMALL
    if _SMALL is None:
        _SMALL = _big_run(n_kernels=6, n_shapes=8, seed=2)
    return _SMALL


def test_layer_share_prefers_the_runner_value():
    rng = np.random.default_rng(3)
    a = make_case(rng, kernel="a", helion_ms=3.0)
    b = make_case(rng, kernel="b", helion_ms=1.0, layer_share=0.4)
    result = BenchResult(FINGERPRINT, (a, b))
    shares = layer_shares(result)
    assert shares[("a", "s")] == pytest.approx(0.75, abs=0.02)
    md = render_markdown(result, check(result, None), None)
    assert "| 40% |" in md and "75%*" in md


def test_json_round_trip(big):
    result, verdicts, baseline = big
    doc = render_json(result, verdicts, baseline, Policy())
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION and doc["exit_code"] == 1
    assert doc["summary"]["regression"] == 1
    text = json.dumps(doc, allow_nan=False)  # strict JSON
    back_result, back_verdicts = parse_json(json.loads(text))
    assert back_result == result
    assert [v.to_dict() for v in back_verdicts] == json.loads(json.dumps([v.to_dict() for v in verdicts]))
    assert sum(len(shapes) for shapes in doc["baseline"]["results"].values()) == 500
    with pytest.raises(ValueError):
        parse_json({**doc, "schema_version": 99})


def test_json_replaces_non_finite_numbers():
    result = BenchResult(FINGERPRINT, (CaseResult("k", "s", precision=GOOD),))
    v = Verdict("k", "s", "ok", effect=float("inf"), evidence={"x": float("nan")})
    doc = render_json(result, [v])
    json.dumps(doc, allow_nan=False)
    assert doc["verdicts"][0]["effect"] is None


def test_rich_table(big):
    result, verdicts, baseline = big
    table = rich_table(result, verdicts, baseline)
    assert table.row_count == 500
    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    text = console.export_text()
    assert "precision-fail" in text and text.index("precision-fail") < text.index("ok")


def test_bench_table_says_which_cases_ran_throttled():
    rng = np.random.default_rng(0)
    result = BenchResult(fingerprint=FINGERPRINT, cases=(make_case(rng, kernel="cool"),
                                                         make_case(rng, kernel="hot", throttled=True)))
    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(bench_table(result))
    rows = {line.split()[1]: line for line in console.export_text().splitlines() if " s " in line}
    assert "throttled" in rows["hot"] and "throttled" not in rows["cool"]


def test_a_cpu_report_says_so_first_and_leaves_out_the_columns_no_row_fills():
    """A CPU run (timings not meaningful, no baseline, no shares or roofline) is said at the top, and its
    per-kernel tables keep only the columns some row fills (they were 12 columns of mostly "—"); the nested
    parts of the fingerprint are rows of their own, not one cut-off dict."""
    rng = np.random.default_rng(0)
    case = make_case(rng, kernel="chunk_cumsum", shape="smoke", timings_meaningful=False)
    fingerprint = {**FINGERPRINT, "device_peaks": {"copy_bytes_per_s": 4.3e12, "method": "copy"}}
    result = BenchResult(fingerprint, (case,), suite="smoke")
    md = render_markdown(result, check(result, None), None)
    lines = md.splitlines()
    assert lines[4] == "**No GPU: CPU interpret mode.** Precision was checked; the timings mean nothing."
    header = lines[lines.index("### chunk_cumsum") + 2]
    assert "baseline ms" not in header and "roofline %" not in header and "share of layer" not in header
    assert header.startswith("| shape | phase | status |") and "current ms" in header
    assert "| device_peaks.copy_bytes_per_s | 4300000000000.0 |" in md and "| device_peaks.method | copy |" in md
    gpu = BenchResult(FINGERPRINT, (make_case(rng, kernel="chunk_cumsum", shape="smoke"),), suite="smoke")
    assert "CPU interpret mode" not in render_markdown(gpu, check(gpu, None), None)


def test_bench_and_check_tables_never_break_a_name_at_80_columns():
    rng = np.random.default_rng(0)
    names = ("chunk_scan_chunk_state_bwd_dx", "ssd_combined_fwd_bwd")
    result = BenchResult(FINGERPRINT, tuple(make_case(rng, kernel=k, shape="nemotron-nano-9b-v2-q256-init")
                                            for k in names))
    for table in (bench_table(result), rich_table(result, check(result, None))):
        console = Console(record=True, width=80, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(table)
        words = set(console.export_text().replace("│", " ").split())
        assert {*names, "nemotron-nano-9b-v2-q256-init"} <= words


def test_the_trend_chart_data_is_each_timed_cases_speedup_over_its_window_relative_to_the_baseline():
    rng = np.random.default_rng(0)
    before = make_case(rng, kernel="a", shape="s1", mamba_ms=1.2)
    slower = make_case(rng, kernel="a", shape="s1", mamba_ms=1.2, helion_shift=1.2)
    other = make_case(rng, kernel="b", shape="s2")
    untimed = make_case(rng, kernel="b", shape="s3", timings_meaningful=False)
    unbased = make_case(rng, kernel="c", shape="s4")
    baseline = baseline_of(before, other, untimed)
    result = BenchResult(FINGERPRINT, (slower, other, untimed, unbased))
    verdicts = check(result, baseline, lambda kernel, shape: [], Policy())
    assert [v.status for v in verdicts][:2] == ["regression", "ok"]
    reference = baseline.get("a", "s1").speedup_vs_mamba_ssm
    trends = speedup_trends(result, verdicts, baseline, {("a", "s1"): [reference, 1.1 * reference]})
    assert set(trends) == {"a", "b"}  # untimed (CPU) and unbaselined cases have no trend
    (case_a,) = trends["a"]
    assert case_a["shape"] == "s1" and case_a["regression"] is True
    assert case_a["points"][:2] == [1.0, 1.1] and case_a["points"][2] == round(slower.speedup / reference, 4) < 0.9
    assert trends["b"] == [{"shape": "s2", "points": [1.0], "regression": False}]
