"""Static int8 (tei_export.quantize) on small hand-built graphs: which MatMuls are sites, the
QDQ rewrite, batch invariance through onnxruntime, smoothing, and the fp32-keeping rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tei_export import quantize as q

HIDDEN, WIDE = 16, 48


def _graph(seed: int = 0, outlier: float = 1.0, hidden_outlier: float = 1.0) -> onnx.ModelProto:
    """x [b, s, 16] -> MatMul W1 [16, 48] -> Relu -> MatMul W2 [48, 16] -> Add x -> y.
    Channel 3 of x is scaled by `outlier` inside the graph (a transformer's wide channel),
    channel 5 of the Relu's output by `hidden_outlier` (W1's column 5)."""
    rng = np.random.default_rng(seed)
    gain = np.ones(HIDDEN, np.float32)
    gain[3] = outlier
    w1 = rng.normal(size=(HIDDEN, WIDE)).astype(np.float32) / 4
    w1[:, 5] *= hidden_outlier
    inits = [
        numpy_helper.from_array(gain, "gain"),
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.normal(size=(WIDE, HIDDEN)).astype(np.float32) / 7, "w2"),
        numpy_helper.from_array(rng.normal(size=(HIDDEN,)).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "gain"], ["xg"], name="gain"),
        helper.make_node("MatMul", ["xg", "w1"], ["h"], name="up"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["d"], name="down"),
        helper.make_node("Add", ["d", "xg"], ["y"], name="residual"),
        helper.make_node("Add", ["y", "bias"], ["out"], name="bias_add"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int = 12, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"x": rng.normal(size=(1, int(rng.integers(3, 20)), HIDDEN)).astype(np.float32)}
        for _ in range(n)
    ]


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["out"], {"x": x})[0])


def _calibrated(
    tmp_path: Path, outlier: float = 1.0, hidden_outlier: float = 1.0
) -> tuple[onnx.ModelProto, q.Calibration]:
    model = _graph(outlier=outlier, hidden_outlier=hidden_outlier)
    onnx.save(model, str(tmp_path / "g.onnx"))
    sites = q.matmul_sites(model)
    return model, q.calibrate(tmp_path / "g.onnx", sites, _feeds())


def test_sites_are_matmuls_with_a_constant_2d_weight() -> None:
    sites = q.matmul_sites(_graph())
    assert [(s.node, s.activation, s.weight) for s in sites] == [
        ("up", "xg", "w1"),
        ("down", "hr", "w2"),
    ]


def test_activation_range_holds_zero_exactly() -> None:
    for low, high in ((-1.0, 3.0), (0.5, 2.0), (-4.0, -1.0)):
        aq = q.activation_quant(low, high)
        assert 0 <= aq.zero_point <= 255
        zero = q.fake_quant_activation(np.zeros(1, np.float32), aq)
        assert zero[0] == 0.0
        edges = q.fake_quant_activation(np.array([low, high], np.float32), aq)
        np.testing.assert_allclose(edges, [low, high], atol=aq.scale)


def test_weights_are_per_channel_and_reduced_range_stays_in_7_bits() -> None:
    w = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32) * np.arange(1, 6)
    codes, scales = q.quantize_weight(w, reduce_range=True)
    assert codes.dtype == np.int8
    assert np.abs(codes).max() == q.WEIGHT_MAX_REDUCED
    assert scales.shape == (5,)
    np.testing.assert_allclose(codes * scales, w, atol=float(scales.max()) / 2 + 1e-7)
    full, _ = q.quantize_weight(w, reduce_range=False)
    assert np.abs(full).max() == q.WEIGHT_MAX_FULL


def test_qdq_graph_is_close_and_kept_matmuls_stay_fp32(tmp_path: Path) -> None:
    model, calib = _calibrated(tmp_path)
    sites = q.matmul_sites(model)
    x = _feeds(1, seed=9)[0]["x"]
    exact = _run(model, x)
    both = q.to_qdq(model, sites, calib.plans)
    got = _run(both, x)
    cos = (got * exact).sum() / np.linalg.norm(got) / np.linalg.norm(exact)
    assert 0.995 < cos < 1.0  # quantized: close, not identical
    ops = [n.op_type for n in both.graph.node]
    assert ops.count("QuantizeLinear") == 2
    assert ops.count("DequantizeLinear") == 4
    assert {t.name for t in both.graph.initializer}.isdisjoint({"w1", "w2"})
    kept = q.to_qdq(model, sites, calib.plans, keep_fp32=["down"])
    assert [n.op_type for n in kept.graph.node].count("QuantizeLinear") == 1
    assert "w2" in {t.name for t in kept.graph.initializer}
    assert "w1" not in {t.name for t in kept.graph.initializer}


def test_a_row_gets_the_same_int8_output_in_any_batch(tmp_path: Path) -> None:
    model, calib = _calibrated(tmp_path)
    int8 = q.to_qdq(model, q.matmul_sites(model), calib.plans)
    rng = np.random.default_rng(5)
    alone = rng.normal(size=(1, 6, HIDDEN)).astype(np.float32)
    neighbours = rng.normal(size=(3, 6, HIDDEN)).astype(np.float32) * 5  # far wider values
    batch = np.concatenate([neighbours[:1], alone, neighbours[1:]])
    assert np.abs(_run(int8, batch)[1] - _run(int8, alone)[0]).max() <= 1e-6


def test_smoothing_is_chosen_where_it_lowers_the_error(tmp_path: Path) -> None:
    flat = q.smoothing(
        q.ChannelStats(low=-np.ones(4, np.float32), high=np.ones(4, np.float32)),
        [np.ones((4, 2), np.float32)],
        0.0,
    )
    np.testing.assert_array_equal(flat, np.ones(4, np.float32))
    _, plain = _calibrated(tmp_path, outlier=1.0)
    _, wide = _calibrated(tmp_path, outlier=60.0)
    # One wide channel: one per-tensor scale would leave the rest a few levels, so the
    # up-projection's input is smoothed, and its error stays near the plain graph's.
    assert not np.all(wide.plans["xg"].smooth == 1.0)
    assert wide.errors["up"] < 5 * plain.errors["up"]
    assert set(wide.errors) == {"up", "down"}


def test_choose_fp32_keeps_the_fewest_that_reach_the_target() -> None:
    ranked = ["a", "b", "c", "d", "e"]
    gains = {"a": 0.004, "b": 0.003, "c": 0.001, "d": 0.0005, "e": 0.0001}
    tried: list[int] = []

    def score(kept: list[str] | tuple[str, ...]) -> float:
        tried.append(len(kept))
        return 0.98 + sum(gains[k] for k in kept)

    kept, got = q.choose_fp32(ranked, score, target=0.9865, cap=4)
    assert kept == ["a", "b"]
    assert got == pytest.approx(0.987)
    assert tried == [0, 1, 2]
    kept, got = q.choose_fp32(ranked, score, target=0.999, cap=3)
    assert kept == ["a", "b", "c"]  # the best tried; the export's validation then decides
    assert q.fp32_steps(18, 3) == [0, 1, 2, 3]
    assert q.fp32_steps(40, 6) == [0, 1, 2, 4, 6]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def test_stress_inputs_widen_the_ranges_that_clip_them(tmp_path: Path) -> None:
    """Inputs 6x wider than the calibration texts': ranges fitted to prose clip them (what a
    word repeated to the model's length does to attention outputs), so calibrate widens the
    ranges where that costs the readers less than the coarser step, and prose stays close."""
    model = _graph()
    onnx.save(model, str(tmp_path / "g.onnx"))
    sites = q.matmul_sites(model)
    prose = _feeds()
    stress = [{"x": feed["x"] * 6} for feed in _feeds(4, seed=3)]
    plain = q.calibrate(tmp_path / "g.onnx", sites, prose)
    assert plain.widened == []
    wide = q.calibrate(tmp_path / "g.onnx", sites, prose, stress=stress)
    assert wide.widened == ["hr", "xg"]
    plan = wide.plans["xg"]  # x itself: the graph's gain is 1 on every channel here
    smoothed = np.concatenate([f["x"].reshape(-1, HIDDEN) for f in stress]) / plan.smooth
    low = -plan.quant.zero_point * plan.quant.scale
    high = (255 - plan.quant.zero_point) * plan.quant.scale
    assert low - plan.quant.scale <= smoothed.min() and smoothed.max() <= high + plan.quant.scale

    odd = _feeds(1, seed=11)[0]["x"] * 6
    exact = _run(model, odd)
    clipped = _run(q.to_qdq(model, sites, plain.plans), odd)
    widened = _run(q.to_qdq(model, sites, wide.plans), odd)
    assert _cosine(widened, exact) > _cosine(clipped, exact) + 0.01
    normal = _feeds(1, seed=9)[0]["x"]
    assert _cosine(_run(q.to_qdq(model, sites, wide.plans), normal), _run(model, normal)) > 0.99


def _attention_graph(seed: int = 0, hidden: int = HIDDEN) -> onnx.ModelProto:
    """x [b, s, hidden] and a [b] key length -> fused Attention (2 heads, Q/K/V weight
    [hidden, 3 x hidden]) -> out: the op onnxruntime's BERT fusion writes."""
    rng = np.random.default_rng(seed)
    qkv = rng.normal(size=(hidden, 3 * hidden)).astype(np.float32) / 3
    inits = [
        numpy_helper.from_array(qkv, "qkv"),
        numpy_helper.from_array(rng.normal(size=(3 * hidden,)).astype(np.float32) / 5, "qkv_bias"),
    ]
    node = helper.make_node(
        "Attention", ["x", "qkv", "qkv_bias", "lengths"], ["out"], name="attention",
        domain="com.microsoft", num_heads=2,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden]),
            helper.make_tensor_value_info("lengths", TensorProto.INT32, ["b"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", hidden])],
        inits,
    )  # fmt: skip
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )


def _run_attention(model: onnx.ModelProto, x: np.ndarray, lengths: list[int]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": x, "lengths": np.array(lengths, np.int32)}
    return np.asarray(session.run(["out"], feed)[0])


def test_a_fused_attention_quantizes_to_qattention_per_row(tmp_path: Path) -> None:
    """The fused op's Q/K/V projection is a site; quantized it becomes a QAttention reading
    fixed-scale u8 codes, so a padded row in a batch matches the row alone; kept, it stays."""
    model = _attention_graph()
    onnx.save(model, str(tmp_path / "a.onnx"))
    sites = q.matmul_sites(model)
    assert [(s.node, s.activation, s.weight, s.attention) for s in sites] == [
        ("attention", "x", "qkv", True)
    ]
    rng = np.random.default_rng(3)
    feeds = []
    for _ in range(8):
        length = int(rng.integers(3, 12))
        feeds.append({"x": rng.normal(size=(1, length, HIDDEN)).astype(np.float32),
                      "lengths": np.array([length], np.int32)})  # fmt: skip
    calib = q.calibrate(tmp_path / "a.onnx", sites, feeds)
    int8 = q.to_qdq(model, sites, calib.plans)
    ops = [n.op_type for n in int8.graph.node]
    assert ops[-2:] == ["QuantizeLinear", "QAttention"]  # after a smoothing Mul, if chosen
    alone = rng.normal(size=(1, 5, HIDDEN)).astype(np.float32)
    exact = _run_attention(model, alone, [5])
    got = _run_attention(int8, alone, [5])
    assert 0.995 < _cosine(got.ravel(), exact.ravel()) < 1.0
    wide = rng.normal(size=(2, 8, HIDDEN)).astype(np.float32) * 4
    padded = np.zeros((1, 8, HIDDEN), np.float32)
    padded[0, :5] = alone[0]
    batch = np.concatenate([wide[:1], padded, wide[1:]])
    in_batch = _run_attention(int8, batch, [8, 5, 8])[1, :5]
    assert np.abs(in_batch - got[0]).max() <= 1e-6
    kept = q.to_qdq(model, sites, calib.plans, keep_fp32=["attention"])
    assert [n.op_type for n in kept.graph.node] == ["Attention"]


def test_an_attention_with_inputs_qattention_lacks_is_not_a_site() -> None:
    model = _attention_graph()
    model.graph.node[0].attribute.append(helper.make_attribute("qkv_hidden_sizes", [16, 16, 16]))
    assert q.matmul_sites(model) == []


def test_outlier_channels_are_the_few_far_wider_than_the_median() -> None:
    high = np.ones(64, np.float32)
    high[[40, 7]] = [9.0, 30.0]
    high[12] = 5.0  # wide, but not 6x the median
    stats = q.ChannelStats(low=-high / 2, high=high)
    np.testing.assert_array_equal(q.outlier_channels(stats), [7, 40])
    graded = np.ones(64, np.float32)
    graded[:20] = np.arange(20, 40)  # 20 outliers, the widest last
    many = q.ChannelStats(low=np.zeros(64, np.float32), high=graded)
    np.testing.assert_array_equal(q.outlier_channels(many), np.arange(12, 20))  # widest 8
    narrow = q.ChannelStats(low=np.zeros(16, np.float32), high=high[:16])
    assert q.outlier_channels(narrow).size == 0  # too few channels for a median to mean much


def test_an_outlier_channel_is_split_off_into_an_fp32_side_product(tmp_path: Path) -> None:
    """One Relu output channel 40x wider than the rest: one u8 range for all of them would
    leave the rest a few levels, so the down-projection reads it in fp32 beside its integer
    GEMM; the result is far closer to fp32 than without the split, and still per row."""
    model, calib = _calibrated(tmp_path, hidden_outlier=40.0)
    plan = calib.plans["hr"]
    np.testing.assert_array_equal(plan.outliers, [5])
    assert calib.plans["xg"].outliers.size == 0  # 16 channels: never split
    sites = q.matmul_sites(model)
    int8 = q.to_qdq(model, sites, calib.plans)
    ops = [n.op_type for n in int8.graph.node]
    assert ops.count("Gather") == 1 and ops.count("Add") == 3  # two of the graph's own
    side = {t.name: numpy_helper.to_array(t) for t in int8.graph.initializer}
    w2 = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w2"))
    np.testing.assert_array_equal(side["down_qdq_w_outliers"], w2[[5]])
    assert not side["down_qdq_w_s8"][5].any()  # its int8 row adds nothing
    assert q.split_channels(calib.plans, sites, []) == 1
    assert q.split_channels(calib.plans, sites, ["down"]) == 0

    x = _feeds(1, seed=9)[0]["x"]
    exact = _run(model, x)
    assert _cosine(_run(int8, x), exact) > 0.999
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(q, "SPLIT_GAIN", 0.0)  # a split would have to remove every error
        _, whole = _calibrated(tmp_path, hidden_outlier=40.0)
    assert whole.plans["hr"].outliers.size == 0
    assert calib.errors["down"] < whole.errors["down"] / 4
    unsplit = q.to_qdq(model, sites, whole.plans)
    # the up-projection's error and the residual are the same in both
    assert 1 - _cosine(_run(int8, x), exact) < (1 - _cosine(_run(unsplit, x), exact)) / 1.5

    rng = np.random.default_rng(6)
    alone = rng.normal(size=(1, 6, HIDDEN)).astype(np.float32)
    batch = np.concatenate([rng.normal(size=(2, 6, HIDDEN)).astype(np.float32) * 5, alone])
    assert np.abs(_run(int8, batch)[2] - _run(int8, alone)[0]).max() <= 1e-6


def test_a_fused_attention_input_is_never_split(tmp_path: Path) -> None:
    """QAttention reads the u8 codes and nothing beside them, so an outlier channel of its
    input stays in the range (smoothing may still spread it), and a plan that splits one
    there is refused rather than written with those channels silently dropped."""
    hidden = 64
    model = _attention_graph(hidden=hidden)
    onnx.save(model, str(tmp_path / "a.onnx"))
    sites = q.matmul_sites(model)
    rng = np.random.default_rng(4)
    feeds = []
    for _ in range(8):
        length = int(rng.integers(3, 12))
        x = rng.normal(size=(1, length, hidden)).astype(np.float32)
        x[..., 5] *= 40  # one channel 40x the rest: a MatMul reading it would split it
        feeds.append({"x": x, "lengths": np.array([length], np.int32)})
    flat = np.concatenate([f["x"].reshape(-1, hidden) for f in feeds])
    assert q.outlier_channels(q.ChannelStats(low=flat.min(0), high=flat.max(0))).size == 1
    calib = q.calibrate(tmp_path / "a.onnx", sites, feeds)
    assert calib.plans["x"].outliers.size == 0
    assert q.split_channels(calib.plans, sites, []) == 0
    forced = dataclasses.replace(calib.plans["x"], outliers=np.array([5], np.intp))
    with pytest.raises(ValueError, match="cannot split"):
        q.to_qdq(model, sites, {"x": forced})
