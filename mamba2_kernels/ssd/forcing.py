"""Which path a fused stage runs, forced whatever the GPU's rule says (``mamba2_kernels.ssd.fused_paths``): in
this thread (``forced``, how the rules' data is measured), or in every process that inherits
``$MAMBA2_GUARD_PATHS`` (``chunk_scan=fused,chunk_state_passing=chain``), how a path's own configs are tuned
before a rule can pick it. No torch here: the CLI checks the variable before anything loads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from mamba2_kernels import _environ

# The fused kernels, the rules' keys: the state passes (a chain rule: fused unless it says chain) and the
# fusions of kernels that exist unfused (a fuse rule: the chain unless it says fused). CUMSUM is chunk_cumsum
# fused into the forward's state pass, which it can join only where that pass runs fused; DCB the backward's
# bmm_chunk fused into its dCB stage; ONE_PASS the forward after chunk_cumsum in one launch (where it runs, the
# forward's other rules do not matter).
FWD, BWD, SCAN, DB_DC = "chunk_state_passing", "chunk_state_passing_bwd", "chunk_scan", "chunk_bwd_db_dc"
CUMSUM, DCB, ONE_PASS = "chunk_cumsum_state_passing", "chunk_scan_bwd_dcb", "ssd_fused_fwd"
STAGES = (FWD, BWD, SCAN, DB_DC, CUMSUM, DCB, ONE_PASS)
FUSE_STAGES = (SCAN, DB_DC, CUMSUM, DCB, ONE_PASS)
PATHS = ("fused", "chain")
PATHS_ENV = "MAMBA2_GUARD_PATHS"
_forced = threading.local()


def parse(text: str) -> dict[str, str]:
    """``stage=path,...`` as {stage: path}; ValueError naming what is wrong."""
    found: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        stage, sep, path = (s.strip() for s in part.partition("="))
        if not sep or stage not in STAGES or path not in PATHS:
            raise ValueError(f"expected stage=path pairs, a stage of {', '.join(STAGES)} and a path of "
                             f"{' or '.join(PATHS)}; got {part!r}")
        found[stage] = path
    return found


@contextlib.contextmanager
def forced(stage: str, path: str) -> Iterator[None]:
    """Run ``stage`` by ``path`` whatever the rule says, in this thread: how the rule's data is measured."""
    if stage not in STAGES or path not in PATHS:
        raise ValueError(f"forced: expected a stage of {STAGES} and a path of {PATHS}, got {stage!r}, {path!r}")
    before = getattr(_forced, stage, None)
    setattr(_forced, stage, path)
    try:
        yield
    finally:
        setattr(_forced, stage, before)


def forced_path(stage: str) -> str | None:
    """The path forced for ``stage`` in this thread, else by ``$MAMBA2_GUARD_PATHS``, else None (the rule's)."""
    path = getattr(_forced, stage, None)
    if path is not None:
        return path
    text = _environ.get(PATHS_ENV)
    if not text:
        return None
    try:
        return parse(text).get(stage)
    except ValueError as exc:
        raise ValueError(f"${PATHS_ENV}: {exc}") from None


@contextlib.contextmanager
def forced_all(paths: dict[str, str]) -> Iterator[None]:
    """``forced`` for each stage -> path of ``paths`` at once (empty: the rules' paths)."""
    with contextlib.ExitStack() as stack:
        for stage, path in paths.items():
            stack.enter_context(forced(stage, path))
        yield
