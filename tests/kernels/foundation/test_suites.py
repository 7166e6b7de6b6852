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
    fit, heldout = loaded.suite("zoo-fit"), loaded.suite("zoo-steered")
    assert not {s.name for s in fit} & {s.name for s in heldout}
    assert len(fit) + len(heldout) >= 10
    # every call pattern frameworks use appears among the held-out shapes
    assert {s.pattern for s in heldout} >= {"", "z, dt float32", "4 docs", "initial states"}
    assert {s.dstate for s in heldout} >= {64, 128, 256} and {s.chunk_size for s in heldout} == {128, 256}
    assert {s.headdim for s in heldout} >= {64, 80, 128}
    packed = loaded.shape("nemotron3-nano-packed")
    assert (packed.docs, packed.z, packed.dt_torch_dtype.is_floating_point) == (4, False, True)


def test_the_frozen_held_out_set_covers_the_axes_the_zoo_lacks():
    loaded = suites.load()
    wide = loaded.suite("heldout-wide")
    others = {s.name for name in ("default", "zoo-fit", "zoo-steered") for s in loaded.suite(name)}
    assert not {s.name for s in wide} & others
    assert {s.headdim for s in wide} >= {32, 96} and {s.dstate for s in wide} >= {16, 32}
    assert 64 in {s.chunk_size for s in wide} and 4 in {s.ngroups for s in wide}
    assert {s.batch for s in wide} >= {4, 8, 16} and "float16" in {s.dtype for s in wide}
    assert any(s.seqlen % s.chunk_size for s in wide) and {2048, 32768} <= {s.seqlen for s in wide}
    assert any(s.norm_before_gate for s in wide) and max(s.docs for s in wide) >= 64


FROZEN_FILE = """shapes:
  a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, dtype: float32}
  b: {batch: 2, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, dtype: float32}
suites: {held: [a]}
frozen: {held: {since: 2026-12-05, digest: DIGEST}}
"""


def test_a_frozen_suite_loads_until_it_changes(tmp_path):
    path = tmp_path / "suites.yaml"
    path.write_text(FROZEN_FILE.replace("DIGEST", "stale"))
    with pytest.raises(SuiteFileError, match="suites.held: frozen since 2026-12-05, but its shapes changed"):
        suites.load(path)
    digest = suites.frozen_digest([suites.load(_unfrozen(path)).shape("a")])
    path.write_text(FROZEN_FILE.replace("DIGEST", digest))
    assert [s.name for s in suites.load(path).suite("held")] == ["a"]
    # one field of a frozen shape, or one more shape in the list, is a change
    for changed in (FROZEN_FILE.replace("seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
                                        "dtype: float32}\n  b", "seqlen: 16, nheads: 4, headdim: 8, ngroups: 2, "
                                        "dstate: 8, chunk_size: 4, dtype: float32}\n  b", 1),
                    FROZEN_FILE.replace("held: [a]", "held: [a, b]")):
        path.write_text(changed.replace("DIGEST", digest))
        with pytest.raises(SuiteFileError, match="must not change once named"):
            suites.load(path)


def _unfrozen(path):
    """The file without its frozen: section, to read the shapes whose digest the test then freezes."""
    plain = path.with_name("plain.yaml")
    plain.write_text(path.read_text().split("frozen:")[0])
    return plain


def test_the_committed_held_out_set_is_frozen():
    import yaml

    frozen = yaml.safe_load(suites.SUITES_FILE.read_text())["frozen"]
    assert set(frozen) == {"heldout-wide"}
    assert frozen["heldout-wide"]["digest"] == suites.frozen_digest(suites.load().suite("heldout-wide"))


def test_a_suite_may_list_the_suites_above_it():
    loaded = suites.load()
    grid = [s.name for s in loaded.suite("selection-grid")]
    assert grid == [s.name for s in loaded.suite("zoo-fit") + loaded.suite("default")]
    assert not set(grid) & {s.name for s in loaded.suite("zoo-steered")}


def test_unknown_names_list_the_valid_ones():
    loaded = suites.load()
    with pytest.raises(KeyError, match="valid shapes: axis-d16-q64, .*, long-context, .*, zamba2-7b"):
        loaded.shape("x")
    with pytest.raises(KeyError, match="did you mean 'long-context'"):
        loaded.shape("long-contxt")
    with pytest.raises(KeyError, match="valid suites: default, heldout-wide, selection-grid, smoke, zoo-fit, "
                                       "zoo-steered"):
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
    ("shapes: {}\nfrozen: {s: {digest: x}}", "frozen.s: no such suite"),
    ("shapes: {a: {batch: 1, seqlen: 8, nheads: 4, headdim: 8, ngroups: 2, dstate: 8, chunk_size: 4, "
     "dtype: float32}}\nsuites: {s: [a]}\nfrozen: {s: 1}", "frozen.s: expected a mapping with a digest"),
])
def test_malformed_suite_files_name_file_and_key(tmp_path, body, where):
    path = tmp_path / "suites.yaml"
    path.write_text(body)
    with pytest.raises(SuiteFileError) as info:
        suites.load(path)
    assert str(path) in str(info.value) and where in str(info.value)
