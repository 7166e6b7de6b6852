"""Tuned Helion configs, one YAML file per GPU model in ``kernels/configs/<gpu-slug>.yaml``.

File layout (stable: keys sorted, one config per line, so that config-update PRs show small diffs)::

    fingerprint: {...}          # the environment the configs were tuned in
    tuned: {date: ..., effort: ..., seed: ..., budget_s: ...}
    kernels:
      chunk_state:
        dtype=bfloat16,headdim=64,...,tokens=16384: {"block_sizes": [64, 64], "num_warps": 4}

Lookup rule, the same for every kernel (``lookup``):
  1. the exact shape key;
  2. else the nearest key: every *exact* field must be equal, and among those keys the one with the
     smallest sum over the *scaled* fields (``tokens``, ``channels``) of |log2(a / b)| wins; ties go
     to the lexicographically smallest key, so the choice is deterministic;
  3. else the kernel's default config (``None`` here; the runtime then asks Helion for its default).
A fallback (2 or 3) is logged once per kernel and key, and counted in ``FALLBACKS``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# Fields of a shape key compared by distance rather than equality.
SCALED_FIELDS = frozenset({"tokens", "channels"})
TOP_LEVEL_KEYS = ("fingerprint", "tuned", "kernels")

FALLBACKS: Counter[tuple[str, str]] = Counter()
# (gpu slug, kernel, shape key) -> why the installed helion rejected that stored config: drift, which the
# guard reports.
INVALID: dict[tuple[str, str, str], str] = {}
_warned: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, order=True)
class ShapeKey:
    """The values a kernel specializes on. ``str(key)`` is the key written in config files."""

    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **values: Any) -> ShapeKey:
        for name, value in values.items():
            if name in SCALED_FIELDS and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"shape key field {name!r} must be a positive int, got {value!r}")
        return cls(tuple(sorted(values.items())))

    @classmethod
    def parse(cls, text: str) -> ShapeKey:
        values: dict[str, Any] = {}
        for part in text.split(","):
            name, sep, raw = part.partition("=")
            if not sep or not name:
                raise ValueError(f"shape key {text!r}: expected comma-separated name=value pairs")
            values[name] = int(raw) if re.fullmatch(r"-?\d+", raw) else raw
        return cls.of(**values)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.fields)

    def exact(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in self.fields if k not in SCALED_FIELDS)

    def distance(self, other: ShapeKey) -> float:
        mine, theirs = dict(self.fields), dict(other.fields)
        return sum(abs(math.log2(mine[k] / theirs[k])) for k in SCALED_FIELDS if k in mine and k in theirs)


def tokens_bucket(n: int) -> int:
    """Power-of-two bucket of a token count (batch x seqlen), the scaled field of SSD shape keys."""
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class ConfigFile:
    fingerprint: dict[str, Any] = field(default_factory=dict)
    tuned: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def get(self, kernel: str, key: ShapeKey | str) -> dict[str, Any] | None:
        return self.kernels.get(kernel, {}).get(str(key))

    def put(self, kernel: str, key: ShapeKey | str, config: dict[str, Any]) -> None:
        self.kernels.setdefault(kernel, {})[str(key)] = dict(config)


@dataclass(frozen=True)
class Lookup:
    config: dict[str, Any] | None
    source: str  # "exact" | "nearest" | "default"
    key: str | None  # the key whose config was used


def slugify(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'; 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"gpu_name: expected a GPU name with letters or digits, got {gpu_name!r}")
    return slug


def path_for(slug: str, config_dir: Path | None = None) -> Path:
    return (config_dir or CONFIG_DIR) / f"{slug}.yaml"


def _check_config(path: Path, where: str, config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigFileError(f"{path}: {where}: expected a mapping of Helion config fields, got {config!r}")
    for name in config:
        if not isinstance(name, str):
            raise ConfigFileError(f"{path}: {where}: config field names must be strings, got {name!r}")
    return config


def load(path: Path) -> ConfigFile:
    """Read and validate one config file. Errors name the file and the key."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping with keys {TOP_LEVEL_KEYS}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigFileError(f"{path}: unknown top-level key(s) {unknown}; expected {list(TOP_LEVEL_KEYS)}")
    for name in ("fingerprint", "tuned"):
        if not isinstance(data.get(name) or {}, dict):
            raise ConfigFileError(f"{path}: {name}: expected a mapping")
    kernels_section = data.get("kernels") or {}
    if not isinstance(kernels_section, dict):
        raise ConfigFileError(f"{path}: kernels: expected a mapping of kernel name -> shape key -> config")
    kernels: dict[str, dict[str, dict[str, Any]]] = {}
    for kernel, by_key in kernels_section.items():
        if not isinstance(by_key, dict):
            raise ConfigFileError(f"{path}: kernels.{kernel}: expected a mapping of shape key -> config")
        kernels[kernel] = {}
        for key, config in by_key.items():
            try:
                ShapeKey.parse(str(key))
            except ValueError as exc:
                raise ConfigFileError(f"{path}: kernels.{kernel}.{key}: bad shape key: {exc}") from exc
            kernels[kernel][str(key)] = _check_config(path, f"kernels.{kernel}.{key}", config)
    return ConfigFile(dict(data.get("fingerprint") or {}), dict(data.get("tuned") or {}), kernels)


def dumps(cf: ConfigFile) -> str:
    """Stable text: sorted keys, one config per line."""
    head = yaml.safe_dump(
        {"fingerprint": cf.fingerprint, "tuned": cf.tuned}, sort_keys=True, default_flow_style=False
    )
    lines = [head.rstrip("\n"), "kernels:" + ("" if cf.kernels else " {}")]
    for kernel in sorted(cf.kernels):
        lines.append(f"  {kernel}:" + ("" if cf.kernels[kernel] else " {}"))
        for key in sorted(cf.kernels[kernel]):
            lines.append(f"    {key}: {json.dumps(cf.kernels[kernel][key], sort_keys=True)}")
    return "\n".join(lines) + "\n"


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a temp file in the same folder, fsync, then rename: a kill leaves old or new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save(path: Path, cf: ConfigFile) -> None:
    atomic_write_text(path, dumps(cf))


def find(cf: ConfigFile, kernel: str, key: ShapeKey) -> Lookup:
    """The lookup rule of this module's docstring, on one loaded file."""
    by_key = cf.kernels.get(kernel, {})
    exact = by_key.get(str(key))
    if exact is not None:
        return Lookup(exact, "exact", str(key))
    candidates = _same_exact_fields(by_key, key)
    if candidates:
        text, config = candidates[0]
        return Lookup(config, "nearest", text)
    return Lookup(None, "default", None)


def neighbours(cf: ConfigFile, kernel: str, key: ShapeKey) -> list[dict[str, Any]]:
    """The configs of the other keys that ``find`` could fall back to for ``key``, nearest first."""
    by_key = {text: config for text, config in cf.kernels.get(kernel, {}).items() if text != str(key)}
    return [config for _, config in _same_exact_fields(by_key, key)]


def _same_exact_fields(by_key: dict[str, dict[str, Any]], key: ShapeKey) -> list[tuple[str, dict[str, Any]]]:
    """(key text, config) of the keys whose exact fields equal ``key``'s, by distance, then text."""
    found = []
    for text, config in by_key.items():
        other = ShapeKey.parse(text)
        if other.exact() == key.exact():
            found.append((key.distance(other), text, config))
    return [(text, config) for _, text, config in sorted(found, key=lambda c: (c[0], c[1]))]


_cache: dict[Path, tuple[float, ConfigFile | None]] = {}


def load_cached(slug: str, config_dir: Path | None = None) -> ConfigFile | None:
    """The file for a GPU slug, re-read when it changes on disk; None when there is none."""
    path = path_for(slug, config_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    with _lock:
        hit = _cache.get(path)
        if hit is None or hit[0] != mtime:
            hit = (mtime, load(path))
            _cache[path] = hit
        return hit[1]


def lookup(kernel: str, key: ShapeKey, slug: str, config_dir: Path | None = None) -> Lookup:
    cf = load_cached(slug, config_dir)
    result = find(cf, kernel, key) if cf is not None else Lookup(None, "default", None)
    if result.source != "exact":
        note_fallback(kernel, str(key), slug, result.source, result.key)
    return result


def note_fallback(kernel: str, key: str, slug: str, source: str, used: str | None) -> None:
    """Count every fallback; log it once per (kernel, key, slug)."""
    with _lock:
        FALLBACKS[(kernel, source)] += 1
        first = (kernel, key, slug) not in _warned
        _warned.add((kernel, key, slug))
    if first:
        level = logging.DEBUG if slug == "cpu" else logging.WARNING
        detail = f"nearest key {used}" if used else "the kernel's default config"
        log.log(level, "%s: no tuned config for %s on %s; using %s", kernel, key, slug, detail)
