"""Which limit an engine is held to, and how much of it a cell reached.

fp32 engines (sentence-transformers, ours in fp32, infinity, fastembed) against the host's fp32
GEMM rate; int8 engines against its int8 GEMM rate. Useful FLOPs only (flops.py): padding,
tokenization and HTTP are the engine's cost, not work.

A limit is the fastest of its readings (at the start and after each model), not their median:
each reading is already the best of several runs, and some hosts change speed for tens of
seconds, so a reading taken in a slow phase would lower the limit and flatter every engine
held to it (an AMD EPYC guest here read 106 then 208 GFLOP/s in one run).
"""

from __future__ import annotations

from bench.config import is_int8
from bench.flops import Measured
from bench.records import Peak


def peak_of(measured: list[Measured], threads: int) -> Peak:
    """Readings of the limits (flops.measure_peak) as one record; BLAS, note and int8 forms
    from the first."""
    first = measured[0]
    return Peak(
        fp32_gflops=[m.fp32 for m in measured],
        int8_gops=[m.int8 for m in measured if m.int8 is not None],
        threads=threads,
        note=first.note,
        blas=first.blas,
        int8_forms=first.int8_forms,
    )


def fp32_limit(peak: Peak) -> float:
    return max(peak.fp32_gflops)


def int8_limit(peak: Peak) -> float | None:
    return max(peak.int8_gops) if peak.int8_gops else None


def limit_of(engine: str, peak: Peak) -> tuple[str, float | None]:
    """("fp32" | "int8", the rate in G(FL)OP/s), None when that rate was not measured."""
    if is_int8(engine):
        return "int8", int8_limit(peak)
    return "fp32", fp32_limit(peak)


def fraction(gflops: float, limit: float | None) -> float | None:
    return gflops / limit if limit else None


def limit_line(peak: Peak) -> str:
    """The host's limits in one line, for every table header."""
    line = (f"fp32 GEMM (numpy sgemm, {peak.threads} threads): "
            f"{' / '.join(f'{x:.0f}' for x in peak.fp32_gflops)} GFLOP/s")  # fmt: skip
    if peak.int8_gops:
        forms = ", ".join(f"{k} {v:.0f}" for k, v in peak.int8_forms.items())
        line += (f"; int8 GEMM (onnxruntime MatMulInteger, best form): "
                 f"{' / '.join(f'{x:.0f}' for x in peak.int8_gops)} GOP/s"
                 + (f" ({forms})" if forms else ""))  # fmt: skip
    if peak.blas:
        line += f"; BLAS: {peak.blas}"
    if peak.note:
        line += f"; {peak.note}"
    return line
