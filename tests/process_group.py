"""Real gloo process groups on 127.0.0.1, for the context-parallel tests: ``spawn`` starts the ranks, each of which
runs its body inside ``joined``."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker: Callable[..., None], world: int, *args: object, preload: list[str]) -> None:
    """``worker(rank, world, port, *args)`` in ``world`` processes. They fork from a server that imported
    ``preload`` (torch, the module under test, the test module) once: spawned imports took most of a test."""
    mp.get_context("forkserver").set_forkserver_preload(["torch", *preload])
    mp.start_processes(worker, args=(world, _free_port(), *args), nprocs=world, start_method="forkserver")


@contextlib.contextmanager
def joined(rank: int, world: int, port: int) -> Iterator[None]:
    """This rank in the gloo group of ``world`` ranks at ``port``, destroyed on leaving."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def collect(values: dict[str, object], summed: tuple[str, ...], result: str) -> None:
    """Every rank's ``values``, those named in ``summed`` (the gradients of tensors every rank holds, each a
    part) summed over the ranks first, saved by rank 0 to ``result`` as {name: [value of rank 0, 1, ...]}."""
    for name in summed:
        dist.all_reduce(values[name])
    pieces: list[dict[str, object] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, values)
    if dist.get_rank() == 0:
        torch.save({k: [p[k] for p in pieces] for k in pieces[0]}, result)
