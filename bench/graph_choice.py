"""The per-host graph choice, measured: each CPU graph forced (runtime-fused-*, runtime-plain-*)
on the same cells, against the graph tei_runtime picked for this host (runtime-fp32 / -int8).

The verdict per precision and batch is the geometric mean of plain / fused texts/s over the
lengths both ran; within +-5% is a tie, which a 2-core guest's repeats cannot split."""

from __future__ import annotations

import math
from collections.abc import Mapping

from bench.config import GRAPHS
from bench.records import Run

Key = tuple[str, str, int, int]  # engine, length, batch, concurrency
TIE = 0.05


def _variant_run(run: Run, engine: str) -> str | None:
    return next((e.variant for e in run.engines if e.engine == engine and e.variant), None)


def plain_over_fused(texts_s: Mapping[Key, float], precision: str, batch: int) -> dict[str, float]:
    """length -> plain texts/s over fused texts/s, for the cells both graphs ran."""
    fused, plain = (f"runtime-{g}-{precision}" for g in GRAPHS)
    out = {}
    for (engine, length, b, _), rate in texts_s.items():
        other = texts_s.get((plain, length, b, 1))
        if engine == fused and b == batch and other is not None and rate > 0:
            out[length] = other / rate
    return out


def verdict(ratios: Mapping[str, float]) -> str:
    if not ratios:
        return "not measured"
    mean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    if abs(mean - 1) <= TIE:
        return f"tie (plain / fused {mean:.2f}x, within ±{TIE:.0%})"
    return f"{'plain' if mean > 1 else 'fused'} faster (plain / fused {mean:.2f}x)"


def lines(run: Run, texts_s: Mapping[Key, float]) -> list[str]:
    """The markdown section; empty when no graph was forced in this run."""
    precisions = [p for p in ("fp32", "int8")
                  if any(k[0] == f"runtime-plain-{p}" for k in texts_s)]  # fmt: skip
    if not precisions:
        return []
    out = [
        "",
        "## CPU graph per host",
        "",
        "Each CPU graph forced (`load(graph=...)`): `fused` = the exporter's offline fusions, "
        "`plain` = the traced graph fused by onnxruntime at load time. plain / fused > 1: the "
        "plain graph is faster here. Verdict: geometric mean over the lengths at the batch "
        f"shown, within ±{TIE:.0%} a tie.",
        "",
        "| precision | batch | " + " | ".join(run.workloads) + " | verdict | runtime picked |",
        "| --- | --- | " + " | ".join("---" for _ in run.workloads) + " | --- | --- |",
    ]
    batches = sorted({k[2] for k in texts_s if k[0].startswith("runtime-plain-")})
    for p in precisions:
        picked = _variant_run(run, f"runtime-{p}") or "not run"
        for b in batches:
            ratios = plain_over_fused(texts_s, p, b)
            cells = [f"{ratios[x]:.2f}x" if x in ratios else "" for x in run.workloads]
            out.append(f"| {p} | {b} | " + " | ".join(cells) + f" | {verdict(ratios)} | {picked} |")
    return out
