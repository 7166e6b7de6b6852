"""Reports of a check: Markdown (step summary, PR bodies), JSON (all the data) and a rich table.

Pure: results, verdicts and the baseline in; a string, a dict or a ``rich.table.Table`` out.
Markdown stays under ``max_bytes`` (UTF-8): failures come first and are cut last; when rows must
go, the report says how many and that the JSON report has everything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from mamba2_guard.core.results import Baseline, BaselineCase, BenchResult, CaseResult
from mamba2_guard.core.verdicts import (
    FAILING,
    REGRESSION,
    SEVERITY,
    Policy,
    Verdict,
    exit_code,
    failures_first,
)

REPORT_SCHEMA_VERSION = 1
REPORT_KIND = "mamba2-guard/check"
MAX_MARKDOWN_BYTES = 64_000
MAX_DETAIL_CHARS = 240

_ICON = {
    "precision-fail": "❌", "regression": "❌", "error": "❌", "missing-kernel": "❌",
    "no-baseline": "⚪", "faster": "🚀", "ok": "✅",
}
_STYLE = {
    "precision-fail": "bold red", "regression": "bold red", "error": "red", "missing-kernel": "red",
    "no-baseline": "yellow", "faster": "green", "ok": "green",
}
_ENV_KEYS = (("gpu_name", "GPU"), ("driver_version", "driver"), ("cuda_runtime", "CUDA"), ("torch", "torch"),
             ("triton", "triton"), ("helion", "helion"), ("mamba_ssm", "mamba-ssm"))


# ----------------------------------------------------------------------------------------------
# Formatting


def _cell(text: Any) -> str:
    s = "" if text is None else str(text)
    s = s.replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    return s if len(s) <= MAX_DETAIL_CHARS else s[: MAX_DETAIL_CHARS - 1] + "…"


def _f(x: float | None, fmt: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


def _ms(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.4f}" if x < 1 else f"{x:.3f}" if x < 100 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _share(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def _status_label(v: Verdict) -> str:
    label = v.status
    if v.status == "regression":
        kind = "environment" if v.environment else (v.signal or "unattributed")
        label += f" ({kind}{', confirmed' if v.confirmed else ''})"
    return label


@dataclass(frozen=True)
class Row:
    """Everything the tables show about one case."""

    verdict: Verdict
    case: CaseResult | None
    base: BaselineCase | None
    layer_share: float | None
    share_estimated: bool

    @property
    def current_ms(self) -> float | None:
        return self.case.helion_median_ms if self.case else None

    @property
    def baseline_ms(self) -> float | None:
        return self.base.helion.median_ms if self.base else None

    @property
    def speedup(self) -> tuple[float | None, float | None]:
        return (self.base.speedup_vs_mamba_ssm if self.base else None,
                self.case.speedup if self.case else None)


def layer_shares(result: BenchResult) -> dict[tuple[str, str], float]:
    """Estimated share of each case in its shape's total Helion time (over the cases benchmarked):
    the fallback when the runner did not measure ``layer_share``."""
    totals: dict[str, float] = {}
    medians: dict[tuple[str, str], float] = {}
    for c in result.cases:
        m = c.helion_median_ms
        if m and c.timings_meaningful:
            medians[c.key] = m
            totals[c.shape] = totals.get(c.shape, 0.0) + m
    return {k: m / totals[k[1]] for k, m in medians.items() if totals.get(k[1])}


def rows(result: BenchResult, verdicts: Sequence[Verdict], baseline: Baseline | None) -> list[Row]:
    """One row per verdict, failures first (by severity), then in the verdicts' order."""
    est = layer_shares(result)
    out = []
    for v in failures_first(verdicts):
        case = result.case(v.kernel, v.shape)
        base = baseline.get(v.kernel, v.shape) if baseline else None
        share = case.layer_share if case and case.layer_share is not None else None
        estimated = share is None and (v.kernel, v.shape) in est
        out.append(Row(v, case, base, share if share is not None else est.get((v.kernel, v.shape)), estimated))
    return out


def speedup_trends(result: BenchResult, verdicts: Sequence[Verdict], baseline: Baseline | None,
                   earlier: Mapping[tuple[str, str], Sequence[float]]) -> dict[str, list[dict[str, Any]]]:
    """What the report's trend chart draws, per kernel: each timed case's speedup against mamba-ssm over its
    history window (``earlier``: (kernel, shape) -> speedups, oldest first) and then this run, as a ratio to
    the baseline's speedup (1.0: as fast as the baseline), and whether this run judged it a regression.
    Cases without meaningful timings, a speedup or a baseline speedup are left out."""
    statuses = {(v.kernel, v.shape): v.status for v in verdicts}
    out: dict[str, list[dict[str, Any]]] = {}
    for case in result.cases:
        base = baseline.get(case.kernel, case.shape) if baseline else None
        reference = base.speedup_vs_mamba_ssm if base else None
        if not (case.timings_meaningful and case.speedup and reference):
            continue
        points = [*(s / reference for s in earlier.get(case.key, ()) if s), case.speedup / reference]
        out.setdefault(case.kernel, []).append({"shape": case.shape, "points": [round(p, 4) for p in points],
                                                 "regression": statuses.get(case.key) == REGRESSION})
    return out


def counts(verdicts: Iterable[Verdict]) -> dict[str, int]:
    c = Counter(v.status for v in verdicts)
    return {s: c[s] for s in SEVERITY if c[s]}


# ----------------------------------------------------------------------------------------------
# Markdown

_FAIL_HEAD = ("| kernel | shape | phase | status | effect | p | detail |\n"
              "|---|---|---|---|--:|--:|---|")
# The per-kernel table's columns: (title, alignment); a column no row of the kernel fills is left out.
_KERNEL_COLUMNS = (("shape", "---"), ("phase", "---"), ("status", "---"), ("share of layer", "--:"),
                   ("baseline ms", "--:"), ("current ms", "--:"), ("speedup vs mamba-ssm", "--:"), ("Δ", "--:"),
                   ("p", "--:"), ("diff_mean", "--:"), ("diff_max", "--:"), ("roofline %", "--:"))
EMPTY = "—"


def _fail_line(r: Row) -> str:
    v = r.verdict
    return (f"| {_cell(v.kernel)} | {_cell(v.shape)} | {_cell(v.phase)} | {_ICON[v.status]} {_status_label(v)} "
            f"| {_pct(v.effect)} | {_f(v.p_value, '.2g')} | {_cell(v.detail)} |")


def _kernel_cells(r: Row) -> list[str]:
    v, case = r.verdict, r.case
    prec = case.precision if case else None
    sb, sc = r.speedup
    speed = f"{_f(sb, '.2f')} → {_f(sc, '.2f')}" if sb is not None else _f(sc, ".2f")
    share = _share(r.layer_share) + ("*" if r.share_estimated and r.layer_share is not None else "")
    roof = _f(case.roofline_fraction * 100 if case and case.roofline_fraction is not None else None, ".0f")
    return [_cell(v.shape), _cell(v.phase), f"{_ICON[v.status]} {_status_label(v)}", share, _ms(r.baseline_ms),
            _ms(r.current_ms), speed, _pct(v.effect), _f(v.p_value, ".2g"),
            _f(prec.mean_abs_diff_vs_mamba_ssm if prec else None, ".2e"),
            _f(prec.max_abs_diff_vs_mamba_ssm if prec else None, ".2e"), roof]


def filled_columns(table: Sequence[Sequence[str]]) -> list[int]:
    """The indexes of the columns that some row of ``table`` fills (not empty, not "—")."""
    return [i for i in range(len(table[0])) if any(row[i] not in ("", EMPTY) for row in table)] if table else []


def _row(cells: Sequence[str], keep: Sequence[int]) -> str:
    return "| " + " | ".join(cells[i] for i in keep) + " |"


def _environment(fp: Mapping[str, Any]) -> str:
    parts = [f"{label} {fp[k]}" for k, label in _ENV_KEYS if fp.get(k) not in (None, "")]
    return ", ".join(parts)


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8")) + 1  # + newline


def render_markdown(result: BenchResult, verdicts: Sequence[Verdict], baseline: Baseline | None,
                    max_bytes: int = MAX_MARKDOWN_BYTES, chart: str | None = None) -> str:
    """The check as GitHub Markdown, at most ``max_bytes`` UTF-8 bytes.

    Layout: a summary line, a table of the failures, then one table per kernel (kernels with
    failures first, failing rows first), then the environment. Under the limit, rows are kept in
    priority order: failures, then faster / no-baseline, then ok; the environment details go first.
    ``chart``: the trend chart's file name beside the report (``speedup_trends``), shown under the summary.
    """
    all_rows = rows(result, verdicts, baseline)
    c = counts(verdicts)
    failing = [r for r in all_rows if r.verdict.status in FAILING]
    code = exit_code(verdicts)
    if failing:
        title = f"## mamba2-guard check: {_ICON['regression']} {len(failing)} of {len(verdicts)} cases failing"
    else:
        title = f"## mamba2-guard check: {_ICON['ok']} all {len(verdicts)} cases pass"
    summary = " · ".join(f"{s} {n}" for s, n in c.items()) or "no cases"
    head = [title, "", f"{summary} (exit code {code})", ""]
    if result.cases and not all(case.timings_meaningful for case in result.cases):
        head += ["**No GPU: CPU interpret mode.** Precision was checked; the timings mean nothing.", ""]
    head += [
            "Δ: change of Helion's time since the baseline (+ = slower), relative to mamba-ssm unless the "
            "status says absolute/environment (own latency) or history (recent runs vs the window); "
            "p: two-sided Mann-Whitney U on the per-round samples."]
    if chart:
        head += ["", f"![Each kernel's speedup against mamba-ssm over its history window, relative to the "
                     f"baseline's; the band is the regression threshold, a cross a regression]({chart})"]
    env = _environment(result.fingerprint)
    if env:
        head += ["", f"Environment: {_cell(env)} (fingerprint `{result.fingerprint_hash[:12]}`)"]
    if any(r.verdict.environment for r in failing):
        head += ["", "Environment regressions: Helion and mamba-ssm slowed down together (driver, clocks, "
                     "thermals), while the speedup held."]

    # Candidate items: (priority, group, line). Groups: "fail" (failures table), ("kernel", name), "footer".
    kernel_order: list[str] = []
    for r in all_rows:  # failures-first order => kernels with failures come first
        if r.verdict.kernel not in kernel_order:
            kernel_order.append(r.verdict.kernel)
    by_kernel: dict[str, list[Row]] = {k: [] for k in kernel_order}
    for r in all_rows:
        by_kernel[r.verdict.kernel].append(r)

    items: list[tuple[int, int, Any, str]] = []  # (priority, order, group, line)
    order = 0
    for r in failing:
        items.append((0, order, "fail", _fail_line(r)))
        order += 1
    group_head: dict[Any, list[str]] = {"fail": ["", "### Failures", "", _FAIL_HEAD], "footer": []}
    for k in kernel_order:
        table = [_kernel_cells(r) for r in by_kernel[k]]
        keep = filled_columns(table)
        group_head[("kernel", k)] = ["", f"### {_cell(k)}", "", _row([t for t, _ in _KERNEL_COLUMNS], keep),
                                     _row([a for _, a in _KERNEL_COLUMNS], keep)]
        for r, cells in zip(by_kernel[k], table, strict=True):
            st = r.verdict.status
            prio = 1 if st in FAILING else 2 if st in ("faster", "no-baseline") else 3
            items.append((prio, order, ("kernel", k), _row(cells, keep)))
            order += 1
    footer = _footer(result, all_rows)
    if footer:  # one item: the <details> block is kept or cut whole
        items.append((4, order, "footer", "\n".join(footer)))

    note_reserve = 400
    used = sum(_nbytes(x) for x in head) + note_reserve
    chosen: set[int] = set()
    opened: set[Any] = set()
    for _prio, idx, group, line in sorted(items, key=lambda t: (t[0], t[1])):
        cost = _nbytes(line)
        if group not in opened:
            cost += sum(_nbytes(x) for x in group_head[group])
        if used + cost > max_bytes:
            continue
        used += cost
        chosen.add(idx)
        opened.add(group)

    lines = list(head)
    last_group: Any = None
    for _prio, idx, group, line in items:
        if idx not in chosen:
            continue
        if group != last_group:
            lines += group_head[group]
            last_group = group
        lines.append(line)

    cut = [t for t in items if t[1] not in chosen]
    if cut:
        n_fail = sum(1 for t in cut if t[2] == "fail")
        n_kfail = sum(1 for t in cut if t[0] == 1)
        n_pass = sum(1 for t in cut if t[0] in (2, 3))
        n_foot = sum(1 for t in cut if t[0] == 4)
        what = []
        if n_fail:
            what.append(f"{n_fail} of {len(failing)} failure rows")
        if n_kfail:
            what.append(f"{n_kfail} failing rows of the per-kernel tables")
        if n_pass:
            what.append(f"{n_pass} passing rows")
        if n_foot:
            what.append("the environment details")
        lines += ["", f"_Truncated to fit {max_bytes} bytes: cut {', '.join(what)}. "
                      "The JSON report has all the data._"]
    text = "\n".join(lines) + "\n"
    return _hard_limit(text, max_bytes)


def _footer(result: BenchResult, all_rows: Sequence[Row]) -> list[str]:
    out = []
    if any(r.share_estimated for r in all_rows):
        out += ["", "\\* share of the benchmarked kernels' Helion time for that shape (the runner did not "
                    "measure the layer)."]
    if result.fingerprint:
        out += ["", "<details><summary>Fingerprint</summary>", "", "| key | value |", "|---|---|"]
        out += [f"| {_cell(k)} | {_cell(v)} |" for k, v in flat_items(result.fingerprint)]
        out += ["", "</details>"]
    return out


def flat_items(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of a nested mapping, sorted: a fingerprint's nested parts (versions, device peaks)
    as rows of their own rather than one cut-off dict."""
    out: list[tuple[str, Any]] = []
    for key in sorted(mapping):
        value = mapping[key]
        if isinstance(value, Mapping) and value:
            out += flat_items(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _hard_limit(text: str, max_bytes: int) -> str:
    """Last resort (a limit smaller than the header): cut at a line boundary, then at bytes."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    note = "\n_Truncated._\n"
    budget = max(0, max_bytes - len(note.encode()))
    cut = data[:budget].decode("utf-8", errors="ignore")
    if "\n" in cut:
        cut = cut[: cut.rindex("\n")]
    out = cut + note
    return out if len(out.encode("utf-8")) <= max_bytes else out.encode("utf-8")[:max_bytes].decode(
        "utf-8", errors="ignore")


# ----------------------------------------------------------------------------------------------
# JSON


def _jsonable(x: Any) -> Any:
    """Strict-JSON data: non-finite floats become None, tuples lists, keys strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def render_json(result: BenchResult, verdicts: Sequence[Verdict], baseline: Baseline | None = None,
                policy: Policy | None = None) -> dict[str, Any]:
    """All the data of a check, versioned (``schema_version`` = :data:`REPORT_SCHEMA_VERSION`);
    ``json.dumps(..., allow_nan=False)`` accepts it. :func:`parse_json` reads it back."""
    doc: dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "exit_code": exit_code(verdicts),
        "summary": counts(verdicts),
        "fingerprint_hash": result.fingerprint_hash,
        "result": result.to_dict(),
        "verdicts": [v.to_dict() for v in verdicts],
        "policy": policy.to_dict() if policy else None,
        "baseline": None,
    }
    if baseline is not None:
        keys = {(v.kernel, v.shape) for v in verdicts}
        sub = Baseline(baseline.fingerprint, {k: c for k, c in baseline.cases.items() if k in keys},
                       baseline.device_peaks, baseline.schema_version)
        doc["baseline"] = sub.to_dict()
    return _jsonable(doc)


def parse_json(doc: Mapping[str, Any]) -> tuple[BenchResult, list[Verdict]]:
    """The result and verdicts of a JSON report (the inverse of :func:`render_json`)."""
    version = doc.get("schema_version")
    if version != REPORT_SCHEMA_VERSION or doc.get("kind") != REPORT_KIND:
        raise ValueError(f"not a {REPORT_KIND} report of schema {REPORT_SCHEMA_VERSION} "
                         f"(kind={doc.get('kind')!r}, schema_version={version!r})")
    return BenchResult.from_dict(doc["result"]), [Verdict.from_dict(v) for v in doc["verdicts"]]


# ----------------------------------------------------------------------------------------------
# Terminal


def rich_table(result: BenchResult, verdicts: Sequence[Verdict], baseline: Baseline | None = None,
               title: str | None = None) -> Table:
    """A terminal table, failures first."""
    all_rows = rows(result, verdicts, baseline)
    n_fail = sum(1 for r in all_rows if r.verdict.status in FAILING)
    table = Table(title=title or f"mamba2-guard check: {n_fail} failing of {len(all_rows)}", show_lines=False,
                  caption="ms: baseline→current; Δ (p): change and p-value; share and roofline: report.md")
    # Seven columns, the case's three names in one, so that it fits 80 columns (report.md has every column);
    # the case column is as wide as its longest name, so that it wraps between names, never inside one.
    longest = max((len(name) for r in all_rows for name in (r.verdict.kernel, r.verdict.shape)), default=4)
    table.add_column("case", min_width=longest)
    for name, justify in (("status", "left"), ("ms", "right"), ("speedup", "right"), ("Δ (p)", "right"),
                          ("diff max", "right"), ("detail", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in all_rows:
        v, case = r.verdict, r.case
        sb, sc = r.speedup
        prec = case.precision if case else None
        ms = f"{_ms(r.baseline_ms)}→{_ms(r.current_ms)}" if r.baseline_ms is not None else _ms(r.current_ms)
        change = _pct(v.effect) + (f" ({_f(v.p_value, '.2g')})" if v.p_value is not None else "")
        table.add_row(
            f"{v.kernel} {v.shape} {v.phase}", Text(_status_label(v), style=_STYLE[v.status]), ms,
            f"{_f(sb, '.2f')}→{_f(sc, '.2f')}" if sb is not None else _f(sc, ".2f"), change,
            _f(prec.max_abs_diff_vs_mamba_ssm if prec else None, ".1e"),
            v.detail if v.status != "ok" else "",
        )
    return table


def bench_table(result: BenchResult) -> Table:
    """``bench``'s closing summary: each case's medians, its speedup against mamba-ssm and its precision."""
    meaningful = all(c.timings_meaningful for c in result.cases)
    title = "mamba2-guard bench" + ("" if meaningful else " (CPU interpret mode: timings mean nothing)")
    table = Table(title=title)
    for name in ("kernel", "shape"):  # never broken inside a name: the other columns wrap for them
        table.add_column(name, no_wrap=True, min_width=max((len(getattr(c, name)) for c in result.cases), default=5))
    for name, justify in (("ours ms", "right"), ("mamba-ssm ms", "right"), ("speedup", "right"),
                          ("precision", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for case in result.cases:
        prec = case.precision
        if case.error:
            precision = Text("error", style=_STYLE["error"])
        elif case.missing:
            precision = Text("not implemented", style=_STYLE["missing-kernel"])
        elif prec is None or prec.ok is None:
            precision = Text("—")
        else:
            err = f" (rel err {_f(prec.max_rel_err_vs_fp64, '.1e')})"
            precision = Text(("ok" if prec.ok else "FAIL") + err, style=_STYLE["ok" if prec.ok else "precision-fail"])
        speedup = Text(_f(case.speedup, ".2f") + ("x" if case.speedup is not None else ""))
        if case.throttled:
            speedup.append(" throttled", style=_STYLE["no-baseline"])
        table.add_row(case.kernel, case.shape, _ms(case.helion_median_ms), _ms(case.mamba_ssm_median_ms),
                      speedup, precision)
    return table
