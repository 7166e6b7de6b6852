"""Bench pieces that run without a GPU: whole-call entries, layer shares, argument checks."""

from __future__ import annotations

import threading

import pytest
import torch

from mamba2_guard.bench.run import gpu_lock, holding_gpu_lock, with_layer_shares
from mamba2_guard.bench.timing import _check_counts
from mamba2_guard.core.results import CaseResult, SamplesMs
from mamba2_kernels import registry
from mamba2_kernels.testing import execution_mode


@pytest.mark.parametrize("name", ["ssd_combined_fwd", "ssd_combined_fwd_bwd", "mamba2_layer_fwd",
                                  "mamba2_layer_fwd_bwd"])
def test_whole_call_entries_run_helion_against_fp64(name, smoke_shape):
    entry = registry.get(name)
    inputs = entry.inputs(smoke_shape, seed=5)
    with execution_mode("ref"):
        ours = entry.run_helion(inputs)
    ref = entry.run_reference(inputs)
    parts = entry.output_parts(inputs) if entry.output_parts else {}
    declared = {f"{o}.{p}" for o in parts for p, _ in parts[o]} | (set(entry.outputs_at(inputs)) - set(parts))
    assert set(ours) == set(ref) == declared
    for output, value in ref.items():
        torch.testing.assert_close(ours[output].double(), value, atol=1e-5, rtol=1e-4, msg=output)


def test_references_computed_once_judge_each_config_as_the_bench_does(smoke_shape, monkeypatch):
    from mamba2_guard.bench import run

    entry = registry.get("chunk_scan")
    inputs = entry.inputs(smoke_shape, seed=3)
    with execution_mode("ref"):
        ours = entry.run_helion(inputs)
    refs = run.references(entry, inputs, ours)
    calls = []
    monkeypatch.setattr(run, "references", lambda *a: calls.append(a))  # must not be called again
    good = run.precision_of(entry, inputs, ours, refs)
    wrong = run.precision_of(entry, inputs, {**ours, "out": ours["out"] * 1.1}, refs)
    assert good.ok and not wrong.ok and not calls
    assert [o["output"] for o in wrong.outputs if not o["ok"]] == ["out"]
    monkeypatch.undo()
    assert run.precision_of(entry, inputs, ours) == good  # the bench's own call, references made inside


def test_gradient_entry_binds_a_forward_and_backward(smoke_shape):
    entry = registry.get("ssd_combined_fwd_bwd")
    inputs = entry.inputs(smoke_shape, seed=2)
    with execution_mode("ref"):
        grads = entry.bind(entry.helion_fn(), inputs)()
    assert len(grads) == len(entry.grad_of)
    for name, grad in zip(entry.grad_of, grads, strict=True):
        # an optional input the smoke call leaves out (z, initial_states) has no gradient
        assert grad is None if inputs[name] is None else grad.shape == inputs[name].shape, name
    assert inputs["x"].grad is None and not inputs["x"].requires_grad  # the caller's tensors are untouched


def _case(kernel, phase, mamba_ms):
    return CaseResult(kernel=kernel, shape="s", phase=phase, samples_ms=SamplesMs((1.0,), (mamba_ms,)))


def test_layer_shares_count_kernels_not_whole_calls():
    cases = with_layer_shares([_case("a", "fwd_1", 1.0), _case("b", "fwd_2", 3.0), _case("call", "call_fwd", 4.0),
                               _case("layer", "layer_fwd_bwd", 9.0)])
    assert [c.layer_share for c in cases] == [0.25, 0.75, None, None]


def test_progress_line_for_each_kind_of_case():
    from mamba2_guard.bench.run import _line
    from mamba2_guard.core.results import Precision

    good = Precision(max_rel_err_vs_fp64=1e-3, allclose=True, finite=True, ok=True)
    timed = CaseResult("k", "s", "fwd", SamplesMs((1.0,), (2.0,)), precision=good)
    peerless = CaseResult("layer", "s", "layer_fwd", SamplesMs((1.0,), ()), precision=good)
    retimed = CaseResult("k", "s", "fwd", SamplesMs((1.0,), ()))  # the calibration's timing-only runs
    cpu = CaseResult("k", "s", "fwd", precision=good, timings_meaningful=False)
    lines = [_line(0, 4, case, 1.0) for case in (timed, peerless, retimed, cpu)]
    assert "helion 1.0000 ms, mamba-ssm 2.0000 ms, 2.00x" in lines[0]
    assert "helion 1.0000 ms (no mamba-ssm here)" in lines[1] and "(no mamba-ssm here)" in lines[2]
    assert "precision ok (max rel err vs fp64 1.0e-03)" in lines[3]
    assert "no precision data" in _line(0, 1, CaseResult("k", "s", "fwd", timings_meaningful=False), 1.0)


def test_timing_counts_are_checked():
    with pytest.raises(ValueError, match="rounds: expected >= 1"):
        _check_counts(0, 3, 1)


def test_precision_holds_large_reductions_to_a_tolerance_relative_to_their_size():
    from mamba2_guard.bench.precision import compare_output, failing_outputs

    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=gen, dtype=torch.float64) * 800  # like a per-chunk ddt
    exact[7] = 0.01  # a sum that crossed zero
    theirs, ours = exact + 0.1, exact - 0.1  # accumulation-order noise: 1e-4 of the scale, 20x a 1e-2 floor
    assert compare_output("ddt", ours, exact, theirs, atol=1e-2, rtol=1e-2).ok

    ours[7] += 80.0  # 10% of the scale at one element: an error
    result = compare_output("ddt", ours, exact, theirs, atol=1e-2, rtol=1e-2)
    assert not result.allclose and not result.ok
    assert failing_outputs([result.to_dict()]).startswith("ddt: max|ours - mamba-ssm| 79.8")

    small = torch.randn(64, generator=gen, dtype=torch.float64)  # order one: atol stays 1e-2
    assert not compare_output("dx", small + 0.02, small, small, atol=1e-2, rtol=0.0).allclose


def test_a_few_strays_agree_when_within_mamba_ssms_own_fp64_error():
    """Measured on the H200 (2026-12-01): the layer's bf16 output missed |ours - mamba-ssm| <= 1e-2 + 1e-2
    |mamba-ssm| at 1-12 of 67 M elements (up to 0.125 apart) with the same max fp64 error as mamba-ssm's.
    Up to one stray per million elements agrees if each is within mamba-ssm's worst fp64 error; more, or
    a stray beyond that error, or any stray in fp32, does not. Strays are counted either way."""
    from mamba2_guard.bench.precision import compare_output, failing_outputs

    gen = torch.Generator().manual_seed(1)
    exact = torch.randn(2_000_000, generator=gen, dtype=torch.float64) * 4
    theirs = exact.to(torch.bfloat16)
    theirs[5] = exact[5] + 0.25  # mamba-ssm's own worst fp64 error: 0.25
    ours = theirs.clone()
    ours[[10, 20]] = (theirs[[10, 20]].double() + 0.2).to(torch.bfloat16)  # 2 strays, each within 0.25 of fp64

    two = compare_output("out", ours, exact, theirs, atol=1e-2, rtol=1e-2)
    assert two.strays == 2 and two.allclose and two.ok
    far = ours.clone()
    far[20] = (exact[20] + 0.5).to(torch.bfloat16)  # farther from fp64 than mamba-ssm ever is
    assert not compare_output("out", far, exact, theirs, atol=1e-2, rtol=1e-2).allclose
    many = theirs.clone()
    many[100:103] = (theirs[100:103].double() + 0.2).to(torch.bfloat16)  # 3 > 1 per million of 2 M
    result = compare_output("out", many, exact, theirs, atol=1e-2, rtol=1e-2)
    assert result.strays == 3 and not result.allclose and not result.ok
    assert "allclose False (3 beyond tolerance)" in failing_outputs([result.to_dict()])
    fp32 = compare_output("out", ours.float(), exact, theirs.float(), atol=1e-2, rtol=1e-2)
    assert fp32.strays == 2 and not fp32.allclose
    assert registry.get("mamba2_layer_fwd").tolerance("out") == registry.DEFAULT_TOLERANCE


def test_without_mamba_ssm_the_yardstick_is_pytorch_in_the_same_dtype():
    from mamba2_guard.bench.precision import compare_output, failing_outputs

    gen = torch.Generator().manual_seed(1)
    exact = torch.randn(4096, generator=gen, dtype=torch.float64)  # max |exact| ~ 4, rms ~ 1
    exact[3] = 0.0
    same_dtype = exact.to(torch.bfloat16).double()  # PyTorch's bf16 result: rounding only, ~2e-3 of scale
    ours = exact.clone()
    ours[3] = 0.012  # one element outside allclose vs fp64 (1e-2 + 1e-2 |0|) ...
    result = compare_output("out", ours, exact, None, atol=1e-2, rtol=1e-2, same_dtype=same_dtype)
    assert not result.allclose and result.ok  # ... yet within twice PyTorch's own bf16 error: ok
    assert result.mamba_ssm_max_rel_err_vs_fp64 is None and result.same_dtype_reference_max_rel_err_vs_fp64 > 0

    ours[5] += 0.5  # far beyond twice the bf16 rounding of this output
    failed = compare_output("out", ours, exact, None, atol=1e-2, rtol=1e-2, same_dtype=same_dtype)
    assert not failed.ok and "(PyTorch in the same dtype 0.00" in failing_outputs([failed.to_dict()])
    assert not compare_output("out", ours, exact, None, atol=1e-2, rtol=1e-2).ok  # no yardstick: allclose rules


@pytest.mark.gpu
def test_device_time_leaves_out_the_host_dispatch_before_a_launch():
    """A call that spends 0.3 ms on the host before its 0.05 ms kernel reads as 0.05 ms: the head start
    keeps the GPU busy while the host dispatches (without it, the host work left after the 0.1 ms L2
    flush would be in the sample)."""
    import statistics
    import time

    from mamba2_guard.bench.timing import Timer, sleep_cycles_per_ms

    cycles = int(0.05 * sleep_cycles_per_ms())

    def slow_host_call():
        started = time.perf_counter()
        while time.perf_counter() - started < 3e-4:
            pass
        torch.cuda._sleep(cycles)

    samples = Timer("cuda").interleaved({"call": slow_host_call}, rounds=20)["call"]
    assert statistics.median(samples) == pytest.approx(0.05, rel=0.25)


@pytest.mark.gpu
def test_graph_timing_runs_after_a_search_left_the_whole_card_in_the_allocators_cache():
    """A tuner's validation times the whole call's graphs right after Helion's search, whose freed buffers the
    caching allocator keeps: the side stream the timing creates must still find memory."""
    from mamba2_guard.bench.timing import Timer

    timer, held = Timer("cuda"), []
    for chunk in (1 << 30, 1 << 26, 1 << 21):  # every byte the driver will give, down to 2 MiB pieces
        while True:
            try:
                held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    del held  # freed into the allocator's cache, still taken from the driver's view
    x = torch.ones(1024, device="cuda")
    samples = timer.interleaved_graphs({"call": lambda: x.mul_(1.0)}, rounds=3)
    assert len(samples["call"]) == 3 and all(ms >= 0 for ms in samples["call"])


def test_whole_calls_are_timed_by_graph_replays_single_kernels_eagerly():
    """The bench and the tuner's keep-or-reject decision time an entry the same way
    (mamba2_guard.bench.run.graph_timed):
    a whole call or layer by its CUDA-graph replays (its eager time is mostly host work), a kernel eagerly
    unless the run asks for graphs."""
    from mamba2_guard.bench.run import graph_timed
    from mamba2_kernels import registry

    composite = [e for e in registry.ENTRIES if e.phase.startswith(registry.COMPOSITE_PHASES)]
    assert {"ssd_combined_fwd_bwd", "mamba2_layer_fwd_bwd"} <= {e.name for e in composite}
    assert all(graph_timed(e) for e in composite)
    kernel = registry.get("chunk_scan")
    assert not graph_timed(kernel) and graph_timed(kernel, cuda_graphs=True)


@pytest.mark.parametrize("damaged", ['{"copy_bytes_per_s": 4.8e1', "[]", "\xff"])
def test_a_damaged_peaks_cache_is_measured_again_not_an_error_in_every_bench(tmp_path, monkeypatch, damaged):
    import json

    from mamba2_guard.bench import peaks

    measured = {"copy_bytes_per_s": 4.0e12, "bf16_matmul_flops_per_s": 9.0e14, "method": "a stand-in for the GPU"}
    monkeypatch.setattr(peaks, "measure", lambda device="cuda": dict(measured))  # the GPU part
    digest = "0123456789abcdef" * 4
    path = tmp_path / "peaks" / f"{digest[:16]}.json"
    path.parent.mkdir()
    path.write_bytes(damaged.encode("latin-1"))
    assert peaks.cached(tmp_path, digest) == measured
    assert json.loads(path.read_text()) == measured  # cached again for the next bench


def test_a_bench_says_it_waits_for_the_gpu_lock_only_while_another_holds_it(tmp_path):
    said = []
    with holding_gpu_lock(tmp_path, "GPU-x", said.append):
        pass
    assert said == []
    held, release = threading.Event(), threading.Event()

    def other_bench():
        with gpu_lock(tmp_path, "GPU-x"):
            held.set()
            release.wait(30)

    other = threading.Thread(target=other_bench)
    other.start()
    assert held.wait(30)
    threading.Timer(0.2, release.set).start()
    with holding_gpu_lock(tmp_path, "GPU-x", said.append):
        assert release.is_set()  # held only once the other bench let go
    other.join()
    assert len(said) == 1 and "waiting for the GPU lock" in said[0] and "another bench or tune holds it" in said[0]
