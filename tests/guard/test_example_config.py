"""deploy/guard.example.yaml: every key in it is real, and mamba2_guard.config loads it."""

from __future__ import annotations

from pathlib import Path

import yaml

from mamba2_guard import config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "guard.example.yaml"


def test_example_loads_with_every_section():
    cfg = config.load(EXAMPLE)
    assert cfg.path == EXAMPLE
    assert set(cfg.raw) == set(config.SECTIONS)
    assert cfg.github_repo == "my-org/mamba2-guard"
    assert cfg.verdict_policy.threshold == 0.05
    assert cfg.drift_policy.software["mamba_ssm"] == "rebaseline"
    assert cfg.autotune_value("budget_seconds", None) == 10
    assert cfg.pr_enabled


def test_example_defaults_match_the_embedded_ones():
    """The example shows the defaults (overrides aside): loading it changes no drift or verdict setting."""
    cfg = config.load(EXAMPLE)
    default = config.GuardConfig()
    assert cfg.drift_policy == default.drift_policy
    assert cfg.verdict_policy.alpha == default.verdict_policy.alpha
    assert cfg.verdict_policy.confidence == default.verdict_policy.confidence


def test_a_typo_in_the_example_would_be_caught(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["autotune"]["budget_second"] = 10
    bad = tmp_path / "guard.yaml"
    bad.write_text(yaml.safe_dump(data))
    try:
        config.load(bad)
    except config.GuardConfigError as exc:
        assert "autotune.budget_second" in str(exc)
    else:
        raise AssertionError("an unknown key was accepted")
