"""PR title, body, branch name and hidden marker for a config/baseline update.

Pure: config-file and baseline-file documents (plain dicts) plus a drift report in, strings out.

The body always starts with the hidden marker ``<!-- mamba2-guard:gpu=<slug> fingerprint=<hash> -->``
(so it survives any truncation and the bot can find its own PRs), and stays under
:data:`MAX_BODY_BYTES`: when the full tables do not fit, rows are dropped (the least interesting
first) and the body says so and where the full data is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mamba2_guard.core import bringup
from mamba2_guard.core.configdiff import ConfigDiff, diff_config_files
from mamba2_guard.core.drift import fingerprint_changes, short_value
from mamba2_guard.core.fingerprint_hash import fingerprint_hash

# GitHub rejects PR bodies over 65536 characters; stay clearly under it, counted in UTF-8 bytes.
MAX_BODY_BYTES = 60_000
MAX_TITLE_CHARS = 200
MAX_FAILED_SEARCHES = 10  # listed in the body; the full list is in the config file's `tuned` record
MAX_CHART_CASES = 16  # the before-and-after chart's bars: the most changed cases, readable on one screen
BRANCH_PREFIX = "mamba2-guard"
SHORT_HASH_LEN = 12

MARKER_RE = re.compile(r"<!--\s*mamba2-guard:gpu=(?P<gpu>[^\s]+)\s+fingerprint=(?P<fp>[0-9a-fA-F]+)\s*-->")

# Software shown in the one-line environment summary, in this order.
_ENV_KEYS = (
    ("gpu_name", "GPU"),
    ("driver_version", "driver"),
    ("cuda_runtime", "CUDA"),
    ("torch", "torch"),
    ("triton", "triton"),
    ("helion", "helion"),
    ("mamba_ssm", "mamba-ssm"),
    ("python", "python"),
)


# ----------------------------------------------------------------------------------------------
# Identity: fingerprint hash, branch, marker


def sanitize_slug(gpu_slug: str) -> str:
    """A GPU slug safe inside a git ref and an HTML comment."""
    s = re.sub(r"[^a-z0-9._-]+", "-", str(gpu_slug).strip().lower())
    s = re.sub(r"\.{2,}", ".", s).strip(".-")
    if s.endswith(".lock"):
        s = s[: -len(".lock")]
    return s or "unknown-gpu"


def branch_name(gpu_slug: str, fp_hash: str, prefix: str = BRANCH_PREFIX) -> str:
    """``mamba2-guard/<gpu-slug>/<short fingerprint hash>``: one branch per GPU and environment."""
    return f"{prefix}/{sanitize_slug(gpu_slug)}/{fp_hash[:SHORT_HASH_LEN].lower()}"


def branch_prefix(gpu_slug: str, prefix: str = BRANCH_PREFIX) -> str:
    return f"{prefix}/{sanitize_slug(gpu_slug)}/"


def marker(gpu_slug: str, fp_hash: str) -> str:
    return f"<!-- mamba2-guard:gpu={sanitize_slug(gpu_slug)} fingerprint={fp_hash.lower()} -->"


def parse_marker(body: str | None) -> dict[str, str] | None:
    """``{"gpu": slug, "fingerprint": hash}`` from a PR body, or None."""
    m = MARKER_RE.search(body or "")
    return {"gpu": m.group("gpu"), "fingerprint": m.group("fp").lower()} if m else None


# ----------------------------------------------------------------------------------------------
# Formatting helpers


def _cell(value: Any) -> str:
    s = "" if value is None else str(value)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ms(v: Any) -> str:
    f = _num(v)
    return "n/a" if f is None else f"{f:.4g}"


def _err(v: Any) -> str:
    f = _num(v)
    return "n/a" if f is None else f"{f:.2e}"


def _speedup(v: Any) -> str:
    f = _num(v)
    return "n/a" if f is None else f"{f:.2f}x"


def _pct(before: Any, after: Any) -> str:
    b, a = _num(before), _num(after)
    if b is None or a is None or b <= 0:
        return "n/a"
    return f"{(a / b - 1.0) * 100:+.1f}%"


def _drift_dict(drift: Any) -> dict[str, Any] | None:
    if drift is None:
        return None
    if hasattr(drift, "to_dict"):
        return drift.to_dict()
    return dict(drift)


# ----------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class PrInput:
    gpu_slug: str
    fingerprint: Mapping[str, Any]
    new_configs: Mapping[str, Any] | None = None  # config-file document this run wrote
    old_configs: Mapping[str, Any] | None = None  # the one on the base branch (None: new GPU)
    new_baseline: Mapping[str, Any] | None = None
    old_baseline: Mapping[str, Any] | None = None
    drift: Any = None  # DriftReport or its to_dict()
    reproduce_command: str | None = None
    run_url: str | None = None
    full_data: str | None = None  # where the full data is attached (artifact name or URL)
    fingerprint_hash: str | None = None  # precomputed; else fingerprint_hash(fingerprint)
    bring_up: Mapping[str, Any] | None = None  # a new GPU's bring-up progress (core.bringup.progress)


@dataclass(frozen=True)
class PrText:
    title: str
    body: str
    branch: str
    fingerprint_hash: str
    marker: str
    truncated: bool = False
    omitted: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PerfRow:
    kernel: str
    shape: str
    helion_before: Any
    helion_after: Any
    mamba_after: Any
    speedup_before: Any
    speedup_after: Any
    max_rel_err: Any
    max_abs_diff: Any
    allclose: Any
    interest: float

    def render(self) -> str:
        ok = self.allclose
        ok_s = "n/a" if ok is None else ("yes" if ok else "**NO**")
        cells = [
            f"`{_cell(self.kernel)}`",
            f"`{_cell(self.shape)}`",
            _ms(self.helion_before),
            _ms(self.helion_after),
            _pct(self.helion_before, self.helion_after),
            _ms(self.mamba_after),
            _speedup(self.speedup_before),
            _speedup(self.speedup_after),
            _err(self.max_rel_err),
            _err(self.max_abs_diff),
            ok_s,
        ]
        return "| " + " | ".join(cells) + " |"


# A case whose Helion median moved less than this (log ratio, about 0.5 %) is shown as unchanged.
UNCHANGED = math.log(1.005)
_PERF_HEADER = (
    "| Kernel | Shape | Helion before (ms) | Helion after (ms) | Change | mamba-ssm (ms) "
    "| Speedup before | Speedup after | Max rel err vs fp64 | Max abs diff vs mamba-ssm | allclose |\n"
    "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"
)


def _median(entry: Mapping[str, Any] | None, impl: str) -> Any:
    sub = (entry or {}).get(impl)
    return sub.get("median_ms") if isinstance(sub, Mapping) else None


def _precision(entry: Mapping[str, Any] | None) -> Mapping[str, Any]:
    entry = entry or {}
    p = entry.get("precision")
    if isinstance(p, Mapping):
        return p
    helion = entry.get("helion")
    if isinstance(helion, Mapping) and isinstance(helion.get("precision"), Mapping):
        return helion["precision"]
    return {}


def _results(doc: Mapping[str, Any] | None) -> dict[str, dict[str, Mapping[str, Any]]]:
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for kernel, shapes in ((doc or {}).get("results") or {}).items():
        if isinstance(shapes, Mapping):
            out[str(kernel)] = {str(s): (e if isinstance(e, Mapping) else {}) for s, e in shapes.items()}
    return out


def perf_rows(old_baseline: Mapping[str, Any] | None, new_baseline: Mapping[str, Any] | None) -> list[PerfRow]:
    old, new = _results(old_baseline), _results(new_baseline)
    rows = []
    for kernel in sorted(set(old) | set(new)):
        for shape in sorted(set(old.get(kernel, {})) | set(new.get(kernel, {}))):
            o, n = old.get(kernel, {}).get(shape), new.get(kernel, {}).get(shape)
            prec = _precision(n)
            hb, ha = _median(o, "helion"), _median(n, "helion")
            allclose = prec.get("allclose")
            finite = prec.get("finite")
            b, a = _num(hb), _num(ha)
            interest = abs(math.log(a / b)) if (a and b and a > 0 and b > 0) else 0.0
            if allclose is False or finite is False:
                interest += 1e6  # precision failures are always shown
            if n is None or o is None:
                interest += 1e3  # a shape that disappeared or is new
            rows.append(
                PerfRow(
                    kernel=kernel,
                    shape=shape,
                    helion_before=hb,
                    helion_after=ha,
                    mamba_after=_median(n, "mamba_ssm"),
                    speedup_before=(o or {}).get("speedup_vs_mamba_ssm"),
                    speedup_after=(n or {}).get("speedup_vs_mamba_ssm"),
                    max_rel_err=prec.get("max_rel_err_vs_fp64"),
                    max_abs_diff=prec.get("max_abs_diff_vs_mamba_ssm"),
                    allclose=allclose if finite is not False else False,
                    interest=interest,
                )
            )
    return rows


def _keep(rows: list, limit: int, key=None) -> list:
    """The ``limit`` most interesting rows, shown in their original order."""
    if limit >= len(rows):
        return rows
    order = sorted(range(len(rows)), key=lambda i: (-(key(rows[i]) if key else 0.0), i))
    chosen = sorted(order[: max(0, limit)])
    return [rows[i] for i in chosen]


# ----------------------------------------------------------------------------------------------
# Title and body


def _what_changed(inp: PrInput, drift: dict[str, Any] | None) -> list[tuple[str, str, str, str, str]]:
    """(class, component, before, after, action) rows."""
    rows = []
    if drift and drift.get("items"):
        for it in drift["items"]:
            cls = it.get("class", "")
            if cls == "invalid-config":
                before, after = "valid", f"invalid: {it.get('detail', '')}"
            else:
                before, after = short_value(it.get("before")), short_value(it.get("after"))
                extra = []
                if it.get("detail"):
                    extra.append(str(it["detail"]))
                if it.get("files"):
                    extra.append("files: " + ", ".join(it["files"]))
                if extra:
                    after = f"{after} ({'; '.join(extra)})"
            rows.append((cls, str(it.get("component", "")), before, after, str(it.get("action", ""))))
        return rows
    old_fp = (inp.old_configs or {}).get("fingerprint") or (inp.old_baseline or {}).get("fingerprint")
    for comp, b, a in fingerprint_changes(old_fp, inp.fingerprint):
        rows.append(("", comp, short_value(b), short_value(a), ""))
    return rows


def pr_title(inp: PrInput, drift: dict[str, Any] | None = None) -> str:
    gpu_slug = sanitize_slug(inp.gpu_slug)
    drift = drift if drift is not None else _drift_dict(inp.drift)
    action = (drift or {}).get("action")
    if inp.old_configs is None and inp.new_configs is not None:
        what = f"tuned Helion configs for new GPU {gpu_slug}"
    elif action == "rebaseline" or inp.new_configs is None:
        what = f"new baseline for {gpu_slug}"
    else:
        what = f"re-tuned Helion configs for {gpu_slug}"
    parts = []
    for cls, comp, before, after, act in _what_changed(inp, drift):
        if act == "ignore" or cls == "new-gpu":
            continue
        if cls == "invalid-config":
            parts.append("invalid config")
        elif cls == "kernel-source":
            parts.append("kernel sources changed")
        else:
            parts.append(f"{comp} {before} -> {after.split(' (')[0]}")
    parts = list(dict.fromkeys(parts))
    if len(parts) > 2:
        parts = parts[:2] + [f"+{len(parts) - 2} more"]
    title = f"mamba2-guard: {what}" + (f" ({', '.join(parts)})" if parts else "")
    return title if len(title) <= MAX_TITLE_CHARS else title[: MAX_TITLE_CHARS - 3] + "..."


def _environment_line(fp: Mapping[str, Any]) -> str:
    parts = [f"{label} {fp[k]}" for k, label in _ENV_KEYS if fp.get(k) is not None]
    return ", ".join(parts)


def _jobs_done(tuned: Mapping[str, Any]) -> str:
    if tuned.get("jobs") is None:
        return "-"
    return f"{tuned.get('jobs_ok', 0)}/{tuned['jobs']}" + (f" ({tuned['jobs_failed']} failed)"
                                                            if tuned.get("jobs_failed") else "")


def _jobs_left(tuned: Mapping[str, Any]) -> str:
    """What a partial re-tune (overall budget spent, jobs failed) left undone, for the reviewer."""
    jobs, ok = tuned.get("jobs"), tuned.get("jobs_ok")
    if not isinstance(jobs, int) or not isinstance(ok, int) or ok >= jobs:
        return ""
    return f"{jobs - ok} of {jobs} autotune jobs did not finish (budget spent or failed)"


def _render_body(
    inp: PrInput,
    fp_hash: str,
    drift: dict[str, Any] | None,
    changes: list[tuple[str, str, str, str, str]],
    rows: list[PerfRow],
    diff: ConfigDiff,
    limit: int | None,
) -> tuple[str, dict[str, int]]:
    """The body, section by section, each cut to ``limit`` rows (None: whole); and what each cut left out."""
    omitted: dict[str, int] = {}
    out = [*_header(inp, fp_hash, drift), *_changes_section(changes, limit, omitted), *_bringup_section(inp),
           *_performance_section(rows, limit, omitted), *_config_diff_section(diff, limit, omitted),
           *_autotune_section(inp), *_reproduce_section(inp, omitted),
           "<sub>Opened by mamba2-guard. The bot updates this PR in place; a human commit on the branch stops "
           "it from pushing here, and closing the PR unmerged makes it skip this fingerprint.</sub>"]
    return "\n".join(out) + "\n", omitted


def _header(inp: PrInput, fp_hash: str, drift: dict[str, Any] | None) -> list[str]:
    gpu_slug = sanitize_slug(inp.gpu_slug)
    out = [marker(gpu_slug, fp_hash), "", f"## mamba2-guard: `{gpu_slug}`", ""]
    env = _environment_line(inp.fingerprint)
    if env:
        out.append(f"**Environment:** {env}  ")
    out.append(f"**Fingerprint:** `{fp_hash[:SHORT_HASH_LEN]}`  ")
    if drift:
        out.append(f"**Action:** {drift.get('action')}")
    return [*out, ""]


def _changes_section(changes: list[tuple[str, str, str, str, str]], limit: int | None,
                     omitted: dict[str, int]) -> list[str]:
    out = ["### What changed", ""]
    if not changes:
        return [*out, "No environment change recorded (a re-tune or re-baseline was requested).", ""]
    shown = changes if limit is None else changes[:limit]
    classified = any(c[0] for c in changes)
    out += (["| Class | Component | Before | After | Action |", "|---|---|---|---|---|"] if classified
            else ["| Component | Before | After |", "|---|---|---|"])
    for cls, comp, before, after, act in shown:
        row = f"`{_cell(comp)}` | {_cell(before)} | {_cell(after)}"
        out.append(f"| {_cell(cls)} | {row} | {_cell(act)} |" if classified else f"| {row} |")
    if len(shown) < len(changes):
        omitted["changes"] = len(changes) - len(shown)
        out.append(f"| ... {omitted['changes']} more |" + (" |" * (4 if classified else 2)))
    return [*out, ""]


def _bringup_section(inp: PrInput) -> list[str]:
    if not inp.bring_up:
        return []
    return ["### Bring-up of a new GPU", "", bringup.render(inp.bring_up), "",
            "_The guard updates this PR as each later stage lands; nothing needs to be run by hand._", ""]


def _performance_section(rows: list[PerfRow], limit: int | None, omitted: dict[str, int]) -> list[str]:
    out = ["### Performance and precision (median latency, lower is better)", ""]
    if not rows:
        return [*out, "No baseline results in this update.", ""]
    # The changed cases first, most changed first; the unchanged ones folded away, so that what a reviewer
    # must look at fits one screen (a re-tune that moved nothing showed 150 rows of +0.0 %).
    rows = sorted(rows, key=lambda r: -r.interest)
    shown_rows = rows if limit is None else _keep(rows, limit, key=lambda r: r.interest)
    changed = [r for r in shown_rows if r.interest >= UNCHANGED]
    same = [r for r in shown_rows if r.interest < UNCHANGED]
    out += [f"{len(changed)} of {len(rows)} cases changed by more than {UNCHANGED:.1%} or in precision.", ""]
    out += before_after_chart(changed)
    if changed:
        out += [_PERF_HEADER, *(r.render() for r in changed)]
    if same:
        out += ["", f"<details><summary>{len(same)} unchanged cases</summary>", "", _PERF_HEADER,
                *(r.render() for r in same), "", "</details>"]
    if len(shown_rows) < len(rows):
        omitted["perf_rows"] = len(rows) - len(shown_rows)
        out += ["", f"_{omitted['perf_rows']} of {len(rows)} rows not shown (the largest changes and all "
                    "precision failures are kept)._"]
    return [*out, ""]


def before_after_chart(changed: list[PerfRow]) -> list[str]:
    """The changed cases' speedups against mamba-ssm before and after, as a Mermaid chart that GitHub draws
    in the PR itself (no file to upload or host, also for a private repository or an offline runner): after
    as bars, before as a line, for the first ``MAX_CHART_CASES`` cases with both (most changed first)."""
    cases = [r for r in changed if _num(r.speedup_before) and _num(r.speedup_after)][:MAX_CHART_CASES]
    if not cases:
        return []
    labels = ", ".join('"' + re.sub(r"[^\w.@-]", "_", f"{r.kernel}@{r.shape}") + '"' for r in cases)
    top = max(max(_num(r.speedup_before), _num(r.speedup_after)) for r in cases)
    return ["```mermaid", "xychart-beta",
            '    title "Speedup vs mamba-ssm of the changed cases: after (bars), before (line)"',
            f"    x-axis [{labels}]", f'    y-axis "speedup (x)" 0 --> {math.ceil(top * 11) / 10}',
            f"    bar [{', '.join(f'{_num(r.speedup_after):.3f}' for r in cases)}]",
            f"    line [{', '.join(f'{_num(r.speedup_before):.3f}' for r in cases)}]", "```", ""]


def _config_diff_section(diff: ConfigDiff, limit: int | None, omitted: dict[str, int]) -> list[str]:
    out = ["### Config diff", ""]
    if diff.empty:
        return [*out, "No config changes.", ""]
    lines = diff.render_lines(limit)
    if limit is not None and limit < len(diff.entries):
        omitted["config_entries"] = len(diff.entries) - limit
    return [*out, f"<details><summary>{diff.summary()}</summary>", "", "```diff",
            *(line.replace("```", "'''") for line in lines), "```", "", "</details>", ""]


def _autotune_section(inp: PrInput) -> list[str]:
    tuned = (inp.new_configs or {}).get("tuned") or {}
    if not tuned:
        return []
    out = ["### Autotune", "", "| Seed | Effort | Budget (s) | Date | Jobs done | Seconds spent |",
           "|---|---|---|---|---|---|",
           f"| {_cell(tuned.get('seed'))} | {_cell(tuned.get('effort'))} | {_cell(tuned.get('budget_s'))} | "
           f"{_cell(tuned.get('date'))} | {_jobs_done(tuned)} | {_cell(tuned.get('seconds_spent', '-'))} |", ""]
    left = _jobs_left(tuned)
    if left:
        out += [f"_{left}: their committed configs stay; the next run resumes them._", ""]
    failed = [str(x) for x in tuned.get("searches_failed") or ()]
    if failed:
        shown = ", ".join(f"`{x}`" for x in failed[:MAX_FAILED_SEARCHES])
        more = f" and {len(failed) - MAX_FAILED_SEARCHES} more" if len(failed) > MAX_FAILED_SEARCHES else ""
        out += [f"_{len(failed)} search(es) failed, so their old configs stay: {shown}{more}._", ""]
    return out


def _reproduce_section(inp: PrInput, omitted: dict[str, int]) -> list[str]:
    """How to reproduce, the CI run, and where the data left out by the cuts (``omitted``) is."""
    out = ["### Reproduce", ""]
    if inp.reproduce_command:
        out += ["```bash", inp.reproduce_command.replace("```", "'''"), "```"]
    else:
        out.append("_No reproduce command was given._")
    out.append("")
    if inp.run_url:
        out += [f"CI run: {inp.run_url}", ""]
    if omitted:
        where = inp.full_data or "the bench result attached to the run"
        parts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in omitted.items())
        out += [f"> [!NOTE]\n> This description was truncated to stay under GitHub's 64 KB limit ({parts} "
                f"not shown). The full data is in {where}; the complete configs and baselines are in this "
                "PR's diff.", ""]
    elif inp.full_data:
        out += [f"Full data: {inp.full_data}", ""]
    return out


def _fits(body: str, max_bytes: int) -> bool:
    return len(body.encode("utf-8")) <= max_bytes


def render_pr(inp: PrInput, max_bytes: int = MAX_BODY_BYTES) -> PrText:
    """Title, body, branch and marker for one GPU's update PR (body <= ``max_bytes`` UTF-8 bytes)."""
    fp_hash = (inp.fingerprint_hash or fingerprint_hash(inp.fingerprint)).lower()
    drift = _drift_dict(inp.drift)
    changes = _what_changed(inp, drift)
    rows = perf_rows(inp.old_baseline, inp.new_baseline)
    diff = diff_config_files(inp.old_configs, inp.new_configs)

    body, omitted = _render_body(inp, fp_hash, drift, changes, rows, diff, None)
    truncated = False
    if not _fits(body, max_bytes):
        truncated = True
        # Largest row limit that fits (rendering is monotone in the limit).
        lo, hi = 0, max(len(changes), len(rows), len(diff.entries))
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand, cand_omitted = _render_body(inp, fp_hash, drift, changes, rows, diff, mid)
            if _fits(cand, max_bytes):
                best = (cand, cand_omitted)
                lo = mid + 1
            else:
                hi = mid - 1
        if best is not None:
            body, omitted = best
        else:
            # Even with no rows it is too long (e.g. a huge reproduce command): hard cut, keep the marker.
            body, omitted = _render_body(inp, fp_hash, drift, changes, rows, diff, 0)
            note = "\n\n_[truncated: the description exceeded GitHub's size limit]_\n"
            room = max_bytes - len(note.encode())
            body = body.encode("utf-8")[:room].decode("utf-8", errors="ignore") + note
            omitted = {**omitted, "bytes": 1}
    return PrText(
        title=pr_title(inp, drift),
        body=body,
        branch=branch_name(inp.gpu_slug, fp_hash),
        fingerprint_hash=fp_hash,
        marker=marker(inp.gpu_slug, fp_hash),
        truncated=truncated,
        omitted=omitted,
    )
