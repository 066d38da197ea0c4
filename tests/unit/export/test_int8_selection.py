"""Which MatMuls the int8 variant keeps in fp32: the first two layers' FFN down-projections."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tei_export.precision import early_down_projections


def _graph(weights: list[tuple[str, tuple[int, int]]]) -> onnx.ModelProto:
    nodes, inits = [], []
    current = "x"
    for i, (name, shape) in enumerate(weights):
        inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"y{i}"], name=name))
        current = f"y{i}"
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", weights[0][1][0]])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, ["b", weights[-1][1][1]])],
        inits,
    )
    return helper.make_model(graph)


def test_first_narrowing_matmuls_are_kept() -> None:
    model = _graph([
        ("layer0.attn_out", (384, 384)),
        ("layer0.ffn_up", (384, 1536)),
        ("layer0.ffn_down", (1536, 384)),
        ("layer1.ffn_up", (384, 1536)),
        ("layer1.ffn_down", (1536, 384)),
        ("layer2.ffn_up", (384, 1536)),
        ("layer2.ffn_down", (1536, 384)),
        ("classifier", (384, 2)),
    ])
    assert early_down_projections(model) == ["layer0.ffn_down", "layer1.ffn_down"]
    assert early_down_projections(model, count=1) == ["layer0.ffn_down"]


def test_no_narrowing_matmul_keeps_nothing() -> None:
    assert early_down_projections(_graph([("a", (32, 32)), ("b", (32, 64))])) == []
