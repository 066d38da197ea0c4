"""Worker process for in-process engines (sentence-transformers, tei_runtime).

`python -m bench.inproc JOB OUT`: one process per engine and repeat, so cold start and peak
RSS are the engine's own. Cold start is from the orchestrator's spawn (wall clock handed in
the job) to the first embedded text, imports and interpreter start included.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from bench.config import Sizes, dtype_of
from bench.measure import chunk, run_cell
from bench.procs import peak_rss_mb
from bench.records import Cell, EngineRun, Model
from bench.texts import Pool


class Job(msgspec.Struct, frozen=True, kw_only=True):
    engine: str  # st | runtime-fp32 | runtime-fp16 | runtime-int8
    device: str  # cpu | cuda
    checkpoint: str
    artifact: str
    spawned_at: float  # time.time() just before the orchestrator's Popen
    repeat: int
    sizes: Sizes
    model: Model
    pools: dict[str, Pool]
    cells: list[tuple[str, int]]  # (length, batch)
    vectors_out: str  # .npy of the mixed pool's vectors, for the cosine check; "" for none


Embed = Callable[[list[str], int], np.ndarray]


def _load(job: Job) -> Embed:
    if job.engine == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(job.checkpoint, device=job.device)

        def st_embed(texts: list[str], batch: int) -> np.ndarray:
            out = st.encode(texts, batch_size=batch, show_progress_bar=False)
            return np.asarray(out)

        return st_embed
    import tei_runtime

    model = tei_runtime.load(job.artifact, device=job.device, dtype=dtype_of(job.engine))

    def rt_embed(texts: list[str], batch: int) -> np.ndarray:
        return np.asarray(model.embed(texts))  # the runtime packs by its own token budget

    return rt_embed


def run(job: Job) -> EngineRun:
    embed = _load(job)
    embed(["cold start"], 1)
    cold = time.time() - job.spawned_at
    cells: list[Cell] = []
    for length, batch in job.cells:

        def call(texts: list[str], b: int = batch) -> object:
            return embed(texts, b)

        cells.append(
            run_cell(
                call,
                job.pools[length],
                engine=job.engine,
                length=length,
                batch=batch,
                concurrency=1,
                repeat=job.repeat,
                sizes=job.sizes,
                model=job.model,
            )
        )
    if job.vectors_out:
        pool = job.pools["mixed"]
        vecs = [embed(chunk(pool, i, 32)[0], 32) for i in range(-(-len(pool.texts) // 32))]
        np.save(job.vectors_out, np.concatenate(vecs)[: len(pool.texts)])
    return EngineRun(
        engine=job.engine,
        repeat=job.repeat,
        cold_start_s=cold,
        peak_rss_mb=peak_rss_mb(os.getpid()),
        cells=cells,
    )


def main(argv: list[str]) -> int:
    job = msgspec.json.decode(Path(argv[0]).read_bytes(), type=Job)
    result = run(job)
    Path(argv[1]).write_bytes(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
