"""The timed loop shared by in-process and HTTP engines.

Call i embeds the pool's texts i*b .. i*b+b-1 (wrapping), so every engine sees the same texts
in the same order. A cell runs until it has min_calls calls and min_seconds, or max_seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.config import Sizes
from bench.flops import text_flops
from bench.records import Cell, Model
from bench.texts import Pool


def chunk(pool: Pool, i: int, batch: int) -> tuple[list[str], list[int]]:
    idx = [(i * batch + j) % len(pool.texts) for j in range(batch)]
    return [pool.texts[k] for k in idx], [pool.tokens[k] for k in idx]


@dataclass(frozen=True)
class Usage:
    """A server's counters at one moment: the seconds its model has spent in forwards (None
    where the server does not say) and its process's CPU seconds."""

    model_busy_s: float | None
    cpu_s: float


def run_cell(
    call: Callable[[list[str]], object],
    pool: Pool,
    *,
    engine: str,
    length: str,
    batch: int,
    concurrency: int,
    repeat: int,
    sizes: Sizes,
    model: Model,
    usage: Callable[[], Usage] | None = None,
    probe: Callable[[], float] | None = None,
) -> Cell:
    """`concurrency` threads issue calls; each call's latency is measured around `call`.
    With `usage` (a server's), the cell also says where the timed part's time went: the
    share of it the model ran forwards, and the cores the server and this process's client
    threads used. With `probe` (bench/host_probe.py), the host's speed right after it."""
    warm, warm_tokens = chunk(pool, 0, batch)
    if sum(warm_tokens) > sizes.warm_token_cap:
        warm = warm[:1]  # a minutes-long batch is not run twice; its arena growth is noise
    call(warm)  # warm: first-shape allocations, connection setup
    lock = threading.Lock()
    latencies: list[float] = []
    tokens: list[int] = []
    state = {"next": 0, "texts": 0}
    # at least one full round of concurrency, else the cell measures a ramp, not a load
    min_calls = max(sizes.min_calls, concurrency)
    before = usage() if usage else None
    client_cpu = time.process_time()  # every thread of this process: the client threads
    start = time.perf_counter()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                elapsed = time.perf_counter() - start
                done = state["next"] >= min_calls and elapsed >= sizes.min_seconds
                if done or elapsed >= sizes.max_seconds or errors:
                    return
                i = state["next"]
                state["next"] += 1
            texts, toks = chunk(pool, i, batch)
            t = time.perf_counter()
            try:
                call(texts)
            except BaseException as e:  # re-raised below, on the caller's thread
                errors.append(e)
                return
            dt = time.perf_counter() - t
            with lock:
                latencies.append(dt)
                tokens.extend(toks)
                state["texts"] += len(texts)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    after = usage() if usage else None
    if errors:
        raise errors[0]
    host = None
    if probe is not None:
        try:
            host = probe()
        except Exception:  # a probe that fails leaves the cell unprobed, not lost
            host = None
    busy = server = client = None
    if before is not None and after is not None:
        server, client = (after.cpu_s - before.cpu_s) / seconds, client_cpu / seconds
        if before.model_busy_s is not None and after.model_busy_s is not None:
            busy = (after.model_busy_s - before.model_busy_s) / seconds
    lat_ms = np.array(latencies) * 1e3
    return Cell(
        engine=engine,
        length=length,
        batch=batch,
        concurrency=concurrency,
        repeat=repeat,
        texts=state["texts"],
        tokens=sum(tokens),
        flops=text_flops(model, tokens),
        seconds=seconds,
        p50_ms=float(np.percentile(lat_ms, 50)),
        p99_ms=float(np.percentile(lat_ms, 99)),
        model_busy=busy,
        server_cores=server,
        client_cores=client,
        host_int8_gops=host,
    )
