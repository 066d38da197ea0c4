"""Worker process for in-process engines (sentence-transformers, tei_runtime, fastembed).

`python -m bench.inproc JOB OUT`: one process per engine and repeat, so cold start and peak
RSS are the engine's own. Cold start is from the orchestrator's spawn (wall clock handed in
the job) to the first embedded text, imports and interpreter start included. fastembed runs
this same module with bench/.venv-fastembed's Python (its pins conflict with ours).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from bench.config import Sizes, dtype_of, graph_of
from bench.host_probe import ProbeProcess
from bench.measure import run_cell
from bench.procs import peak_rss_mb
from bench.records import Cell, EngineRun, Model
from bench.texts import Pool


class Job(msgspec.Struct, frozen=True, kw_only=True):
    engine: str  # st, runtime-fp32 / -fp16 / -int8, runtime-plain-fp32 ..., fastembed
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
    fastembed_dir: str = ""  # fastembed's model folder (fastembed_dir.py)
    fastembed_name: str = ""  # the catalogue entry fastembed loads that folder as
    probe_model: str = ""  # bench/host_probe.py's graph, run after each cell; "" for none
    threads: int = 0  # the probe's onnxruntime threads


Embed = Callable[[list[str], int], np.ndarray]


def _load(job: Job) -> tuple[Embed, str | None]:
    """The engine's embed function, and the variant tei_runtime loaded (None for others)."""
    if job.engine == "st":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(job.checkpoint, device=job.device)

        def st_embed(texts: list[str], batch: int) -> np.ndarray:
            out = st.encode(texts, batch_size=batch, show_progress_bar=False)
            return np.asarray(out)

        return st_embed, None
    if job.engine == "fastembed":
        from fastembed import TextEmbedding

        # specific_model_path: fastembed reads this folder instead of downloading its hub repo.
        fe = TextEmbedding(job.fastembed_name, specific_model_path=job.fastembed_dir)

        def fe_embed(texts: list[str], batch: int) -> np.ndarray:
            return np.stack(list(fe.embed(texts, batch_size=batch)))

        return fe_embed, None
    import tei_runtime

    model = tei_runtime.load(
        job.artifact, device=job.device, dtype=dtype_of(job.engine), graph=graph_of(job.engine)
    )

    def rt_embed(texts: list[str], batch: int) -> np.ndarray:
        return np.asarray(model.embed(texts))  # the runtime packs by its own token budget

    return rt_embed, model.variant.name


def run(job: Job) -> EngineRun:
    embed, variant = _load(job)
    embed(["cold start"], 1)
    cold = time.time() - job.spawned_at
    probe = ProbeProcess(Path(job.probe_model), job.threads) if job.probe_model else None
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
                probe=probe,
            )
        )
    if probe is not None:
        probe.close()  # before the peak RSS, which counts live child processes
    if job.vectors_out:
        pool = job.pools["mixed"]
        texts = pool.texts[: job.sizes.cosine_texts or len(pool.texts)]
        vecs = [embed(texts[i : i + 32], 32) for i in range(0, len(texts), 32)]
        np.save(job.vectors_out, np.concatenate(vecs))
    return EngineRun(
        engine=job.engine,
        repeat=job.repeat,
        cold_start_s=cold,
        peak_rss_mb=peak_rss_mb(os.getpid()),
        cells=cells,
        variant=variant,
    )


def main(argv: list[str]) -> int:
    job = msgspec.json.decode(Path(argv[0]).read_bytes(), type=Job)
    result = run(job)
    Path(argv[1]).write_bytes(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
