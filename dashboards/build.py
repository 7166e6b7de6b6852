"""Generate ``dashboards/mamba2-guard.json`` with grafana-foundation-sdk.

    python dashboards/build.py           # (re)write the JSON
    python dashboards/build.py --check   # exit 1 when the committed JSON is stale (CI)
    python dashboards/build.py --stdout  # print it

Every PromQL expression lives in this file. ``tests/guard/infra/test_prometheus.py`` runs each one, with the
template variables set to "All", against a real Prometheus scraping a guard and fails on any that
returns no data, so a renamed metric cannot leave a dead panel behind.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "mamba2-guard.json"
UID = "mamba2-guard"
DS = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'modelName=~"$gpu", kernel=~"$kernel", shape=~"$shape"'
GPU = 'modelName=~"$gpu"'


def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> prom_b.Dataquery:
    query = prom_b.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        query = query.legend_format(legend)
    if instant:
        query = query.instant()
    if table:
        query = query.format(prom_m.PromQueryFormat.TABLE)
    return query


def thresholds(*steps: tuple[float | None, str]) -> dash_b.ThresholdsConfig:
    return (dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE)
            .steps([dash_m.Threshold(value=v, color=c) for v, c in steps]))


def timeseries(title: str, description: str, unit: str, *targets: prom_b.Dataquery, w: int = 12) -> ts_b.Panel:
    panel = (ts_b.Panel().title(title).description(description).datasource(DS).unit(unit).height(8).span(w)
             .legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.TABLE)
                     .placement(common_m.LegendPlacement.BOTTOM).show_legend(True))
             .show_points(common_m.VisibilityMode.AUTO))
    for t in targets:
        panel = panel.with_target(t)
    return panel


def stat(title: str, description: str, unit: str, target: prom_b.Dataquery, steps, w: int = 6) -> stat_b.Panel:
    return (stat_b.Panel().title(title).description(description).datasource(DS).unit(unit).height(6).span(w)
            .with_target(target).thresholds(thresholds(*steps))
            .color_mode(common_m.BigValueColorMode.BACKGROUND)
            .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def table(title: str, description: str, target: prom_b.Dataquery, exclude: list[str], w: int = 12) -> table_b.Panel:
    organize = dash_m.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {name: True for name in exclude}, "renameByName": {}})
    return (table_b.Panel().title(title).description(description).datasource(DS).height(8).span(w)
            .with_target(target).with_transformation(organize))


def variable(name: str, label: str, query: str) -> dash_b.QueryVariable:
    return (dash_b.QueryVariable(name).label(label).datasource(DS).query(query)
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


ANNOTATIONS = (
    ("Drift", "drift", "orange", "environment drift detected"),
    ("Re-tune", "retune", "purple", "re-tune started"),
    ("Config PR", "pr", "blue", "config pull request opened or updated"),
)


def annotation(name: str, event: str, color: str) -> dash_b.AnnotationQuery:
    return (dash_b.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(color)
            .expr(f'max(mamba2_guard_last_event_timestamp_seconds{{event="{event}"}}) * 1000'))


def build() -> dict[str, Any]:
    d = (dash_b.Dashboard("mamba2-guard").uid(UID).tags(["mamba2-guard", "helion", "gpu"])
         .description("Helion Mamba-2 kernels vs mamba-ssm: latency, speedup, precision, roofline, drift, run health")
         .refresh("1m").time("now-30d", "now").timezone("utc").editable()
         .tooltip(dash_m.DashboardCursorSync.CROSSHAIR))
    d = d.with_variable(dash_b.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    d = d.with_variable(variable("gpu", "GPU model", "label_values(mamba2_guard_env_info, modelName)"))
    d = d.with_variable(variable(
        "kernel", "Kernel", f"label_values(mamba2_guard_kernel_latency_seconds{{{GPU}}}, kernel)"))
    d = d.with_variable(variable(
        "shape", "Shape", f'label_values(mamba2_guard_kernel_latency_seconds{{{GPU}, kernel=~"$kernel"}}, shape)'))
    for name, event, color, _ in ANNOTATIONS:
        d = d.annotation(annotation(name, event, color))

    d = d.with_row(dash_b.Row("Speed"))
    d = d.with_panel(timeseries(
        "Latency (median): Helion vs mamba-ssm", "Median per-call latency of the last nightly, per implementation.",
        "s", q(f'mamba2_guard_kernel_latency_seconds{{quantile="0.5", {SEL}}}',
               "{{impl}} {{kernel}} {{shape}} ({{modelName}})")))
    d = d.with_panel(timeseries(
        "Speedup vs mamba-ssm", "mamba-ssm time / Helion time (median of paired rounds); above 1 = Helion faster.",
        "none", q(f"mamba2_guard_speedup_ratio{{{SEL}}}", "{{kernel}} {{shape}} ({{modelName}})")))
    d = d.with_panel(timeseries(
        "Helion latency spread (p10..p90)", "Spread of Helion's samples: a widening band means noisy measurements.",
        "s", q(f'mamba2_guard_kernel_latency_seconds{{impl="helion", quantile="0.1", {SEL}}}',
               "p10 {{kernel}} {{shape}}", "A"),
        q(f'mamba2_guard_kernel_latency_seconds{{impl="helion", quantile="0.9", {SEL}}}',
          "p90 {{kernel}} {{shape}}", "B")))
    d = d.with_panel(timeseries(
        "Roofline utilization", "Roofline-bound time / achieved time: how close each kernel is to the hardware limit.",
        "percentunit", q(f"mamba2_guard_roofline_utilization_ratio{{{SEL}}}", "{{kernel}} {{shape}} ({{modelName}})")))

    d = d.with_row(dash_b.Row("Precision"))
    d = d.with_panel(timeseries(
        "Abs diff vs mamba-ssm", "Max and mean absolute difference of Helion's outputs from mamba-ssm's.", "none",
        q(f"mamba2_guard_precision_abs_diff{{{SEL}}}", "{{stat}} {{kernel}} {{shape}}")))
    d = d.with_panel(timeseries(
        "Max relative error vs fp64", "Helion and mamba-ssm against the fp64 reference: Helion should track the peer.",
        "none", q(f'mamba2_guard_precision_rel_error_ratio{{against="fp64", {SEL}}}', "{{impl}} {{kernel}} {{shape}}")))
    d = d.with_panel(timeseries(
        "Strays vs mamba-ssm", "Output elements beyond the tolerance of mamba-ssm's value. Up to one per million "
        "bf16 elements passes when each is within mamba-ssm's own fp64 error; a rise is worth a look.", "none",
        q(f"mamba2_guard_precision_strays{{{SEL}}}", "{{kernel}} {{shape}}")))

    d = d.with_row(dash_b.Row("Verdicts, drift and environment"))
    d = d.with_panel(table(
        "Current regressions", "Cases whose last verdict is a regression (empty = none).",
        q(f"mamba2_guard_regression{{{SEL}}} == 1", instant=True, table=True),
        ["Time", "__name__", "Value", "job", "instance"]))
    d = d.with_panel(table(
        "Verdicts", "The last verdict of every case.",
        q(f"mamba2_guard_case_status{{{SEL}}} == 1", instant=True, table=True),
        ["Time", "__name__", "Value", "job", "instance"]))
    d = d.with_panel(stat(
        "Drift", "1 = this component changed since the configs were tuned and calls for action.", "none",
        q(f"max by (component) (mamba2_guard_drift{{{GPU}}})", "{{component}}", instant=True),
        [(None, "green"), (1, "orange")], w=12))
    d = d.with_panel(table(
        "Environment", "Versions the last result was measured with, per GPU.",
        q(f"mamba2_guard_env_info{{{GPU}}}", instant=True, table=True),
        ["Time", "__name__", "Value", "job", "instance"]))

    d = d.with_row(dash_b.Row("Run health"))
    d = d.with_panel(stat(
        "Since last success", "Time since each job last succeeded; red after 26 h (a nightly was skipped).", "s",
        q("time() - max by (guard_job) (mamba2_guard_last_success_timestamp_seconds)", "{{guard_job}}", instant=True),
        [(None, "green"), (26 * 3600, "red")]))
    d = d.with_panel(stat(
        "Result age", "Age of the bench result behind these numbers, per GPU.", "s",
        q(f"time() - max by (modelName) (mamba2_guard_result_timestamp_seconds{{{GPU}}})", "{{modelName}}",
          instant=True), [(None, "green"), (26 * 3600, "red")]))
    d = d.with_panel(stat(
        "Last run duration", "Wall time of each job's last run (timeouts show the timeout).", "s",
        q("max by (guard_job) (mamba2_guard_run_duration_seconds)", "{{guard_job}}", instant=True), [(None, "blue")]))
    d = d.with_panel(stat(
        "PRs opened", "Config pull requests opened by the guard (counter).", "none",
        q("sum(mamba2_guard_prs_opened_total)", "PRs", instant=True), [(None, "blue")]))
    d = d.with_panel(timeseries(
        "Runs by outcome (24 h)", "success, regression, error, timeout, killed, missed, skipped per job.", "none",
        q("sum by (guard_job, status) (increase(mamba2_guard_runs_total[1d]))", "{{guard_job}} {{status}}")))
    d = d.with_panel(timeseries(
        "Autotune duration", "Duration of the last autotune per kernel.", "s",
        q("mamba2_guard_autotune_duration_seconds", "{{kernel}}")))
    d = d.with_panel(stat(
        "State errors", "State files found unreadable and moved aside (job store, bookkeeping).", "none",
        q("sum(mamba2_guard_state_errors_total)", "errors", instant=True), [(None, "green"), (1, "red")]))

    doc = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    # Prometheus annotations: the series value is the event time (fields the SDK has no builder for).
    for ann in doc.get("annotations", {}).get("list", []):
        for name, _event, _, text in ANNOTATIONS:
            if ann.get("name") == name:
                ann.update({"useValueForTime": True, "titleFormat": name, "textFormat": text, "step": "1m",
                            "tagKeys": "event"})
    return doc


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed JSON is stale")
    parser.add_argument("--stdout", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(OUTPUT), "generated", lineterm="")
            print("\n".join(list(diff)[:60]))
            print(f"{OUTPUT.name} is stale: run `python dashboards/build.py` and commit it", file=sys.stderr)
            return 1
        print(f"{OUTPUT.name} is up to date")
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
