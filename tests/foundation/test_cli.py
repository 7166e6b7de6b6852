"""The command line: exit codes and errors that list the valid names."""

from __future__ import annotations

import json

from guard import cli


def test_unknown_kernel_lists_valid_ones_and_exits_2(capsys):
    assert cli.main(["list", "--kernels", "chunk_stat"]) == cli.EXIT_USAGE
    assert "valid kernels: chunk_cumsum" in capsys.readouterr().err


def test_unknown_shape_and_suite_exit_2(capsys):
    assert cli.main(["list", "--shapes", "nano"]) == cli.EXIT_USAGE
    assert "valid shapes:" in capsys.readouterr().err
    assert cli.main(["list", "--suite", "nightly"]) == cli.EXIT_USAGE
    assert "valid suites: default, smoke" in capsys.readouterr().err


def test_fingerprint_json(capsys):
    assert cli.main(["fingerprint", "--json"]) == cli.EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert {"gpu_name", "driver_version", "torch", "triton", "helion", "mamba_ssm", "kernels_source_hash"} <= set(data)


def test_precision_reports_missing_kernels_and_writes_json(tmp_path, capsys, monkeypatch):
    from kernels import registry

    entry = registry.get("chunk_state")
    monkeypatch.setitem(registry.REGISTRY, "chunk_state", registry.KernelEntry(**{**entry.__dict__, "helion": None}))
    out = tmp_path / "cases.json"
    code = cli.main(["precision", "--shapes", "smoke", "--kernels", "chunk_state", "--json", str(out)])
    assert code == cli.EXIT_OK
    cases = json.loads(out.read_text())
    assert [(c["kernel"], c["status"]) for c in cases] == [("chunk_state", "missing-kernel")]
