"""An onnxruntime profile's node events: time by op type, and the matrix-product work in it.

`SessionOptions.enable_profiling` writes one event per node run with the shapes of the inputs
it was fed (constant initializers such as prepacked weights are not listed) and of its outputs.
From those shapes every op that multiplies matrices gets its work, counted as flops.py counts
a model's (multiply-adds as 2): the weight products of MatMul, FusedMatMul, Gemm and the integer
MatMuls, and for the fused attention ops their Q/K/V projection plus the attention core
(scores and the weighted sum of values, in fp32 whatever the graph's precision). An op's work at
the host's measured GEMM rates (int8 work at the int8 limit, float work at the fp32 limit) is
the time it would take if it ran at those rates; against its measured node time that says how
close each op runs to the limit, and the ops with no products at all are what keeps the whole
graph from it.

What the shapes cannot say, the count assumes: a fused Attention / QAttention projects to three
equal widths (no `qkv_hidden_sizes`); an op named `Attention` is the com.microsoft one our
exports write (opset 17), not opset 23's standard Attention, whose profile name is the same.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

# Integer GEMMs: the first input is the u8 activation, the weight a prepacked initializer.
INTEGER_PRODUCTS = frozenset(
    {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm", "QLinearMatMul"}
)
# MatMulNBits: block-quantized weights expanded to float for the product.
FLOAT_PRODUCTS = frozenset({"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulNBits"})
# Attention ops that project their input to Q, K and V themselves (three equal widths).
PROJECTING_ATTENTION = {"Attention": "fp32", "QAttention": "int8"}
ATTENTION_CORES = frozenset({"MultiHeadAttention", "GroupQueryAttention"})

Shape = list[int]


class Work(msgspec.Struct, frozen=True):
    int8_ops: float = 0.0
    fp32_ops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.int8_ops + other.int8_ops, self.fp32_ops + other.fp32_ops)

    def seconds_at(self, fp32_limit: float, int8_limit: float | None) -> float:
        """The time this work takes at the limits (G(FL)OP/s); int8 work at the fp32 limit
        where the int8 one was not measured."""
        int8_rate = int8_limit or fp32_limit
        return self.int8_ops / int8_rate / 1e9 + self.fp32_ops / fp32_limit / 1e9


def _shapes(listed: Any) -> list[Shape]:
    """`[{"float": [4, 16, 384]}, ...]` -> `[[4, 16, 384], ...]`."""
    shapes = []
    for entry in listed or []:
        for dims in entry.values():
            shapes.append([int(d) for d in dims])
    return shapes


def _inner(a: Shape, out: Shape) -> int:
    """The contracted length of a product whose first operand is `a`: its last axis, or the
    one before where the product reads it transposed (the output's rows are a's last axis)."""
    if len(a) >= 2 and len(out) >= 2 and out[-2] == a[-1] and out[-2] != a[-2]:
        return a[-2]
    return a[-1]


def node_work(op: str, inputs: Sequence[Shape], outputs: Sequence[Shape]) -> Work:
    """The matrix-product work of one node run, from its profiled shapes (none for any op
    that multiplies no matrices, or whose shapes are missing)."""
    if not inputs or not outputs or not inputs[0] or not outputs[0]:
        return Work()
    a, out = inputs[0], outputs[0]
    if op in INTEGER_PRODUCTS or op in FLOAT_PRODUCTS:
        ops = 2.0 * math.prod(out) * _inner(a, out)
        return Work(int8_ops=ops) if op in INTEGER_PRODUCTS else Work(fp32_ops=ops)
    if op in PROJECTING_ATTENTION and len(a) == 3 and len(out) == 3:
        batch, seq, width = a
        value_width = out[-1]
        # with past state, `present` [2, B, heads, past + new, head] has the keys attended
        keys = outputs[1][3] if len(outputs) > 1 and len(outputs[1]) == 5 else seq
        projection = 2.0 * batch * seq * width * 3 * value_width
        core = 4.0 * batch * seq * keys * value_width
        if PROJECTING_ATTENTION[op] == "int8":
            return Work(int8_ops=projection, fp32_ops=core)
        return Work(fp32_ops=projection + core)
    # query [B, S, width], or MultiHeadAttention's packed [B, S, heads, 3, head]
    if op in ATTENTION_CORES and len(a) in (3, 5) and len(out) == 3:
        batch, seq = a[0], a[1]
        return Work(fp32_ops=4.0 * batch * seq * _keys(inputs, outputs, seq) * out[-1])
    return Work()


def _keys(inputs: Sequence[Shape], outputs: Sequence[Shape], seq: int) -> int:
    """How many keys each query of a MultiHeadAttention / GroupQueryAttention attends."""
    if len(outputs) > 1 and len(outputs[1]) == 4:  # present key [B, heads, past + new, head]
        return outputs[1][2]
    key = inputs[1] if len(inputs) > 1 else []
    if len(key) in (3, 5):  # [B, L, width] or packed K/V [B, L, heads, 2, head]
        return key[1]
    if len(key) == 4:  # [B, heads, L, head]
        return key[2]
    return seq  # packed QKV: self-attention over the query's own tokens


def kernel_events(events: Sequence[dict[str, Any]], warmup_runs: int) -> Iterator[dict[str, Any]]:
    """The node kernel events after the first `warmup_runs` Session.run calls (first-run
    allocations); fences and session events left out."""
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    if len(runs) <= warmup_runs:
        return
    since = runs[warmup_runs]
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= since and e["name"].endswith("_kernel_time"):
            yield e


class OpRate(msgspec.Struct, frozen=True, kw_only=True):
    op: str
    ms_per_batch: float
    work: Work
    """Per batch."""

    def at_limits_ms(self, fp32_limit: float, int8_limit: float | None) -> float:
        """What `work` takes at the host's GEMM limits (G(FL)OP/s)."""
        return self.work.seconds_at(fp32_limit, int8_limit) * 1000

    def reached(self, fp32_limit: float, int8_limit: float | None) -> float:
        """`work` at the limits over the node time: 1.0 is an op running at the limits."""
        at = self.at_limits_ms(fp32_limit, int8_limit)
        return at / self.ms_per_batch if self.ms_per_batch else 0.0


def op_rates(events: Sequence[dict[str, Any]], warmup_runs: int, batches: int) -> list[OpRate]:
    """Per op type, per batch: node time and matrix-product work; slowest first."""
    spent: dict[str, float] = defaultdict(float)
    work: dict[str, Work] = defaultdict(Work)
    for e in kernel_events(events, warmup_runs):
        args = e.get("args", {})
        op = str(args.get("op_name", "?"))
        spent[op] += float(e["dur"])
        work[op] = work[op] + node_work(
            op, _shapes(args.get("input_type_shape")), _shapes(args.get("output_type_shape"))
        )
    per = max(batches, 1)
    return [
        OpRate(
            op=op,
            ms_per_batch=us / 1000 / per,
            work=Work(work[op].int8_ops / per, work[op].fp32_ops / per),
        )
        for op, us in sorted(spent.items(), key=lambda kv: kv[1], reverse=True)
    ]
