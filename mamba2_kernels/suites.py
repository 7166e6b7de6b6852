"""Shape suites (``suites.yaml``): validated shape specs, with errors that name the file and the key.

A shape may also say how the whole call is made (``call:``), as frameworks make it: ``z`` given, ``dt_dtype``
(dt in another dtype than x), ``docs`` (that many packed documents, passed as ``seq_idx``), ``D`` per head
(``h``) or per head dim (``hp``), and ``initial_states``. Kernel entries ignore it; the whole-call and layer
entries use it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mamba2_kernels.files import UnreadableFile, load_yaml

if TYPE_CHECKING:
    import torch

SUITES_FILE = Path(__file__).resolve().parent / "suites.yaml"
# The shapes production called at keys no config was tuned for (mamba2_kernels/seen.py), while still untuned.
SEEN_SUITE = "seen"
# torch's names of the dtypes a shape may use. Only the properties below import torch: the guard's commands
# check a suite without it, so a usage error answers before torch loads.
DTYPES = ("float16", "bfloat16", "float32", "float64")
_INT_FIELDS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
# Upper bounds that keep a case within one GPU's memory; a larger value is a typo, not a shape.
_MAX = {"batch": 1024, "seqlen": 1 << 22, "nheads": 4096, "headdim": 512, "ngroups": 4096, "dstate": 512,
        "chunk_size": 1024}
MAX_TOKENS = 1 << 22
CALL_KEYS = ("z", "dt_dtype", "docs", "D", "initial_states")


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> KeyError:
    """The error for a name that is none of ``valid``: "did you mean" the closest where one is close (the whole
    list of kernels was a 630-character line), else the valid names."""
    import difflib

    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid {kind}s: {', '.join(valid)}"
    return KeyError(f"unknown {kind} {name!r}; {hint}")


class SuiteFileError(ValueError):
    """A malformed suite file; the message names the file and the key."""


@dataclass(frozen=True)
class ShapeSpec:
    name: str
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    dtype: str
    norm_group_size: int
    norm_before_gate: bool
    conv_width: int
    # how the whole call is made (module docstring)
    z: bool = False
    dt_dtype: str | None = None  # None: the dtype of x
    docs: int = 1
    d_per_dim: bool = False
    initial_states: bool = False

    @property
    def dt_torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dt_dtype or self.dtype)

    @property
    def pattern(self) -> str:
        """The call pattern in words ('' for the plain call: no z, dt like x, one document, D per head)."""
        parts = (["z"] if self.z else []) + ([f"dt {self.dt_dtype}"] if self.dt_dtype else []) + (
            [f"{self.docs} docs"] if self.docs > 1 else []) + (["D per head dim"] if self.d_per_dim else []) + (
            ["initial states"] if self.initial_states else [])
        return ", ".join(parts)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    @property
    def nchunks(self) -> int:
        return -(-self.seqlen // self.chunk_size)

    @property
    def d_ssm(self) -> int:
        return self.nheads * self.headdim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: x, B and C together (as in mamba-ssm's Mamba2)."""
        return self.d_ssm + 2 * self.ngroups * self.dstate

    def replace(self, **changes: Any) -> ShapeSpec:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Suites:
    shapes: dict[str, ShapeSpec]
    suites: dict[str, tuple[str, ...]]
    # seen suite shape -> the (kernel, key) pairs its call fell back at
    seen_keys: dict[str, tuple[tuple[str, str], ...]] = dataclasses.field(default_factory=dict)
    # why the seen-keys file gave no shapes when it could not be read (None when read, absent or off)
    seen_problem: str | None = None

    def shape(self, name: str) -> ShapeSpec:
        if name not in self.shapes:
            raise unknown_name("shape", name, sorted(self.shapes))
        return self.shapes[name]

    def suite(self, name: str) -> list[ShapeSpec]:
        if name == SEEN_SUITE and name not in self.suites:
            from mamba2_kernels import seen

            file = seen.path()
            why = f"{file} records no call that fell back" if file else f"${seen.SEEN_ENV} is off"
            raise KeyError(f"suite {name!r} is empty: {why}")
        if name not in self.suites:
            raise unknown_name("suite", name, sorted(self.suites))
        return [self.shapes[s] for s in self.suites[name]]


def seen_on(loaded: Suites, gpu_slug: str) -> list[ShapeSpec]:
    """The seen suite's shapes recorded on the GPU ``gpu_slug`` at least one of whose keys still has no exact
    config in that GPU's config file: what a re-tune must still cover."""
    from mamba2_kernels import config_store

    configs = config_store.load_cached(gpu_slug)
    return [loaded.shapes[name] for name in loaded.suites.get(SEEN_SUITE, ()) if name.startswith(f"seen-{gpu_slug}-")
            and any(configs is None or configs.get(kernel, key) is None for kernel, key in loaded.seen_keys[name])]


def _parse_shape(path: Path, name: str, raw: Any) -> ShapeSpec:
    where = f"{path}: shapes.{name}"
    if not isinstance(raw, dict):
        raise SuiteFileError(f"{where}: expected a mapping")
    known = set(_INT_FIELDS) | {"dtype", "norm", "conv", "call"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SuiteFileError(f"{where}: unknown key(s) {unknown}; expected {sorted(known)}")
    values: dict[str, Any] = {}
    for key in _INT_FIELDS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _MAX[key]:
            raise SuiteFileError(f"{where}.{key}: expected an integer from 1 to {_MAX[key]}, got {value!r}")
        values[key] = value
    if values["batch"] * values["seqlen"] > MAX_TOKENS:
        raise SuiteFileError(f"{where}: batch x seqlen must be at most {MAX_TOKENS} tokens, got "
                             f"{values['batch'] * values['seqlen']}")
    if values["nheads"] % values["ngroups"]:
        raise SuiteFileError(f"{where}.ngroups: must divide nheads ({values['nheads']}), got {values['ngroups']}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise SuiteFileError(f"{where}.dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    norm = raw.get("norm") or {}
    conv = raw.get("conv") or {}
    if not isinstance(norm, dict) or not isinstance(conv, dict):
        raise SuiteFileError(f"{where}: norm and conv must be mappings")
    d_ssm = values["nheads"] * values["headdim"]
    group_size = norm.get("group_size", d_ssm)
    if not isinstance(group_size, int) or group_size <= 0 or d_ssm % group_size:
        raise SuiteFileError(f"{where}.norm.group_size: expected a positive divisor of {d_ssm}, got {group_size!r}")
    before = norm.get("norm_before_gate", False)
    if not isinstance(before, bool):
        raise SuiteFileError(f"{where}.norm.norm_before_gate: expected true or false, got {before!r}")
    width = conv.get("width", 4)
    if width not in (2, 3, 4):
        raise SuiteFileError(f"{where}.conv.width: expected 2, 3 or 4, got {width!r}")
    return ShapeSpec(name=name, **values, dtype=dtype, norm_group_size=group_size, norm_before_gate=before,
                     conv_width=width, **_parse_call(where, raw.get("call") or {}, values["seqlen"]))


def _parse_call(where: str, call: Any, seqlen: int) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise SuiteFileError(f"{where}.call: expected a mapping with keys from {list(CALL_KEYS)}")
    unknown = sorted(set(call) - set(CALL_KEYS))
    if unknown:
        raise SuiteFileError(f"{where}.call: unknown key(s) {unknown}; expected {list(CALL_KEYS)}")
    for flag in ("z", "initial_states"):
        if not isinstance(call.get(flag, False), bool):
            raise SuiteFileError(f"{where}.call.{flag}: expected true or false, got {call[flag]!r}")
    dt_dtype = call.get("dt_dtype")
    if dt_dtype is not None and dt_dtype not in DTYPES:
        raise SuiteFileError(f"{where}.call.dt_dtype: expected one of {sorted(DTYPES)}, got {dt_dtype!r}")
    docs = call.get("docs", 1)
    if not isinstance(docs, int) or isinstance(docs, bool) or not 0 < docs <= seqlen:
        raise SuiteFileError(f"{where}.call.docs: expected a document count from 1 to seqlen ({seqlen}), got {docs!r}")
    d_kind = call.get("D", "h")
    if d_kind not in ("h", "hp"):
        raise SuiteFileError(f"{where}.call.D: expected h (per head) or hp (per head dim), got {d_kind!r}")
    if docs > 1 and call.get("initial_states"):
        raise SuiteFileError(f"{where}.call: docs and initial_states together are not a call mamba-ssm supports")
    return {"z": call.get("z", False), "dt_dtype": dt_dtype, "docs": docs, "d_per_dim": d_kind == "hp",
            "initial_states": call.get("initial_states", False)}


def load(path: Path = SUITES_FILE) -> Suites:
    try:
        data = load_yaml(path)
    except UnreadableFile as exc:
        raise SuiteFileError(str(exc)) from exc
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SuiteFileError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("shapes"), dict):
        raise SuiteFileError(f"{path}: shapes: expected a mapping of shape name -> shape")
    shapes = {name: _parse_shape(path, name, raw) for name, raw in data["shapes"].items()}
    suites_raw = data.get("suites") or {}
    if not isinstance(suites_raw, dict):
        raise SuiteFileError(f"{path}: suites: expected a mapping of suite name -> list of shape names")
    suites: dict[str, tuple[str, ...]] = {}
    for name, members in suites_raw.items():
        if not isinstance(members, list) or not members:
            raise SuiteFileError(f"{path}: suites.{name}: expected a non-empty list of shape names")
        expanded: list[str] = []
        for member in members:
            # A member names a shape or a suite listed above (the fit's grid is zoo-fit plus the tuned suite).
            if member not in shapes and member not in suites:
                raise SuiteFileError(
                    f"{path}: suites.{name}: unknown shape {member!r} (nor a suite listed above); valid shapes: "
                    f"{', '.join(sorted(shapes))}")
            expanded += [s for s in ((member,) if member in shapes else suites[member]) if s not in expanded]
        suites[name] = tuple(expanded)
    _check_frozen(path, data.get("frozen") or {}, shapes, suites)
    seen_shapes, seen_keys, seen_problem = _seen_shapes()
    if seen_shapes:
        shapes.update(seen_shapes)
        suites[SEEN_SUITE] = tuple(seen_shapes)
    return Suites(shapes, suites, seen_keys, seen_problem)


def frozen_digest(specs: Iterable[ShapeSpec]) -> str:
    """The digest that fixes a frozen suite: of its shapes' names and fields, in the suite's order. A field at
    its default is left out, so that a field added later with a default does not unfreeze a suite."""
    import hashlib
    import json

    def fields(spec: ShapeSpec) -> dict[str, Any]:
        return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                if f.default is dataclasses.MISSING or getattr(spec, f.name) != f.default}

    text = json.dumps([fields(spec) for spec in specs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_frozen(path: Path, frozen: Any, shapes: dict[str, ShapeSpec], suites: dict[str, tuple[str, ...]]) -> None:
    """A held-out suite is frozen before the work it judges (``frozen: {suite: {since, digest}}``): a change to
    its list or to one of its shapes afterwards would let the results choose the claim, so it is an error."""
    if not isinstance(frozen, dict):
        raise SuiteFileError(f"{path}: frozen: expected a mapping of suite name -> {{since, digest}}")
    for name, entry in frozen.items():
        if name not in suites:
            raise SuiteFileError(f"{path}: frozen.{name}: no such suite")
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
            raise SuiteFileError(f"{path}: frozen.{name}: expected a mapping with a digest")
        digest = frozen_digest(shapes[s] for s in suites[name])
        if digest != entry["digest"]:
            raise SuiteFileError(
                f"{path}: suites.{name}: frozen since {entry.get('since')}, but its shapes changed (digest "
                f"{digest}, frozen as {entry['digest']}); a held-out set must not change once named: name a new one")


def _seen_shapes() -> tuple[dict[str, ShapeSpec], dict[str, tuple[tuple[str, str], ...]], str | None]:
    """Suite shapes of the public calls recorded in the seen-keys file, named ``seen-<gpu slug>-<hash of the
    call>``, and the (kernel, key) pairs each fell back at; unreadable entries are left out. Third: why the
    file could not be read, if so."""
    import hashlib
    import json
    import logging

    from mamba2_kernels import seen

    file = seen.path()
    if file is None:
        return {}, {}, None
    try:
        entries = seen.read(file)
    except ValueError as exc:  # the caller says it: fatal for `--suite seen`, a warning in the nightly
        return {}, {}, str(exc)
    shapes: dict[str, ShapeSpec] = {}
    keys: dict[str, tuple[tuple[str, str], ...]] = {}
    for label, entry in entries.items():
        call = entry.get("call")
        if not isinstance(call, dict):
            continue
        fields = [entry.get(name) for name in ("gpu", "kernel", "key")]
        if not all(isinstance(value, str) and value for value in fields):  # one bad entry must not stop a cycle
            logging.getLogger(__name__).warning("%s: entry %r left out: expected gpu, kernel and key as text",
                                                file, label)
            continue
        name = f"seen-{entry['gpu']}-" + hashlib.sha256(json.dumps(call, sort_keys=True).encode()).hexdigest()[:8]
        try:
            shapes[name] = _parse_shape(file, name, call)
        except SuiteFileError as exc:
            logging.getLogger(__name__).warning("%s: left out of the seen suite", exc)
            continue
        keys[name] = (*keys.get(name, ()), (str(entry["kernel"]), str(entry["key"])))
    return shapes, keys, None
