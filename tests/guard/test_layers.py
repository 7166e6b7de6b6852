"""mamba2_guard/ imports only downward: core <- adapters <- bench <- flows <- entry points (cli, commands, daemon).

Walks every module of both packages with ``ast`` (imports inside functions count too) and checks that
* no module of mamba2_guard imports a module of a higher layer;
* neither package's module import graph has a cycle;
* no ``_private`` name is imported from another module of mamba2_guard;
* mamba2_guard imports no private module or name of mamba2_kernels (its public ``mamba2_kernels.tuning`` surface);
* mamba2_guard/core imports none of torch, git, github, HTTP, the scheduler or the clock's side of the world;
* mamba2_kernels/ never imports mamba2_guard.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "mamba2_guard"

# Lower number = lower layer. A module may import its own layer or any lower one.
LAYERS = {"mamba2_guard": 0, "mamba2_guard.core": 0, "mamba2_guard.adapters": 1, "mamba2_guard.config": 1,
          "mamba2_guard.bench": 2, "mamba2_guard.flows": 3, "mamba2_guard.dev": 3, "mamba2_guard.cli": 4,
          "mamba2_guard.commands": 4, "mamba2_guard.daemon": 4, "mamba2_guard.__main__": 4}
CORE_FORBIDDEN = ("torch", "git", "github", "requests", "urllib", "http", "socket", "subprocess", "apscheduler",
                  "sqlite3", "prometheus_client", "pynvml", "time", "mamba2_kernels")


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    best = None
    for prefix, rank in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    assert best is not None, f"{module}: no layer (add it to LAYERS)"
    return best[1]


def imports(path: Path, modules: set[str], package: str = "mamba2_guard") -> list[tuple[str, str | None, int]]:
    """(imported ``package`` module, imported name or None, line) for every import of it in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != package:
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in modules:  # `from mamba2_guard.adapters import state`: the module itself
                    found.append((sub, None, node.lineno))
                else:
                    found.append((node.module, a.name, node.lineno))
    return found


def package_modules(package: str) -> dict[str, Path]:
    mods = {module_name(p): p for p in sorted((REPO / package).rglob("*.py")) if "__pycache__" not in p.parts}
    assert f"{package}.config_store" in mods or f"{package}.cli" in mods, f"no modules found under {package}"
    return mods


def guard_modules() -> dict[str, Path]:
    return package_modules("mamba2_guard")


def graph(package: str = "mamba2_guard") -> dict[str, set[str]]:
    mods = package_modules(package)
    return {m: {target for target, _, _ in imports(p, set(mods), package) if target != m} for m, p in mods.items()}


def test_imports_only_go_downward():
    mods = guard_modules()
    upward = []
    for m, path in mods.items():
        for target, _, line in imports(path, set(mods)):
            if "mamba2_guard" in (m, target):  # the package root (PROJECT_ROOT, EnvironmentProblem)
                continue
            if layer(target) > layer(m):
                upward.append(f"{path.relative_to(REPO)}:{line}: {m} (layer {layer(m)}) imports {target} "
                              f"(layer {layer(target)})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", ["mamba2_guard", "mamba2_kernels"])
def test_no_import_cycles(package):
    g = graph(package)
    mods = set(g)

    def resolve(target: str) -> str | None:  # `from mamba2_guard.adapters.files import x` -> ...adapters.files
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    edges = {m: {t for t in map(resolve, targets) if t and t != m and not m.startswith(t + ".")
                 and t != package} for m, targets in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_imported_across_modules():
    mods = guard_modules()
    bad = [f"{p.relative_to(REPO)}:{line}: from {target} import {name}"
           for m, p in mods.items() for target, name, line in imports(p, set(mods))
           if name and name.startswith("_") and not name.startswith("__") and target != m]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_guard_uses_only_the_kernels_public_names():
    kernels = set(package_modules("mamba2_kernels"))
    bad = []
    for path in guard_modules().values():
        for target, name, line in imports(path, kernels, "mamba2_kernels"):
            private_module = any(part.startswith("_") and not part.startswith("__") for part in target.split("."))
            if private_module or (name and name.startswith("_") and not name.startswith("__")):
                bad.append(f"{path.relative_to(REPO)}:{line}: {target}" + (f" import {name}" if name else ""))
    assert not bad, "the guard imports private kernel names (use mamba2_kernels.tuning):\n" + "\n".join(bad)


def test_core_stays_pure():
    bad = []
    for path in sorted((GUARD / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for name in names:
                if name.split(".")[0] in CORE_FORBIDDEN or (name.split(".")[0] == "mamba2_guard"
                                                             and not name.startswith("mamba2_guard.core")):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {name}")
    assert not bad, "mamba2_guard/core must stay pure:\n" + "\n".join(bad)


def test_kernels_never_import_guard():
    bad = []
    paths = sorted((REPO / "mamba2_kernels").rglob("*.py"))
    assert paths
    for path in paths:
        for target, _, line in imports(path, set()):
            bad.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert not bad, "mamba2_kernels/ imports mamba2_guard:\n" + "\n".join(bad)
