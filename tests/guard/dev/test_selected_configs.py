"""mamba2_guard.dev.selected_configs (``mamba2-guard dev selected``): which config each launch of a whole call
selects, and
which launches a config change moves, without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mamba2_guard.dev import selected_configs
from mamba2_kernels import config_store, registry, suites
from mamba2_kernels.tuning import capture_launches

ENTRY = "ssd_combined_fwd_bwd"


@pytest.fixture(autouse=True)
def _ref_mode(monkeypatch):
    """The tool runs on CPU in Helion's ref mode (its users' case), not in Triton's interpreter, which the
    kernel tests turn on: capturing the launches needs no compiled kernel."""
    monkeypatch.setenv("HELION_INTERPRET", "1")


@pytest.fixture(scope="module")
def smoke() -> suites.ShapeSpec:
    return suites.load().shape("smoke")


def _keys_at_full_length(shape: suites.ShapeSpec) -> set[tuple[str, str]]:
    entry = registry.get(ENTRY)
    with capture_launches() as captured:
        entry.run_helion(entry.inputs(shape, 0, "cpu"))
    return {(kernel.name, str(kernel.shape_key(*args))) for kernel, args in captured}


def test_keys_captured_at_a_short_sequence_are_the_shapes_own(smoke):
    shape = smoke.replace(docs=2)  # packed documents: the seq_idx path, whose keys flag it
    short = selected_configs.launches(ENTRY, shape, config_store.ConfigFile())  # two chunks of 32: 64 of 96 tokens
    cumsum, args, _ = short[0]
    assert cumsum.name == "chunk_cumsum" and args[0].shape[-1] == 64  # dt (b, h, L): the run was short
    assert {(kernel.name, str(key)) for kernel, _, key in short} == _keys_at_full_length(shape)
    assert all(dict(key.fields).get("tokens", 128) == 128 for _, _, key in short)  # 96 tokens: bucket 128


def test_against_names_only_the_launches_whose_config_moved(smoke, capsys):
    launched = selected_configs.launches(ENTRY, smoke, config_store.ConfigFile(), seqlen=64)
    scan, args, key = next(launch for launch in launched if launch[0].name == "chunk_scan")
    stored = dict(scan.bound(args).config_spec.default_config())
    neighbour = str(selected_configs.at_tokens(key, 4096))  # another key: the call selects it as its nearest
    current = config_store.ConfigFile(kernels={"chunk_scan": {neighbour: {**stored, "num_warps": 4}}})
    before = config_store.ConfigFile(kernels={"chunk_scan": {neighbour: {**stored, "num_warps": 8}}})

    report, changed = selected_configs.compare([smoke], [ENTRY], current, before, seqlen=64)
    assert changed == {"smoke": [f"{ENTRY}: chunk_scan"]}
    rows = {row["now"]["kernel"]: row for row in report["smoke"][ENTRY]}
    assert rows["chunk_scan"]["now"]["source"] == "nearest" and rows["chunk_scan"]["now"]["served_by"] == neighbour
    scan_row = rows["chunk_scan"]
    assert scan_row["now"]["config"]["num_warps"] == 4 and scan_row["before"]["config"]["num_warps"] == 8
    assert rows["bmm_chunk"]["now"]["source"] == rows["bmm_chunk"]["before"]["source"] == "default"
    assert "OTHER than before" in capsys.readouterr().out

    _, unchanged = selected_configs.compare([smoke], [ENTRY], current, current, seqlen=64)
    assert unchanged == {}
    # in two pool processes, one per shape: the same report, in the shapes' order
    other = smoke.replace(name="smoke-docs", docs=2)
    in_pool, moved = selected_configs.compare([smoke, other], [ENTRY], current, before, seqlen=64, processes=2)
    assert list(in_pool) == ["smoke", "smoke-docs"] and in_pool["smoke"] == report["smoke"]
    assert moved["smoke"] == changed["smoke"]


def test_the_state_passes_take_the_files_chain_rule(smoke):
    rule = {"chain": {"min_chunk": 32, "max_state": 10**6}}
    chained = config_store.ConfigFile(selection={"chunk_state_passing": rule})
    names = {kernel.name for kernel, _, _ in selected_configs.launches(ENTRY, smoke, chained, seqlen=64)}
    assert {"chunk_state", "state_passing"} <= names and "chunk_state_passing" not in names
    assert "chunk_state_passing_bwd" in names  # no rule for the backward pass: fused
    empty = config_store.ConfigFile()
    fused = {kernel.name for kernel, _, _ in selected_configs.launches(ENTRY, smoke, empty, seqlen=64)}
    assert "chunk_state_passing" in fused and "chunk_state" not in fused


def test_a_missing_against_file_is_named(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mamba2_guard", "dev", "selected", "--shapes", "smoke", "--against",
                           str(tmp_path / "old.yaml")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--against: expected a config file" in done.stderr
    assert "Traceback" not in done.stderr
