"""The batch-1 floor: the model's weight matrices as the graph holds them, and the report's
reading of it. Times are measured but never asserted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from bench import weight_floor
from bench.records import Model

QWEN3 = Model(name="q", layers=28, hidden=1024, intermediate=3072, max_length=512,
              mflops_per_token_at_128=0.0, attention_width=2048, kv_width=1024,
              ffn_matrices=3)  # fmt: skip
BERT = Model(name="b", layers=12, hidden=768, intermediate=3072, max_length=512,
             mflops_per_token_at_128=0.0)  # fmt: skip
TINY = Model(name="t", layers=2, hidden=8, intermediate=24, max_length=16,
             mflops_per_token_at_128=0.0, attention_width=16, kv_width=4,
             ffn_matrices=3)  # fmt: skip


def test_weights_are_every_projection_of_the_model() -> None:
    # Qwen3-0.6B without its embedding table: 0.44 B; BERT-base's encoder layers: 85 M
    assert weight_floor.weight_params(QWEN3) == 28 * (1024 * 2048 * 2 + 1024 * 1024 * 2
                                                      + 3 * 1024 * 3072)  # fmt: skip
    assert weight_floor.weight_params(QWEN3) == 440_401_920
    assert weight_floor.weight_params(BERT) == 12 * (4 * 768 * 768 + 2 * 768 * 3072)
    per_layer = [(8, 16), (8, 4), (8, 4), (16, 8), (8, 24), (8, 24), (24, 8)]
    assert weight_floor.weight_shapes(TINY) == per_layer * 2


def test_graph_multiplies_each_input_by_each_matrix(tmp_path: Path) -> None:
    path = weight_floor._graph_file(TINY, 3, tmp_path)
    model = onnx.load(str(path))  # the matrices come back from the external-data file
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert len(weights) == 14 and len({w.tobytes() for w in weights.values()}) == 14
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal((3, int(i.shape[1])), dtype=np.float32)
             for i in sess.get_inputs()}  # fmt: skip
    assert sorted(feeds) == ["x16", "x24", "x8"]
    outs = sess.run(None, feeds)
    for j, ((n_in, _), got) in enumerate(zip(weight_floor.weight_shapes(TINY), outs, strict=True)):
        np.testing.assert_allclose(got, feeds[f"x{n_in}"] @ weights[f"w{j}"], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_measure_runs_with_the_runtimes_session_options() -> None:
    floor = weight_floor.measure(TINY, 4, 1)
    assert (floor.rows, floor.params, floor.threads) == (4, weight_floor.weight_params(TINY), 1)
    assert 0 < floor.best_ms <= floor.median_ms
    assert floor.gflops == pytest.approx(2 * 4 * floor.params / floor.median_ms / 1e6)
