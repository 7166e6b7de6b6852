"""State and input files that are not what the guard writes: a FIFO, a link to /dev/zero, nesting 200,000
deep, an entry without its fields, as the seen file, settings, baselines, results, autotune journals,
measurement files and the peaks cache. None may hang, crash or exhaust memory; each is one line naming the
file, or a warning where a cycle can go on. The real console script where a user or the daemon meets it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from mamba2_guard.core import tuneplan
from mamba2_guard.flows import selection_measure
from mamba2_kernels import files, seen
from tests.guard import sample

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


FAKE_TUNER = str(Path(__file__).parents[1] / "flows" / "fake_tuner.py") + ":tune"


def test_an_earlier_journal_that_is_a_fifo_is_left_out_not_waited_on(tmp_path):
    state = tmp_path / "state"
    (state / "autotune" / "fake-0123456789ab").mkdir(parents=True)
    os.mkfifo(state / "autotune" / "fake-0123456789ab" / "journal.jsonl")
    done = guard("autotune", "--tuner", FAKE_TUNER, "--kernels", "chunk_cumsum", "--shapes", "smoke",
                 "--state-dir", str(state), "--out", str(tmp_path / "fake.yaml"), "--gpu-slug", "fake",
                 "--budget-seconds", "5", "--workers", "1", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fake-0123456789ab/journal.jsonl: left out of the earlier runs: " in done.stderr
    assert "not a regular file" in done.stderr


def test_a_journal_line_nested_too_deeply_is_skipped_as_a_torn_one():
    good = json.dumps({"job": "chunk_cumsum@smoke", "status": "ok"})
    assert tuneplan.parse_journal("\n".join([good, DEEP, good])) == [json.loads(good)] * 2


def test_a_measurements_file_that_is_a_fifo_or_too_deep_is_named(tmp_path):
    fifo = tmp_path / "selection.jsonl"
    os.mkfifo(fifo)
    assert f"{fifo}: not a regular file" in raised(selection_measure.read_records, fifo)
    deep = tmp_path / "deep.jsonl"
    deep.write_text(DEEP + "\n")
    assert raised(selection_measure.read_records, deep) == f"{deep}: line 1: not a JSON measurement record"


def test_device_peaks_cached_in_a_fifo_are_measured_again(tmp_path, monkeypatch):
    from mamba2_guard.bench import peaks

    path = tmp_path / "peaks" / f"{'d' * 16}.json"
    path.parent.mkdir()
    os.mkfifo(path)
    monkeypatch.setattr(peaks, "measure", lambda device: {"bandwidth_bytes_per_s": 1.0})
    assert within(peaks.cached, tmp_path, "d" * 64) == {"bandwidth_bytes_per_s": 1.0}
    assert json.loads(path.read_text()) == {"bandwidth_bytes_per_s": 1.0}  # replaced by a regular file


def within(call, *args, seconds: float = 30):
    """``call(*args)`` in a thread: its result, or its exception; a call still waiting after ``seconds`` (on a
    FIFO nobody writes) fails the test instead of hanging it."""
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(call(*args))
        except Exception as exc:  # the caller judges it
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call.__name__}{args} still waiting after {seconds} s"
    return outcome[0]


def raised(call, *args) -> str:
    outcome = within(call, *args)
    assert isinstance(outcome, ValueError), f"{call.__name__} gave {outcome!r} for {args}"
    return str(outcome)
