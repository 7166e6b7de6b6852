"""``baselines/<gpu-slug>.yaml``: read with validation, written atomically and stably by
``mamba2-guard bench --update-baseline``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.core import first_calls
from mamba2_guard.core.fingerprint_hash import fingerprint_hash
from mamba2_guard.core.results import (
    Baseline,
    BenchResult,
    SchemaError,
    baseline_from_result,
    load_baseline,
)
from mamba2_kernels.config_store import slugify
from mamba2_kernels.files import UnreadableFile, atomic_write, load_json, load_yaml

BASELINE_DIR = PROJECT_ROOT / "baselines"


class BaselineFileError(ValueError):
    """An unreadable baseline file; the message names the file and the key."""


def path_for(gpu_slug: str, directory: Path | None = None) -> Path:
    return (directory or BASELINE_DIR) / f"{gpu_slug}.yaml"


def path_for_result(result: BenchResult, directory: Path | None = None) -> Path:
    """The baseline of the GPU that produced ``result`` (``cpu``'s where its fingerprint names none)."""
    gpu = result.fingerprint.get("gpu_name")
    return path_for(slugify(gpu) if gpu else "cpu", directory)


def read_result(path: Path) -> BenchResult:
    """The bench result in ``path``; ValueError naming the file where it is none."""
    try:
        return BenchResult.from_dict(load_json(path))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the bench result: {exc.strerror}") from None
    except UnreadableFile as exc:  # a FIFO, /dev/zero, nesting too deep: named as it is
        raise ValueError(str(exc)) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and the schema's errors
        raise ValueError(f"{path}: not a bench result: {exc}") from None


def read_document(path: Path) -> dict[str, Any] | None:
    """The baseline file's YAML, or None when there is none; BaselineFileError naming the file where it is no
    mapping or its fingerprint is none (drift reads the fingerprint alone, before any schema check)."""
    if not path.exists():
        return None
    try:
        doc = load_yaml(path)
    except UnreadableFile as exc:
        raise BaselineFileError(str(exc)) from exc
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BaselineFileError(f"{path}: not valid YAML: {exc}") from exc
    if doc is not None and not isinstance(doc, dict):
        raise BaselineFileError(f"{path}: expected a mapping (fingerprint, cases, ...), got {type(doc).__name__}")
    recorded = (doc or {}).get("fingerprint")
    if recorded is not None and not isinstance(recorded, dict):
        raise BaselineFileError(f"{path}: fingerprint: expected a mapping, got {type(recorded).__name__}")
    return doc


def load(path: Path) -> Baseline | None:
    """The baseline at ``path``, or None when there is none."""
    doc = read_document(path)
    if doc is None:
        return None
    try:
        return load_baseline(doc)
    except SchemaError as exc:
        raise BaselineFileError(f"{path}: {exc}") from exc


def update(path: Path, result: BenchResult) -> list[str]:
    """Write the result's usable cases into the baseline at ``path``. Cases of other kernels or shapes
    already there are kept, each with the date and fingerprint it was measured under (a partial re-tune
    re-baselines only what it tuned; the rest keeps its numbers). Returns the cases of ``result`` that
    could not go in."""
    new = baseline_from_result(result)
    old = read_document(path) or {}
    old_at = old.get("recorded_at")
    old_fp = fingerprint_hash(old["fingerprint"]) if old.get("fingerprint") else None
    results: dict[str, dict[str, Any]] = {
        kernel: {shape: {**case, "recorded_at": case.get("recorded_at") or old_at,
                         "fingerprint": case.get("fingerprint") or old_fp}
                 for shape, case in (shapes or {}).items()}
        for kernel, shapes in (old.get("results") or {}).items()}
    for kernel, shapes in new["results"].items():
        results.setdefault(kernel, {}).update(shapes)
    merged = dict(new)
    merged["results"] = {k: dict(sorted(v.items())) for k, v in sorted(results.items())}
    load_baseline(merged)  # never write a file that would not load
    atomic_write(path, yaml.safe_dump(merged, sort_keys=True, default_flow_style=False, width=120))
    return [f"{c.kernel}/{c.shape}" for c in result.cases
            if c.kernel not in new["results"] or c.shape not in new["results"][c.kernel]]


def first_call_path(gpu_slug: str, directory: Path | None = None) -> Path:
    """``baselines/first-call/<slug>.yaml``: the first calls measured on a GPU model
    (``mamba2_guard.core.first_calls``)."""
    return (directory or BASELINE_DIR) / "first-call" / f"{gpu_slug}.yaml"


def read_first_calls(path: Path) -> dict[str, dict[str, Any]]:
    """The records of a first-call file (empty where there is none); ValueError naming the file otherwise."""
    try:
        doc = load_yaml(path)
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, UnreadableFile) as exc:
        raise ValueError(f"{path}: not a readable first-call file ({exc})") from None
    return first_calls.parse(doc, str(path))


def record_first_calls(path: Path, seconds: dict[str, dict[str, Any]], **measured: Any) -> list[str]:
    """Merge ``dev first-call``'s ``seconds`` into the file at ``path`` (``mamba2_guard.core.first_calls.recorded``;
    ``measured``: its entries, caches, measured_at and gpu_uuid), atomically. Returns the shapes left out."""
    records, left_out = first_calls.recorded(read_first_calls(path), seconds, **measured)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, yaml.safe_dump(dict(sorted(records.items())), sort_keys=True, width=120))
    return left_out
