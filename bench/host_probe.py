"""How fast the host runs one fixed int8 GEMM right now, measured beside every cell.

Some hosts change speed under a run: a KVM guest on AMD EPYC here ran the same int8 graph at
274-304 ms per batch for 20 s, then 404-485 ms for 18 s, nothing else running, and fp32 ~10%
slower in the same phases (2026-12-07). A repeat that lands in a slow phase drags its cell's
median and reads as a gap between engines. Each cell is followed by this probe (onnxruntime's
MatMulInteger, u8 x s8, a MiniLM-sized FFN product, for PROBE_SECONDS), and the report sets
each cell's probe against the run's fastest: a cell whose probe reads well under it ran while
the host was slow, whatever the engine did.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# rows x inner x columns: 512 tokens through a 384 -> 1536 product (~1 ms on 2 cores).
PROBE_SHAPE = (512, 384, 1536)
PROBE_SECONDS = 0.2
PROBE_MIN_CALLS = 10
# A cell whose probe read under this share of the run's fastest ran in a slow phase.
SLOW_HOST = 0.85


def write_model(path: Path) -> Path:
    """The probe's graph (needs `onnx`, which the bench's own environment has; the engines'
    worker processes only load the file, so fastembed's venv needs no onnx)."""
    from bench.flops import int8_gemm_model

    path.write_bytes(int8_gemm_model(*PROBE_SHAPE))
    return path


class HostProbe:
    """Call it for the probe's rate now, GOP/s (the median call over PROBE_SECONDS)."""

    def __init__(self, model: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # Spinning workers would hold the cores after the probe, into the next cell.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(model), options,
                                             providers=["CPUExecutionProvider"])  # fmt: skip
        m, k, n = PROBE_SHAPE
        rng = np.random.default_rng(1)
        self._feed = {"a": rng.integers(0, 255, (m, k), dtype=np.uint8),
                      "b": rng.integers(-127, 127, (k, n), dtype=np.int8)}  # fmt: skip
        self._session.run(None, self._feed)  # warm: the thread pool, first allocations

    def __call__(self) -> float:
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < PROBE_MIN_CALLS or time.perf_counter() - start < PROBE_SECONDS:
            t = time.perf_counter()
            self._session.run(None, self._feed)
            times.append(time.perf_counter() - t)
        m, k, n = PROBE_SHAPE
        return 2.0 * m * k * n / statistics.median(times) / 1e9


class ProbeProcess:
    """The probe in a child process of its own, for the in-process engines' workers: their
    peak RSS is the engine's (the child is closed before it is read), and a worker whose
    engine never loads onnxruntime (sentence-transformers) does not load it for the probe.
    Call it for a reading; close it when the cells are done."""

    def __init__(self, model: Path, threads: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.host_probe", str(model), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        self._read()  # "ready": the session is built and warm

    def _read(self) -> str:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"host probe process ended (exit {self._proc.wait()})")
        return line.strip()

    def __call__(self) -> float:
        assert self._proc.stdin is not None
        self._proc.stdin.write("probe\n")
        self._proc.stdin.flush()
        return float(self._read())

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def main(argv: list[str]) -> int:
    """`python -m bench.host_probe MODEL THREADS`: "ready", then one reading per input line."""
    probe = HostProbe(Path(argv[0]), int(argv[1]))
    print("ready", flush=True)
    for _ in sys.stdin:
        print(f"{probe():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
