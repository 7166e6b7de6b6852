"""Tuned Helion configs, one YAML file per GPU model in ``mamba2_kernels/configs/<gpu-slug>.yaml``.

File layout (stable: keys sorted, one config per line, so that config-update PRs show small diffs)::

    fingerprint: {...}          # the environment the configs were tuned in
    tuned: {date: ..., effort: ..., seed: ..., budget_s: ...}
    selection:                  # the fitted rule that picks configs for keys nobody tuned (optional)
      chunk_scan: {flag: 0.05, headdim: 2.0, size: 0.125, tile: 0.5, fitted_on: 11, regret: 1.0}
      chunk_state_passing: {chain: {min_chunk: 256, max_state: 828972, fitted_on: 8}}
    kernels:
      chunk_state:
        dtype=bfloat16,headdim=64,...,tokens=16384: {"block_sizes": [64, 64], "num_warps": 4}

A shape key's fields are of three kinds (``docs/config-selection.md`` lists them per kernel):
  * size fields (``SIZE_FIELDS``: tokens, channels, nheads, heads per group) change only the launch grid and
    the number of partial sums, so any config of the kernel generates code for them;
  * tile fields (``TILE_FIELDS``: headdim, dstate, chunk size, ...) are the extents the tiles cover: a config
    tuned at another extent still generates code, but its tiles fit less well;
  * every other field is a flag or a dtype that selects another code path (z given, seq_idx, D per head dim).

Lookup rule, the same for every kernel (``candidates``):
  1. the exact shape key;
  2. else every other stored key of the kernel, nearest first by the kernel's fitted ``Weights``: the sum of
     ``flag`` per differing flag, ``tile`` per doubling of a tile field (``tile_doublings``: half of it
     counted between the powers of two the tiles span; headdim has its own weight, ``headdim``) and ``size``
     per doubling of a size field. The runtime takes the first of them that validates for the call
     (``mamba2_kernels._runtime``);
  3. else the kernel's default config (``None`` here; the runtime then asks Helion for its default).
A fallback (2 or 3) is logged once per kernel and key, and counted in ``FALLBACKS``.

A GPU whose own file holds no config of a kernel (no file at all: a model nobody tuned yet, such as an H100
beside the committed H200 file) takes the rule's candidates from the file of a GPU of the same architecture
(``borrowable_files``: the same compute capability first, then the same major version), each with the source
``other-gpu``. Configs do not carry across architectures at run time, so another major version gets the
default until the guard's bring-up (``mamba2-guard bring-up``) has validated other GPUs' configs on it
(``other_gpu_files``) and written the ones that pass into its own file. ``MAMBA2_GUARD_BORROW=0`` turns all
borrowing off: a GPU then sees its own file alone, as the bring-up's withheld-file measurement needs.

A fused state pass's ``chain`` rule (``ChainRule``) says at which calls the stage runs as the two kernels
it fuses instead (``mamba2_kernels.ssd.fused_paths``); without one, the fused kernel runs everywhere. The
forward's outputs and the backward's gradients of B and C go the other way round: the ``fuse`` rule
(``FuseRule``) of chunk_scan says at which calls it makes cb itself, that of chunk_bwd_db_dc at which calls one
pass computes dB and dC, that of chunk_cumsum_state_passing at which calls the fused state pass makes dt and
dA_cumsum itself, that of chunk_scan_bwd_dcb at which calls the backward's dCB stage makes C B^T itself;
without one, each runs as the kernels it fuses everywhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mamba2_kernels import _environ, seen
from mamba2_kernels.files import UnreadableFile, atomic_write, load_yaml

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# Fields of a shape key by what they change; see the module docstring.
SIZE_FIELDS = frozenset({"tokens", "channels", "nheads", "hpg"})
TILE_FIELDS = frozenset({"headdim", "dstate", "k", "chunk_size", "group_size", "width", "dim"})
SCALED_FIELDS = SIZE_FIELDS | TILE_FIELDS  # positive ints, compared by the log of their ratio
TOP_LEVEL_KEYS = ("fingerprint", "tuned", "selection", "kernels")
# Where each fallback source stands in the lookup rule: "nearest" differs in size fields only, "related"
# in tile fields or flags too, "invalid" is a stored exact config this helion rejects, "other-gpu" any key's
# config from another GPU's file of the same architecture.
FALLBACK_SOURCES = ("nearest", "related", "default", "invalid", "other-gpu")

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

    def code(self) -> tuple[tuple[str, Any], ...]:
        """The fields that are not size fields: equal ones mean the same generated code up to the grid."""
        return tuple((k, v) for k, v in self.fields if k not in SIZE_FIELDS)

    def distance(self, other: ShapeKey, weights: Weights | None = None) -> float:
        """How far a config tuned at ``other`` is expected to be from one tuned at this key (0: the same)."""
        w = weights or Weights()
        mine, theirs = dict(self.fields), dict(other.fields)
        total = 0.0
        for name in mine.keys() | theirs.keys():
            a, b = mine.get(name), theirs.get(name)
            if a == b:
                continue
            if name in SIZE_FIELDS and isinstance(a, int) and isinstance(b, int):
                total += w.size * abs(math.log2(a / b))
            elif name in TILE_FIELDS and isinstance(a, int) and isinstance(b, int):
                total += (w.headdim if name == "headdim" else w.tile) * tile_doublings(a, b)
            else:
                total += w.flag
        # Keys equally far by the formula must tie exactly so that the key text breaks the tie, here and in the
        # fit's replay of this rule (mamba2_guard.core.selection_fit): the terms are summed in set order, which varies
        # with the process's hash seed, and so would the last bit of the sum.
        return round(total, 9)


def tile_doublings(a: int, b: int) -> float:
    """How many doublings apart two extents of a tile field are, for the tiles that cover them. A tile spans a
    power of two, so headdim 80 runs in the 128-wide tiles of headdim 128, not in those of 64: half the
    distance is that of the padded extents, half that of the extents themselves (80 still masks a part of
    its tile that 128 fills). Powers of two are as far apart as their ratio says."""
    padded = abs(math.log2(next_power_of_two(a) / next_power_of_two(b)))
    return (padded + abs(math.log2(a / b))) / 2


WEIGHT_NAMES = ("flag", "tile", "size", "headdim")


@dataclass(frozen=True)
class Weights:
    """The nearest-key rule's weights: per differing flag, per doubling of a tile field, per doubling of a
    size field. Headdim, a tile field, has its own: it is the extent of the output tile of the kernels that
    multiply by x or dout (chunk_scan, dx), whose configs fit it far more tightly than they fit the chunk
    size or dstate. The defaults hold until ``mamba2-guard fit-selection`` fits a kernel's own, and weigh
    headdim four times the other tile fields, as the H200's fits of those kernels do: weighed alike, a config
    tuned at a padded headdim (80, in 128-wide tiles) served calls at headdim 64 in place of one tuned at their
    own headdim and another chunk size, and the calls got slower (docs/guard.md, the bring-up's curve)."""

    flag: float = 1.0
    tile: float = 2.0
    size: float = 0.5
    headdim: float = 8.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Weights:
        return cls(**{name: float(raw[name]) for name in WEIGHT_NAMES if name in raw})

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in WEIGHT_NAMES}


@dataclass(frozen=True)
class ChainRule:
    """When a fused stage runs as its two-kernel chain: at chunk sizes from ``min_chunk`` and at most
    ``max_state`` state elements (batch x heads x headdim x dstate: the fused walk's parallel work, too
    little to fill the GPU below it). Fitted per GPU by ``mamba2-guard fit-selection``."""

    min_chunk: int
    max_state: int

    def chains(self, chunk_size: int, state_elements: int) -> bool:
        return chunk_size >= self.min_chunk and state_elements <= self.max_state


@dataclass(frozen=True)
class FuseRule:
    """When a fusion of kernels runs instead of its chain: at most ``max_heads_per_group`` heads per group.
    chunk_scan making cb itself recomputes a group's cb for each head, which the chain computes once per group;
    the one pass of chunk_bwd_db_dc walks all of a group's heads in each program, which the chain splits. The
    state pass that makes dt itself trades nothing in heads; its rule, fitted the same way, comes out fusing at
    every count of heads per group measured, or at none, as the evidence says."""

    max_heads_per_group: int

    def fuses(self, heads_per_group: int) -> bool:
        return heads_per_group <= self.max_heads_per_group


def next_power_of_two(n: int) -> int:
    """The least power of two at or above ``n`` (for n >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def tokens_bucket(n: int) -> int:
    """Power-of-two bucket of a token count (batch x seqlen), the scaled field of SSD shape keys."""
    return next_power_of_two(n)


@dataclass
class ConfigFile:
    fingerprint: dict[str, Any] = field(default_factory=dict)
    tuned: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # kernel -> the fitted rule: Weights fields plus how it was fitted (fitted_on, regret)
    selection: dict[str, dict[str, Any]] = field(default_factory=dict)

    def weights(self, kernel: str) -> Weights:
        return Weights.from_dict(self.selection.get(kernel, {}))

    def chain_rule(self, stage: str) -> ChainRule | None:
        rule = self.selection.get(stage, {}).get("chain")
        return None if rule is None else ChainRule(int(rule["min_chunk"]), int(rule["max_state"]))

    def fuse_rule(self, stage: str) -> FuseRule | None:
        rule = self.selection.get(stage, {}).get("fuse")
        return None if rule is None else FuseRule(int(rule["max_heads_per_group"]))

    def get(self, kernel: str, key: ShapeKey | str) -> dict[str, Any] | None:
        return self.kernels.get(kernel, {}).get(str(key))

    def put(self, kernel: str, key: ShapeKey | str, config: dict[str, Any]) -> None:
        self.kernels.setdefault(kernel, {})[str(key)] = dict(config)


@dataclass(frozen=True)
class Lookup:
    config: dict[str, Any] | None
    source: str  # "exact", one of FALLBACK_SOURCES, or "pinned" (``pinned_config``)
    key: str | None  # the key whose config was used
    gpu: str | None = None  # the slug of the file it comes from, where that is another GPU's

    @property
    def used(self) -> str | None:
        """The key whose config serves, named with its GPU where that is another: how fallbacks are logged."""
        return f"{self.gpu}:{self.key}" if self.gpu and self.key else self.key


def slugify(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'; 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    if not gpu_slug:
        raise ValueError(f"gpu_name: expected a GPU name with letters or digits, got {gpu_name!r}")
    return gpu_slug


def path_for(gpu_slug: str, config_dir: Path | None = None) -> Path:
    return (config_dir or CONFIG_DIR) / f"{gpu_slug}.yaml"


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
        data = load_yaml(path)
    except UnreadableFile as exc:
        raise ConfigFileError(str(exc)) from exc
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigFileError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping with keys {TOP_LEVEL_KEYS}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigFileError(f"{path}: unknown top-level key(s) {unknown}; expected {list(TOP_LEVEL_KEYS)}")
    for name in ("fingerprint", "tuned", "selection"):
        if not isinstance(data.get(name) or {}, dict):
            raise ConfigFileError(f"{path}: {name}: expected a mapping")
    selection = {kernel: _check_selection(path, kernel, rule) for kernel, rule in (data.get("selection") or {}).items()}
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
    return ConfigFile(dict(data.get("fingerprint") or {}), dict(data.get("tuned") or {}), kernels, selection)


def _check_selection(path: Path, kernel: str, rule: Any) -> dict[str, Any]:
    where = f"{path}: selection.{kernel}"
    if not isinstance(rule, dict):
        raise ConfigFileError(f"{where}: expected a mapping with flag, tile, size and headdim weights")
    for name in WEIGHT_NAMES:
        value = rule.get(name, getattr(Weights(), name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ConfigFileError(f"{where}.{name}: expected a weight >= 0, got {value!r}")
    chain = rule.get("chain")
    if chain is not None:
        if not isinstance(chain, dict):
            raise ConfigFileError(f"{where}.chain: expected a mapping with min_chunk and max_state")
        for name in ("min_chunk", "max_state"):
            value = chain.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigFileError(f"{where}.chain.{name}: expected a positive integer, got {value!r}")
    fuse = rule.get("fuse")
    if fuse is not None:
        value = fuse.get("max_heads_per_group") if isinstance(fuse, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigFileError(f"{where}.fuse.max_heads_per_group: expected a positive integer, got {value!r}")
    return dict(rule)


def dumps(cf: ConfigFile) -> str:
    """Stable text: sorted keys, one config per line."""
    head = yaml.safe_dump(
        {"fingerprint": cf.fingerprint, "tuned": cf.tuned}, sort_keys=True, default_flow_style=False
    )
    lines = [head.rstrip("\n")]
    if cf.selection:
        lines.append("selection:")
        lines += [f"  {kernel}: {json.dumps(cf.selection[kernel], sort_keys=True)}" for kernel in sorted(cf.selection)]
    lines.append("kernels:" + ("" if cf.kernels else " {}"))
    for kernel in sorted(cf.kernels):
        lines.append(f"  {kernel}:" + ("" if cf.kernels[kernel] else " {}"))
        for key in sorted(cf.kernels[kernel]):
            lines.append(f"    {key}: {json.dumps(cf.kernels[kernel][key], sort_keys=True)}")
    return "\n".join(lines) + "\n"


def save(path: Path, cf: ConfigFile) -> None:
    """Write ``cf`` to ``path`` atomically; this process's later lookups read it at once (``forget``)."""
    atomic_write(path, dumps(cf))
    forget()


WRITER_WAIT_S = 120.0


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Hold the writers' lock of the config file ``path`` (``.<name>.lock`` beside it) around a read, change
    and save of it. Its writers (autotune runs of different state directories, a fit, a restamp) each write
    their change over the file as they read it: without the lock, two of them reading before either saves
    would drop the first one's change. An flock, so the kernel drops it when its holder dies."""
    from filelock import FileLock, Timeout

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path.with_name(f".{path.name}.lock")), timeout=WRITER_WAIT_S)
    try:
        lock.acquire()
    except Timeout as exc:
        raise ConfigFileError(f"{path}: another writer has held {lock.lock_file} for {WRITER_WAIT_S:.0f} s") from exc
    try:
        yield
    finally:
        lock.release()


def candidates(cf: ConfigFile, kernel: str, key: ShapeKey) -> list[Lookup]:
    """The lookup rule of this module's docstring, on one loaded file: the exact key's config (if stored),
    then every other key's of ``kernel``, nearest first (ties: the key text), each with its source. The exact
    key comes first even where zero weights put another at distance 0 too."""
    weights = cf.weights(kernel)
    found = []
    for text, config in cf.kernels.get(kernel, {}).items():
        other = ShapeKey.parse(text)
        source = "exact" if other == key else "nearest" if other.code() == key.code() else "related"
        found.append((key.distance(other, weights), text, Lookup(config, source, text)))
    return [lookup for _, _, lookup in sorted(found, key=lambda c: (c[2].source != "exact", c[0], c[1]))]


def find(cf: ConfigFile, kernel: str, key: ShapeKey) -> Lookup:
    """The first candidate, or the default; the runtime goes on to the next when one does not validate."""
    ranked = candidates(cf, kernel, key)
    return ranked[0] if ranked else Lookup(None, "default", None)


_cache: dict[Path, tuple[float, ConfigFile | None]] = {}
# How long the file that serves a GPU's selection rules stands before the files are looked at again. Each fused
# stage asks for its rule at every call, eight times a training step, and the stat that finds a file unchanged
# cost more host time than a small shape's kernels take. A file ``save`` writes here is read at once; one another
# process writes, within this.
RECHECK_SECONDS = 1.0
_serving: dict[tuple[str, str | None, Path | str], tuple[float, ConfigFile | None]] = {}


def forget() -> None:
    """Drop every file this process has read: the next lookup reads the files again."""
    with _lock:
        _cache.clear()
        _serving.clear()


def load_cached(gpu_slug: str, config_dir: Path | None = None) -> ConfigFile | None:
    """The file for a GPU slug, re-read when it changes on disk; None when there is none."""
    path = path_for(gpu_slug, config_dir)
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


BORROW_ENV = "MAMBA2_GUARD_BORROW"
SLUG_ENV = "MAMBA2_GUARD_GPU_SLUG"  # run as another GPU model: its file, baseline and bring-up


def slug_override() -> str | None:
    """The slug ``MAMBA2_GUARD_GPU_SLUG`` names, or None."""
    return (_environ.get(SLUG_ENV) or "").strip() or None


def borrowing() -> bool:
    """Whether other GPUs' files may serve or seed this one (``MAMBA2_GUARD_BORROW``, on unless 0/false/no/off)."""
    return os.environ.get(BORROW_ENV, "").strip().lower() not in {"0", "false", "no", "off"}


def other_gpu_files(gpu_slug: str, config_dir: Path | None = None) -> list[tuple[str, str, ConfigFile]]:
    """Every other GPU's config file, as (slug, compute capability or "", file), by slug; none while
    borrowing is off. Another GPU's file that cannot be read is skipped with a warning: it must not stop this
    GPU's job."""
    if not borrowing():
        return []
    found = []
    for path in sorted((config_dir or CONFIG_DIR).glob("*.yaml")):
        if path.stem == gpu_slug:
            continue
        try:
            cf = load_cached(path.stem, config_dir)
        except (OSError, ConfigFileError) as exc:
            log.warning("config file of another GPU skipped: %s", exc)
            continue
        if cf is not None:
            found.append((path.stem, str(cf.fingerprint.get("compute_capability") or ""), cf))
    return found


def borrowable_files(gpu_slug: str, capability: str | None, config_dir: Path | None = None
                     ) -> list[tuple[str, ConfigFile]]:
    """The config files of the other GPUs of ``gpu_slug``'s architecture, as (slug, file): those whose fingerprint's
    ``compute_capability`` is ``capability`` ("9.0") first, then those of the same major version, each by slug;
    none without a capability."""
    if not capability:
        return []
    major = capability.split(".")[0]
    found = [(theirs != capability, other, cf) for other, theirs, cf in other_gpu_files(gpu_slug, config_dir)
             if theirs.split(".")[0] == major]
    return [(other, cf) for _, other, cf in sorted(found, key=lambda f: f[:2])]


def serving_candidates(own: ConfigFile | None, borrowed: Sequence[tuple[str, ConfigFile]], kernel: str,
                       key: ShapeKey) -> list[Lookup]:
    """``candidates`` on a GPU's own file where it holds a config of ``kernel``; else on the first of
    ``borrowed`` (``borrowable_files``) that does, each with the source "other-gpu"; else none."""
    if own is not None and own.kernels.get(kernel):
        return candidates(own, kernel, key)
    for owner, cf in borrowed:
        if cf.kernels.get(kernel):
            return [Lookup(found.config, "other-gpu", found.key, owner) for found in candidates(cf, kernel, key)]
    return []


def stored_candidates(kernel: str, key: ShapeKey, gpu_slug: str, config_dir: Path | None = None,
                      capability: str | None = None) -> list[Lookup]:
    """``serving_candidates`` from the files in ``config_dir`` for the GPU ``gpu_slug`` of compute ``capability``
    (other GPUs' files are read only where its own has no config of ``kernel``)."""
    own = load_cached(gpu_slug, config_dir)
    borrowed = [] if own is not None and own.kernels.get(kernel) else borrowable_files(gpu_slug, capability, config_dir)
    return serving_candidates(own, borrowed, kernel, key)


def serving_file(gpu_slug: str, capability: str | None, config_dir: Path | None = None) -> ConfigFile | None:
    """The file whose selection rules (the fused stages' chain and fuse rules) a GPU follows: its own, else the
    first of ``borrowable_files``, else None; looked for again once ``RECHECK_SECONDS`` have passed."""
    memo = (gpu_slug, capability, config_dir or CONFIG_DIR)
    now = time.monotonic()
    hit = _serving.get(memo)
    if hit is not None and now - hit[0] < RECHECK_SECONDS:
        return hit[1]
    served = load_cached(gpu_slug, config_dir)
    if served is None:
        borrowed = borrowable_files(gpu_slug, capability, config_dir)
        served = borrowed[0][1] if borrowed else None
    with _lock:
        _serving[memo] = (now, served)
    return served


def note_fallback(kernel: str, key: str, gpu_slug: str, source: str, used: str | None) -> None:
    """Count every fallback; log it once per (kernel, key, slug)."""
    with _lock:
        FALLBACKS[(kernel, source)] += 1
        first = (kernel, key, gpu_slug) not in _warned
        _warned.add((kernel, key, gpu_slug))
    if first:
        seen.record(kernel, key, gpu_slug, source, used)
        level = logging.DEBUG if gpu_slug == "cpu" else logging.WARNING
        detail = f"the config of {source} key {used}" if used else "the kernel's default config"
        log.log(level, "%s: no tuned config for %s on %s; using %s", kernel, key, gpu_slug, detail)
