"""bench.profile's pure parts: padding of the runtime's pieces, op time from a profile."""

from __future__ import annotations

from typing import Any

import pytest

from bench.profile import batch_size, op_shares, padding


def test_padding_of_pieces_and_of_one_forward() -> None:
    lengths = [4, 10, 6, 2]
    p = padding(lengths, [[3, 0], [2, 1]])
    assert (p.real, p.packed, p.pieces, p.longest_padded) == (22, 8 + 20, 2, 40)
    assert p.packed_waste == pytest.approx(1 - 22 / 28)
    assert p.longest_waste == pytest.approx(1 - 22 / 40)
    assert padding([], []).packed_waste == 0.0


def _run(ts: int) -> dict[str, Any]:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 5}


def _node(ts: int, op: str, dur: int, name: str = "n_kernel_time") -> dict[str, Any]:
    return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_op_shares_leave_out_the_warm_up_and_fences() -> None:
    events = [
        _run(0), _node(1, "MatMul", 1000),  # warm-up run: left out
        _run(10), _node(11, "MatMul", 300), _node(12, "Softmax", 100),
        _node(13, "MatMul", 999, name="n_fence_before"),  # not kernel time
        _run(20), _node(21, "MatMul", 300), _node(22, "Add", 100),
    ]  # fmt: skip
    shares = op_shares(events, warmup_runs=1, batches=2)
    assert next(s.op for s in shares) == "MatMul" and {s.op for s in shares} == {
        "MatMul", "Softmax", "Add"}  # fmt: skip
    matmul = shares[0]
    assert matmul.share == pytest.approx(600 / 800)
    assert matmul.ms_per_batch == pytest.approx(0.3)
    assert op_shares(events, warmup_runs=3, batches=1) == []


def test_batch_size_cut_to_the_token_cap() -> None:
    assert batch_size([512] * 32, 32, None) == 32
    assert batch_size([512] * 32, 32, 4096) == 8
    assert batch_size([16] * 32, 32, 4096) == 32
    assert batch_size([9000], 32, 4096) == 1
