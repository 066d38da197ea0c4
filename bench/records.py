"""Result records. msgspec Structs so one run round-trips through `results.json` exactly."""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    """One measured cell of one engine in one repeat."""

    engine: str
    length: str  # short | medium | long | mixed
    batch: int  # texts per call / per HTTP request
    concurrency: int  # in-flight requests; 1 for in-process engines
    repeat: int
    texts: int  # texts embedded in the timed part
    tokens: int  # real (unpadded) tokens of those texts, special tokens included
    flops: float  # useful model FLOPs of those texts (see flops.py)
    seconds: float  # wall time of the timed part
    p50_ms: float  # per-call (in-process) or per-request (HTTP) latency
    p99_ms: float
    # Served engines only (None elsewhere, and in runs recorded before these were):
    model_busy: float | None = None  # share of the wall time the server's model ran forwards
    server_cores: float | None = None  # the server process's CPU seconds per wall second
    client_cores: float | None = None  # the bench's client threads', the same way
    host_int8_gops: float | None = None  # bench/host_probe.py's rate right after the cell


class EngineRun(msgspec.Struct, frozen=True, kw_only=True):
    """One process lifetime of one engine: its cold start, peak RSS and cells."""

    engine: str
    repeat: int
    cold_start_s: float | None = None
    peak_rss_mb: float | None = None
    cells: list[Cell] = msgspec.field(default_factory=list)
    min_cosine_vs_st: float | None = None  # on the mixed texts, filled by the orchestrator
    error: str | None = None  # why the engine did not run (its own error text)
    variant: str | None = None  # the artifact variant tei_runtime ran: fp32, int8-plain ...


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    cpu: str
    cores: int  # CPUs this process may use
    isa: list[str]  # the SIMD flags that matter for GEMM kernels
    memory_gb: float
    python: str
    versions: dict[str, str]


class Peak(msgspec.Struct, frozen=True, kw_only=True):
    """The host's limits: GEMM rates with the engines' thread count (flops.py)."""

    fp32_gflops: list[float]  # one figure per measurement (start and end of the run)
    int8_gops: list[float]  # best int8 form per measurement; empty when not measured
    threads: int
    note: str = ""
    blas: str = ""  # numpy's BLAS as threadpoolctl sees it: library, version, kernel, threads
    int8_forms: dict[str, float] = msgspec.field(default_factory=dict)  # u8s8 / u8u8, first


class Floor(msgspec.Struct, frozen=True, kw_only=True):
    """The model's weight products alone at `rows` rows, onnxruntime fp32 (weight_floor.py):
    what a batch-1 forward of a `rows`-token text cannot beat on this host."""

    rows: int
    params: int  # weights in those products
    median_ms: float
    best_ms: float
    gflops: float  # 2 x rows x params over the median
    threads: int


class Model(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    layers: int
    hidden: int
    intermediate: int
    max_length: int
    mflops_per_token_at_128: float
    # Widths of the attention projections: heads x head_dim for Q/O, kv_heads x head_dim for
    # K/V (grouped-query attention); 0 means hidden (BERT). A gated FFN (SwiGLU) has 3 matrices.
    attention_width: int = 0
    kv_width: int = 0
    ffn_matrices: int = 2
    key: str = ""  # the bench's name for it (bench/models.py): minilm, bert-base, qwen3-0.6b


class Run(msgspec.Struct, frozen=True, kw_only=True):
    started: str  # ISO time
    quick: bool
    command: str
    load_before: list[float]  # /proc/loadavg 1, 5, 15 minutes
    load_after: list[float]
    machine: Machine
    peak: Peak
    model: Model
    workloads: dict[str, float]  # length name -> mean tokens per text
    engines: list[EngineRun]
    # min cosine on the mixed texts between our variants ("runtime-int8 vs runtime-fp32")
    cosines: dict[str, float] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    weight_floor: Floor | None = None  # absent in runs made before it was measured

    def cells_by_key(
        self, keep: Callable[[Cell], bool] = lambda c: True
    ) -> dict[tuple[str, str, int, int], list[Cell]]:
        """The timed cells (engine, length, batch, concurrency) that `keep` keeps, each key's
        repeats in the order they ran."""
        by: dict[tuple[str, str, int, int], list[Cell]] = {}
        for er in self.engines:
            for c in er.cells:
                if c.seconds > 0 and keep(c):
                    by.setdefault((c.engine, c.length, c.batch, c.concurrency), []).append(c)
        return by

    def cell_order(self, key: tuple[str, str, int, int]) -> tuple[int, int, int, int]:
        """Where a cell (engine, length, batch, concurrency) goes in a table: engines as they
        ran, lengths as the workloads list them, then batch and concurrency."""
        engines = [e.engine for e in self.engines]
        return (engines.index(key[0]), list(self.workloads).index(key[1]), key[2], key[3])
