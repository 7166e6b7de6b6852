"""Dashboards as code: the committed JSON is what build.py generates; provisioning and Prometheus configs parse."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.guard.live import APT_LINE, REPO

DASH = REPO / "dashboards"


def test_committed_dashboard_is_fresh_and_check_mode_detects_staleness(tmp_path, monkeypatch):
    res = subprocess.run([sys.executable, str(DASH / "build.py"), "--check"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    sys.path.insert(0, str(DASH))
    try:
        import build
    finally:
        sys.path.remove(str(DASH))
    stale = tmp_path / "mamba2-guard.json"
    stale.write_text((DASH / "mamba2-guard.json").read_text().replace("Speedup vs mamba-ssm", "Speedup"))
    monkeypatch.setattr(build, "OUTPUT", stale)
    assert build.main(["--check"]) == 1


def test_dashboard_has_the_variables_panels_and_annotations():
    doc = json.loads((DASH / "mamba2-guard.json").read_text())
    names = {v["name"] for v in doc["templating"]["list"]}
    assert {"gpu", "kernel", "shape"} <= names
    titles = {p["title"] for p in doc["panels"]}
    for wanted in ("Latency (median): Helion vs mamba-ssm", "Speedup vs mamba-ssm", "Abs diff vs mamba-ssm",
                   "Roofline utilization", "Current regressions", "Drift", "Environment", "Since last success",
                   "Runs by outcome (24 h)"):
        assert wanted in titles
    assert {a["name"] for a in doc["annotations"]["list"]} >= {"Drift", "Config PR"}


def test_provisioning_files():
    ds = yaml.safe_load((DASH / "provisioning/datasources/prometheus.yml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((DASH / "provisioning/dashboards/mamba2-guard.yml").read_text())
    provider = prov["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    compose = yaml.safe_load((DASH / "docker-compose.yml").read_text())
    assert {"prometheus", "grafana", "pushgateway"} <= set(compose["services"])
    mounted = " ".join(compose["services"]["grafana"]["volumes"])
    assert "mamba2-guard.json:" + provider["options"]["path"] in mounted


def test_prometheus_config_passes_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(f"promtool not found (Debian: {APT_LINE})")
    res = subprocess.run([promtool, "check", "config", str(DASH / "prometheus.yml")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
