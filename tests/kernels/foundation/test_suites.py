from __future__ import annotations

import pytest

from mamba2_kernels import suites
from mamba2_kernels.suites import SuiteFileError


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


def test_the_zoo_holds_out_shapes_it_is_not_fitted_on():
    loaded = suites.load()
    fit, heldout = loaded.suite("zoo-fit"), loaded.suite("zoo-heldout")
    assert not {s.name for s in fit} & {s.name for s in heldout}
    assert len(fit) + len(heldout) >= 10
    # every call pattern frameworks use appears among the held-out shapes
    assert {s.pattern for s in heldout} >= {"", "z, dt float32", "4 docs", "initial states"}
    assert {s.dstate for s in heldout} >= {64, 128, 256} and {s.chunk_size for s in heldout} == {128, 256}
    assert {s.headdim for s in heldout} >= {64, 80, 128}
    packed = loaded.shape("nemotron3-nano-packed")
    assert (packed.docs, packed.z, packed.dt_torch_dtype.is_floating_point) == (4, False, True)


def test_a_suite_may_list_the_suites_above_it():
    loaded = suites.load()
    grid = [s.name for s in loaded.suite("selection-grid")]
    assert grid == [s.name for s in loaded.suite("zoo-fit") + loaded.suite("default")]
    assert not set(grid) & {s.name for s in loaded.suite("zoo-heldout")}


def test_unknown_names_list_the_valid_ones():
    loaded = suites.load()
    with pytest.raises(KeyError, match="valid shapes: bamba-9b, .*, long-context, .*, zamba2-7b"):
        loaded.shape("x")
    with pytest.raises(KeyError, match="did you mean 'long-context'"):
        loaded.shape("long-contxt")
    with pytest.raises(KeyError, match="valid suites: default, selection-grid, smoke, zoo-fit, zoo-heldout"):
        loaded.suite("nightly")


@pytest.mark.parametrize(("body", "where"), [
    ("shapes: {a: {batch: 0}}", "shapes.a.batch: expected an integer from 1 to 1024"),
    ("shapes: {a: {batch: 1, seqlen: 1000000000, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32}}", "shapes.a.seqlen: expected an integer from 1 to 4194304"),
    ("shapes: {a: {batch: 64, seqlen: 4194304, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32}}", "shapes.a: batch x seqlen must be at most 4194304 tokens"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {zz: 1}}}", "shapes.a.call: unknown key(s) ['zz']"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {docs: 9}}}", "shapes.a.call.docs: expected a document count from 1 to seqlen"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {D: x}}}", "shapes.a.call.D: expected h"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {dt_dtype: int8}}}", "shapes.a.call.dt_dtype: expected one of"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {z: 1}}}", "shapes.a.call.z: expected true or false"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32, call: {docs: 2, initial_states: true}}}", "shapes.a.call: docs and initial_states"),
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
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32}}\nsuites: {s: [a, t], t: [a]}", "suites.s: unknown shape 't' (nor a suite listed above)"),
    ("shapes: [", "not valid YAML"),
])
def test_malformed_suite_files_name_file_and_key(tmp_path, body, where):
    path = tmp_path / "suites.yaml"
    path.write_text(body)
    with pytest.raises(SuiteFileError) as info:
        suites.load(path)
    assert str(path) in str(info.value) and where in str(info.value)
