from __future__ import annotations

import pytest

from kernels import suites
from kernels.suites import SuiteFileError


def test_the_designed_suites():
    loaded = suites.load()
    nano = loaded.shape("nemotron3-nano")
    assert (nano.batch, nano.seqlen, nano.nheads, nano.headdim, nano.ngroups, nano.dstate, nano.chunk_size) == (
        2, 8192, 64, 64, 8, 128, 128)
    assert nano.dtype == "bfloat16" and nano.norm_group_size == 512 and not nano.norm_before_gate
    assert nano.conv_dim == 6144
    long = loaded.shape("long-context")
    assert (long.batch, long.seqlen) == (1, 65536)
    default = loaded.shape("mamba2-default")
    assert (default.ngroups, default.headdim, default.dstate, default.chunk_size) == (1, 64, 128, 256)
    assert [s.name for s in loaded.suite("default")] == ["nemotron3-nano", "long-context", "mamba2-default"]
    assert loaded.shape("smoke").dtype == "float32"


def test_unknown_names_list_the_valid_ones():
    loaded = suites.load()
    with pytest.raises(KeyError, match="valid shapes: long-context, mamba2-default, nemotron3-nano, smoke"):
        loaded.shape("nano")
    with pytest.raises(KeyError, match="valid suites: default, smoke"):
        loaded.suite("nightly")


@pytest.mark.parametrize(("body", "where"), [
    ("shapes: {a: {batch: 0}}", "shapes.a.batch: expected a positive integer"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 3, dstate: 8, chunk_size: 4, "
     "dtype: float32}}", "shapes.a.ngroups: must divide nheads"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: fp8}}", "shapes.a.dtype: expected one of"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, conv: {width: 7}}}", "shapes.a.conv.width"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, norm: {group_size: 5}}}", "shapes.a.norm.group_size"),
    ("shapes: {a: {bach: 1}}", "shapes.a: unknown key(s) ['bach']"),
    ("shapes: {}\nsuites: {s: [nope]}", "suites.s: unknown shape 'nope'"),
    ("shapes: [", "not valid YAML"),
])
def test_malformed_suite_files_name_file_and_key(tmp_path, body, where):
    path = tmp_path / "suites.yaml"
    path.write_text(body)
    with pytest.raises(SuiteFileError) as info:
        suites.load(path)
    assert str(path) in str(info.value) and where in str(info.value)
