"""bench.profile's pure parts: padding of the runtime's pieces, op time and matrix-product work
from a profile, and how the products section reads."""

from __future__ import annotations

from typing import Any

import pytest

from bench.op_work import OpRate, Work, node_work, op_rates
from bench.profile import Padding, Row, Split, batch_size, padding, products_section
from bench.records import Peak


def test_padding_of_pieces_and_of_one_forward() -> None:
    lengths = [4, 10, 6, 2]
    p = padding(lengths, [[3, 0], [2, 1]])
    assert (p.real, p.packed, p.pieces, p.longest_padded) == (22, 8 + 20, 2, 40)
    assert p.packed_waste == pytest.approx(1 - 22 / 28)
    assert p.longest_waste == pytest.approx(1 - 22 / 40)
    assert padding([], []).packed_waste == 0.0


def _run(ts: int) -> dict[str, Any]:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 5}


def _node(
    ts: int,
    op: str,
    dur: int,
    name: str = "n_kernel_time",
    shapes: tuple[list[list[int]], list[list[int]]] = ([], []),
) -> dict[str, Any]:
    inputs, outputs = shapes
    args = {
        "op_name": op,
        "input_type_shape": [{"float": s} for s in inputs],
        "output_type_shape": [{"float": s} for s in outputs],
    }
    return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": args}


# A [2, 8, 4] activation times a [4, 6] weight: 2 * 8 * 6 * 4 = 384 multiply-adds, 768 ops.
PRODUCT = ([[2, 8, 4]], [[2, 8, 6]])
LIMITS_GFLOPS = 1e-6  # 1000 ops/s: 768 ops take 768 ms at the limit


def test_op_rates_leave_out_the_warm_up_and_fences() -> None:
    events = [
        _run(0), _node(1, "MatMul", 1000, shapes=PRODUCT),  # warm-up run: left out
        _run(10), _node(11, "MatMul", 300_000, shapes=PRODUCT), _node(12, "Softmax", 100),
        _node(13, "MatMul", 999, name="n_fence_before"),  # not kernel time
        _run(20), _node(21, "MatMul", 500_000, shapes=PRODUCT), _node(22, "Add", 100),
    ]  # fmt: skip
    rates = op_rates(events, warmup_runs=1, batches=2)
    assert rates[0].op == "MatMul" and {r.op for r in rates} == {
        "MatMul", "Softmax", "Add"}  # fmt: skip
    matmul = rates[0]
    assert matmul.ms_per_batch == pytest.approx(400)
    assert matmul.work == Work(fp32_ops=768.0)  # per batch: two runs, two batches
    assert matmul.at_limits_ms(LIMITS_GFLOPS, None) == pytest.approx(768)
    assert matmul.reached(LIMITS_GFLOPS, None) == pytest.approx(768 / 400)
    softmax = next(r for r in rates if r.op == "Softmax")
    assert softmax.work == Work() and softmax.at_limits_ms(LIMITS_GFLOPS, None) == 0
    assert op_rates(events, warmup_runs=3, batches=1) == []


def test_node_work_of_products_by_precision() -> None:
    a, out = [2, 8, 4], [2, 8, 6]
    assert node_work("MatMul", [a], [out]) == Work(fp32_ops=768.0)
    assert node_work("MatMulIntegerToFloat", [a], [out]) == Work(int8_ops=768.0)
    # two activations, the second read transposed (scores = Q K^T): inner is a's last axis
    assert node_work("FusedMatMul", [[3, 5, 4], [3, 7, 4]], [[3, 5, 7]]) == Work(
        fp32_ops=2.0 * 3 * 5 * 7 * 4)  # fmt: skip
    # the first operand read transposed: [4, 5]^T [4, 7] -> inner 4, the output's rows are 5
    assert node_work("FusedMatMul", [[4, 5], [4, 7]], [[5, 7]]) == Work(fp32_ops=2.0 * 5 * 7 * 4)
    assert node_work("Add", [a, [6]], [out]) == Work()
    assert node_work("MatMul", [], [out]) == Work()


def test_node_work_of_attention_ops() -> None:
    # the input 16 wide, Q/K/V (and so the output) 12 wide
    batch, seq, width, value = 2, 8, 16, 12
    projection = 2.0 * batch * seq * width * 3 * value
    core = 4.0 * batch * seq * seq * value
    x, y = [[batch, seq, width], [batch]], [[batch, seq, value]]
    assert node_work("QAttention", x, y) == Work(int8_ops=projection, fp32_ops=core)
    assert node_work("Attention", x, y) == Work(fp32_ops=projection + core)
    # with past state: present [2, B, heads, 5 past + 8 new, head] -> 13 keys per query
    present = [2, batch, 3, seq + 5, value // 3]
    assert node_work("Attention", x, [*y, present]) == Work(
        fp32_ops=projection + 4.0 * batch * seq * (seq + 5) * value)  # fmt: skip
    # cross lengths: 5 keys, as [B, L, width], [B, heads, L, head] or packed K/V
    for key in ([batch, 5, value], [batch, 3, 5, 4], [batch, 5, 3, 2, 4]):
        mha = node_work("MultiHeadAttention", [[batch, seq, value], key], y)
        assert mha == Work(fp32_ops=4.0 * batch * seq * 5 * value), key
    # packed QKV [B, S, heads, 3, head]: over the query's own tokens
    assert node_work("MultiHeadAttention", [[batch, seq, 3, 3, 4]], y) == Work(fp32_ops=core)
    # GroupQueryAttention, packed QKV, seqlens listed, no past
    gqa = node_work("GroupQueryAttention", [[batch, seq, 3 * value], [batch]], y)
    assert gqa == Work(fp32_ops=core)
    # with a past buffer: the present key [B, kv heads, past + new, head] says how many keys
    past = [batch, 2, 64, 4]
    gqa = node_work("GroupQueryAttention", [[batch, seq, 3 * value], past, [batch]],
                    [*y, [batch, 2, 20, 4], [batch, 2, 20, 4]])  # fmt: skip
    assert gqa == Work(fp32_ops=4.0 * batch * seq * 20 * value)
    # an attention op whose shapes this count does not know: no work, not a wrong one
    assert node_work("Attention", [[batch, 3, seq, 4]], [[batch, 3, seq, 4]]) == Work()


def test_work_at_the_limits_falls_back_to_fp32_without_an_int8_rate() -> None:
    w = Work(int8_ops=4e9, fp32_ops=1e9)
    assert w.seconds_at(fp32_limit=1.0, int8_limit=4.0) == pytest.approx(2.0)
    assert w.seconds_at(fp32_limit=1.0, int8_limit=None) == pytest.approx(5.0)


def _row(ops: list[OpRate], limits: Peak) -> Row:
    split = Split(total_ms=10.0, tokenize_ms=1.0, session_ms=8.0)
    pad = Padding(real=10, packed=10, pieces=1, longest_padded=10)
    return Row(length="short", dtype="int8", variant="model.int8.onnx", texts=32,
               texts_per_s=100.0, split=split, padding=pad, ops=ops, limits=limits)  # fmt: skip


def test_products_section_splits_node_time_by_products() -> None:
    # a row is held to the faster of the readings on either side of it
    limits = Peak(fp32_gflops=[150.0, 200.0], int8_gops=[800.0, 700.0], threads=2)
    ops = [
        # 4 GOP at 800 GOP/s: 5 ms
        OpRate(op="MatMulIntegerToFloat", ms_per_batch=6.0, work=Work(int8_ops=4e9)),
        OpRate(op="BiasGelu", ms_per_batch=3.0, work=Work()),
        OpRate(op="Add", ms_per_batch=1.0, work=Work()),
    ]  # fmt: skip
    text = "\n".join(products_section([_row(ops, limits), _row([], limits)]))
    assert "(limits 200 GFLOP/s, 800 GOP/s): node time 10.0 ms" in text
    assert "its products at the limits 5.0 ms (50% of the limits reached)" in text
    assert "MatMulIntegerToFloat 83% (6.0 ms)" in text
    assert "ops with no products 4.0 ms (40% of node time): BiasGelu 3.0, Add 1.0 ms" in text
    assert "- short, model.int8.onnx: no node events" in text
    unmeasured = Peak(fp32_gflops=[200.0], int8_gops=[], threads=2)
    # without an int8 rate, int8 work counts at the fp32 one: 4 GOP at 200 GFLOP/s, 20 ms
    text = "\n".join(products_section([_row(ops, unmeasured)]))
    assert "int8 not measured" in text and "its products at the limits 20.0 ms" in text


def test_batch_size_cut_to_the_token_cap() -> None:
    assert batch_size([512] * 32, 32, None) == 32
    assert batch_size([512] * 32, 32, 4096) == 8
    assert batch_size([16] * 32, 32, 4096) == 32
    assert batch_size([9000], 32, 4096) == 1
