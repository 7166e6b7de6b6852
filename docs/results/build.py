"""Generate ``docs/results/<slug>.md`` and its chart ``<slug>-speedups.svg`` from each ``baselines/<slug>.yaml``,
``docs/results/bringup-<slug>.md`` and its chart from each ``baselines/bringup/<slug>.yaml`` (the anytime curve
of a bring-up with the GPU's file withheld, from the bench runs it cites), ``docs/results/eager-<slug>.md``
from each ``baselines/eager/<slug>.yaml`` (the SSD call in an eager loop, host included, from the ``dev
eager-step`` runs it cites), and ``docs/results/traffic.md`` (launches and modelled bytes per call) from the
registry's traffic model.

    python docs/results/build.py           # (re)write every page
    python docs/results/build.py --check   # exit 1, naming the stale page, when a committed page differs (CI)

The rendering is ``mamba2_guard.core.results_page``, ``.bringup_curve`` and ``.eager_table`` (pure); this file reads the
baselines, maps each case's ``recorded_at`` to the raw run in ``baselines/runs/`` whose ``started_at`` it is,
reads the tuned shapes (suites ``default`` and ``zoo-fit`` of ``mamba2_kernels/suites.yaml``), the steered
(``zoo-steered``) and the held-out ones (``heldout-wide``), and the first calls
(``baselines/first-call/<slug>.yaml``), and writes or compares the pages. The chart (``adapters.charts``,
matplotlib) is compared by the digest of the data it was drawn from, which it carries.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mamba2_guard.adapters import charts  # noqa: E402
from mamba2_guard.core import bringup_curve, eager_table, traffic_table  # noqa: E402
from mamba2_guard.core.results_page import (  # noqa: E402
    call_speedups,
    case_speedup,
    render,
    shape_classes,
    software_versions,
)
from mamba2_guard.flows.baselines import read_first_calls, read_result  # noqa: E402
from mamba2_kernels.files import load_yaml  # noqa: E402

WHOLE_CALL = "ssd_combined_fwd_bwd"

STARTED_AT = re.compile(r'"started_at":\s*"([^"]+)"')


def run_files(runs_dir: Path, slug: str) -> dict[str, str]:
    """recorded_at -> file name, for the bench results ``<slug>-*.json`` in ``runs_dir`` (their header only)."""
    found: dict[str, str] = {}
    for path in sorted(runs_dir.glob(f"{slug}-*.json")):
        with path.open(errors="replace") as fh:
            head = fh.read(1 << 16)
        match = STARTED_AT.search(head)
        if match and match.group(1) not in found:
            found[match.group(1)] = path.name
    return found


def suite_lists(root: Path) -> dict[str, list[str]]:
    """The suites of ``mamba2_kernels/suites.yaml`` by name, as listed (``default`` and ``zoo-fit``: tuned;
    ``zoo-steered``: steered; ``heldout-wide``: held out); none without the file."""
    suites = root / "mamba2_kernels" / "suites.yaml"
    if not suites.is_file():
        return {}
    data = yaml.safe_load(suites.read_text()) or {}
    return {name: list(members or []) for name, members in (data.get("suites") or {}).items()}


def pages(root: Path) -> tuple[dict[Path, str], dict[Path, tuple[Callable, dict, str]]]:
    """The pages (path -> text) and their charts (path -> (drawing function, data, title)). ValueError naming
    the file where a bring-up curve file or a run it cites is malformed or missing."""
    out: dict[Path, str] = {}
    drawn: dict[Path, tuple[Callable, dict, str]] = {}
    lists = suite_lists(root)
    tuned = lists.get("default", []) + lists.get("zoo-fit", [])
    steered, heldout = lists.get("zoo-steered", []), lists.get("heldout-wide", [])
    baselines: dict[str, dict] = {}  # slug -> baseline document, read once: a bring-up curve's yardstick too
    for baseline in sorted((root / "baselines").glob("*.yaml")):
        slug = baseline.stem
        data = baselines[slug] = yaml.safe_load(baseline.read_text()) or {}
        first_calls = read_first_calls(root / "baselines" / "first-call" / baseline.name)
        series = call_speedups(data, tuned, heldout, first_calls, steered_shapes=steered)
        chart = f"{slug}-speedups.svg" if series else None
        if chart:
            gpu = (data.get("fingerprint") or {}).get("gpu_name") or slug
            drawn[root / "docs" / "results" / chart] = (charts.speedup_bars, series,
                                                        f"{gpu}: speedup against mamba-ssm per shape")
        out[root / "docs" / "results" / f"{slug}.md"] = render(
            data, slug, runs=run_files(root / "baselines" / "runs", slug), tuned_shapes=tuned, heldout_shapes=heldout,
            source=f"baselines/{baseline.name}", first_calls=first_calls, chart=chart, steered_shapes=steered)
    zoo = [s for suite in ("zoo-fit", "zoo-steered") for s in lists.get(suite, [])]
    for curve_file in sorted((root / "baselines" / "bringup").glob("*.yaml")):
        page, chart = bringup_page(root, curve_file, lists.get("default", []), zoo, baselines.get(curve_file.stem))
        out[root / "docs" / "results" / f"bringup-{curve_file.stem}.md"] = page
        drawn[root / "docs" / "results" / f"bringup-{curve_file.stem}.svg"] = chart
    for eager_file in sorted((root / "baselines" / "eager").glob("*.yaml")):
        out[root / "docs" / "results" / f"eager-{eager_file.stem}.md"] = eager_page(root, eager_file, [*tuned, *zoo])
    out[root / "docs" / "results" / "traffic.md"] = traffic_page(root, shape_classes(tuned, heldout, steered))
    return out, drawn


def read_source(root: Path, path: Path) -> tuple[str, object]:
    """A page's source file under ``baselines/``: its name from ``root`` (what errors say) and its YAML."""
    source = str(path.relative_to(root))
    try:
        return source, load_yaml(path)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}".splitlines()[0]) from None


def cited_run(root: Path, runs: str, name: str, source: str) -> Path:
    """The run ``name`` of ``baselines/runs/<runs>/`` that ``source`` cites; ValueError where it is not there."""
    path = root / "baselines" / "runs" / runs / name
    if not path.is_file():
        raise ValueError(f"{source}: cites {name}, which is not in baselines/runs/{runs}/")
    return path


def read_cited_json(root: Path, runs: str, name: str, source: str) -> object:
    """The JSON of the run ``name`` of ``baselines/runs/<runs>/`` that ``source`` cites (``cited_run``);
    ValueError naming it where it is not valid JSON."""
    path = cited_run(root, runs, name, source)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"baselines/runs/{runs}/{name}: not valid JSON ({exc})") from None


def eager_page(root: Path, eager_file: Path, order: list[str]) -> str:
    """The eager-loop page of ``eager_file`` from the ``dev eager-step`` runs it cites
    (``mamba2_guard.core.eager_table``)."""
    source, doc = read_source(root, eager_file)
    eager = eager_table.parse(doc, source)
    reports = {ref.file: read_cited_json(root, "eager", ref.file, source) for ref in eager.runs}
    return eager_table.render(eager, reports, source=source, order=order)


def whole_call_speedups(path: Path) -> tuple[dict[str, float], dict]:
    """shape -> the whole call's speedup in the bench result ``path``, and the result's fingerprint."""
    result = read_result(path)
    return ({c.shape: c.speedup for c in result.cases if c.kernel == WHOLE_CALL and c.speedup},
            result.fingerprint)


def bringup_page(root: Path, curve_file: Path, suite: list[str], zoo: list[str], baseline: dict | None
                 ) -> tuple[str, tuple[Callable, dict, str]]:
    """The anytime-curve page of ``curve_file`` and its chart (``mamba2_guard.core.bringup_curve``);
    ``baseline``: the GPU's baseline document (None: it has none), the yardstick where the curve names no runs."""
    source, doc = read_source(root, curve_file)
    curves = bringup_curve.parse(doc, source)
    cited = dict.fromkeys([*(r for c in curves.curves for p in c.points for r in p.runs), *curves.yardstick_runs])
    by_run, prints = {}, []
    for run in cited:
        by_run[run], fingerprint = whole_call_speedups(cited_run(root, "bringup", run, source))
        prints.append(fingerprint)
    if curves.yardstick_runs:
        yardstick = bringup_curve.merged_speedups(curves.yardstick_runs, by_run)
    elif baseline is None:
        raise ValueError(f"{source}: the yardstick names no runs, and there is no baselines/{curve_file.stem}.yaml")
    else:
        results = (baseline.get("results") or {}).get(WHOLE_CALL, {})
        yardstick = {shape: x for shape, case in results.items() if (x := case_speedup(case)) is not None}
    evidence = dict.fromkeys(p.carried.evidence for c in curves.curves for p in c.points if p.carried)
    unchanged = {name: bringup_curve.unchanged_shapes(read_cited_json(root, "bringup", name, source),
                                                      f"baselines/runs/bringup/{name}") for name in evidence}
    speedups = [bringup_curve.with_carried(c, [bringup_curve.merged_speedups(p.runs, by_run) for p in c.points],
                                           unchanged, source, i) for i, c in enumerate(curves.curves)]
    versions = "; ".join(sorted({software_versions(fp) for fp in prints}))
    gpus = sorted({str(fp.get("gpu_uuid", ""))[:12] for fp in prints if fp.get("gpu_uuid")})
    environment = (f"The runs name {versions}" + (f", on the cards {', '.join(gpus)}" if gpus else "") + "."
                   if versions else "")
    chart = f"bringup-{curve_file.stem}.svg"
    page = bringup_curve.render(curves, speedups, yardstick, slug=curve_file.stem, source=source,
                                suite_shapes=suite, zoo_shapes=zoo, chart=chart, versions=environment)
    data = bringup_curve.chart_data(curves, speedups, yardstick, [*suite, *zoo], zoo)
    return page, (charts.anytime_curves, data, f"{curves.gpu}, file withheld: the anytime curve")


def traffic_page(root: Path, classes: list[tuple[str, list[str]]]) -> str:
    """The launches-and-bytes page at the shapes of ``classes`` (``results_page.shape_classes``: each shape
    labelled held out, steered or tuned), by ``mamba2_guard.core.traffic_table``."""
    import dataclasses

    from mamba2_kernels import suites
    from mamba2_kernels.registry.calls import call_traffic

    loaded = suites.load(root / "mamba2_kernels" / "suites.yaml")
    labelled = [(name, label) for label, members in reversed(classes) for name in members]  # tuned first
    rows = [{"shape": name, "label": label, "call": call,
             **dataclasses.asdict(call_traffic(loaded.shape(name), backward))}
            for call, backward in zip(traffic_table.CALLS, (False, True), strict=True) for name, label in labelled]
    return traffic_table.render(rows, "the traffic model of `mamba2_kernels/registry` at the shapes of "
                                "`mamba2_kernels/suites.yaml`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        generated, drawn = pages(root)
    except ValueError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = [str(path.relative_to(root)) for path, (_, data, _) in drawn.items()
                 if charts.drawn_from(path) != charts.digest(data)]
        for path, text in generated.items():
            current = path.read_text() if path.exists() else ""
            if current != text:
                name = path.relative_to(root)
                diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(name), "generated",
                                            lineterm="")
                print("\n".join(list(diff)[:40]))
                stale.append(str(name))
        if stale:
            for name in stale:
                print(f"{name} is stale: run `python docs/results/build.py` and commit it", file=sys.stderr)
            return 1
        print(f"{len(generated)} results page(s) and {len(drawn)} chart(s) up to date")
        return 0
    for path, text in generated.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(root)}")
    for path, (draw, data, title) in drawn.items():
        draw(data, title, path)
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
