"""Shape suites (``suites.yaml``): validated shape specs, with errors that name the file and the key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

SUITES_FILE = Path(__file__).resolve().parent / "suites.yaml"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
_INT_FIELDS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")


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

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

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

    def shape(self, name: str) -> ShapeSpec:
        if name not in self.shapes:
            raise KeyError(f"unknown shape {name!r}; valid shapes: {', '.join(sorted(self.shapes))}")
        return self.shapes[name]

    def suite(self, name: str) -> list[ShapeSpec]:
        if name not in self.suites:
            raise KeyError(f"unknown suite {name!r}; valid suites: {', '.join(sorted(self.suites))}")
        return [self.shapes[s] for s in self.suites[name]]


def _parse_shape(path: Path, name: str, raw: Any) -> ShapeSpec:
    where = f"{path}: shapes.{name}"
    if not isinstance(raw, dict):
        raise SuiteFileError(f"{where}: expected a mapping")
    known = set(_INT_FIELDS) | {"dtype", "norm", "conv"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SuiteFileError(f"{where}: unknown key(s) {unknown}; expected {sorted(known)}")
    values: dict[str, Any] = {}
    for key in _INT_FIELDS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SuiteFileError(f"{where}.{key}: expected a positive integer, got {value!r}")
        values[key] = value
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
                     conv_width=width)


def load(path: Path = SUITES_FILE) -> Suites:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
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
        for member in members:
            if member not in shapes:
                raise SuiteFileError(
                    f"{path}: suites.{name}: unknown shape {member!r}; valid shapes: {', '.join(sorted(shapes))}"
                )
        suites[name] = tuple(members)
    return Suites(shapes, suites)
