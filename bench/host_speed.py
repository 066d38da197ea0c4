"""The report's "Host speed beside each cell" section: each repeat's texts/s beside the host
probe's reading right after it (bench/host_probe.py), as a share of the run's fastest probe,
so a repeat that ran in a slow phase of the host shows as one, not as an engine's loss."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from bench.host_probe import SLOW_HOST
from bench.records import Cell, Run


def _fastest(run: Run) -> float | None:
    readings = [c.host_int8_gops for cells in run.cells_by_key().values() for c in cells
                if c.host_int8_gops]  # fmt: skip
    return max(readings) if readings else None


def full_speed(run: Run) -> Callable[[Cell], bool] | None:
    """Whether a cell ran at the host's full speed (its probe unmarked); None where the run
    has no probe readings."""
    fastest = _fastest(run)
    if fastest is None:
        return None
    bar = SLOW_HOST * fastest
    return lambda c: c.host_int8_gops is not None and c.host_int8_gops >= bar


def lines(run: Run, at_full_speed: Sequence[tuple[str, str, str]] = ()) -> list[str]:
    """The markdown section, or nothing where no cell has a probe reading (older runs, GPU).
    `at_full_speed`: the report's targets over the unmarked repeats only."""
    fastest, at_full = _fastest(run), full_speed(run)
    by = run.cells_by_key(lambda c: c.host_int8_gops is not None)
    if fastest is None or at_full is None or not by:
        return []
    total = sum(len(cells) for cells in by.values())
    slow = sum(1 for cells in by.values() for c in cells if not at_full(c))
    out = [
        "",
        "## Host speed beside each cell",
        "",
        f"host = an int8 GEMM probe's rate right after the cell (onnxruntime MatMulInteger "
        f"512 x 384 x 1536, 0.2 s) over the fastest reading in this run ({fastest:.0f} GOP/s); "
        f"* marks a reading under {SLOW_HOST:.0%}: that repeat ran while the host was slow, "
        f"and its texts/s says so rather than anything about the engine. {slow} of {total} "
        "cell repeats were marked. unmarked = the median texts/s of the unmarked repeats: the "
        "cell at the host's full speed, to set beside other cells' (the tables above take "
        "every repeat).",
        "",
        "| engine | length | batch | conc | texts/s per repeat | host per repeat | unmarked |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(by, key=run.cell_order):
        cells = sorted(by[key], key=lambda c: c.repeat)
        rates = " / ".join(f"{c.texts / c.seconds:.1f}" for c in cells)
        shares = " / ".join(_share(c.host_int8_gops or 0.0, fastest) for c in cells)
        full = [c.texts / c.seconds for c in cells if at_full(c)]
        unmarked = f"{statistics.median(full):.1f}" if full else "n/a"
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {rates} | {shares} | "
                   f"{unmarked} |")  # fmt: skip
    if at_full_speed:
        out += [
            "",
            "Targets over the unmarked repeats only (a cell with none is not measured here): "
            "the same ratios with every cell at the host's full speed.",
            "",
            "| target | measured | |",
            "| --- | --- | --- |",
            *(f"| {a} | {b} | {c} |" for a, b, c in at_full_speed),
        ]
    return out


def _share(gops: float, fastest: float) -> str:
    share = gops / fastest
    return f"{share:.0%}" + ("*" if share < SLOW_HOST else "")
