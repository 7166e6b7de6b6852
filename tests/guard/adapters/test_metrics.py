"""Metrics against real parts: Prometheus scraping our /metrics, a Pushgateway, the textfile collector format,
and every PromQL expression of the generated dashboard returning data."""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.guard import sample
from tests.guard.live import REPO, free_port, http_get, wait_for

FAMILIES = {
    "mamba2_guard_kernel_latency_seconds", "mamba2_guard_speedup_ratio", "mamba2_guard_precision_abs_diff",
    "mamba2_guard_precision_rel_error_ratio", "mamba2_guard_roofline_utilization_ratio", "mamba2_guard_regression",
    "mamba2_guard_case_status", "mamba2_guard_drift", "mamba2_guard_env_info",
    "mamba2_guard_result_timestamp_seconds", "mamba2_guard_run_duration_seconds",
    "mamba2_guard_last_run_timestamp_seconds", "mamba2_guard_last_success_timestamp_seconds",
    "mamba2_guard_runs_total", "mamba2_guard_autotune_duration_seconds", "mamba2_guard_prs_opened_total",
    "mamba2_guard_last_event_timestamp_seconds", "mamba2_guard_state_errors_total", "mamba2_guard_precision_strays",
}
DCGM_LABELS = {"gpu", "UUID", "modelName", "Hostname"}
BOUNDED = {"kernel", "shape", "impl", "quantile", "stat", "against", "status", "component", "guard_job", "event",
           "file", "__name__", "instance"} | DCGM_LABELS


def test_exposition_names_units_and_labels():
    m = sample.metrics()
    text = m.exposition().decode()
    series = [s for f in text_string_to_metric_families(text) for s in f.samples]
    names = {s.name for s in series}
    for family in FAMILIES:
        assert family in names, family
    for s in series:
        if s.name == "mamba2_guard_env_info":
            assert {"torch", "triton", "helion", "driver"} <= set(s.labels)
            assert not {"fingerprint", "kernels_source"} & set(s.labels)  # hashes are not labels
            continue
        assert set(s.labels) <= BOUNDED, (s.name, s.labels)
        if "kernel" in s.labels:
            assert set(s.labels) >= DCGM_LABELS, s
    lat = [s for s in series if s.name == "mamba2_guard_kernel_latency_seconds" and s.labels["quantile"] == "0.5"
           and s.labels["kernel"] == "ssd_chunk_scan_fwd" and s.labels["impl"] == "helion"]
    assert lat and 0.0005 < lat[0].value < 0.00056  # seconds, not milliseconds
    reg = {s.labels["kernel"]: s.value for s in series if s.name == "mamba2_guard_regression"}
    assert reg["ssd_chunk_state_fwd"] == 1 and reg["ssd_chunk_scan_fwd"] == 0
    strays = {s.labels["kernel"]: s.value for s in series if s.name == "mamba2_guard_precision_strays"}
    assert strays["gated_rmsnorm_bwd"] == 2 and strays["ssd_chunk_scan_fwd"] == 0
    drift = {s.labels["component"]: s.value for s in series if s.name == "mamba2_guard_drift"}
    assert drift["helion"] == 1 and drift["torch"] == 0


def test_new_result_replaces_old_series():
    from mamba2_guard.adapters.metrics import GuardMetrics

    m = GuardMetrics()
    m.update_from_result(sample.result(), sample.verdicts())
    smaller = sample.result()
    smaller["cases"] = smaller["cases"][:1]
    m.update_from_result(smaller, [])
    kernels = {s.labels["kernel"] for f in text_string_to_metric_families(m.exposition().decode())
               for s in f.samples if s.name == "mamba2_guard_speedup_ratio"}
    assert kernels == {"ssd_chunk_scan_fwd"}


def test_textfile_is_written_atomically_and_parses(tmp_path):
    m = sample.metrics()
    path = tmp_path / "textfile" / "mamba2_guard.prom"
    m.write_textfile(path)
    m.write_textfile(path)  # overwrite goes through rename too
    assert [p.name for p in path.parent.iterdir()] == ["mamba2_guard.prom"]  # no temp files left behind
    names = {f.name for f in text_string_to_metric_families(path.read_text())}
    assert "mamba2_guard_kernel_latency_seconds" in names


def test_cli_textfile_from_snapshot(tmp_path):
    import argparse

    from mamba2_guard.adapters.metrics import write_snapshot
    from mamba2_guard.cli import build_parser

    s = sample.snapshot()
    write_snapshot(tmp_path, s["result"], s["verdicts"], drift=s["drift"], events=s["events"])
    parser = build_parser()

    def cmd_metrics(args: argparse.Namespace) -> int:
        return args.func(args)

    assert cmd_metrics(parser.parse_args(["metrics", "textfile", "--state-dir", str(tmp_path)])) == 0
    assert "mamba2_guard_speedup_ratio" in (tmp_path / "metrics" / "mamba2_guard.prom").read_text()
    assert cmd_metrics(parser.parse_args(["metrics", "push", "--state-dir", str(tmp_path), "--gateway", ""])) == 2
    assert cmd_metrics(parser.parse_args(["metrics", "show", "--state-dir", str(tmp_path / "nothing")])) == 2


def _dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads((REPO / "dashboards" / "mamba2-guard.json").read_text())
    found = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                found.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(doc["panels"])
    for a in doc["annotations"]["list"]:
        if a.get("expr"):
            found.append((f"annotation {a['name']}", a["expr"]))
    variables = [(f"variable {v['name']}", v["query"]) for v in doc["templating"]["list"] if v["type"] == "query"]
    return found, variables


def _all(expr: str) -> str:
    """Template variables at "All" (Grafana substitutes the allValue, .*)."""
    expr = re.sub(r"\$\{?(gpu|kernel|shape)\}?", ".*", expr)
    return expr.replace("$__rate_interval", "1m").replace("$__range", "1h")


def test_prometheus_scrapes_every_family_and_every_dashboard_query_has_data(start_prometheus):
    m = sample.metrics()
    port = free_port()
    server, _thread = m.serve(port)
    try:
        prom = start_prometheus([f"127.0.0.1:{port}"])
        # Three scrapes, so that range functions (increase) have two points at least.
        wait_for(lambda: prom.query('count_over_time(up{job="guard"}[1m]) >= 3'), 30, 0.5, "three scrapes")
        assert prom.query('up{job="guard"}')[0]["value"][1] == "1"
        names = set(json.loads(http_get(f"{prom.url}/api/v1/label/__name__/values"))["data"])
        missing = FAMILIES - names
        assert not missing, f"families Prometheus did not ingest: {sorted(missing)}"
        panels, variables = _dashboard_queries()
        assert len(panels) >= 15
        empty = [(title, expr) for title, expr in panels if not prom.query(_all(expr))]
        assert not empty, f"dashboard queries without data: {empty}"
        for title, query in variables:
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert match, (title, query)
            selector, label = _all(match.group(1)), match.group(2)
            url = f"{prom.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
            assert json.loads(http_get(url))["data"], (title, query)
        # The DCGM join keys survive the scrape (honor_labels off: ours are not job/instance).
        lat = prom.query('mamba2_guard_kernel_latency_seconds{impl="helion", quantile="0.5"}')
        assert {r["metric"]["UUID"] for r in lat} == {sample.FINGERPRINT["gpu_uuid"]}
        # No label of ours collides with Prometheus's target labels (they would become exported_*).
        assert not [n for n in json.loads(http_get(f"{prom.url}/api/v1/labels"))["data"] if n.startswith("exported_")]
    finally:
        server.shutdown()


def test_push_mode_through_a_real_pushgateway(pushgateway, start_prometheus):
    m = sample.metrics()
    m.push(pushgateway, job="mamba2-guard-ci")
    text = http_get(f"{pushgateway}/metrics").decode()
    pushed = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "mamba2_guard_speedup_ratio"]
    assert len(pushed) == len(sample.CASES)
    assert all(s.labels["job"] == "mamba2-guard-ci" and s.labels["instance"] == "gpu-runner-1" for s in pushed)
    # A second push replaces the group: a case that disappeared is gone from the gateway too.
    from mamba2_guard.adapters.metrics import GuardMetrics

    m2 = GuardMetrics()
    smaller = sample.result()
    smaller["cases"] = smaller["cases"][:2]
    m2.update_from_result(smaller, sample.verdicts()[:2])
    m2.push(pushgateway, job="mamba2-guard-ci")
    prom = start_prometheus([pushgateway.removeprefix("http://")], honor_labels=True)
    wait_for(lambda: prom.query('mamba2_guard_speedup_ratio{job="mamba2-guard-ci"}'), 30, 0.5, "pushed series")
    assert len(prom.query('mamba2_guard_speedup_ratio{job="mamba2-guard-ci"}')) == 2


@pytest.mark.parametrize("bad", [{"schema_version": 99, "fingerprint": {}, "cases": []}, {"nope": 1}])
def test_bad_snapshot_is_reported_not_raised(tmp_path, bad):
    from mamba2_guard.adapters.metrics import GuardMetrics

    path = tmp_path / "latest.json"
    path.write_text(json.dumps({"result": bad}))
    assert GuardMetrics().load_snapshot(path) is False
    path.write_text("{torn")
    assert GuardMetrics().load_snapshot(path) is False
