"""``mamba2-guard dev measure-selection``'s flow on CPU (interpret mode): every stored config of a kernel timed at
a grid shape's keys, the whole call with each fused stage fused and chained, records appended as they finish,
and a rerun that measures only what is missing."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from mamba2_guard.flows import selection_measure
from mamba2_kernels import config_store
from mamba2_kernels.config_store import ConfigFile
from mamba2_kernels.testing import execution_mode

TILES = {"block_sizes": [16, 16, 16], "num_warps": 4}
STAGES = ("chunk_state_passing", "chunk_state_passing_bwd", "chunk_scan", "chunk_bwd_db_dc",
          "chunk_cumsum_state_passing", "chunk_scan_bwd_dcb", "ssd_fused_fwd")  # in measured order
WIDER = {"block_sizes": [32, 32, 16], "num_warps": 4}


class CallingTimer:
    """The flow's timing adapter, without CUDA: gives each candidate a fixed time by name, having run it once.
    ``run=False`` only names them, for a test of what the flow records and resumes: running them (whole calls,
    forward and backward, in ref mode) is the first test's check, and seconds each."""

    def __init__(self, run: bool = True):
        self.run = run
        self.timed: list[str] = []

    def interleaved(self, fns, rounds):
        for name, fn in sorted(fns.items()):
            if self.run:
                fn()
            self.timed.append(name)
        return {name: [1.0 + i] * rounds for i, name in enumerate(sorted(fns))}

    def interleaved_graphs(self, fns, rounds):
        with execution_mode("ref"):  # whole calls: what is checked here needs no Triton interpreter
            return self.interleaved(fns, rounds)


@pytest.fixture(autouse=True)
def _ref_mode(monkeypatch):
    """Helion's ref mode, as on a CPU the tool's users have: the flow's records and resumes are checked here,
    with times from ``CallingTimer``, and Triton's interpreter (which the kernel tests turn on) only slowed
    them down."""
    monkeypatch.setenv("HELION_INTERPRET", "1")


SMALL = "causal=0,chunk_size=128,dtype=float32,k=128,out=float32,seq=0,tokens=16384"
LARGE = SMALL.replace("chunk_size=128", "chunk_size=256")


def _config(tmp_path, configs: dict) -> Path:
    path = tmp_path / "gpu-a.yaml"
    config_store.save(path, ConfigFile(kernels={"bmm_chunk": configs}))
    return path


def _measure(config, out, timer, **options) -> list[dict]:
    """The smoke shape measured on CPU, one compile process."""
    return selection_measure.measure(["smoke"], config=config, seed=0, rounds=3, processes=1, out=out, device="cpu",
                             timer=timer, **options)


def test_every_stored_config_is_timed_at_the_grid_keys_and_a_rerun_resumes(tmp_path, capsys, monkeypatch):
    first, twin = SMALL, SMALL.replace("tokens=16384", "tokens=65536")
    config = _config(tmp_path, {first: TILES, twin: dict(TILES), LARGE: WIDER})
    out, timer = tmp_path / "m.jsonl", CallingTimer()
    records = _measure(config, out, timer)
    launched = selection_measure.captured_launches("smoke", 0, "cpu")
    launch_record, kernel_records, path_records = records[0], records[1:-len(STAGES)], records[-len(STAGES):]
    keys = [[k.name, str(k.shape_key(*a))] for k, a in launched]
    assert launch_record == {"shape": "smoke", "launches": keys}
    assert [[r["kernel"], r["key"]] for r in kernel_records] == keys
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    (bmm,) = [r for r in kernel_records if r["kernel"] == "bmm_chunk"]
    assert sorted(bmm["ms"]) == sorted(bmm["configs"]) and len(bmm["ms"]) == 2 and not bmm["errors"]
    assert sorted(bmm["ms"].values()) == [1.0, 2.0]
    assert bmm["aliases"] == {twin: first}  # the same config stored twice is timed once, and the fit knows it
    assert all(not r["ms"] for r in kernel_records if r["kernel"] != "bmm_chunk")  # nothing stored for them
    # The whole call, each fused stage forced both ways: smoke is b1 h4 g2 p16 n16 at chunk 32.
    assert [(r["stage"], r["chunk_size"], r["state"], r["heads_per_group"], r["ms"]) for r in path_records] == [
        (stage, 32, 1 * 4 * 16 * 16, 2, {"chain": 1.0, "fused": 2.0}) for stage in STAGES]
    assert len(timer.timed) == 2 + 2 * len(STAGES) and timer.timed[2:] == ["chain", "fused"] * len(STAGES)
    # A rerun (a device call cut short, then called again) measures nothing twice, and does not capture a shape
    # whose recorded launches are all measured: on a GPU that capture compiles the whole call.
    lines = out.read_text()

    def no_capture(*args):
        raise AssertionError("captured a shape the file already covers")

    monkeypatch.setattr(selection_measure, "captured_launches", no_capture)
    assert _measure(config, out, timer) == []
    assert out.read_text() == lines and len(timer.timed) == 2 + 2 * len(STAGES)
    assert "smoke: measured by an earlier run" in capsys.readouterr().out


def test_a_kernel_without_stored_configs_is_not_bound(helion_bindings):
    """Binding runs Helion's front end, seconds per kernel and shape; a kernel with nothing stored has no
    candidate to adapt or time."""
    (kernel, args), *_ = selection_measure.captured_launches("smoke", 0, "cpu")
    kernel._kernels.clear()
    helion_bindings.clear()
    assert selection_measure.candidate_configs(kernel, args, ConfigFile(kernels={"other_k": {SMALL: TILES}})) \
        == ({}, {})
    assert helion_bindings == []


def test_paths_only_times_the_fused_stages_and_no_stored_config(tmp_path):
    config, out, timer = _config(tmp_path, {SMALL: TILES}), tmp_path / "m.jsonl", CallingTimer(run=False)
    records = _measure(config, out, timer, paths_only=True)
    assert [r["stage"] for r in records] == list(STAGES)
    assert timer.timed == ["chain", "fused"] * len(STAGES)
    # The candidates a later full run measures are still missing from the file, so it times them then.
    full = _measure(config, out, timer)
    assert full[0]["launches"] and full[1:] and all("kernel" in r for r in full[1:])


def test_a_shape_cut_short_is_captured_again_for_what_is_missing(tmp_path):
    config, out, timer = _config(tmp_path, {SMALL: TILES}), tmp_path / "m.jsonl", CallingTimer(run=False)
    records = _measure(config, out, timer)
    lines = out.read_text().splitlines()
    cut = len(STAGES) + 1
    out.write_text("\n".join(lines[:-cut]) + "\n")  # the call ended before the last kernel and the fused stages
    again = _measure(config, out, timer)
    assert [r.get("kernel", r.get("stage")) for r in again] == [records[-cut]["kernel"], *STAGES]  # no launches


# The measure in a child whose file size limit falls inside its second record's write: cut short there, as by a
# kill or a full disk (CPython ignores SIGXFSZ, so the write fails with EFBIG after writing what fits).
CUT_SHORT = """
import resource, sys
from pathlib import Path
from mamba2_kernels.testing import enable_cpu_interpret
enable_cpu_interpret()
from tests.guard.flows.test_selection_measure import CallingTimer, _measure
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))
_measure(Path(sys.argv[1]), Path(sys.argv[2]), CallingTimer())
"""


def test_a_run_cut_short_while_writing_a_record_keeps_the_earlier_ones_and_resumes(tmp_path):
    import subprocess
    import sys

    config, out = _config(tmp_path, {SMALL: TILES}), tmp_path / "m.jsonl"
    keys = [[k.name, str(k.shape_key(*a))] for k, a in selection_measure.captured_launches("smoke", 0, "cpu")]
    first = json.dumps({"launches": keys, "shape": "smoke"}, sort_keys=True) + "\n"
    repo = Path(__file__).resolve().parents[3]
    child = subprocess.run([sys.executable, "-c", CUT_SHORT, str(config), str(out), str(len(first) + 20)],
                           capture_output=True, text=True, timeout=600, cwd=repo,
                           env={**os.environ, "PYTHONPATH": str(repo)})
    assert child.returncode == 1 and "File too large" in child.stderr, child.stderr[-2000:]
    assert out.read_text().startswith(first)
    records = _measure(config, out, CallingTimer(run=False))  # the rerun reads the file and measures the rest
    assert [r.get("kernel", r.get("stage")) for r in records] == [*(name for name, _ in keys), *STAGES]
    assert selection_measure.read_records(out) == [json.loads(first), *records]


def test_a_layout_keeps_strides_offsets_and_integer_values_and_zeroes_floats():
    ints = torch.arange(40, dtype=torch.int32).reshape(4, 10)[:, 2:5]  # seq_idx-like: its values address memory
    rebuilt = pickle.loads(pickle.dumps(selection_measure.TensorLayout.of(ints))).build("cpu")
    assert torch.equal(rebuilt, ints) and rebuilt.stride() == (10, 1) and rebuilt.storage_offset() == 2
    floats = torch.randn(4, 10)[:, 3:7]
    zeros = selection_measure.TensorLayout.of(floats).build("cpu")
    assert zeros.shape == (4, 4) and zeros.stride() == (10, 1) and zeros.storage_offset() == 3 and not zeros.any()


def test_a_compile_worker_launches_every_candidate_from_the_launch_layout_alone(tmp_path):
    # The pool's children get a launch's layout, not its data, so none of them runs the whole call again.
    config = _config(tmp_path, {SMALL: TILES, LARGE: WIDER})
    kernel, args = next((k, a) for k, a in selection_measure.captured_launches("smoke", 0, "cpu")
                        if k.name == "bmm_chunk")
    layout = pickle.loads(pickle.dumps(selection_measure.launch_layout(args)))
    assert not any(isinstance(a, torch.Tensor) for a in layout)
    assert selection_measure._compile_worker("bmm_chunk", layout, str(config), "cpu") == 2


def test_the_command_names_bad_shapes_and_needs_a_gpu(tmp_path):
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "measure-selection", "--out",
                               str(tmp_path / "m.jsonl"), *argv], capture_output=True, text=True, timeout=120)

    unknown = run("--shapes", "no-such-shape")
    assert unknown.returncode == 2 and "no-such-shape" in unknown.stderr and "Traceback" not in unknown.stderr
    no_gpu = run("--shapes", "smoke")
    assert no_gpu.returncode == 2 and "needs a CUDA GPU" in no_gpu.stderr and "Traceback" not in no_gpu.stderr
    assert not (tmp_path / "m.jsonl").exists()


def test_the_command_times_this_gpus_configs_by_default(tmp_path, monkeypatch, capsys):
    """On a B200 the measurement times the B200's file, not the H200's, and the fit it prints names it."""
    import argparse
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.dev import measure_selection

    b200 = dataclasses.replace(fingerprint.collect(), gpu_name="NVIDIA B200")
    measured = []
    monkeypatch.setattr(measure_selection, "require_gpu", lambda parser, why: None)
    monkeypatch.setattr(fingerprint, "collect", lambda: b200)
    monkeypatch.setattr(measure_selection.selection_measure, "measure",
                        lambda shapes, config, **_: measured.append(config))
    args = argparse.Namespace(shapes=["smoke"], suite=None, gpu_slug=None, seed=0, rounds=1, processes=1,
                              out=tmp_path / "m.jsonl", paths_only=False)
    assert measure_selection.measure(args, argparse.ArgumentParser()) == 0
    assert [path.name for path in measured] == ["nvidia-b200.yaml"]
    assert "mamba2-guard fit-selection" in (out := capsys.readouterr().out) and "--gpu-slug nvidia-b200" in out
    args.gpu_slug = "nvidia-h200"  # named: that file's configs
    assert measure_selection.measure(args, argparse.ArgumentParser()) == 0
    assert measured[-1].name == "nvidia-h200.yaml"
