"""State and input files that are not what the guard writes: a FIFO, a link to /dev/zero, nesting 200,000
deep, an entry without its fields. None may hang, crash or exhaust memory; each is one line naming the file, or
a warning where a cycle can go on. The real console script, as a user or the daemon runs it."""

from __future__ import annotations

import json
import os

from mamba2_kernels import files, seen
from tests.guard.infra import sample

from .test_console_script import guard, one_line_error

DEEP = "[" * 200_000 + "]" * 200_000


def test_a_fifo_as_the_seen_file_is_named_not_waited_on(tmp_path):
    fifo = tmp_path / "seen.json"
    os.mkfifo(fifo)
    done = guard("list", "--suite", "seen", timeout=120, MAMBA2_GUARD_SEEN=str(fifo))
    one_line_error(done, "seen.json", "not a regular file")


def test_a_link_to_dev_zero_is_named_not_read_to_the_end(tmp_path):
    link = tmp_path / "latest.json"
    link.symlink_to("/dev/zero")
    done = guard("metrics", "show", "--snapshot", str(link), "--state-dir", str(tmp_path / "s"), timeout=120)
    one_line_error(done, "latest.json", "not a regular file")


def test_a_seen_file_nested_too_deeply_is_named_and_a_job_still_records(tmp_path, monkeypatch):
    file = tmp_path / "seen.json"
    file.write_text(DEEP)
    one_line_error(guard("list", "--suite", "seen", MAMBA2_GUARD_SEEN=str(file)), "seen.json", "nested too deeply")
    monkeypatch.setenv(seen.SEEN_ENV, str(file))
    monkeypatch.delenv(seen.RECORD_ENV, raising=False)
    seen.record("chunk_scan", "k=1", "nvidia-h200", "default", None)  # a training job's fallback
    assert list(json.loads(file.read_text())) == ["nvidia-h200|chunk_scan|k=1"]


def test_one_bad_seen_entry_is_left_out_with_a_warning_naming_the_file(tmp_path):
    file = tmp_path / "seen.json"
    call = {"batch": 1, "seqlen": 256, "nheads": 4, "headdim": 16, "ngroups": 1, "dstate": 16, "chunk_size": 64,
            "dtype": "float32"}
    good = {"gpu": "nvidia-h200", "kernel": "chunk_scan", "key": "k=1", "call": call}
    file.write_text(json.dumps({"nvidia-h200|chunk_scan|k=1": good, "broken": {"call": call, "key": "k=2"}}))
    done = guard("list", "--suite", "seen", MAMBA2_GUARD_SEEN=str(file))
    assert done.returncode == 0, done.stderr
    assert "entry 'broken' left out" in done.stderr and str(file) in done.stderr
    assert "seen-nvidia-h200-" in done.stdout


def test_read_regular_refuses_what_is_not_a_regular_file_of_its_size(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"0" * 1025)
    for path, why in ((tmp_path, "not a regular file"), (big, "over the 1024")):
        try:
            files.read_regular(path, limit=1024)
        except files.UnreadableFile as exc:
            assert why in str(exc) and str(path) in str(exc)
        else:
            raise AssertionError(f"{path} was read")
    assert files.read_regular(big, limit=2048) == b"0" * 1025


def test_yaml_nested_too_deeply_is_named_in_one_line(tmp_path):
    deep = ("[" * 200_000 + "]" * 200_000 + "\n").encode()
    (tmp_path / "guard.yaml").write_bytes(b"policy: " + deep)
    one_line_error(guard("config", "check", str(tmp_path / "guard.yaml")), "guard.yaml", "nested too deeply")
    (tmp_path / "baseline.yaml").write_bytes(deep)
    result = tmp_path / "result.json"
    result.write_text(json.dumps(sample.result()))
    one_line_error(guard("check", "--result", str(result), "--baseline", str(tmp_path / "baseline.yaml"),
                         "--state-dir", str(tmp_path / "s")), "baseline.yaml", "nested too deeply")


def test_a_fifo_as_the_result_to_check_is_named_not_waited_on(tmp_path):
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    one_line_error(guard("check", "--result", str(fifo), "--state-dir", str(tmp_path / "s"), timeout=120),
                   "result.json", "not a regular file")
