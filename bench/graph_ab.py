"""The fused and the plain CPU graph of one artifact, timed against each other.

`python -m bench.graph_ab ARTIFACT [--precisions fp32,int8] [--shapes 1x16,32x16,32x128]`

Each graph runs in its own process, loaded by `tei_runtime.load(graph=...)` with the
runtime's own session options, and the two take turns in blocks of calls on the same texts
(the order flips every block), so a host that changes speed for tens of seconds slows both
alike. Between blocks the idle process sleeps: onnxruntime's threads spin for a while after a
call, and a spinning neighbour would tax whichever graph ran next. The table gives each
graph's median milliseconds per call and plain / fused in texts per second (> 1: the plain
graph is faster), the evidence for a card's `[fusion.plain_graph_cpus]`. Under
`python -m bench.isa_mask --` it measures the AVX2 class on a host that has AVX-512.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from bench.procs import clean_env, machine
from bench.texts import make_pools

REPO = Path(__file__).resolve().parent.parent
"""Where `python -m bench.graph_ab --worker` finds the bench package."""


class Shape(msgspec.Struct, frozen=True):
    batch: int
    tokens: int

    @property
    def name(self) -> str:
        return f"{self.batch}x{self.tokens}"


class Job(msgspec.Struct, frozen=True):
    """One worker's graph and every shape's texts (the first line it reads)."""

    artifact: str
    precision: str
    graph: str
    texts: dict[str, list[str]]


class Call(msgspec.Struct, frozen=True):
    shape: str
    calls: int


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for part in text.split(","):
        batch, sep, tokens = part.strip().partition("x")
        if not sep or not batch.isdigit() or not tokens.isdigit() or "0" in (batch, tokens):
            raise argparse.ArgumentTypeError(f"shape {part!r}: write BATCHxTOKENS, e.g. 32x128")
        shapes.append(Shape(int(batch), int(tokens)))
    return shapes


def worker() -> int:
    """Load the job's graph, then time each Call read from stdin; one JSON line per call."""
    import tei_runtime

    job = msgspec.json.decode(sys.stdin.readline(), type=Job)
    model = tei_runtime.load(job.artifact, device="cpu", dtype=job.precision, graph=job.graph)
    print(msgspec.json.encode({"variant": model.variant.name}).decode(), flush=True)
    for line in sys.stdin:
        call = msgspec.json.decode(line, type=Call)
        texts = job.texts[call.shape]
        times = []
        for _ in range(call.calls):
            t = time.perf_counter()
            model.embed(texts)
            times.append(time.perf_counter() - t)
        print(msgspec.json.encode(times).decode(), flush=True)
    return 0


class Worker:
    def __init__(self, job: Job) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.graph_ab", "--worker"], env=clean_env(), cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.variant = str(self._ask(msgspec.json.encode(job).decode())["variant"])

    def _ask(self, line: str) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"worker exited {self.proc.wait()} (its stderr is above)")
        got = msgspec.json.decode(answer)
        return got if isinstance(got, dict) else {"times": got}

    def time(self, shape: str, calls: int) -> list[float]:
        times = self._ask(msgspec.json.encode(Call(shape, calls)).decode())["times"]
        assert isinstance(times, list)
        return [float(t) for t in times]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def compare(artifact: Path, precision: str, shapes: list[Shape], blocks: int,
            seconds_per_block: float) -> list[str]:  # fmt: skip
    """Table rows for one precision: shape, fused ms, plain ms, plain / fused."""
    max_tokens = max(s.tokens for s in shapes)
    pools = make_pools(artifact, max(s.batch for s in shapes), max_tokens,
                       {s.name: s.tokens for s in shapes})  # fmt: skip
    texts = {s.name: pools[s.name].texts[: s.batch] for s in shapes}
    workers = {g: Worker(Job(str(artifact), precision, g, texts)) for g in ("fused", "plain")}
    try:
        rows = []
        for s in shapes:
            for w in workers.values():
                w.time(s.name, 2)  # warm-up: first calls allocate
            one = statistics.median(workers["fused"].time(s.name, 3))
            calls = max(1, round(seconds_per_block / one))
            got: dict[str, list[float]] = {"fused": [], "plain": []}
            for block in range(blocks):
                order = ("fused", "plain") if block % 2 == 0 else ("plain", "fused")
                for g in order:
                    time.sleep(0.2)  # the other process's threads stop spinning
                    got[g] += workers[g].time(s.name, calls)
            fused, plain = statistics.median(got["fused"]), statistics.median(got["plain"])
            rows.append(f"| {precision} | {s.name} | {fused * 1e3:.2f} | {plain * 1e3:.2f} | "
                        f"{fused / plain:.2f}x | {workers['fused'].variant} / "
                        f"{workers['plain'].variant} |")  # fmt: skip
            print(rows[-1], file=sys.stderr, flush=True)
        return rows
    finally:
        for w in workers.values():
            w.close()


def main(argv: list[str]) -> int:
    if argv == ["--worker"]:
        return worker()
    p = argparse.ArgumentParser(prog="python -m bench.graph_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("artifact", type=Path, help="an artifact folder with fused and plain graphs")
    p.add_argument("--precisions", default="fp32,int8", help="comma list of fp32, int8")
    p.add_argument("--shapes", type=parse_shapes, default=parse_shapes("1x16,32x16,32x128"),
                   help="comma list of BATCHxTOKENS (default 1x16,32x16,32x128)")  # fmt: skip
    p.add_argument("--blocks", type=int, default=6, help="turns each graph takes per shape")
    p.add_argument("--block-seconds", type=float, default=1.5, help="length of one turn")
    args = p.parse_args(argv)
    precisions = args.precisions.split(",")
    if bad := [x for x in precisions if x not in ("fp32", "int8")]:
        p.error(f"unknown precision {', '.join(bad)} (fp32, int8)")
    if not (args.artifact / "manifest.json").is_file():
        p.error(f"{args.artifact} has no manifest.json: not an artifact folder")
    host = machine({})
    lines = [
        f"host: {host.cpu}, {host.cores} CPUs, ISA {', '.join(host.isa) or 'none'}; "
        f"{args.blocks} turns of ~{args.block_seconds:g} s per graph and shape, medians",
        "",
        "| precision | shape | fused ms | plain ms | plain / fused | variants |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for precision in precisions:
        lines += compare(args.artifact, precision, args.shapes, args.blocks, args.block_seconds)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
