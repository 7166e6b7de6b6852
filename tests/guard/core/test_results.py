"""mamba2_guard.core.results: bench result and baseline documents, round trips and validation."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.results import (
    BenchResult,
    CaseResult,
    Precision,
    SamplesMs,
    SchemaError,
    baseline_from_result,
    baseline_skip_reason,
    load_baseline,
)

from .factories import FINGERPRINT, GOOD, make_case

ms = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
opt_num = st.one_of(st.none(), st.floats(min_value=0, max_value=10, allow_nan=False))
opt_bool = st.one_of(st.none(), st.booleans())
name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)


@st.composite
def cases(draw):
    n = draw(st.integers(0, 8))
    h = tuple(draw(st.lists(ms, min_size=n, max_size=n)))
    m = tuple(draw(st.lists(ms, min_size=n, max_size=n))) if draw(st.booleans()) else ()
    prec = draw(st.one_of(st.none(), st.builds(
        Precision, opt_num, opt_num, opt_num, opt_num, opt_bool, opt_bool, opt_bool,
        st.just(({"output": "y", "ok": True},)))))
    return CaseResult(
        kernel=draw(name), shape=draw(name), phase=draw(st.sampled_from(["fwd", "bwd", ""])),
        samples_ms=SamplesMs(h, m), precision=prec, roofline_fraction=draw(opt_num), layer_share=draw(opt_num),
        throttled=draw(st.booleans()), error=draw(st.one_of(st.none(), st.text(max_size=30))),
        missing=draw(st.booleans()), timings_meaningful=draw(st.booleans()),
        seed=draw(st.one_of(st.none(), st.integers(0, 2**31))), extra=draw(st.just({"config": {"block": 64}})),
    )


@st.composite
def results(draw):
    cs = draw(st.lists(cases(), max_size=5, unique_by=lambda c: (c.kernel, c.shape)))
    return BenchResult(
        fingerprint=draw(st.dictionaries(name, st.one_of(name, st.integers()), max_size=4)),
        cases=tuple(cs), device_peaks={"hbm_bytes_per_s": 4.8e12}, suite=draw(st.one_of(st.none(), name)),
        started_at="2026-09-01T03:00:00+00:00",
    )


@settings(max_examples=60, deadline=None)
@given(results())
def test_result_json_round_trip(result):
    doc = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert BenchResult.from_dict(doc) == result


def _doc():
    rng = np.random.default_rng(0)
    return BenchResult(FINGERPRINT, (make_case(rng, kernel="a"), make_case(rng, kernel="b"))).to_dict()


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["cases"][1]["samples_ms"]["helion"].__setitem__(2, "x"), "cases[1].samples_ms.helion[2]"),
        (lambda d: d["cases"][0]["samples_ms"]["helion"].__setitem__(0, -1.0), "cases[0].samples_ms.helion[0]"),
        (lambda d: d["cases"][0]["samples_ms"]["mamba_ssm"].pop(), "cases[0].samples_ms.mamba_ssm"),
        (lambda d: d["cases"][1].__setitem__("helion_ms", [1.0]), "cases[1].helion_ms"),
        (lambda d: d["cases"][0].pop("kernel"), "cases[0].kernel"),
        (lambda d: d["cases"][0]["precision"].__setitem__("allclose", "yes"), "cases[0].precision.allclose"),
        (lambda d: d["cases"][0].__setitem__("throttled", 1), "cases[0].throttled"),
        (lambda d: d.__setitem__("schema_version", 99), "schema_version"),
        (lambda d: d.pop("fingerprint"), "fingerprint"),
        (lambda d: d["cases"].append(copy.deepcopy(d["cases"][0])), "cases[2]"),
    ],
)
def test_result_validation_names_the_bad_key(mutate, path):
    d = _doc()
    mutate(d)
    with pytest.raises(SchemaError) as info:
        BenchResult.from_dict(d)
    assert info.value.path == path
    assert str(info.value).startswith(path)


def test_case_derived_numbers():
    c = CaseResult("k", "s", samples_ms=SamplesMs((1.0, 2.0, 4.0), (2.0, 3.0, 4.0)), precision=GOOD)
    assert c.helion_median_ms == 2.0 and c.mamba_ssm_median_ms == 3.0
    assert c.ratio_samples == [2.0, 1.5, 1.0] and c.speedup == 1.5
    d = c.to_dict()["summary"]
    assert d["helion"]["median_ms"] == 2.0 and d["speedup_vs_mamba_ssm"] == 1.5


def test_fingerprint_hash_ignores_the_machine():
    a = fingerprint_hash({**FINGERPRINT, "hostname": "n1", "gpu_uuid": "GPU-1"})
    b = fingerprint_hash({**FINGERPRINT, "hostname": "n2", "gpu_uuid": "GPU-2"})
    assert a == b != fingerprint_hash({**FINGERPRINT, "driver_version": "590.0"})


# ----------------------------------------------------------------------------------------------
# Baseline


def test_baseline_has_the_required_keys_and_survives_yaml():
    rng = np.random.default_rng(1)
    result = BenchResult(FINGERPRINT, (make_case(rng, kernel="ssd_fwd", shape="b4"),))
    doc = baseline_from_result(result)
    e = doc["results"]["ssd_fwd"]["b4"]
    for key in ("median_ms", "p10_ms", "p90_ms", "iqr_ms", "samples_ms"):
        assert key in e["helion"] and key in e["mamba_ssm"]
    for key in ("max_abs_diff_vs_mamba_ssm", "mean_abs_diff_vs_mamba_ssm", "max_rel_err_vs_fp64"):
        assert key in e["precision"]
    assert e["speedup_vs_mamba_ssm"] == pytest.approx(result.cases[0].speedup, rel=1e-5)
    assert doc["fingerprint"] == FINGERPRINT
    text = yaml.safe_dump(doc, sort_keys=True)
    loaded = load_baseline(yaml.safe_load(text))
    assert loaded.to_dict() == doc
    bc = loaded.get("ssd_fwd", "b4")
    assert len(bc.ratio_samples) == 30 and bc.helion.n == 30
    assert loaded.get("ssd_fwd", "other") is None


def test_baseline_cases_keep_their_timing_method():
    rng = np.random.default_rng(3)
    result = BenchResult(FINGERPRINT, (make_case(rng, kernel="graph", extra={"timing_method": "cuda-graph/v2"}),
                                       make_case(rng, kernel="old")))
    loaded = load_baseline(yaml.safe_load(yaml.safe_dump(baseline_from_result(result))))
    assert loaded.get("graph", "s").timing_method == "cuda-graph/v2" and loaded.get("old", "s").timing_method is None
    doc = baseline_from_result(result)
    doc["results"]["graph"]["s"]["timing_method"] = 2
    with pytest.raises(SchemaError, match="results.graph.s.timing_method"):
        load_baseline(doc)


def test_baseline_skips_cases_that_cannot_be_references():
    rng = np.random.default_rng(2)
    good = make_case(rng, kernel="good")
    skipped = [
        make_case(rng, kernel="missing", missing=True),
        make_case(rng, kernel="error", error="boom"),
        make_case(rng, kernel="interp", timings_meaningful=False),
        make_case(rng, kernel="hot", throttled=True),
        make_case(rng, kernel="bad", precision=Precision(allclose=False, ok=False)),
        make_case(rng, kernel="bad_vs_peer",
                  precision=Precision(allclose=False, ok=True, max_abs_diff_vs_mamba_ssm=1.0)),
    ]
    # No mamba-ssm (the layer without causal-conv1d): bf16 misses fp64's allclose, the runner's same-dtype
    # bound passed it, and it is a reference like any other.
    peerless = make_case(rng, kernel="peerless", precision=Precision(allclose=False, ok=True, finite=True))
    result = BenchResult(FINGERPRINT, (good, peerless, *skipped))
    assert set(baseline_from_result(result)["results"]) == {"good", "peerless"}
    assert all(baseline_skip_reason(c) for c in skipped) and baseline_skip_reason(good) is None
    with pytest.raises(ValueError, match="interp/s: timings not meaningful"):
        baseline_from_result(result, strict=True)


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda e: e["helion"].__setitem__("median_ms", "fast"), "results.k.s.helion.median_ms"),
        (lambda e: e["helion"].pop("median_ms"), "results.k.s.helion.median_ms"),
        (lambda e: e["precision"].pop("max_rel_err_vs_fp64"), "results.k.s.precision.max_rel_err_vs_fp64"),
        (lambda e: e.pop("speedup_vs_mamba_ssm"), "results.k.s.speedup_vs_mamba_ssm"),
        (lambda e: e.__setitem__("speedup", 1.0), "results.k.s.speedup"),
        (lambda e: e["mamba_ssm"]["samples_ms"].pop(), "results.k.s.mamba_ssm.samples_ms"),
    ],
)
def test_baseline_validation_names_the_bad_key(mutate, path):
    rng = np.random.default_rng(3)
    doc = baseline_from_result(BenchResult(FINGERPRINT, (make_case(rng),)))
    mutate(doc["results"]["k"]["s"])
    with pytest.raises(SchemaError) as info:
        load_baseline(doc)
    assert info.value.path == path


def test_summary_only_baseline_loads():
    doc = {"fingerprint": {}, "results": {"k": {"s": {
        "helion": {"median_ms": 1.0}, "mamba_ssm": {"median_ms": 1.3}, "speedup_vs_mamba_ssm": 1.3,
        "precision": {"max_abs_diff_vs_mamba_ssm": 1e-3, "mean_abs_diff_vs_mamba_ssm": 1e-4,
                      "max_rel_err_vs_fp64": 1e-3}}}}}
    b = load_baseline(doc)
    assert b.get("k", "s").ratio_samples == [] and b.get("k", "s").helion.median_ms == 1.0


def test_update_keeps_other_cases_with_the_environment_they_were_measured_in(tmp_path):
    from mamba2_guard.flows import baselines

    rng = np.random.default_rng(3)
    path = tmp_path / "gpu.yaml"
    first = BenchResult(FINGERPRINT, (make_case(rng, kernel="a", shape="s"), make_case(rng, kernel="b", shape="s")),
                        started_at="2026-11-01T00:00:00+00:00")
    baselines.update(path, first)
    newer_env = {**FINGERPRINT, "triton": "9.9.9"}
    second = BenchResult(newer_env, (make_case(rng, kernel="b", shape="s", helion_ms=0.5),),
                         started_at="2026-11-02T00:00:00+00:00")
    assert baselines.update(path, second) == []

    merged = baselines.load(path)
    assert set(merged.cases) == {("a", "s"), ("b", "s")}  # a partial re-baseline loses nothing
    assert merged.fingerprint == newer_env
    kept, redone = merged.get("a", "s"), merged.get("b", "s")
    assert (kept.recorded_at, kept.fingerprint) == ("2026-11-01T00:00:00+00:00", fingerprint_hash(FINGERPRINT))
    assert (redone.recorded_at, redone.fingerprint) == ("2026-11-02T00:00:00+00:00", fingerprint_hash(newer_env))
    assert redone.helion.median_ms < kept.helion.median_ms
