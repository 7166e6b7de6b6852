"""Config diff and PR text: content, determinism, and the 64 KB cap on huge inputs."""

from __future__ import annotations

import re

from mamba2_guard.core.configdiff import diff_config_files, diff_configs
from mamba2_guard.core.drift import classify
from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.prbody import (
    MAX_BODY_BYTES,
    PerfRow,
    PrInput,
    before_after_chart,
    branch_name,
    marker,
    parse_marker,
    render_pr,
)
from tests.guard.pr_data import CONFIGS_OLD, FP_NEW, FP_OLD, KEY_4K, baseline_doc, new_configs


def test_config_diff_added_removed_changed_fields():
    old = {
        "k1": {"s1": {"block_sizes": [64, 32], "num_warps": 4, "pid_type": "flat"}, "gone": {"num_warps": 2}},
        "k2": {"s": {"indexing": {"a": "pointer", "b": "pointer"}}},
    }
    new = {
        "k1": {"s1": {"block_sizes": [128, 32], "num_warps": 4, "num_stages": 3}, "fresh": {"num_warps": 8}},
        "k2": {"s": {"indexing": {"a": "pointer", "b": "block_ptr"}}},
        "k3": {"x": {"num_warps": 1}},
    }
    d = diff_configs(old, new)
    by = {(e.kernel, e.shape_key): e for e in d.entries}
    assert set(by) == {("k1", "fresh"), ("k1", "gone"), ("k1", "s1"), ("k2", "s"), ("k3", "x")}
    assert by[("k1", "fresh")].status == "added" and by[("k1", "gone")].status == "removed"
    s1 = {f.field: (f.status, f.old, f.new) for f in by[("k1", "s1")].fields}
    assert s1 == {
        "block_sizes": ("changed", [64, 32], [128, 32]),
        "num_stages": ("added", None, 3),
        "pid_type": ("removed", "flat", None),
    }
    assert [f.field for f in by[("k2", "s")].fields] == ["indexing.b"]
    text = d.render_text()
    assert '~ k1 / s1: block_sizes [64,32] -> [128,32]; +num_stages=3; -pid_type (was "flat")' in text
    assert d.counts() == {"added": 2, "removed": 1, "changed": 2}
    assert diff_configs(old, old).empty
    assert diff_config_files(CONFIGS_OLD, new_configs()).entries[0].fields[0].new == 8


def test_a_refitted_selection_rule_shows_in_the_config_diff():
    rule = {"weights": {"flag": 1.0, "tile": 2.0, "size": 0.5}, "fitted_on": 7}
    refit = {**rule, "weights": {"flag": 1.0, "tile": 4.0, "size": 0.5}}
    old, new = {**CONFIGS_OLD, "selection": {"chunk_scan": rule}}, {**CONFIGS_OLD, "selection": {"chunk_scan": refit}}
    assert diff_config_files(old, new).render_lines() == ["~ chunk_scan / selection rule: weights.tile 2.0 -> 4.0"]
    assert diff_config_files(CONFIGS_OLD, old).render_lines() == [
        "+ chunk_scan / selection rule: {fitted_on=7, weights.flag=1.0, weights.size=0.5, weights.tile=2.0}"]
    assert diff_config_files(old, old).empty


def test_branch_and_marker_are_deterministic():
    h = fingerprint_hash(FP_NEW)
    assert h == fingerprint_hash(dict(reversed(list(FP_NEW.items()))))
    # Host and card identity are not part of the environment.
    assert h == fingerprint_hash({**FP_NEW, "gpu_uuid": "GPU-9", "hostname": "n2"})
    assert h != fingerprint_hash(FP_OLD)
    assert branch_name("nvidia-h200", h) == f"mamba2-guard/nvidia-h200/{h[:12]}"
    assert branch_name("NVIDIA H200", h) == f"mamba2-guard/nvidia-h200/{h[:12]}"
    assert parse_marker("x\n" + marker("nvidia-h200", h) + "\ny") == {"gpu": "nvidia-h200", "fingerprint": h}
    assert parse_marker("no marker") is None


def test_fingerprint_hash_matches_fingerprint_digest_when_available():
    try:
        from mamba2_guard.adapters.fingerprint import Fingerprint
    except Exception:  # another module; only checked when present
        return
    fields = {f: FP_NEW.get(f) for f in Fingerprint.__dataclass_fields__}
    fields.update(hostname="h", gpu_index=0)
    fp = Fingerprint(**fields)
    assert fingerprint_hash(fp.to_dict()) == fp.digest()


def _input(**kw):
    drift = classify(FP_NEW, FP_OLD, FP_OLD, {})
    base = dict(
        gpu_slug="nvidia-h200",
        fingerprint=FP_NEW,
        new_configs=new_configs(),
        old_configs=CONFIGS_OLD,
        new_baseline=baseline_doc(FP_NEW, helion_ms=0.4),
        old_baseline=baseline_doc(FP_OLD, helion_ms=0.5),
        drift=drift,
        reproduce_command="mamba2-guard autotune --gpu nvidia-h200 --seed 7",
        run_url="https://ci.example/runs/42",
    )
    base.update(kw)
    return PrInput(**base)


def test_pr_body_contents():
    pr = render_pr(_input())
    body = pr.body
    assert body.startswith(pr.marker) and pr.marker == marker("nvidia-h200", pr.fingerprint_hash)
    assert pr.branch == branch_name("nvidia-h200", fingerprint_hash(FP_NEW))
    assert "helion 1.4.0 -> 1.5.0" in pr.title and "triton 3.5.0 -> 3.6.0" in pr.title
    assert "| software | `helion` | 1.4.0 | 1.5.0 | retune |" in body
    # Per kernel x shape: before/after latency, change, speedup, precision.
    assert f"| `ssd_chunk_scan_fwd` | `{KEY_4K}` | 0.5 | 0.4 | -20.0% | 0.6 | 1.20x | 1.50x |" in body
    assert "1.00e-03" in body and "2.00e-04" in body
    assert f"~ ssd_chunk_scan_fwd / {KEY_4K}: num_warps 4 -> 8" in body
    assert "| 7 | full | 3600 | 2026-02-01 | - | - |" in body and "did not finish" not in body
    assert "mamba2-guard autotune --gpu nvidia-h200 --seed 7" in body
    assert "https://ci.example/runs/42" in body
    assert not pr.truncated
    assert render_pr(_input()).body == body  # deterministic


def test_pr_body_says_when_the_re_tune_was_partial():
    configs = new_configs()
    configs["tuned"] = {**configs["tuned"], "jobs": 69, "jobs_ok": 21, "jobs_failed": 1, "seconds_spent": 534.2}
    body = render_pr(_input(new_configs=configs)).body
    assert "| 21/69 (1 failed) | 534.2 |" in body
    assert "48 of 69 autotune jobs did not finish" in body
    assert "search(es) failed" not in body


def test_pr_body_lists_the_searches_that_failed():
    configs = new_configs()
    failed = [f"k{i:02d}[tokens=1]: NoConfigFound" for i in range(12)]
    configs["tuned"] = {**configs["tuned"], "searches_failed": failed}
    body = render_pr(_input(new_configs=configs)).body
    assert "_12 search(es) failed, so their old configs stay: `k00[tokens=1]: NoConfigFound`," in body
    assert "`k09[tokens=1]: NoConfigFound` and 2 more._" in body and "k10[" not in body


def test_pr_body_new_gpu_and_no_drift_report():
    pr = render_pr(_input(old_configs=None, old_baseline=None, drift=None))
    assert "new GPU nvidia-h200" in pr.title
    assert "+ rmsnorm_gated_fwd / dtype=bfloat16,group_size=1024" in pr.body
    # Without a drift report the changed versions come from the recorded fingerprints.
    pr2 = render_pr(_input(drift=None))
    assert "| `helion` | 1.4.0 | 1.5.0 |" in pr2.body


def test_huge_input_stays_under_64kb_and_says_so():
    n = 4000
    old_k = {"k": {f"shape{i:05d}": {"block_sizes": [64, 32], "num_warps": 4} for i in range(n)}}
    new_k = {"k": {f"shape{i:05d}": {"block_sizes": [128, 32], "num_warps": 8} for i in range(n)}}

    def bl(ms, bad=None, slow=None):
        return {
            "results": {
                "k": {
                    f"shape{i:05d}": {
                        "helion": {"median_ms": ms * (1 + (i == slow))},
                        "mamba_ssm": {"median_ms": 1.0},
                        "speedup_vs_mamba_ssm": 1.0 / ms,
                        "precision": {"allclose": i != bad, "max_rel_err_vs_fp64": 1e-3},
                    }
                    for i in range(n)
                }
            }
        }

    inp = _input(
        old_configs={"kernels": old_k},
        new_configs={"kernels": new_k, "tuned": {"seed": 1}},
        old_baseline=bl(0.5),
        new_baseline=bl(0.5, bad=3999, slow=1234),
        full_data="artifact bench-result.json",
    )
    pr = render_pr(inp)
    size = len(pr.body.encode("utf-8"))
    assert size <= MAX_BODY_BYTES < 65536
    assert pr.truncated and pr.omitted["perf_rows"] > 0 and pr.omitted["config_entries"] > 0
    assert "truncated to stay under GitHub's 64 KB limit" in pr.body and "artifact bench-result.json" in pr.body
    assert pr.body.startswith(pr.marker)
    # The precision failure and the biggest latency change survive truncation.
    assert "`shape03999`" in pr.body and "**NO**" in pr.body
    assert "`shape01234`" in pr.body
    # Diff alone is also bounded.
    d = diff_configs(old_k, new_k)
    assert len(d.render_lines(10)) == 11 and "3990 more" in d.render_lines(10)[-1]


def test_giant_reproduce_command_is_hard_cut():
    pr = render_pr(_input(reproduce_command="x" * 200_000), max_bytes=20_000)
    assert len(pr.body.encode()) <= 20_000 and pr.body.startswith(pr.marker) and pr.truncated


def test_changed_cases_come_first_and_unchanged_ones_fold_away():
    """The performance table shows the changed cases, most changed first (a precision failure above all);
    cases within 0.5 % fold into a <details> block: a re-tune that moved little fits one screen."""
    import copy

    old = baseline_doc(FP_OLD, helion_ms=0.5)
    new = copy.deepcopy(old)
    cases = [(k, s) for k, shapes in new["results"].items() for s in shapes]
    assert len(cases) >= 3
    (k1, s1), (k2, s2) = cases[0], cases[1]
    new["results"][k1][s1]["helion"]["median_ms"] = 0.55  # +10 %
    new["results"][k2][s2]["precision"]["allclose"] = False
    body = render_pr(_input(new_baseline=new, old_baseline=old)).body
    perf = body[body.index("### Performance"):body.index("### Config diff")]
    assert f"2 of {len(cases)} cases changed by more than 0.5% or in precision." in perf
    shown, folded = perf.split("<details>")
    assert shown.index(f"`{s2}`") < shown.index(f"`{s1}`")  # the precision failure first
    assert f"<summary>{len(cases) - 2} unchanged cases</summary>" in folded
    assert f"`{s1}`" not in folded and f"`{s2}`" not in folded


def test_the_changed_cases_speedups_are_drawn_before_and_after_where_github_shows_them():
    """A Mermaid chart in the body (GitHub draws it; nothing to upload): the changed cases in the table's
    order, after as bars, before as a line; none when nothing changed."""
    import copy

    old = baseline_doc(FP_OLD, helion_ms=0.5)
    new = copy.deepcopy(old)
    (k1, s1), (k2, s2) = [(k, s) for k, shapes in new["results"].items() for s in shapes][:2]
    before1, before2 = old["results"][k1][s1]["speedup_vs_mamba_ssm"], old["results"][k2][s2]["speedup_vs_mamba_ssm"]
    new["results"][k1][s1]["helion"]["median_ms"] = 0.4  # 20 % faster
    new["results"][k1][s1]["speedup_vs_mamba_ssm"] = 2.0
    new["results"][k2][s2]["helion"]["median_ms"] = 0.52  # 4 % slower
    new["results"][k2][s2]["speedup_vs_mamba_ssm"] = 0.9 * before2
    body = render_pr(_input(new_baseline=new, old_baseline=old)).body
    perf = body[body.index("### Performance"):body.index("### Config diff")]
    chart = perf[perf.index("```mermaid"):perf.index("```", perf.index("xychart-beta"))]
    lines = [line.strip() for line in chart.splitlines()]
    assert lines[1] == "xychart-beta"
    label = [re.sub(r"[^\w.@-]", "_", f"{k}@{s}") for k, s in ((k1, s1), (k2, s2))]
    assert f'x-axis ["{label[0]}", "{label[1]}"]' in lines  # most changed first, as the table
    assert f"bar [2.000, {0.9 * before2:.3f}]" in lines and f"line [{before1:.3f}, {before2:.3f}]" in lines
    assert chart.index("xychart") < perf.index("| Kernel |")  # above the table
    unchanged = render_pr(_input(new_baseline=copy.deepcopy(old), old_baseline=old)).body
    assert "```mermaid" not in unchanged


def test_the_chart_labels_cannot_break_the_mermaid_block():
    row = PerfRow('k"]', "s 1\n", 1.0, 0.9, 1.2, 1.2, 1.3, None, None, True, 0.1)
    (label,) = [line for line in before_after_chart([row]) if "x-axis" in line]
    assert label.strip() == 'x-axis ["k__@s_1_"]'
