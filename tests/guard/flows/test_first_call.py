"""``mamba2-guard dev first-call``: a job's cold start at a shape, ours and mamba-ssm's, each in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mamba2_guard.flows import baselines, selection_measure

ROOT = Path(__file__).resolve().parents[3]


def test_fresh_runs_every_job_in_a_new_process():
    # A first call timed in a process that already ran another shape would find its kernels loaded.
    assert len(set(selection_measure.in_parallel(os.getpid, [(), (), ()], 1, fresh=True))) == 3
    assert len(set(selection_measure.in_parallel(os.getpid, [(), (), ()], 1))) == 1


def first_call(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    """Run the console script at the smoke shape with its own Inductor cache (where Helion's generated code goes
    on a CPU) and temporary directory; returns the seconds it printed and that cache."""
    cache, scratch = tmp_path / "inductor-cache", tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "first-call", "--shapes", "smoke", "--entries",
                           "ssd_combined_fwd", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MAMBA2_GUARD_STATE": str(tmp_path / "state"),
                               "TORCHINDUCTOR_CACHE_DIR": str(cache), "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("smoke helion ")
    return json.loads(done.stdout.splitlines()[-1]), cache


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_the_tool_times_both_sides_at_a_shape_on_the_environments_caches(tmp_path):
    seconds, cache = first_call(tmp_path)
    assert set(seconds) == {"smoke"} and set(seconds["smoke"]) == {"helion", "mamba_ssm"}
    assert all(isinstance(value, float) and value > 0 for value in seconds["smoke"].values()), seconds
    assert files_under(cache), "the compiled kernels went elsewhere than the environment's cache"


def test_empty_caches_compile_into_new_directories_and_remove_them(tmp_path):
    seconds, cache = first_call(tmp_path, "--sides", "helion", "--empty-caches")
    assert set(seconds["smoke"]) == {"helion"} and isinstance(seconds["smoke"]["helion"], float), seconds
    assert not files_under(cache), "the environment's cache was used"
    assert not list((tmp_path / "tmp").iterdir()), "the new caches were left behind"


def test_empty_compile_caches_are_where_each_library_looks_and_the_environment_is_restored(monkeypatch, tmp_path):
    from helion.autotuner.local_cache import get_helion_cache_dir
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from triton import knobs

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("HELION_CACHE_DIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with selection_measure.empty_compile_caches() as root:
        assert not list(root.iterdir())
        for found in (knobs.cache.dir, get_helion_cache_dir(), cache_dir()):
            assert Path(found).parent == root, found
    assert not root.exists()
    # Inductor writes its variable back when it looks its cache up; the variables are the caller's again.
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert "HELION_CACHE_DIR" not in os.environ and "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_each_shape_is_handed_on_as_it_finishes():
    """`dev first-call --record` keeps each shape as it finishes: a device call's time limit during the
    next shape (here: the hand-on itself interrupted) leaves the shapes before recorded, and nothing after
    the interruption runs."""
    handed = []

    def on_shape(name, by_side):
        handed.append((name, sorted(by_side)))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        selection_measure.first_call_seconds(["smoke", "mamba2-default"], ["chunk_cumsum"], ("helion",),
                                             on_shape=on_shape)
    assert handed == [("smoke", ["helion"])]


@pytest.fixture
def on_a_gpu(tmp_path, monkeypatch):
    """``dev first-call``'s command with a GPU standing in (--record needs one): its file under ``tmp_path``,
    and the shapes each call measures; ``measure`` replaces the measurement (default: fixed seconds)."""
    import dataclasses

    from mamba2_guard.adapters import fingerprint
    from mamba2_guard.dev import measure_selection

    gpu = dataclasses.replace(fingerprint.collect(), gpu_name="NVIDIA H200", gpu_uuid="GPU-1")
    monkeypatch.setattr(measure_selection, "require_gpu", lambda parser, why: None)
    monkeypatch.setattr(fingerprint, "collect", lambda: gpu)
    monkeypatch.setattr(baselines, "first_call_path", lambda slug: tmp_path / f"{slug}.yaml")
    measured: list[list[str]] = []

    def every_shape(shapes, entries, sides, empty_caches, on_shape):
        measured.append(list(shapes))
        seconds = {name: {"helion": 40.0, "mamba_ssm": 90.0} for name in shapes}
        for name, by_side in seconds.items():
            on_shape(name, by_side)
        return seconds

    def run(*shapes, measure=every_shape, empty_caches=True, record=True, missing_only=False):
        import argparse

        monkeypatch.setattr(measure_selection.selection_measure, "first_call_seconds", measure)
        args = argparse.Namespace(shapes=list(shapes), suite=None, entries=["ssd_combined_fwd_bwd"],
                                  sides=["helion", "mamba_ssm"], empty_caches=empty_caches, record=record,
                                  missing_only=missing_only)
        return measure_selection.first_call(args, argparse.ArgumentParser())

    return run, tmp_path / "nvidia-h200.yaml", measured


def test_record_keeps_each_shape_as_it_finishes(on_a_gpu):
    """The command records a shape as soon as both sides finished: cut during the next one, the file holds
    the first."""
    run, path, _ = on_a_gpu

    def cut_during_the_second(shapes, entries, sides, empty_caches, on_shape):
        on_shape(shapes[0], {"helion": 40.0, "mamba_ssm": 90.0})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run("bamba-9b", "zamba2-7b", measure=cut_during_the_second)
    recorded = baselines.read_first_calls(path)
    assert list(recorded) == ["bamba-9b"] and recorded["bamba-9b"]["mamba_ssm_s"] == 90.0


def test_missing_only_measures_what_the_file_lacks(on_a_gpu):
    """The same command again after a cut: only the shapes not kept for these entries and caches."""
    run, path, measured = on_a_gpu
    run("bamba-9b")
    run("bamba-9b", "zamba2-7b", missing_only=True)
    run("bamba-9b", "zamba2-7b", missing_only=True)  # nothing left
    run("bamba-9b", "zamba2-7b", missing_only=True, empty_caches=False)  # other caches: measured again
    assert measured == [["bamba-9b"], ["zamba2-7b"], [], ["bamba-9b", "zamba2-7b"]]
    assert baselines.read_first_calls(path)["zamba2-7b"]["caches"] == "environment"
    with pytest.raises(SystemExit):  # nothing recorded to skip by
        run("bamba-9b", record=False, missing_only=True)


MEASURED = {"entries": ["ssd_combined_fwd_bwd"], "caches": "empty", "measured_at": "2026-12-04T20:09:35+00:00",
            "gpu_uuid": "GPU-1"}


def test_recording_twice_merges_the_shapes_into_one_file(tmp_path):
    path = baselines.first_call_path("test-gpu", tmp_path)
    assert baselines.record_first_calls(path, {"a": {"helion": 40.0, "mamba_ssm": 90.0}}, **MEASURED) == []
    left_out = baselines.record_first_calls(path, {"b": {"helion": 30.0, "mamba_ssm": "Error: boom"},
                                                   "c": {"helion": 20.0, "mamba_ssm": 80.0}}, **MEASURED)
    assert left_out == ["b"]
    assert path == tmp_path / "first-call" / "test-gpu.yaml"
    assert sorted(yaml.safe_load(path.read_text())) == ["a", "c"]
    assert baselines.read_first_calls(path)["a"]["helion_s"] == 40.0


def test_an_unreadable_file_is_named_and_left_as_it_was(tmp_path):
    path = baselines.first_call_path("test-gpu", tmp_path)
    path.parent.mkdir()
    path.write_text("a: {helion_s: fast}\n")
    with pytest.raises(ValueError, match=f"{path}: a: missing"):
        baselines.record_first_calls(path, {"b": {"helion": 1.0, "mamba_ssm": 2.0}}, **MEASURED)
    assert path.read_text() == "a: {helion_s: fast}\n"
    assert baselines.read_first_calls(tmp_path / "none.yaml") == {}
