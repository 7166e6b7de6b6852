"""The SSD call as an eager training loop sees it, host included: ``mamba2-guard dev eager-step``'s runs as one
results page per GPU model, ``docs/results/eager-<gpu-slug>.md``.

``baselines/eager/<gpu-slug>.yaml`` cites the runs (files of ``baselines/runs/eager/``) and says what each
measured, since a run records its environment but not which commit or config file served the kernels::

    gpu: NVIDIA H100 80GB HBM3
    note: why these runs were taken
    runs:
      - file: nvidia-h100-80gb-hbm3-2026-12-07-eager-short.json
        note: the code of commit bbae657; the H200 file lent

Each row is one shape (``<shape>@L<n>``: the shape at n tokens) and call (the forward, or the training step:
forward and backward through autograd): the wall medians of ours and mamba-ssm's, their ratio, the device-time
ratio, the host cost (how far the wall ratio falls below the device ratio), and where the run compiled, how our
call under torch.compile compares with our eager one. The training step's targets are judged per row: at least
mamba-ssm's speed in the eager loop, and at the named shapes themselves (no ``@L``) a host cost of at most 5 %.
The compiled column is shown, not judged: a graph of the call alone bears torch.compile's per-graph runtime
wrappers, which a compiled model pays once per step for all its layers.

A cited ``dev module-bench`` run (the whole patched ``Mamba2`` block) gets a section of its own: the block's
device-time ratios against mamba-ssm's, its projections' share, and where it compiled, its training step
eager against torch.compile in the mode the run names, judged: compiled, at least the eager loop's speed.

Pure: plain data in and out; errors name the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mamba2_guard.core.results_page import software_versions

CALLS = {"ssd_combined_fwd": "forward", "ssd_combined_fwd_bwd": "forward + backward"}
STEP = "ssd_combined_fwd_bwd"
HOST_COST_LIMIT = 0.05


@dataclass(frozen=True)
class RunRef:
    file: str
    note: str


@dataclass(frozen=True)
class EagerFile:
    gpu: str
    note: str
    runs: tuple[RunRef, ...]


@dataclass(frozen=True)
class Row:
    shape: str
    call: str  # a key of CALLS
    ours_ms: float | None
    mamba_ssm_ms: float | None
    wall: float | None  # mamba-ssm / ours, wall time
    device: float | None  # the same, device time (CUDA-graph replays)
    host_cost: float | None
    error: str | None = None
    compiled: float | None = None  # our eager wall / ours under torch.compile: above 1, compiling is faster

    @property
    def short(self) -> bool:
        """A shape put at another sequence length (``<shape>@L<n>``), not the zoo's own."""
        return "@L" in self.shape


def _text(raw: Mapping[str, Any], name: str, where: str, required: bool = True) -> str:
    value = raw.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.{name}: expected text, got {value!r}")
    return value.strip()


def parse(doc: Any, where: str) -> EagerFile:
    """An eager file (``yaml.safe_load``'s result); ``where`` names it in errors."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected a mapping with gpu and runs, got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"gpu", "note", "runs"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{where}.runs: expected a list of {{file, note}}, got {runs!r}")
    refs = []
    for i, raw in enumerate(runs):
        at = f"{where}.runs[{i}]"
        if not isinstance(raw, Mapping) or set(raw) - {"file", "note"}:
            raise ValueError(f"{at}: expected a mapping with file and note")
        refs.append(RunRef(_text(raw, "file", at), _text(raw, "note", at)))
    return EagerFile(_text(doc, "gpu", where), _text(doc, "note", where, required=False), tuple(refs))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def rows(report: Any, where: str) -> list[Row]:
    """The rows of one ``dev eager-step`` JSON report, in its order; ``where`` names it in errors."""
    cases = report.get("cases") if isinstance(report, Mapping) else None
    if not isinstance(cases, Mapping):
        raise ValueError(f"{where}: not a dev eager-step report (expected an object with 'cases')")
    out = []
    for shape, calls in cases.items():
        if not isinstance(calls, Mapping):
            raise ValueError(f"{where}: cases.{shape}: expected a mapping of call -> result")
        for call, result in calls.items():
            if call not in CALLS or not isinstance(result, Mapping):
                raise ValueError(f"{where}: cases.{shape}.{call}: expected one of {sorted(CALLS)} with a result")
            if "error" in result:
                out.append(Row(str(shape), call, None, None, None, None, None, str(result["error"])))
                continue
            wall, device = result.get("wall") or {}, result.get("device") or {}
            medians = wall.get("median_ms") or {}
            out.append(Row(str(shape), call, _number(medians.get("helion")), _number(medians.get("mamba_ssm")),
                           _number(wall.get("speedup_vs_mamba_ssm")), _number(device.get("speedup_vs_mamba_ssm")),
                           _number(result.get("host_cost")), compiled=_number(wall.get("compiled_vs_eager"))))
    return out


@dataclass(frozen=True)
class Block:
    """A ``dev module-bench`` run: the whole patched ``Mamba2`` block, its projections included."""

    shape: str
    d_model: int | None
    forward: float | None  # mamba-ssm / ours, device time (CUDA-graph replays) of the block's forward
    step: float | None  # the same, forward + backward
    gemm_share: float | None  # the two projections' share of our block's forward + backward
    mode: str | None  # the torch.compile mode of the compiled step (None: the run did not compile)
    eager_ms: float | None  # our block's training step in an eager loop, host included
    compiled_ms: float | None  # the same under torch.compile
    compiled: float | None  # eager_ms / compiled_ms: above 1, compiling is faster
    compiled_error: str | None = None  # the compiled step's error, where it failed


def is_block_report(report: Any) -> bool:
    """Whether ``report`` is a ``dev module-bench`` report rather than a ``dev eager-step`` one."""
    return isinstance(report, Mapping) and "d_model" in report and "cases" not in report


def block(report: Mapping[str, Any], where: str) -> Block:
    """The ``Block`` of one ``dev module-bench`` JSON report; ``where`` names it in errors."""
    phases = [report.get(phase) for phase in ("fwd", "fwd_bwd")]
    if not all(isinstance(phase, Mapping) for phase in phases) or not isinstance(report.get("shape"), str):
        raise ValueError(f"{where}: not a dev module-bench report (expected shape, fwd and fwd_bwd)")
    forward, step = phases
    compiled = report.get("compiled_step")
    if compiled is not None and not isinstance(compiled, Mapping):
        raise ValueError(f"{where}: compiled_step: expected a mapping, got {type(compiled).__name__}")
    medians = (compiled or {}).get("median_ms") or {}
    d_model = report.get("d_model")
    return Block(report["shape"], d_model if isinstance(d_model, int) and not isinstance(d_model, bool) else None,
                 _number(forward.get("speedup_vs_mamba_ssm")), _number(step.get("speedup_vs_mamba_ssm")),
                 _number((step.get("gemm_share") or {}).get("helion")),
                 None if compiled is None else str(compiled.get("mode") or "default"),
                 _number(medians.get("eager")), _number(medians.get("compiled")),
                 None if compiled is None else _number(compiled.get("compiled_vs_eager")),
                 None if compiled is None or compiled.get("error") is None else str(compiled["error"]))


def block_verdict(run: Block) -> str:
    """The block's target: compiled, a training step at least as fast as the eager loop's."""
    if run.mode is None:
        return "not compiled"
    if run.compiled_error is not None:
        return f"failed: {run.compiled_error}"
    if run.compiled is None:
        return "not measured"
    return f"compiled {run.compiled:.2f}x of eager" if run.compiled < 1.0 else "met"


def verdict(row: Row) -> str:
    """The training step's targets at ``row``: ``met``, or what misses (empty for the forward alone)."""
    if row.call != STEP:
        return ""
    if row.error or row.wall is None:
        return "not measured"
    misses = [f"{row.wall:.2f}x < 1.0x"] if row.wall < 1.0 else []
    if not row.short and (row.host_cost is None or row.host_cost > HOST_COST_LIMIT):
        cost = "unknown" if row.host_cost is None else f"{row.host_cost:.0%} > {HOST_COST_LIMIT:.0%}"
        misses.append(f"host cost {cost}")
    return "; ".join(misses) or "met"


def _fmt(value: float | None, form: str, unit: str = "") -> str:
    return "" if value is None else format(value, form) + unit


def _environment(report: Mapping[str, Any]) -> str:
    fp = report.get("fingerprint") or {}
    versions = software_versions(fp)
    card = str(fp.get("gpu_uuid") or "")[:12]
    return (f"{fp.get('gpu_name') or 'unknown GPU'}" + (f" ({card})" if card else "") + f", {report.get('date', '?')}"
            + (f"; {versions}" if versions else "") + f"; {report.get('rounds', '?')} rounds of "
            + f"{report.get('steps', '?')} calls")


def render(eager: EagerFile, reports: Mapping[str, Mapping[str, Any]], *, source: str,
           order: Sequence[str] = ()) -> str:
    """The page: per cited run, its environment, its note and its rows. ``reports``: file -> report (every
    cited file); ``order``: shape names in the order to list them (others after, as the run lists them)."""
    lines = [f"# Eager training loop, host included: {eager.gpu}", "",
             f"Generated by `docs/results/build.py` from `{source}` and the `dev eager-step` and `dev "
             "module-bench` runs it cites "
             "(`baselines/runs/eager/`); do not edit.", ""]
    if eager.note:
        lines += [eager.note, ""]
    lines += ["Columns: wall = the median of back-to-back calls with one synchronize after them, host work "
              "included (no CUDA graphs); device = the same calls as CUDA-graph replays; ratio = mamba-ssm / "
              "ours; host cost = 1 - wall ratio / device ratio; compiled = our eager wall over ours under "
              "`torch.compile(fullgraph=True, dynamic=True)` (above 1.0x, compiling makes the call faster; empty "
              "where the run did not compile; not judged: a graph of the call alone bears torch.compile's per-graph "
              "runtime wrappers, which a compiled model pays once per step for all its layers, so the compile "
              "target is judged on a whole block). The training step's targets: >= 1.0x in the eager loop at every "
              f"shape, and a host cost of at most {HOST_COST_LIMIT:.0%} at the named shapes themselves "
              "(`<shape>@L<n>` is the shape at n tokens).", ""]
    rank = {name: i for i, name in enumerate(order)}
    for ref in eager.runs:
        report = reports[ref.file]
        if is_block_report(report):
            lines += _block_section(ref, report)
            continue
        table = sorted(rows(report, ref.file), key=lambda r: (rank.get(r.shape.split("@")[0], len(rank)),
                                                               r.shape.split("@")[0], r.short, r.shape))
        lines += [f"## `{ref.file}`", "", f"{_environment(report)}. {ref.note}", "",
                  "| shape | call | ours ms | mamba-ssm ms | wall | device | host cost | compiled | step targets |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in table:
            if row.error:
                lines.append(f"| `{row.shape}` | {CALLS[row.call]} | failed: {row.error} |  |  |  |  |  | "
                             f"{verdict(row)} |")
                continue
            cells = (_fmt(row.ours_ms, ".3f"), _fmt(row.mamba_ssm_ms, ".3f"), _fmt(row.wall, ".2f", "x"),
                     _fmt(row.device, ".2f", "x"), _fmt(row.host_cost, ".0%"), _fmt(row.compiled, ".2f", "x"),
                     verdict(row))
            lines.append(f"| `{row.shape}` | {CALLS[row.call]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _block_section(ref: RunRef, report: Mapping[str, Any]) -> list[str]:
    run = block(report, ref.file)
    cells = (f"`{run.shape}`", _fmt(run.d_model, "d"), _fmt(run.forward, ".2f", "x"), _fmt(run.step, ".2f", "x"),
             _fmt(run.gemm_share, ".0%"), f"`{run.mode}`" if run.mode else "", _fmt(run.eager_ms, ".3f"),
             _fmt(run.compiled_ms, ".3f"), _fmt(run.compiled, ".2f", "x"), block_verdict(run))
    return [f"## `{ref.file}`: the whole `Mamba2` block", "", f"{_environment(report)}. {ref.note}", "",
            "A patched `Mamba2` block (`dev module-bench`): forward and forward + backward as device time against "
            "mamba-ssm's block (ratio = mamba-ssm / ours), the share of its two projections, and where the run "
            "compiled, our block's training step in an eager loop, host included, eager against torch.compile "
            "in the mode named. Target: compiled, at least the eager loop's speed.", "",
            "| shape | d_model | forward | fwd + bwd | GEMMs' share | compile mode | eager step ms | compiled step ms "
            "| compiled | block target |", "|---|---|---|---|---|---|---|---|---|---|",
            "| " + " | ".join(cells) + " |", ""]
