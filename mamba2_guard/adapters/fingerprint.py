"""The environment, as one frozen record: what the configs and baselines were measured under."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import socket
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mamba2_guard import PROJECT_ROOT
from mamba2_guard.core.fingerprint_hash import TIMING_METHOD, fingerprint_hash

KERNELS_DIR = PROJECT_ROOT / "mamba2_kernels"

# Source files under mamba2_kernels/ that run on the host only: they choose among stored configs, launch them and
# record what ran, load the suites' shapes and mamba-ssm, read the environment's switches (a fused stage's forced
# path), or wrap the public calls (the SSD call's arguments, operators and autograd, context parallelism); they shape
# no generated code, so a config searched before a change to them is still what the search would find. A guard upgrade
# that touched only them (the selection rule's weights, say) must not send a GPU's finished tuning jobs through their
# searches again. tests/guard/adapters/test_fingerprint.py checks that none of them defines a kernel, and pins the
# compile options _runtime.py gives Helion.
HOST_SOURCES = ("_environ.py", "_mamba_ssm.py", "_ops.py", "_runtime.py", "config_store.py", "context_parallel.py",
                "files.py", "layer_fn.py", "seen.py", "ssd/combined.py", "ssd/forcing.py", "suites.py", "targets.py",
                "testing.py", "tuning.py")


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def kernel_source_hashes(root: Path = KERNELS_DIR) -> dict[str, str]:
    """sha256 of every kernel source file (configs excluded: they are outputs, not sources)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def kernel_shaping(sources: dict[str, str]) -> dict[str, str]:
    """``sources`` (path under mamba2_kernels/ -> hash) without the ``HOST_SOURCES``."""
    return {path: digest for path, digest in sources.items() if path not in HOST_SOURCES}


def combined_hash(hashes: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str | None
    compute_capability: str
    sm_count: int
    memory_bytes: int


@dataclass(frozen=True)
class Fingerprint:
    hostname: str
    gpu_name: str | None
    gpu_uuid: str | None
    gpu_index: int | None
    compute_capability: str | None
    sm_count: int | None
    memory_bytes: int | None
    driver_version: str | None
    cuda_runtime: str | None
    torch: str | None
    triton: str | None
    helion: str | None
    mamba_ssm: str | None
    python: str
    kernels_source_hash: str
    kernel_sources: dict[str, str] = field(default_factory=dict)
    # The bench's timing method is part of the environment: a new method resets the history like a new
    # driver, and the hash the CLI shows is the one a result and its report.md carry.
    timing_method: str = TIMING_METHOD

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """Hash of the fields that decide whether configs and baselines still apply (not host or uuid):
        ``mamba2_guard.core.fingerprint_hash.fingerprint_hash`` of :meth:`to_dict`."""
        return fingerprint_hash(self.to_dict())


def driver_version() -> str | None:
    """The NVIDIA driver through NVML, or None without one."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        raw = pynvml.nvmlSystemGetDriverVersion()
        return raw.decode() if isinstance(raw, bytes) else raw
    finally:
        pynvml.nvmlShutdown()


def gpus() -> list[GpuInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        found.append(GpuInfo(
            index=index, name=props.name, uuid=f"GPU-{uuid}" if uuid is not None else None,
            compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
        ))
    return found


def collect(gpu_index: int | None = None) -> Fingerprint:
    """Fingerprint this machine; with ``gpu_index`` None, the first GPU (GPU fields null on a CPU)."""
    import torch

    devices = gpus()
    gpu = None
    if devices:
        gpu = devices[gpu_index or 0] if (gpu_index or 0) < len(devices) else None
        if gpu is None:
            raise ValueError(f"gpu_index: expected 0..{len(devices) - 1}, got {gpu_index}")
    sources = kernel_source_hashes()
    return Fingerprint(
        hostname=socket.gethostname(),
        gpu_name=gpu.name if gpu else None,
        gpu_uuid=gpu.uuid if gpu else None,
        gpu_index=gpu.index if gpu else None,
        compute_capability=gpu.compute_capability if gpu else None,
        sm_count=gpu.sm_count if gpu else None,
        memory_bytes=gpu.memory_bytes if gpu else None,
        driver_version=driver_version() if gpu else None,
        cuda_runtime=torch.version.cuda,
        torch=str(torch.__version__),  # TorchVersion is a str subclass YAML cannot write
        triton=_version("triton"),
        helion=_version("helion"),
        mamba_ssm=_version("mamba-ssm"),
        python=platform.python_version(),
        kernels_source_hash=combined_hash(sources),
        kernel_sources=sources,
    )


def restamped(recorded: dict[str, Any], files: list[str] | None, root: Path = KERNELS_DIR) -> dict[str, Any]:
    """``recorded`` (a config file's or baseline's fingerprint) with the current hashes of ``files`` (paths
    under mamba2_kernels/; None: every source file, vanished ones dropped) and the combined hash recomputed."""
    current = kernel_source_hashes(root)
    sources = dict(current) if files is None else dict(recorded.get("kernel_sources") or {})
    for name in files or ():
        if name in current:
            sources[name] = current[name]
        else:
            sources.pop(name, None)
    return {**recorded, "kernel_sources": dict(sorted(sources.items())), "kernels_source_hash": combined_hash(sources)}


def gpu_slug(fp: Fingerprint) -> str:
    """The GPU model's config-file name: ``MAMBA2_GUARD_GPU_SLUG`` where set (as the kernels' lookup reads
    it), else from the GPU's name, else "cpu"."""
    from mamba2_kernels.config_store import slug_override, slugify

    return slug_override() or (slugify(fp.gpu_name) if fp.gpu_name else "cpu")
