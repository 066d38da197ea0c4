"""Where a served cell's time goes: the model's busy share, the cores each side used.

A served engine trails the same graph in-process for two reasons, which these figures tell
apart: the model waits for work (HTTP, JSON, tokenizing and the clients hold the cores
between batches: busy share under 100%), or its forwards run slower beside that work (the
forward rate, texts/s over the busy share, under the in-process engine's texts/s). Both are
medians over repeats, from the server's `tei_onnx_model_busy_seconds` and /proc.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from bench.records import Run

if TYPE_CHECKING:
    from bench.report import Key, Row


def _median(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return statistics.median(known) if known else None


def lines(run: Run, table: dict[Key, Row]) -> list[str]:
    """The markdown section, or nothing where no served cell has the figures. `table`: the
    report's medians per cell (texts/s)."""
    by = run.cells_by_key(lambda c: c.server_cores is not None)
    if not by:
        return []
    out = [
        "",
        "## Served cells: where the time goes",
        "",
        "busy = share of the cell's wall time the server's model ran forwards "
        "(`tei_onnx_model_busy_seconds`; n/a for servers without it); forward rate = texts/s "
        "over that share, what the model does while it runs, against the in-process "
        "`runtime-*` engine of the same precision at the same length and batch (whose texts/s "
        "include its tokenizing and pooling, a few % of a call: the same speed reads a little "
        "over 1x); cores = CPU "
        f"seconds per wall second of the server process and of the bench's client threads "
        f"({run.machine.cores} CPUs in all). A busy share well under 100% means the model "
        "waited for HTTP, JSON, tokenizing or the clients; a forward rate under the "
        "in-process one means its forwards ran slower beside that work.",
        "",
        "| engine | length | batch | conc | texts/s | busy | forward rate | in-process | "
        "server cores | client cores |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(by, key=run.cell_order):
        cells = by[key]
        engine, length, batch, conc = key
        texts_s = table[key].texts_s
        busy = _median([c.model_busy for c in cells])
        forward = texts_s / busy if busy else None
        precision = engine.rsplit("-", 1)[-1]
        alone = table.get((f"runtime-{precision}", length, batch, 1))
        alone_s = alone.texts_s if alone and engine.startswith("serve-") else None
        out.append(
            f"| {engine} | {length} | {batch} | {conc} | {texts_s:.1f} | "
            f"{_fmt(busy, '{:.0%}')} | {_fmt(forward, '{:.1f}')} | {_fmt(alone_s, '{:.1f}')} | "
            f"{_fmt(_median([c.server_cores for c in cells]), '{:.2f}')} | "
            f"{_fmt(_median([c.client_cores for c in cells]), '{:.2f}')} |"
        )
    return out


def _fmt(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else fmt.format(x)
