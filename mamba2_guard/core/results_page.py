"""The results page of one GPU model: ``docs/results/<slug>.md`` from ``baselines/<slug>.yaml``.

Pure: the baseline document as plain data (what ``yaml.safe_load`` gives) in, Markdown text out; no file,
GPU or clock access. ``docs/results/build.py`` reads the files and writes (or ``--check``s) the pages.

Rows are grouped by suite when the baseline's cases say which suite they belong to (a ``suite`` field),
otherwise by shape. A case is held out when its ``heldout`` field is true or its suite's name says so
(``heldout``, ``held-out``); held-out groups come first, as they are the claim: the configs were not tuned
on them, and no change was decided on their numbers. Steered shapes were never tuned on either, but were
benched to decide changes, so they count as tuned and are labelled apart. Within a group, whole calls and
the layer (phases ``call_*`` and ``layer_*``) come first, then the kernels by name. Each row names its run:
the file under ``baselines/runs/`` when the caller maps the case's ``recorded_at`` to one, else the
``recorded_at`` itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

HELDOUT_SUITE_WORDS = ("heldout", "held-out", "held_out")
COMPOSITE_PREFIXES = ("call_", "layer_")
FINGERPRINT_FIELDS = (("gpu_name", "GPU"), ("compute_capability", "compute capability"), ("sm_count", "SMs"),
                      ("driver_version", "driver"), ("cuda_runtime", "CUDA"), ("torch", "torch"),
                      ("triton", "triton"), ("helion", "helion"), ("mamba_ssm", "mamba-ssm"),
                      ("python", "python"), ("kernels_source_hash", "kernel source hash"))
# The software a measurement names beside its numbers, wherever a page cites runs (the bring-up and eager pages).
SOFTWARE_FIELDS = (("driver_version", "driver"), ("torch", "torch"), ("triton", "triton"), ("helion", "helion"),
                   ("mamba_ssm", "mamba-ssm"))
HEADER = ("| kernel | phase | ours ms | mamba-ssm ms | speedup | roofline | precision | "
          "max rel err vs fp64 (ours / mamba-ssm) | timing | run |")
RULE = "|---|---|--:|--:|--:|--:|---|---|---|---|"


def is_composite(phase: str | None) -> bool:
    return bool(phase) and str(phase).startswith(COMPOSITE_PREFIXES)


def is_heldout(case: Mapping[str, Any], shape: str = "", heldout_shapes: Iterable[str] = ()) -> bool:
    if case.get("heldout") is True or shape in heldout_shapes:
        return True
    suite = str(case.get("suite") or "").lower()
    return any(word in suite for word in HELDOUT_SUITE_WORDS)


def _median(side: Any) -> float | None:
    if isinstance(side, Mapping):
        value = side.get("median_ms")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value >= 0.1 else f"{value:.4f}"


def software_versions(fingerprint: Mapping[str, Any]) -> str:
    """``driver ..., torch ..., ...``: the ``SOFTWARE_FIELDS`` that ``fingerprint`` has."""
    return ", ".join(f"{name} {fingerprint[key]}" for key, name in SOFTWARE_FIELDS if fingerprint.get(key))


def case_speedup(case: Mapping[str, Any]) -> float | None:
    """A baseline case's speedup against mamba-ssm: its recorded one, else the ratio of the two medians; None
    where it has neither."""
    value = case.get("speedup_vs_mamba_ssm")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    ours, theirs = _median(case.get("helion")), _median(case.get("mamba_ssm"))
    if ours and theirs:
        return theirs / ours
    return None


def _precision(case: Mapping[str, Any]) -> tuple[str, str]:
    precision = case.get("precision")
    if not isinstance(precision, Mapping):
        return "n/a", "n/a"
    passed = precision.get("allclose") is True and precision.get("finite") is not False
    verdict = "pass" if passed else "FAIL"

    def err(key: str) -> str:
        value = precision.get(key)
        return f"{value:.1e}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"

    return verdict, f"{err('max_rel_err_vs_fp64')} / {err('mamba_ssm_max_rel_err_vs_fp64')}"


def _run(case: Mapping[str, Any], runs: Mapping[str, str]) -> str:
    recorded = str(case.get("recorded_at") or "")
    name = runs.get(recorded)
    if name:
        return f"[`{name}`](../../baselines/runs/{name})"
    return f"recorded {recorded}" if recorded else "n/a"


def _order(item: tuple[str, Mapping[str, Any]]) -> tuple[int, str, str]:
    kernel, case = item
    phase = str(case.get("phase") or "")
    return (0 if is_composite(phase) else 1, phase if is_composite(phase) else "", kernel)


def row(kernel: str, case: Mapping[str, Any], runs: Mapping[str, str]) -> str:
    speedup = case_speedup(case)
    roofline = case.get("roofline_fraction")
    verdict, errs = _precision(case)
    cells = [
        f"`{kernel}`",
        str(case.get("phase") or "n/a"),
        _ms(_median(case.get("helion"))),
        _ms(_median(case.get("mamba_ssm"))),
        f"{speedup:.2f}x" if speedup is not None else "n/a",
        f"{100 * roofline:.0f} %" if isinstance(roofline, (int, float)) and not isinstance(roofline, bool) else "n/a",
        verdict,
        errs,
        str(case.get("timing_method") or "n/a"),
        _run(case, runs),
    ]
    return "| " + " | ".join(cells) + " |"


def _rank(order: list[str]):
    return lambda name: (order.index(name) if name in order else len(order), name)


def groups(results: Mapping[str, Mapping[str, Mapping[str, Any]]],
           order: Iterable[str] = (), heldout_shapes: Iterable[str] = ()) -> list[tuple[str, str, bool, list]]:
    """[(kind, name, heldout, [(kernel, shape, case)])]: by suite when every case names one, else by shape;
    held-out groups (``heldout_shapes`` among them) first, then in ``order`` (others after, by name)."""
    heldout_shapes = set(heldout_shapes)
    rank = _rank(list(order))
    cases = [(kernel, shape, case) for kernel, by_shape in results.items() for shape, case in by_shape.items()]
    by_suite = bool(cases) and all(case.get("suite") for _, _, case in cases)
    found: dict[tuple[str, bool], list] = {}
    for kernel, shape, case in cases:
        name = str(case["suite"]) if by_suite else shape
        found.setdefault((name, is_heldout(case, shape, heldout_shapes)), []).append((kernel, shape, case))
    kind = "suite" if by_suite else "shape"
    return [(kind, name, heldout, found[(name, heldout)])
            for name, heldout in sorted(found, key=lambda k: (not k[1], rank(k[0])))]


def _table(items: Iterable[tuple[str, Mapping[str, Any]]], runs: Mapping[str, str]) -> list[str]:
    return [HEADER, RULE, *(row(kernel, case, runs) for kernel, case in sorted(items, key=_order))]


def _composite_kernels(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The whole calls and the layer among the baseline's kernels, by phase."""
    composite = {k for k, by_shape in results.items() if any(is_composite(c.get("phase")) for c in by_shape.values())}
    return sorted(composite, key=lambda k: (str(next(iter(results[k].values())).get("phase")), k))


def _headline(results: Mapping[str, Mapping[str, Mapping[str, Any]]], order: list[str]) -> list[str]:
    composite = _composite_kernels(results)
    shapes = sorted({shape for by_shape in results.values() for shape in by_shape}, key=_rank(order))
    if not composite or not shapes:
        return []
    lines = ["| speedup vs mamba-ssm | " + " | ".join(shapes) + " |", "|---|" + "--:|" * len(shapes)]
    for kernel in composite:
        cells = []
        for shape in shapes:
            case = results[kernel].get(shape)
            speedup = case_speedup(case) if case is not None else None
            cells.append(f"{speedup:.2f}x" if speedup is not None else "n/a")
        lines.append(f"| `{kernel}` | " + " | ".join(cells) + " |")
    return lines


def shape_classes(tuned: Iterable[str], heldout: Iterable[str], steered: Iterable[str]) -> list[tuple[str, list[str]]]:
    """[(class, its shapes in order)]: held out, steered (when any), tuned; a shape in one class only, the first
    that names it."""
    out, taken = [], set()
    for name, shapes in (("held out", heldout), ("steered", steered), ("tuned", tuned)):
        members = [s for s in dict.fromkeys(shapes) if s not in taken]
        taken.update(members)
        if members or name != "steered":
            out.append((name, members))
    return out


def _label(shape: str, classes: list[tuple[str, list[str]]]) -> str:
    return next((f" ({name})" for name, members in classes if shape in members), "")


def _group_means(results: Mapping[str, Mapping[str, Mapping[str, Any]]],
                 classes: list[tuple[str, list[str]]]) -> list[str]:
    """Per whole call and layer, the geometric mean of the speedups over each class of shapes (held out,
    steered, tuned), each with its range and the number of shapes with a row: the claim and what tuning
    reaches."""
    heldout = classes[0][1]
    lines = []
    for kernel in _composite_kernels(results):
        cells = []
        for _, member in classes:
            speedups = [x for shape, c in results[kernel].items()
                        if shape in member and (x := case_speedup(c)) is not None]
            cells.append(f"{statistics.geometric_mean(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}x; "
                         f"{len(speedups)})" if speedups else "n/a")
        lines.append(f"| `{kernel}` | " + " | ".join(cells) + " |")
    if not lines or not heldout:
        return []
    return ["| geometric mean of the speedups (range; shapes) | " + " | ".join(name for name, _ in classes) + " |",
            "|---|" + "--:|" * len(classes), *lines]


def _first_call_table(first_calls: Mapping[str, Mapping[str, Any]], classes: list[tuple[str, list[str]]]
                      ) -> list[str]:
    """The first calls (``mamba2_guard.core.first_calls``), held-out shapes first, then by class."""
    rank = _rank([s for _, members in classes for s in members])
    lines = ["| shape | entries | ours s | mamba-ssm s | ours / mamba-ssm | compile caches | measured | run |",
             "|---|---|--:|--:|--:|---|---|---|"]
    for shape in sorted(first_calls, key=rank):
        rec = first_calls[shape]
        label = f"`{shape}`" + _label(shape, classes)
        log = rec.get("log")
        lines.append(f"| {label} | {', '.join(rec['entries'])} | {rec['helion_s']:.1f} | {rec['mamba_ssm_s']:.1f} | "
                     f"{rec['helion_s'] / rec['mamba_ssm_s']:.2f} | {rec['caches']} | {str(rec['measured_at'])[:10]} | "
                     + (f"[`{log}`](../../baselines/runs/{log})" if log else "n/a") + " |")
    return lines


FIRST_CALL_PANEL = "first call (mamba-ssm's seconds / ours)"


def call_speedups(baseline: Mapping[str, Any], tuned_shapes: Iterable[str], heldout_shapes: Iterable[str],
                  first_calls: Mapping[str, Mapping[str, Any]] | None = None, steered_shapes: Iterable[str] = ()
                  ) -> dict[str, list[tuple[str, str, float]]]:
    """The chart's data: per whole call and layer, (shape, "held out", "steered" or "tuned", speedup) at every
    such shape that has a speedup, held-out shapes first, each class in the suites' order; with
    ``first_calls``, a last panel of the first calls' speedups (mamba-ssm's seconds over ours) likewise."""
    results = baseline.get("results") or {}
    groups = shape_classes(tuned_shapes, heldout_shapes, steered_shapes)
    out = {}
    for kernel in _composite_kernels(results):
        points = [(shape, group, x) for group, shapes in groups for shape in shapes
                  if shape in results[kernel] and (x := case_speedup(results[kernel][shape])) is not None]
        if points:
            out[kernel] = points
    firsts = [(shape, group, round(rec["mamba_ssm_s"] / rec["helion_s"], 4)) for group, shapes in groups
              for shape in shapes if (rec := (first_calls or {}).get(shape)) and rec.get("helion_s")]
    if firsts:
        out[FIRST_CALL_PANEL] = firsts
    return out


def render(baseline: Mapping[str, Any], gpu_slug: str, *, runs: Mapping[str, str] | None = None,
           tuned_shapes: Iterable[str] = (), heldout_shapes: Iterable[str] = (), source: str | None = None,
           first_calls: Mapping[str, Mapping[str, Any]] | None = None, chart: str | None = None,
           steered_shapes: Iterable[str] = ()) -> str:
    """The page. ``runs`` maps a case's ``recorded_at`` to the run file it came from; ``tuned_shapes`` are
    the shapes the stored configs may have been tuned at, ``heldout_shapes`` those never tuned or fitted on (the
    claim), ``steered_shapes`` those never tuned on but benched to decide changes (they count as tuned);
    ``source`` is the baseline's path as the page cites it; ``first_calls`` the GPU's first-call records
    (``mamba2_guard.core.first_calls``), if any; ``chart`` the file name of the speedup chart beside the page
    (drawn from ``call_speedups``), if any."""
    runs = dict(runs or {})
    tuned = list(dict.fromkeys(tuned_shapes))
    classes = shape_classes(tuned, heldout_shapes, steered_shapes)
    steered = dict(classes).get("steered", [])
    source = source or f"baselines/{gpu_slug}.yaml"
    results = baseline.get("results") or {}
    fingerprint = baseline.get("fingerprint") or {}
    title = fingerprint.get("gpu_name") or gpu_slug
    out = [f"# Results: {title}", "",
           f"Generated by `python docs/results/build.py` from `{source}`; do not edit by hand (CI runs "
           "`python docs/results/build.py --check`).", ""]
    env = [f"{label} {fingerprint[key]}" for key, label in FINGERPRINT_FIELDS if fingerprint.get(key) is not None]
    if env:
        out += ["Environment: " + ", ".join(env) + ".", ""]
    peaks = baseline.get("device_peaks") or {}
    copy_bw, flops = peaks.get("copy_bytes_per_s"), peaks.get("bf16_matmul_flops_per_s")
    if isinstance(copy_bw, (int, float)) and isinstance(flops, (int, float)):
        out += [f"Measured peaks (the roofline's denominators): copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul "
                f"{flops / 1e12:.0f} TFLOP/s" + (f" ({peaks['method']})" if peaks.get("method") else "") + ".", ""]
    out += ["Columns: medians of the interleaved, L2-flushed timing rounds (device time) of ours (Helion) and "
            "mamba-ssm in one process; speedup = mamba-ssm / ours; roofline = the fraction of the device's "
            "measured peak the case reaches (bytes or FLOPs, whichever bounds it); precision = allclose "
            "against mamba-ssm and fp64 and finite; timing = `eager` (CUDA events around each call) or "
            "`cuda-graph` (graph replays); run = the raw bench result the row was taken from.", ""]
    all_groups = groups(results, [s for _, members in classes for s in members], heldout_shapes)
    heldout = [g for g in all_groups if g[2]]
    out += ["## Which shapes are the claim", ""]
    if tuned:
        out += ["The stored configs (`mamba2_kernels/configs/" + gpu_slug + ".yaml`) were tuned at shapes among "
                + ", ".join(f"`{s}`" for s in tuned) + "."]
    if steered:
        out += ["The steered shapes (" + ", ".join(f"`{s}`" for s in steered) + ") were never tuned on, but were "
                "benched to decide kernel changes: they count as tuned, not as the claim."]
    if heldout:
        out += ["Held-out groups (" + ", ".join(f"`{g[1]}`" for g in heldout) + ") were not tuned on: they are "
                "the claim, and come first. The tuned shapes show what tuning reaches."]
    elif classes[0][1]:
        out += ["The held-out shapes (" + ", ".join(f"`{s}`" for s in classes[0][1]) + ") have no rows yet: they "
                "are measured once, at the end of the work they judge. Every row below is at a tuned or steered "
                "shape, so it shows what tuning reaches there, not what a new shape gets."]
    else:
        out += ["This baseline has no held-out shapes yet: every row below is at a shape the configs were tuned "
                "at, so it shows what tuning reaches there, not what a new shape gets."]
    out += [""]
    headline = _headline(results, tuned)
    if headline:
        out += ["## Whole calls and the layer", ""]
        if chart:
            out += [f"![Speedup against mamba-ssm per shape, held-out shapes apart, and of the first call]({chart})",
                    ""]
        out += [*headline, ""]
        means = _group_means(results, classes)
        if means:
            out += [*means, ""]
    if first_calls:
        out += ["## First call at a shape", "",
                "The seconds of a training job's first call of the entries, each side in a fresh process, ours "
                "compiling the configs it selects and mamba-ssm's autotuning (`mamba2-guard dev first-call "
                f"--record`, kept in `baselines/first-call/{gpu_slug}.yaml`); `empty` compile caches are a machine "
                "that never ran the shape.", "", *_first_call_table(first_calls, classes), ""]
    for kind, name, is_held, items in all_groups:
        label = f"{kind} `{name}`" + (" (held out)" if is_held else _label(name, classes))
        out += [f"## {label[0].upper()}{label[1:]}", ""]
        if kind == "suite":
            for shape in sorted({shape for _, shape, _ in items}, key=_rank(tuned)):
                out += [f"### Shape `{shape}`", "",
                        *_table([(k, c) for k, s, c in items if s == shape], runs), ""]
        else:
            out += [*_table([(k, c) for k, _, c in items], runs), ""]
    cited = sorted({str(c["recorded_at"]) for by_shape in results.values() for c in by_shape.values()
                    if c.get("recorded_at")})
    if cited:
        out += ["## Runs", "", "| recorded at | raw result |", "|---|---|"]
        out += [f"| {t} | " + (f"`baselines/runs/{runs[t]}`" if t in runs else "not kept in baselines/runs/")
                + " |" for t in cited]
        out += [""]
    return "\n".join(out)
