"""``mamba2-guard dev eager-step`` on CPU: the host-inclusive wall timing, the shapes it runs at, and one
measured case of both sides (Helion's ref mode against mamba-ssm in Triton's interpreter)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from mamba2_guard.bench.timing import wall_interleaved
from mamba2_guard.dev import eager_step
from mamba2_kernels import registry, suites


def test_a_wall_sample_is_steps_calls_between_two_synchronizes_in_abba_rounds():
    events: list[str] = []
    fns = {"a": lambda: events.append("a"), "b": lambda: (events.append("b"), time.sleep(0.002))}
    samples = wall_interleaved(fns, rounds=3, steps=2, warmup=1, synchronize=lambda: events.append("|"))
    assert events == ["a", "b",  # warm-up
                      "|", "a", "a", "|", "|", "b", "b", "|",
                      "|", "b", "b", "|", "|", "a", "a", "|",
                      "|", "a", "a", "|", "|", "b", "b", "|"]
    assert [len(samples[n]) for n in "ab"] == [3, 3]
    # Per call, host time included: b sleeps 2 ms a call, a does not.
    assert min(samples["b"]) >= 2.0 > max(samples["a"])
    with pytest.raises(ValueError, match="^rounds: expected >= 1, warmup >= 0, steps >= 1; got 1, 3, 0$"):
        wall_interleaved(fns, rounds=1, steps=0)


def test_each_shape_runs_as_it_is_and_at_each_other_length():
    loaded = suites.load()
    shapes = eager_step.cases([loaded.shape("smoke"), loaded.shape("nemotron3-nano")], [1024, 8192])
    assert [(s.name, s.seqlen) for s in shapes] == [
        ("smoke", loaded.shape("smoke").seqlen), ("smoke@L1024", 1024), ("smoke@L8192", 8192),
        ("nemotron3-nano", 8192), ("nemotron3-nano@L1024", 1024)]  # its own length is not repeated
    assert shapes[1].nheads == shapes[0].nheads and shapes[1].docs == shapes[0].docs


def test_a_call_is_timed_on_both_sides_with_its_ratio(monkeypatch):
    monkeypatch.setenv("HELION_INTERPRET", "1")
    shape = suites.load().shape("smoke")
    result = eager_step.measure(registry.get("ssd_combined_fwd"), shape, device=torch.device("cpu"), seed=0,
                                rounds=2, steps=1, graphs=None, compile_backend="aot_eager")
    wall = result["wall"]
    assert set(wall["median_ms"]) == {"helion", "helion_compiled", "mamba_ssm"}
    assert all(v > 0 for v in wall["median_ms"].values()) and wall["compiled_vs_eager"] > 0
    assert wall["speedup_vs_mamba_ssm"] > 0 and "device" not in result
    text = eager_step.line("ssd_combined_fwd", "smoke", result)
    assert text.startswith("smoke ssd_combined_fwd: eager") and "x eager)" in text
    with_device = {**result, "device": {"speedup_vs_mamba_ssm": 1.25}, "host_cost": 0.2}
    assert "device 1.25x, host cost +20.0%" in eager_step.line("e", "s", with_device)
    no_sample = {**with_device, "device": {"speedup_vs_mamba_ssm": None}, "host_cost": None}
    assert "device n/a, host cost n/a" in eager_step.line("e", "s", no_sample)  # no sample: no number


def test_a_case_that_fails_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    def measure(entry, shape, **_):
        if entry.name == "ssd_combined_fwd_bwd":
            raise RuntimeError("CUDA out of memory")
        return {"wall": {"median_ms": {"helion": 1.0, "mamba_ssm": 2.0}, "speedup_vs_mamba_ssm": 2.0}}

    monkeypatch.setattr(eager_step, "measure", measure)
    shapes = eager_step.cases([suites.load().shape("smoke")], [64])
    out = tmp_path / "eager.json"
    eager_step.measure_all(shapes, {"cases": {}}, out, device=torch.device("cpu"), seed=0, rounds=1, steps=1,
                           graphs=None)
    written = json.loads(out.read_text())["cases"]
    assert list(written) == ["smoke", "smoke@L64"]
    assert all(written[s]["ssd_combined_fwd"]["wall"]["speedup_vs_mamba_ssm"] == 2.0 for s in written)
    assert all(written[s]["ssd_combined_fwd_bwd"] == {"error": "RuntimeError: CUDA out of memory"} for s in written)
    assert "smoke@L64 ssd_combined_fwd_bwd: FAILED RuntimeError: CUDA out of memory" in capsys.readouterr().out
