"""How long `tei-serve` takes to answer `/health` when its hub cache starts empty: the first
start (the default model exported from its installed copy), a second start on that export,
then a start in int8 (the export made again with int8 added) and one more on that.

Each start is a fresh process; the clock runs from spawning it to the first 200 from
`/health` (polled every 50 ms). Every round gets a new empty hub cache in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.procs import machine

POLL_S = 0.05


@dataclass(frozen=True)
class Step:
    name: str
    flags: tuple[str, ...] = ()


STEPS = (
    Step("first start, empty hub cache"),
    Step("second start"),
    Step("--dtype int8 (adds int8)", ("--dtype", "int8")),
    Step("--dtype int8 again", ("--dtype", "int8")),
)


class StartError(RuntimeError):
    pass


def tei_serve() -> str:
    found = Path(sys.executable).with_name("tei-serve")
    return str(found) if found.exists() else "tei-serve"


def time_to_healthy(cache: Path, port: int, flags: Sequence[str], timeout_s: float) -> float:
    """Seconds from spawning tei-serve on CACHE to its first healthy `/health`; the server is
    stopped (SIGTERM) afterwards."""
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env.pop("HUGGINGFACE_HUB_CACHE", None)  # it would win over HF_HUB_CACHE, as in TEI
    cmd = [tei_serve(), "--port", str(port), "--prometheus-port", "0", *flags]
    # Its log goes to a file, not a pipe: an export's progress would fill a pipe nobody reads.
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            while True:
                try:
                    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                    if health.status_code == 200:
                        return time.perf_counter() - start
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    log.seek(0)
                    err = log.read().decode(errors="replace")
                    raise StartError(f"{' '.join(cmd)} exited {proc.returncode}: {err[-2000:]}")
                if time.perf_counter() - start > timeout_s:
                    raise StartError(f"{' '.join(cmd)} not healthy after {timeout_s:.0f} s")
                time.sleep(POLL_S)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_round(port: int, timeout_s: float) -> list[float]:
    cache = Path(tempfile.mkdtemp(prefix="tei-first-start-"))
    try:
        return [time_to_healthy(cache, port, step.flags, timeout_s) for step in STEPS]
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def table(rounds: Sequence[Sequence[float]]) -> list[str]:
    out = ["| start | " + " | ".join(f"round {i + 1} s" for i in range(len(rounds))) + " |"]
    out.append("| --- |" + " --- |" * len(rounds))
    for i, step in enumerate(STEPS):
        out.append(f"| {step.name} | " + " | ".join(f"{r[i]:.1f}" for r in rounds) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.first_start", description=__doc__)
    p.add_argument("--rounds", type=int, default=2, help="rounds, each on an empty hub cache")
    p.add_argument("--port", type=int, default=3913)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    host = machine({})
    print(f"host: {host.cpu}, {host.cores} CPUs, ISA {' '.join(host.isa) or 'none'}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)  # fmt: skip
    rounds: list[list[float]] = []
    for i in range(args.rounds):
        try:
            rounds.append(run_round(args.port, args.timeout))
        except StartError as e:
            print(f"round {i + 1}: {e}", file=sys.stderr)
            return 1
        print(f"round {i + 1}: " + ", ".join(f"{t:.1f} s" for t in rounds[-1]), flush=True)
    print("\n".join(["", *table(rounds)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
