"""Drift classification: what changed since the configs and the baseline were recorded, and what to do.

Pure: fingerprints (plain dicts) in, dataclasses out. No GPU, git, network or clock.

Classes
-------
``new-gpu``
    No configs are recorded for this GPU, or the recorded ones were tuned on a different GPU model
    (name, compute capability, SM count or memory differ; the UUID alone is not a model change).
``software``
    helion, triton, torch, cuda_runtime, driver or mamba_ssm changed, by version or by package source
    hash. One item per component, with before/after.
``kernel-source``
    The hash over the project's kernel sources changed; the changed files are named when the
    fingerprints carry per-file hashes (``kernel_sources: {path: hash}``). When every changed file is host
    code (``host_sources``: it shapes no generated code), the configs stay valid and the action is at most
    ``rebaseline``.
``invalid-config``
    A stored config no longer validates (the caller passes ``{(kernel, shape_key): message}``).

Each item compares the current fingerprint with the one recorded in the config file (what the
configs were tuned under) and with the one recorded in the baseline file. A change against the
configs gets the policy's action; a change seen only against the baseline (the configs were already
tuned under the new software but the baseline was not re-measured) is at most ``rebaseline``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("ignore", "rebaseline", "retune")
ACTION_RANK = {a: i for i, a in enumerate(ACTIONS)}

NEW_GPU = "new-gpu"
SOFTWARE = "software"
KERNEL_SOURCE = "kernel-source"
INVALID_CONFIG = "invalid-config"
CLASSES = (NEW_GPU, SOFTWARE, KERNEL_SOURCE, INVALID_CONFIG)

SOFTWARE_COMPONENTS = ("helion", "triton", "torch", "cuda_runtime", "driver", "mamba_ssm")

# Where each component's version lives in a fingerprint (first key present wins).
VERSION_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "helion": (("helion",), ("versions", "helion")),
    "triton": (("triton",), ("versions", "triton")),
    "torch": (("torch",), ("versions", "torch")),
    "cuda_runtime": (("cuda_runtime",), ("versions", "cuda_runtime")),
    "driver": (("driver_version",), ("driver",), ("versions", "driver")),
    "mamba_ssm": (("mamba_ssm",), ("versions", "mamba_ssm")),
}


def _source_paths(name: str) -> tuple[tuple[str, ...], ...]:
    return (
        (f"{name}_source_hash",),
        ("source_hashes", name),
        ("package_sources", name),
        ("package_source_hashes", name),
    )


# Where each component's package source hash lives (optional; only compared when both sides have it).
SOURCE_HASH_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    c: _source_paths(c) for c in ("helion", "triton", "torch", "mamba_ssm")
}

# A change in any of these means the configs were tuned on another GPU model.
GPU_MODEL_KEYS = ("gpu_name", "compute_capability", "sm_count", "memory_bytes")

KERNELS_HASH_KEY = "kernels_source_hash"
KERNEL_FILES_KEY = "kernel_sources"

DEFAULT_POLICY: dict[str, Any] = {
    NEW_GPU: "retune",
    SOFTWARE: {
        "helion": "retune",
        "triton": "retune",
        "torch": "retune",
        "cuda_runtime": "retune",
        "driver": "retune",
        "mamba_ssm": "rebaseline",
    },
    KERNEL_SOURCE: "retune",
    INVALID_CONFIG: "retune",
}


def _norm_name(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def _check_action(value: Any, where: str) -> str:
    if value not in ACTIONS:
        raise ValueError(f"drift policy {where}: action must be one of {', '.join(ACTIONS)}, got {value!r}")
    return value


@dataclass(frozen=True)
class DriftPolicy:
    """Which action each drift class (and each software component) calls for."""

    new_gpu: str = "retune"
    software: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_POLICY[SOFTWARE]))
    kernel_source: str = "retune"
    invalid_config: str = "retune"

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> DriftPolicy:
        """Build from a policy mapping; missing entries keep the defaults.

        ``{"new-gpu": a, "software": a | {component: a}, "kernel-source": a, "invalid-config": a}``;
        underscores and hyphens are interchangeable in class names. Unknown classes, components or
        actions raise ValueError (a typo must not silently disable a guard).
        """
        mapping = dict(mapping or {})
        software = dict(DEFAULT_POLICY[SOFTWARE])
        values = {NEW_GPU: "retune", KERNEL_SOURCE: "retune", INVALID_CONFIG: "retune"}
        for raw_key, value in mapping.items():
            key = _norm_name(raw_key)
            if key not in CLASSES:
                raise ValueError(f"drift policy: unknown class {raw_key!r} (known: {', '.join(CLASSES)})")
            if key == SOFTWARE:
                if isinstance(value, Mapping):
                    for comp, act in value.items():
                        comp_key = str(comp).strip().lower().replace("-", "_")
                        if comp_key not in SOFTWARE_COMPONENTS:
                            raise ValueError(
                                f"drift policy: unknown software component {comp!r} "
                                f"(known: {', '.join(SOFTWARE_COMPONENTS)})"
                            )
                        software[comp_key] = _check_action(act, f"software.{comp_key}")
                else:
                    act = _check_action(value, "software")
                    software = dict.fromkeys(SOFTWARE_COMPONENTS, act)
            else:
                values[key] = _check_action(value, key)
        return cls(
            new_gpu=values[NEW_GPU],
            software=software,
            kernel_source=values[KERNEL_SOURCE],
            invalid_config=values[INVALID_CONFIG],
        )

    def action_for(self, cls_name: str, component: str | None = None) -> str:
        if cls_name == NEW_GPU:
            return self.new_gpu
        if cls_name == SOFTWARE:
            return self.software.get(component or "", "retune")
        if cls_name == KERNEL_SOURCE:
            return self.kernel_source
        if cls_name == INVALID_CONFIG:
            return self.invalid_config
        raise ValueError(f"unknown drift class {cls_name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            NEW_GPU: self.new_gpu,
            SOFTWARE: dict(sorted(self.software.items())),
            KERNEL_SOURCE: self.kernel_source,
            INVALID_CONFIG: self.invalid_config,
        }


@dataclass(frozen=True)
class DriftItem:
    cls: str
    component: str
    before: Any
    after: Any
    action: str
    # Which recorded fingerprints differ from the current one: "configs", "baseline".
    reference: tuple[str, ...] = ()
    detail: str = ""
    files: tuple[str, ...] = ()
    kernel: str | None = None
    shape_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "class": self.cls,
            "component": self.component,
            "before": self.before,
            "after": self.after,
            "action": self.action,
            "reference": list(self.reference),
            "detail": self.detail,
        }
        if self.files:
            d["files"] = list(self.files)
        if self.kernel is not None:
            d["kernel"] = self.kernel
            d["shape_key"] = self.shape_key
        return d

    def render(self) -> str:
        if self.cls == INVALID_CONFIG:
            head = f"{self.kernel}/{self.shape_key}: {self.detail}"
        else:
            head = f"{self.component}: {short_value(self.before)} -> {short_value(self.after)}"
            if self.detail:
                head += f" ({self.detail})"
        if self.files:
            head += "; files: " + ", ".join(self.files)
        ref = f", vs {'+'.join(self.reference)}" if self.reference else ""
        return f"[{self.cls}] {head} => {self.action}{ref}"


@dataclass(frozen=True)
class DriftReport:
    items: tuple[DriftItem, ...]
    gpu_name: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def actionable(self) -> tuple[DriftItem, ...]:
        return tuple(i for i in self.items if i.action != "ignore")

    @property
    def found(self) -> bool:
        """True when some drift calls for an action (ignored items do not count)."""
        return bool(self.actionable)

    @property
    def action(self) -> str:
        """The strongest action over all items: retune > rebaseline > ignore."""
        best = "ignore"
        for item in self.items:
            if ACTION_RANK[item.action] > ACTION_RANK[best]:
                best = item.action
        return best

    @property
    def classes(self) -> tuple[str, ...]:
        present = {i.cls for i in self.actionable}
        return tuple(c for c in CLASSES if c in present)

    def by_class(self, cls_name: str) -> tuple[DriftItem, ...]:
        return tuple(i for i in self.items if i.cls == cls_name)

    def summary(self) -> str:
        """One line, e.g. for a commit message: 'software: helion 1.4 -> 1.5; kernel-source: 2 files'."""
        if not self.items:
            return "no drift"
        parts = []
        for cls_name in CLASSES:
            items = [i for i in self.by_class(cls_name) if i.action != "ignore"]
            if not items:
                continue
            if cls_name == SOFTWARE:
                parts.append(
                    "software: "
                    + ", ".join(f"{i.component} {short_value(i.before)} -> {short_value(i.after)}" for i in items)
                )
            elif cls_name == KERNEL_SOURCE:
                n = sum(len(i.files) for i in items)
                parts.append(f"kernel-source: {n} file(s)" if n else "kernel-source")
            elif cls_name == INVALID_CONFIG:
                parts.append(f"invalid-config: {len(items)} config(s)")
            else:
                parts.append(f"new-gpu: {short_value(items[0].after)}")
        return "; ".join(parts) if parts else "ignored drift only"

    def to_dict(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "action": self.action,
            "classes": list(self.classes),
            "gpu_name": self.gpu_name,
            "items": [i.to_dict() for i in self.items],
            "notes": list(self.notes),
        }

    def render_text(self) -> str:
        gpu = f" on {self.gpu_name}" if self.gpu_name else ""
        if not self.items:
            lines = [f"No drift{gpu}."]
        else:
            lines = [f"Drift{gpu}: action = {self.action}" + ("" if self.found else " (all ignored by policy)")]
            lines += ["  " + i.render() for i in self.items]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


def short_value(value: Any) -> str:
    """A fingerprint value as reports show it: hashes cut to 12 characters, versions whole, None named."""
    if value is None:
        return "(none)"
    s = str(value)
    if len(s) >= 32 and all(c in "0123456789abcdef" for c in s.lower()):
        return s[:12]
    return s


def _get_path(fp: Mapping[str, Any] | None, paths: Iterable[tuple[str, ...]]) -> Any:
    if not fp:
        return None
    for path in paths:
        cur: Any = fp
        for part in path:
            if not isinstance(cur, Mapping) or part not in cur:
                cur = None
                break
            cur = cur[part]
        if cur is not None:
            return cur
    return None


def _differs(a: Any, b: Any) -> bool:
    """Only two known values can differ: a value missing on either side is no evidence of drift."""
    return a is not None and b is not None and str(a) != str(b)


def fingerprint_changes(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> list[tuple[str, Any, Any]]:
    """(component, before, after) for every displayed field that differs; for PR bodies and logs."""
    out: list[tuple[str, Any, Any]] = []
    if not before or not after:
        return out
    for key in GPU_MODEL_KEYS:
        if _differs(before.get(key), after.get(key)):
            out.append((key, before.get(key), after.get(key)))
    for comp in SOFTWARE_COMPONENTS:
        b, a = _get_path(before, VERSION_PATHS[comp]), _get_path(after, VERSION_PATHS[comp])
        if _differs(b, a):
            out.append((comp, b, a))
        elif comp in SOURCE_HASH_PATHS:
            bs, as_ = _get_path(before, SOURCE_HASH_PATHS[comp]), _get_path(after, SOURCE_HASH_PATHS[comp])
            if _differs(bs, as_):
                out.append((f"{comp} (source)", bs, as_))
    if _differs(before.get("python"), after.get("python")):
        out.append(("python", before.get("python"), after.get("python")))
    if _differs(before.get(KERNELS_HASH_KEY), after.get(KERNELS_HASH_KEY)):
        out.append(("kernel sources", before.get(KERNELS_HASH_KEY), after.get(KERNELS_HASH_KEY)))
    return out


def changed_kernel_files(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """'path (changed|added|removed)' for each per-file kernel source hash that differs."""
    return _named(_kernel_file_changes(before, after))


def _named(changes: list[tuple[str, str]]) -> list[str]:
    return [f"{path} ({how})" for path, how in changes]


def _kernel_file_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(path, "changed" | "added" | "removed") for each per-file kernel source hash that differs, by path."""
    b = (before or {}).get(KERNEL_FILES_KEY)
    a = (after or {}).get(KERNEL_FILES_KEY)
    if not isinstance(b, Mapping) or not isinstance(a, Mapping):
        return []
    out = []
    for path in sorted(set(b) | set(a), key=str):
        if path not in b:
            out.append((path, "added"))
        elif path not in a:
            out.append((path, "removed"))
        elif str(b[path]) != str(a[path]):
            out.append((path, "changed"))
    return out


def _cap(action: str, limit: str) -> str:
    return action if ACTION_RANK[action] <= ACTION_RANK[limit] else limit


def _compare(
    current: Mapping[str, Any],
    configs_fp: Mapping[str, Any] | None,
    baseline_fp: Mapping[str, Any] | None,
    getter,
) -> tuple[Any, Any, tuple[str, ...]]:
    """(recorded before, current, references that differ); 'before' prefers the configs' record."""
    now = getter(current)
    refs = []
    before = None
    for name, fp in (("configs", configs_fp), ("baseline", baseline_fp)):
        old = getter(fp)
        if _differs(old, now):
            refs.append(name)
            if before is None:
                before = old
    return before, now, tuple(refs)


def classify(
    current_fp: Mapping[str, Any],
    recorded_configs_fp: Mapping[str, Any] | None,
    recorded_baseline_fp: Mapping[str, Any] | None,
    config_validation_errors: Mapping[tuple[str, str], str] | None = None,
    policy: DriftPolicy | None = None,
    host_sources: Iterable[str] = (),
) -> DriftReport:
    """Classify the drift between the current fingerprint and the recorded ones.

    ``recorded_configs_fp`` is the ``fingerprint`` of ``mamba2_kernels/configs/<slug>.yaml`` (None when that
    file does not exist), ``recorded_baseline_fp`` the one of ``baselines/<slug>.yaml`` (None when
    absent). ``config_validation_errors`` maps (kernel, shape_key) to the reason a stored config no
    longer validates. ``host_sources`` are the kernel source files that shape no generated code.
    Each class has its own step below; the report lists them per class, each in its
    step's order (stable output for diffs and tests).
    """
    policy = policy or DriftPolicy()
    current_fp = current_fp or {}
    notes: list[str] = []
    items = [
        *_gpu_drift(current_fp, recorded_configs_fp, policy, notes),
        *_software_drift(current_fp, recorded_configs_fp, recorded_baseline_fp, policy, notes),
        *_kernel_source_drift(current_fp, recorded_configs_fp, recorded_baseline_fp, policy, frozenset(host_sources)),
        *_invalid_config_drift(config_validation_errors or {}, policy),
    ]
    items.sort(key=lambda i: CLASSES.index(i.cls))
    return DriftReport(items=tuple(items), gpu_name=current_fp.get("gpu_name"), notes=tuple(dict.fromkeys(notes)))


def _gpu_drift(current_fp: Mapping[str, Any], configs_fp: Mapping[str, Any] | None, policy: DriftPolicy,
               notes: list[str]) -> list[DriftItem]:
    """new-gpu: no config file for this GPU, or one tuned on another GPU model."""
    gpu_name = current_fp.get("gpu_name")
    if gpu_name is None:
        # CPU interpret mode: nothing runs compiled, so there are no configs to tune or to miss.
        notes.append("no GPU: tuned configs do not apply (CPU interpret mode)")
        return []
    if configs_fp is None:
        return [DriftItem(cls=NEW_GPU, component="gpu", before=None, after=gpu_name,
                          action=policy.action_for(NEW_GPU), reference=("configs",),
                          detail="no configs recorded for this GPU")]
    model_changes = [(k, configs_fp.get(k), current_fp.get(k)) for k in GPU_MODEL_KEYS
                     if _differs(configs_fp.get(k), current_fp.get(k))]
    if not model_changes:
        return []
    return [DriftItem(cls=NEW_GPU, component="gpu", before=configs_fp.get("gpu_name"), after=gpu_name,
                      action=policy.action_for(NEW_GPU), reference=("configs",),
                      detail="configs were tuned on another GPU model: "
                      + ", ".join(f"{k} {short_value(b)} -> {short_value(a)}" for k, b, a in model_changes))]


def _software_drift(current_fp: Mapping[str, Any], configs_fp: Mapping[str, Any] | None,
                    baseline_fp: Mapping[str, Any] | None, policy: DriftPolicy, notes: list[str]) -> list[DriftItem]:
    """software: a component's version or (where recorded) source hash differs from either reference; a change
    only the baseline saw is at most a re-baseline."""
    items = []
    for comp in SOFTWARE_COMPONENTS:
        v_before, v_now, v_refs = _compare(current_fp, configs_fp, baseline_fp,
                                           lambda fp, c=comp: _get_path(fp, VERSION_PATHS[c]))
        s_before, s_now, s_refs = (None, None, ())
        if comp in SOURCE_HASH_PATHS:
            s_before, s_now, s_refs = _compare(current_fp, configs_fp, baseline_fp,
                                               lambda fp, c=comp: _get_path(fp, SOURCE_HASH_PATHS[c]))
        for name, fp in (("configs", configs_fp), ("baseline", baseline_fp)):
            if fp is not None and _get_path(fp, VERSION_PATHS[comp]) is None and v_now is not None:
                notes.append(f"{comp}: version not recorded in the {name} fingerprint")
        refs = tuple(r for r in ("configs", "baseline") if r in v_refs or r in s_refs)
        if not refs:
            continue
        if v_refs:
            before, after = v_before, v_now
            detail = f"source {short_value(s_before)} -> {short_value(s_now)}" if s_refs else ""
        else:
            before, after = s_before, s_now
            detail = f"source changed, version {v_now if v_now is not None else 'unknown'} unchanged"
        action = policy.action_for(SOFTWARE, comp)
        if "configs" not in refs:
            action = _cap(action, "rebaseline")
        items.append(DriftItem(cls=SOFTWARE, component=comp, before=before, after=after, action=action,
                               reference=refs, detail=detail))
    return items


def _kernel_source_drift(current_fp: Mapping[str, Any], configs_fp: Mapping[str, Any] | None,
                         baseline_fp: Mapping[str, Any] | None, policy: DriftPolicy,
                         host_sources: frozenset[str]) -> list[DriftItem]:
    """kernel-source: the kernels' source hash differs, with the files that changed where recorded. Changes
    of host code alone leave the configs valid (a re-tune would search for what it found before)."""
    k_before, k_now, k_refs = _compare(current_fp, configs_fp, baseline_fp, lambda fp: (fp or {}).get(KERNELS_HASH_KEY))
    if not k_refs:
        return []
    changes = _kernel_file_changes(configs_fp if "configs" in k_refs else baseline_fp, current_fp)
    files = tuple(_named(changes))
    host_only = bool(changes) and all(path in host_sources for path, _ in changes)
    action = policy.action_for(KERNEL_SOURCE)
    if "configs" not in k_refs or host_only:
        action = _cap(action, "rebaseline")
    detail = "host code only: the configs stay valid" if host_only else "" if files else "per-file hashes not recorded"
    return [DriftItem(cls=KERNEL_SOURCE, component="kernels", before=k_before, after=k_now, action=action,
                      reference=k_refs, detail=detail, files=files)]


def _invalid_config_drift(errors: Mapping[tuple[str, str], str], policy: DriftPolicy) -> list[DriftItem]:
    """invalid-config: each stored config that no longer validates, by kernel and key."""
    return [DriftItem(cls=INVALID_CONFIG, component=f"{kernel}/{key}", before=None, after=None,
                      action=policy.action_for(INVALID_CONFIG), reference=("configs",), detail=str(msg),
                      kernel=str(kernel), shape_key=str(key))
            for (kernel, key), msg in sorted(errors.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))]
