"""Which (length, batch, concurrency) cells an engine runs: the cap thins the grid, never the
targets' own cell (4 clients x 32 texts at every length)."""

from __future__ import annotations

from bench.config import FULL
from bench.run import _cells
from bench.texts import Pool


def _pool(tokens: int) -> Pool:
    return Pool(texts=["x"] * 4, tokens=[tokens] * 4)


POOLS = {"short": _pool(16), "medium": _pool(128), "long": _pool(256), "mixed": _pool(40)}


def test_http_engines_run_the_target_cell_at_every_length_and_skip_costlier_ones() -> None:
    cells = set(_cells("serve-fp32", FULL, POOLS, ["short", "medium", "long", "mixed"]))
    for length in POOLS:
        assert (length, 32, 4) in cells, length
    assert ("long", 32, 16) not in cells  # 131k tokens a round: over the cap
    assert ("short", 32, 16) in cells  # 8k: under it
    assert ("long", 1, 16) in cells


def test_in_process_engines_run_at_concurrency_one_and_grpc_on_mixed_texts_only() -> None:
    assert set(_cells("runtime-fp32", FULL, POOLS, ["long"])) == {("long", 1, 1), ("long", 32, 1)}
    grpc = _cells("serve-grpc-fp32", FULL, POOLS, ["short", "mixed"])
    assert {length for length, _, _ in grpc} == {"mixed"}
