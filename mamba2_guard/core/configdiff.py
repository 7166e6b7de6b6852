"""Compact diff between the ``kernels`` (and ``selection``) sections of two config files.

Pure: ``{kernel: {shape_key: {field: value}}}`` in, a :class:`ConfigDiff` out. Nested dicts inside a
config are compared by dotted path (``a.b``); lists and scalars are compared whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"
_SIGIL = {ADDED: "+", REMOVED: "-", CHANGED: "~"}


@dataclass(frozen=True)
class FieldChange:
    field: str
    status: str  # added | removed | changed
    old: Any = None
    new: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "status": self.status, "old": self.old, "new": self.new}

    def render(self) -> str:
        if self.status == ADDED:
            return f"+{self.field}={fmt_value(self.new)}"
        if self.status == REMOVED:
            return f"-{self.field} (was {fmt_value(self.old)})"
        return f"{self.field} {fmt_value(self.old)} -> {fmt_value(self.new)}"


@dataclass(frozen=True)
class EntryDiff:
    kernel: str
    shape_key: str
    status: str  # added | removed | changed
    fields: tuple[FieldChange, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "shape_key": self.shape_key,
            "status": self.status,
            "fields": [f.to_dict() for f in self.fields],
        }

    def render(self) -> str:
        head = f"{_SIGIL[self.status]} {self.kernel} / {self.shape_key}"
        if self.status == REMOVED:
            return head + " (config removed)"
        if self.status == ADDED:
            body = ", ".join(f"{f.field}={fmt_value(f.new)}" for f in self.fields)
            return f"{head}: {{{body}}}"
        return head + ": " + "; ".join(f.render() for f in self.fields)


@dataclass(frozen=True)
class ConfigDiff:
    entries: tuple[EntryDiff, ...]

    @property
    def empty(self) -> bool:
        return not self.entries

    def counts(self) -> dict[str, int]:
        out = {ADDED: 0, REMOVED: 0, CHANGED: 0}
        for e in self.entries:
            out[e.status] += 1
        return out

    def summary(self) -> str:
        if self.empty:
            return "no config changes"
        c = self.counts()
        return f"{len(self.entries)} config(s): {c[ADDED]} added, {c[REMOVED]} removed, {c[CHANGED]} changed"

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts(), "entries": [e.to_dict() for e in self.entries]}

    def render_lines(self, limit: int | None = None) -> list[str]:
        """One line per kernel x shape key; at most ``limit`` lines plus an 'N more' line."""
        entries = self.entries if limit is None else self.entries[: max(0, limit)]
        lines = [e.render() for e in entries]
        rest = len(self.entries) - len(entries)
        if rest > 0:
            lines.append(f"... {rest} more config change(s) not shown")
        return lines

    def render_text(self, limit: int | None = None) -> str:
        return "\n".join(self.render_lines(limit)) if not self.empty else "no config changes"


def fmt_value(value: Any) -> str:
    """Compact, deterministic rendering of a config value (JSON-like, no spaces)."""
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, Mapping):
        # A config that is not a dict (e.g. a list) is one opaque value.
        return {prefix or "<value>": config}
    out: dict[str, Any] = {}
    for k, v in config.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _as_section(section: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kernel, shapes in (section or {}).items():
        if isinstance(shapes, Mapping):
            out[str(kernel)] = {str(k): v for k, v in shapes.items()}
    return out


def diff_configs(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> ConfigDiff:
    """Diff two ``kernels`` sections: ``{kernel: {shape_key: config_dict}}``. None counts as empty."""
    a, b = _as_section(old), _as_section(new)
    entries: list[EntryDiff] = []
    for kernel in sorted(set(a) | set(b)):
        ka, kb = a.get(kernel, {}), b.get(kernel, {})
        for key in sorted(set(ka) | set(kb)):
            if key not in ka:
                flat = _flatten(kb[key])
                entries.append(
                    EntryDiff(kernel, key, ADDED, tuple(FieldChange(f, ADDED, None, flat[f]) for f in sorted(flat)))
                )
                continue
            if key not in kb:
                flat = _flatten(ka[key])
                entries.append(
                    EntryDiff(kernel, key, REMOVED, tuple(FieldChange(f, REMOVED, flat[f], None) for f in sorted(flat)))
                )
                continue
            fa, fb = _flatten(ka[key]), _flatten(kb[key])
            changes = []
            for f in sorted(set(fa) | set(fb)):
                if f not in fa:
                    changes.append(FieldChange(f, ADDED, None, fb[f]))
                elif f not in fb:
                    changes.append(FieldChange(f, REMOVED, fa[f], None))
                elif fa[f] != fb[f]:
                    changes.append(FieldChange(f, CHANGED, fa[f], fb[f]))
            if changes:
                entries.append(EntryDiff(kernel, key, CHANGED, tuple(changes)))
    return ConfigDiff(tuple(entries))


SELECTION_RULE = "selection rule"  # the shape-key column of a kernel's fitted rule (``selection`` section)


def diff_config_files(old_doc: Mapping[str, Any] | None, new_doc: Mapping[str, Any] | None) -> ConfigDiff:
    """Diff two whole config-file documents (``fingerprint``, ``tuned``, ``selection``, ``kernels``) by their
    configs and their fitted selection rules: a reviewer sees a re-fitted rule as plainly as a new config."""
    def rules(doc: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
        return {kernel: {SELECTION_RULE: rule} for kernel, rule in ((doc or {}).get("selection") or {}).items()}

    configs = diff_configs((old_doc or {}).get("kernels"), (new_doc or {}).get("kernels"))
    return ConfigDiff(configs.entries + diff_configs(rules(old_doc), rules(new_doc)).entries)
