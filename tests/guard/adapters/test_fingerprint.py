"""The kernel sources a fingerprint weighs: which of mamba2_kernels' files are host code only
(``HOST_SOURCES``), whose changes leave every searched config what its search would find again."""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path

import helion

from mamba2_guard.adapters.fingerprint import HOST_SOURCES, KERNELS_DIR, kernel_shaping, kernel_source_hashes
from mamba2_kernels.tuning import tuned_kernels


def device_code(source: str) -> list[str]:
    """What in ``source`` is device code: Helion's language (``hl.``), or a function made a Triton or Helion
    kernel by its decorator (where tuned kernels are defined is ``test_no_tuned_kernel_is_defined_...``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hl":
            found.append(f"hl.{node.attr}")
        elif isinstance(node, ast.FunctionDef):
            found += [f"@{ast.unparse(d)} {node.name}" for d in node.decorator_list
                      if any(part in ast.unparse(d) for part in ("jit", "kernel"))]
    return found


def test_every_host_source_exists_and_holds_no_device_code():
    assert device_code("import helion.language as hl\nx = hl.arange(4)\n") == ["hl.arange"]
    assert device_code("@triton.jit\ndef k(x):\n    pass\n") == ["@triton.jit k"]
    for name in HOST_SOURCES:
        path = KERNELS_DIR / name
        assert path.is_file(), f"HOST_SOURCES names {name}, which is no file under mamba2_kernels/"
        assert not device_code(path.read_text()), f"{name} holds device code: it shapes generated code"


def test_no_tuned_kernel_is_defined_in_a_host_source():
    root = KERNELS_DIR.resolve()
    sources = {name: Path(inspect.getsourcefile(kernel.fn)).resolve() for name, kernel in tuned_kernels().items()}
    ours = {name: str(path.relative_to(root)) for name, path in sources.items() if path.is_relative_to(root)}
    assert "chunk_scan" in ours  # the test modules' toy kernels, registered too where they were imported, are not
    for name, source in ours.items():
        assert source not in HOST_SOURCES, f"{name} is defined in the host source {source}"


def test_the_options_runtime_compiles_kernels_with_are_those_it_was_called_host_code_under(monkeypatch):
    # _runtime.py is a host source only while what it gives Helion beyond the config is these options: they
    # shape the generated code. Another option, or another value, must take _runtime.py out of HOST_SOURCES.
    seen: dict = {}
    monkeypatch.setattr(helion, "kernel", lambda fn, **options: seen.update(options) or fn)
    kernel = copy.copy(next(iter(tuned_kernels().values())))
    kernel._kernels = {}
    kernel.helion_kernel({"num_warps": 4}, "compiled")
    assert seen.pop("static_shapes") is True and seen.pop("ref_mode") == helion.RefMode.OFF
    assert set(seen) == {"config", "ignore_warnings"}


def test_the_kernel_shaping_sources_are_all_but_the_host_ones():
    sources = kernel_source_hashes()
    shaping = kernel_shaping(sources)
    assert set(sources) - set(shaping) == set(HOST_SOURCES)
    assert "ssd/chunk_scan.py" in shaping and "ssd/compose.py" in shaping


def test_a_run_on_another_card_after_a_suites_loader_change_has_the_same_search_identity():
    """What a bring-up met: its next night ran on another H100 of the same model, under a guard whose only
    change below mamba2_kernels/ was the suites' loader. Its searches were still what a search would find, but
    the run searched them all again. A kernel's change still makes a new identity."""
    from mamba2_guard.flows.autotune import search_identity

    plan = {"effort": "quick", "seed": 1234, "gpu_slug": "gpu-a", "jobs": ["ssd_combined_fwd_bwd@smoke"],
            "fingerprint_digest": "a" * 64}
    sources = kernel_source_hashes()
    before = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-1", "hostname": "runner-1", "helion": "1.5.0",
              "kernel_sources": sources}

    def after(*changed: str) -> dict:
        return {**before, "gpu_uuid": "GPU-2", "hostname": "runner-2",
                "kernel_sources": {**sources, **{name: "0" * 64 for name in changed}}}

    for host in ("suites.py", "_ops.py", "context_parallel.py", "_mamba_ssm.py", "ssd/combined.py"):
        assert search_identity(plan, after(host)) == search_identity(plan, before), host
    assert search_identity(plan, after("suites.py", "ssd/chunk_scan.py")) != search_identity(plan, before)
