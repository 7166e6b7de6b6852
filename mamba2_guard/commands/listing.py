"""``mamba2-guard list``: the shapes and kernels of a selection, with their sizes."""

from __future__ import annotations

import argparse

from mamba2_guard.commands import common


def register(commands) -> None:
    p = common.add_command(commands, "list", "list kernels and shapes of a suite")
    common.selection_arguments(p, "default")
    p.set_defaults(func=run)


WIDE = 120  # columns from which the kernels' table also says what each replaces


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    entries, shapes = common.selected(args)
    # The shapes first: `list --suite seen` is how a user sees the calls their jobs made without a config.
    # The name columns never wrap (at 80 columns they were cut to "chunk_cu…"): the others wrap for them.
    table = Table(title="shapes")
    table.add_column("shape", no_wrap=True, min_width=max((len(s.name) for s in shapes), default=5))
    for column in ("batch x seqlen", "heads x headdim", "groups", "dstate", "chunk", "dtype", "call"):
        table.add_column(column, overflow="fold")
    for s in shapes:
        table.add_row(s.name, f"{s.batch} x {s.seqlen}", f"{s.nheads} x {s.headdim}", str(s.ngroups), str(s.dstate),
                      str(s.chunk_size), s.dtype, s.pattern or "plain")
    common.console().print(table)

    def spread(values: list[float]) -> str:  # one shape: its value; several: their range
        low, high = min(values), max(values)
        return f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"

    wide = common.console().width >= WIDE  # narrower, what a kernel replaces is left out: names must fit whole
    table = Table(title="kernels" + (" (GB moved and GFLOP: the range over the shapes)" if len(shapes) > 1 else ""),
                  caption=None if wide else f"what each replaces: at {WIDE} columns or more")
    table.add_column("kernel", no_wrap=True, min_width=max((len(e.name) for e in entries), default=6))
    for column in ("family", "phase", *(("replaces",) if wide else ()), "helion", "GB moved", "GFLOP"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        status = "implemented" if entry.has_helion else "[red]missing[/red]"
        table.add_row(entry.name, entry.family, entry.phase, *((entry.replaces,) if wide else ()), status,
                      spread([entry.bytes_moved(s) / 1e9 for s in shapes]),
                      spread([entry.flops(s) / 1e9 for s in shapes]))
    common.console().print(table)
    return common.EXIT_OK
