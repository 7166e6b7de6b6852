"""A training job's first call at a shape: its seconds, ours and mamba-ssm's, kept per GPU model.

``baselines/first-call/<gpu-slug>.yaml`` maps a shape to its latest measurement, written by ``mamba2-guard dev
first-call --record`` (the cold start of ``docs/config-selection.md``), and the results page shows it::

    nemotron-h-8b: {helion_s: 47.2, mamba_ssm_s: 94.8, entries: [ssd_combined_fwd_bwd], caches: empty,
                    measured_at: '2026-12-02T03:10:00+00:00', gpu_uuid: GPU-75ee0340-..., log: <run log>}

``caches`` says whether each process started on new, empty compile caches (``empty``) or on the environment's
(``environment``); ``log``, where given, names the raw run under ``baselines/runs/`` that printed the numbers.

Pure: plain data in and out; errors name the shape and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CACHES = ("empty", "environment")
FIELDS = ("helion_s", "mamba_ssm_s", "entries", "caches", "measured_at", "gpu_uuid", "log")
REQUIRED = ("helion_s", "mamba_ssm_s", "entries", "caches", "measured_at")


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: expected seconds > 0, got {value!r}")
    return float(value)


def parse(doc: Any, where: str) -> dict[str, dict[str, Any]]:
    """The records of a first-call file (``yaml.safe_load``'s result; None is empty). ``where`` names the
    file in errors."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected a mapping of shape -> first-call record, got {type(doc).__name__}")
    out = {}
    for shape, raw in doc.items():
        at = f"{where}: {shape}"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{at}: expected a mapping with {', '.join(REQUIRED)}")
        unknown = sorted(set(raw) - set(FIELDS))
        missing = [name for name in REQUIRED if name not in raw]
        if unknown or missing:
            raise ValueError(f"{at}: " + "; ".join(
                ([f"unknown field(s) {unknown}"] if unknown else []) + ([f"missing {missing}"] if missing else [])))
        entries = raw["entries"]
        if not isinstance(entries, list) or not entries or not all(isinstance(e, str) for e in entries):
            raise ValueError(f"{at}.entries: expected a list of registry entry names, got {entries!r}")
        if raw["caches"] not in CACHES:
            raise ValueError(f"{at}.caches: expected one of {list(CACHES)}, got {raw['caches']!r}")
        for name in ("measured_at", "gpu_uuid", "log"):
            if raw.get(name) is not None and not isinstance(raw[name], str):
                raise ValueError(f"{at}.{name}: expected text, got {raw[name]!r}")
        out[str(shape)] = {**raw, "helion_s": _seconds(raw["helion_s"], f"{at}.helion_s"),
                           "mamba_ssm_s": _seconds(raw["mamba_ssm_s"], f"{at}.mamba_ssm_s")}
    return out


def recorded(existing: Mapping[str, Mapping[str, Any]], seconds: Mapping[str, Mapping[str, Any]], *,
             entries: Sequence[str], caches: str, measured_at: str, gpu_uuid: str | None
             ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``existing`` with each shape of ``seconds`` ({shape: {"helion": s, "mamba_ssm": s}}, as ``dev first-call``
    measures them) whose two sides gave seconds replacing its record; and the shapes left out (a side failed, or
    was not run), which keep their old record."""
    out = {shape: dict(record) for shape, record in existing.items()}
    left_out = []
    for shape, by_side in seconds.items():
        ours, theirs = by_side.get("helion"), by_side.get("mamba_ssm")
        if not all(isinstance(v, float) and v > 0 for v in (ours, theirs)):
            left_out.append(shape)
            continue
        out[shape] = {"helion_s": round(ours, 1), "mamba_ssm_s": round(theirs, 1), "entries": list(entries),
                      "caches": caches, "measured_at": measured_at, "gpu_uuid": gpu_uuid}
    return out, left_out
