"""Sizes of a run. Full: the committed figures. Quick: a smoke run. BIG: the base-size and 0.6B
models, whose single batch of 32 x 512 tokens is seconds (BERT-base) to minutes (Qwen3-0.6B)."""

from __future__ import annotations

import msgspec

LENGTHS = ("short", "medium", "long", "mixed")
# Target tokens per text (special tokens included). long is the model's max (256 for MiniLM).
TARGET_TOKENS = {"short": 16, "medium": 128, "long": 256}

_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
_SHORT = {v: k for k, v in _DTYPES.items()}


GRAPHS = ("fused", "plain")


def engines(dtypes: list[str], *, graphs: bool = True) -> list[str]:
    """In run order: the baseline first, then ours in-process (the graph the runtime picks
    for this host, then with `graphs` each CPU graph forced, to measure that pick), ours over
    HTTP and gRPC (EmbedStream), infinity, fastembed."""
    ours = [_SHORT[d] for d in dtypes]
    inproc = ["st"] + [f"runtime-{p}" for p in ours]
    if graphs:
        inproc += [f"runtime-{g}-{p}" for p in ours if p != "fp16" for g in GRAPHS]
    return (
        inproc
        + [f"serve-{p}" for p in ours]
        + [f"serve-grpc-{p}" for p in ours]
        + ["infinity-optimum", "infinity-torch", "fastembed"]
    )


def is_int8(engine: str) -> bool:
    """Whose limit is the host's int8 GEMM rate rather than its fp32 one."""
    return engine.endswith("-int8")


def graph_of(engine: str) -> str:
    """runtime-plain-fp32 -> plain; every other engine -> auto (the runtime's own pick)."""
    parts = engine.split("-")
    return parts[1] if len(parts) == 3 and parts[0] == "runtime" and parts[1] in GRAPHS else "auto"


def is_grpc(engine: str) -> bool:
    return engine.startswith("serve-grpc-")


def dtype_of(engine: str) -> str:
    """runtime-int8 -> int8, serve-fp32 -> float32 (tei_runtime / tei-serve names)."""
    return _DTYPES[engine.rsplit("-", 1)[1]]


def is_http(engine: str) -> bool:
    return engine.startswith(("serve-", "infinity-"))


class Sizes(msgspec.Struct, frozen=True, kw_only=True):
    repeats: int
    pool: int  # texts per length; calls cycle through them
    batches: tuple[int, ...]
    concurrencies: tuple[int, ...]
    min_calls: int  # timed calls (requests) per cell, at least
    min_seconds: float  # and at least this long ...
    max_seconds: float  # ... but never longer than this, whatever min_calls says
    # A cell whose one round (concurrency x batch x mean tokens) is over this many tokens is
    # skipped: on 2 cores one round of 16 x 32 long texts alone takes minutes per engine.
    round_token_cap: int
    gemm_n: int
    # A cell whose one call is over this many tokens is warmed with one text instead of a whole
    # batch: warming 32 x 512 tokens of a 0.6B model would double a minutes-long cell.
    warm_token_cap: int = 1_000_000_000
    cosine_texts: int = 0  # mixed texts embedded for the cosine check; 0: the whole pool


FULL = Sizes(
    repeats=3,
    pool=64,
    batches=(1, 32),
    concurrencies=(1, 4, 16),
    min_calls=2,
    min_seconds=0.5,
    max_seconds=1.5,
    round_token_cap=17_000,
    gemm_n=2048,
)

QUICK = Sizes(
    repeats=1,
    pool=8,
    batches=(1, 4),
    concurrencies=(1, 2),
    min_calls=1,
    min_seconds=0.0,
    max_seconds=1.0,
    round_token_cap=4_000,
    gemm_n=256,
)

BIG = Sizes(
    repeats=1,
    pool=32,
    batches=(1, 32),
    concurrencies=(1,),
    min_calls=3,
    min_seconds=0.0,
    max_seconds=3.0,  # one call when a call is longer: 32 x 512 tokens is one timed batch
    round_token_cap=1_000_000_000,
    gemm_n=2048,
    warm_token_cap=2048,
    cosine_texts=8,
)

BIG_QUICK = Sizes(
    repeats=1,
    pool=4,
    batches=(1, 4),
    concurrencies=(1,),
    min_calls=1,
    min_seconds=0.0,
    max_seconds=1.0,
    round_token_cap=600,
    gemm_n=256,
    warm_token_cap=64,
    cosine_texts=4,
)
