"""Autotuner seeds for the SSD kernels: mamba-ssm 2.3.2.post1's own Triton autotune lists
(``mamba_ssm/ops/triton/ssd_*.py``), written as partial Helion configs over each kernel's block sizes in
the order the kernel registers them, plus configs that hand sweeps (``mamba2-guard dev sweep``) found
faster than the tuner's picks. Triton's default warps (4) and stages (3) fill in where mamba-ssm sets none.
They only start the search: Helion's tuner measures them with everything else it tries."""

from __future__ import annotations

from typing import Any


def _config(block_sizes: list[int], stages: int = 3, warps: int = 4) -> dict[str, Any]:
    return {"block_sizes": block_sizes, "num_stages": stages, "num_warps": warps}


# (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_stages, num_warps) of chunk_state / chunk_scan / dstates.
_MATMUL = ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
           (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2), (64, 64, 32, 4, 2))
# chunk_scan and dx (M, N, chunk K, dstate K) from a hand sweep: 4 warps (Hopper's wgmma needs a multiple of 4)
# and different blocks for the two inner loops, faster than the tuner's picks.
SWEPT_CHUNK_SCAN = _config([64, 64, 32, 64], stages=3, warps=4)
SWEPT_DX = _config([64, 64, 64, 128], stages=1, warps=4)
# (BLOCK_SIZE_M, BLOCK_SIZE_N) of the dC and db kernels, whose K (headdim) is one whole block.
_TILES_MN = ((32, 128), (128, 32), (64, 128), (128, 64), (64, 64), (64, 32), (32, 64), (32, 32))
# BLOCK_SIZE of state passing, forward and backward.
STATE_BLOCKS = (64, 128, 256, 512, 1024, 2048)
# (BLOCK_SIZE_M, BLOCK_SIZE_N) of the dCB kernel.
_TILES_DCB = ((32, 128), (128, 32), (64, 64), (64, 32), (32, 64), (32, 32))
# (BLOCK_SIZE_M, BLOCK_SIZE_N) of the stable ddA kernel.
_TILES_DDACS = ((64, 32), (64, 64), (128, 32), (128, 64), (128, 128))
# BLOCK_SIZE_H of chunk_cumsum, forward and backward.
HEAD_BLOCKS = (1, 2, 4, 8, 16, 32, 64)


def matmul_mnk() -> list[dict[str, Any]]:
    """Kernels registering (M, N, K) blocks, as chunk_state and dstates do."""
    return [_config([m, n, k], stages, warps) for m, n, k, stages, warps in _MATMUL]


def matmul_mn() -> list[dict[str, Any]]:
    """The fused state kernels: chunk_state's (M, N) blocks and settings, with the chunk in one block."""
    return [_config([m, n], stages, warps) for m, n, _, stages, warps in _MATMUL]


def matmul_mnkk() -> list[dict[str, Any]]:
    """chunk_scan and dx: one K block for both of mamba-ssm's inner loops (over dstate and the chunk)."""
    return [_config([m, n, k, k], stages, warps) for m, n, k, stages, warps in _MATMUL]


def tiles_mn_whole_k(headdim_block: int = 64, tiles: tuple[tuple[int, int], ...] = _TILES_MN) -> list[dict[str, Any]]:
    """dC and db (and, with their own tiles, dCB and ddA): (M, N) tiles with the head dimension in one
    block."""
    return [_config([m, n, headdim_block]) for m, n in tiles]


def tiles_db_dc() -> list[dict[str, Any]]:
    """The fused dB and dC kernel: the db and dC kernels' (M, N) tiles and whole head dimension, and a chunk block
    of 32 for its dCB loop (the two accumulators and two state products it holds per tile leave less room)."""
    return [_config([m, n, 64, 32]) for m, n in _TILES_MN]


def tiles_dcb() -> list[dict[str, Any]]:
    return tiles_mn_whole_k(tiles=_TILES_DCB)


def tiles_ddacs() -> list[dict[str, Any]]:
    return tiles_mn_whole_k(tiles=_TILES_DDACS)


def ssd_fused_fwd() -> list[dict[str, Any]]:
    """The fused forward: (headdim, state-product chunk, row, column) blocks. chunk_scan's swept and
    mamba-ssm's (M, N, K) rows and columns, the state product in chunk_state's K blocks."""
    return [_config([64, 64, 64, 32], 3, 4), _config([64, 32, 64, 64], 2, 4), _config([32, 64, 64, 32], 3, 4),
            _config([64, 64, 128, 32], 2, 8), _config([32, 32, 32, 32], 4, 4)]


def rows(sizes: tuple[int, ...], *inner: int) -> list[dict[str, Any]]:
    """One block over rows (dz: chunk rows, state passing: the flattened state, chunk_cumsum: heads), the
    rest whole."""
    return [_config([size, *inner]) for size in sizes]
