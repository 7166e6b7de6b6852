"""First-call records: the file's rules (errors name the shape and field), and how a new measurement merges."""

from __future__ import annotations

import pytest

from mamba2_guard.core import first_calls

GOOD = {"helion_s": 40.0, "mamba_ssm_s": 90.0, "entries": ["ssd_combined_fwd_bwd"], "caches": "empty",
        "measured_at": "2026-12-04T20:09:35+00:00", "gpu_uuid": "GPU-1"}


def test_a_valid_file_parses_and_an_empty_one_is_empty():
    assert first_calls.parse({"bamba-9b": GOOD}, "f.yaml") == {"bamba-9b": GOOD}
    assert first_calls.parse(None, "f.yaml") == {}


@pytest.mark.parametrize(("doc", "says"), [
    (["bamba-9b"], "f.yaml: expected a mapping of shape"),
    ({"bamba-9b": {**GOOD, "helion_s": 0}}, "f.yaml: bamba-9b.helion_s: expected seconds > 0"),
    ({"bamba-9b": {**GOOD, "mamba_ssm_s": "slow"}}, "bamba-9b.mamba_ssm_s: expected seconds > 0"),
    ({"bamba-9b": {**GOOD, "caches": "warm"}}, "bamba-9b.caches: expected one of"),
    ({"bamba-9b": {**GOOD, "entries": []}}, "bamba-9b.entries: expected a list"),
    ({"bamba-9b": {**GOOD, "speed": 1}}, r"bamba-9b: unknown field\(s\) \['speed'\]"),
    ({"bamba-9b": {k: v for k, v in GOOD.items() if k != "caches"}}, r"bamba-9b: missing \['caches'\]"),
    ({"bamba-9b": {**GOOD, "log": 3}}, "bamba-9b.log: expected text"),
])
def test_a_bad_file_is_refused_naming_the_shape_and_field(doc, says):
    with pytest.raises(ValueError, match=says):
        first_calls.parse(doc, "f.yaml")


def test_a_measurement_replaces_its_shapes_and_keeps_the_others_and_those_a_side_failed_at():
    existing = {"bamba-9b": GOOD, "zamba2-7b": {**GOOD, "helion_s": 62.0}}
    seconds = {"bamba-9b": {"helion": 50.04, "mamba_ssm": 120.0},
               "zamba2-7b": {"helion": 55.0, "mamba_ssm": "RuntimeError: out of memory"},
               "falcon-h1-34b": {"helion": 60.0, "mamba_ssm": 100.0}}
    merged, left_out = first_calls.recorded(existing, seconds, entries=["ssd_combined_fwd_bwd"], caches="environment",
                                            measured_at="2026-12-05T00:00:00+00:00", gpu_uuid="GPU-2")
    assert left_out == ["zamba2-7b"]
    assert merged["zamba2-7b"] == existing["zamba2-7b"]
    assert merged["bamba-9b"] == {"helion_s": 50.0, "mamba_ssm_s": 120.0, "entries": ["ssd_combined_fwd_bwd"],
                                  "caches": "environment", "measured_at": "2026-12-05T00:00:00+00:00",
                                  "gpu_uuid": "GPU-2"}
    assert set(merged) == {"bamba-9b", "zamba2-7b", "falcon-h1-34b"}
    assert first_calls.parse(merged, "merged") == merged  # what is written reads back
