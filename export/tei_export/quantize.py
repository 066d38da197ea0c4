"""Static int8: calibrated activation ranges, per-channel weights, written as QDQ pairs.

Every activation a quantized MatMul reads gets one fixed (scale, zero point), measured on
the calibration texts at export time, so a row's int8 codes depend on that row alone: a
text gets the same vector in any batch (dynamic quantization picks one scale per forward
from the whole batch tensor, so neighbours moved it). onnxruntime fuses each
DequantizeLinear -> MatMul pair into an integer GEMM at load time (MatMulIntegerToFloat on
CPU), u8 activations times s8 weights. Each range is the calibration texts' or, where that
measures better, one also covering a few stress texts (repetitions, a lone symbol) that
push attention outputs past anything prose does.

A transformer's activations carry a few channels far wider than the rest (one GELU output
channel of all-MiniLM-L6-v2 reaches 8-13x its median channel): such outlier channels are
split off, their product with their weight rows computed in fp32 beside the integer GEMM
(a Gather, a MatMul k rows deep and an Add), so the u8 range is sized for the rest; the int8
weight's rows for them are zero, so their saturated codes add nothing.

Which MatMuls stay fp32 is measured, not listed: each MatMul's local error (its int8 output
against its fp32 output on the calibration activations) ranks them, and the most sensitive
are kept fp32 one step at a time until the whole graph's vectors reach the target on the
calibration texts.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

FloatArray = npt.NDArray[np.float32]
Feeds = Mapping[str, npt.NDArray[np.int64]]

# Activations are u8 (0..255); weights s8 per output channel, symmetric. Reduced range (7-bit
# weights, -64..63) keeps u8 x s8 pair sums inside int16 on AVX2 hosts without VNNI
# (vpmaddubsw saturates there); VNNI hosts lose a bit of resolution for it and nothing else.
WEIGHT_MAX_REDUCED = 63
WEIGHT_MAX_FULL = 127


class MatMulSite(msgspec.Struct, frozen=True, kw_only=True):
    """A product of an activation and a 2-D constant weight: what static int8 quantizes.
    Either a MatMul or a fused Attention op, whose weight is its [hidden, 3 x hidden] Q/K/V
    projection (quantized, it becomes a QAttention reading u8 codes)."""

    node: str
    activation: str
    weight: str
    attention: bool = False


@dataclass(frozen=True)
class ChannelStats:
    """Per input channel (last axis) minimum and maximum of an activation over the
    calibration texts."""

    low: FloatArray
    high: FloatArray


class ActivationQuant(msgspec.Struct, frozen=True, kw_only=True):
    scale: float
    zero_point: int


IndexArray = npt.NDArray[np.intp]
NO_CHANNELS: IndexArray = np.zeros(0, np.intp)
NO_CHANNELS.flags.writeable = False


@dataclass(frozen=True)
class ActivationPlan:
    """How one activation is quantized: divided per channel by `smooth` (folded into the
    weights that read it), then u8 with one scale and zero point; its `outliers` channels
    (ascending) are left out of the range and multiplied in fp32 instead."""

    smooth: FloatArray
    quant: ActivationQuant
    outliers: IndexArray = field(default_factory=lambda: NO_CHANNELS)


# Attention attributes QAttention reads the same way; an Attention using any other (unequal
# Q/K/V widths, rotary) keeps its fp32 projection.
QATTENTION_ATTRIBUTES = frozenset(
    {"num_heads", "unidirectional", "mask_filter_value", "scale", "past_present_share_buffer"}
)


def _quantizable_attention(node: onnx.NodeProto) -> bool:
    """A fused Attention whose inputs QAttention has too: (input, weights, bias[, mask])."""
    used = [name for name in node.input if name]
    return (
        node.op_type == "Attention"
        and node.domain == "com.microsoft"
        and len(node.input) <= 4
        and len(used) >= 3
        and used == list(node.input[: len(used)])
        and all(a.name in QATTENTION_ATTRIBUTES for a in node.attribute)
    )


def matmul_sites(model: onnx.ModelProto) -> list[MatMulSite]:
    weights = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    sites: list[MatMulSite] = []
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in weights or node.input[0] in weights:
            continue
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            sites.append(MatMulSite(node=node.name, activation=node.input[0], weight=node.input[1]))
        elif _quantizable_attention(node):
            sites.append(
                MatMulSite(
                    node=node.name, activation=node.input[0], weight=node.input[1], attention=True
                )
            )
    return sites


def activation_quant(low: float, high: float) -> ActivationQuant:
    """u8 asymmetric over [low, high], widened to hold 0 exactly (padding, GELU's zeros)."""
    low, high = min(low, 0.0), max(high, 0.0)
    if high - low < 1e-8:
        return ActivationQuant(scale=1.0, zero_point=0)
    scale = float(np.float32((high - low) / 255.0))
    zero_point = int(min(255, max(0, round(-low / scale))))
    return ActivationQuant(scale=scale, zero_point=zero_point)


def smoothing(stats: ChannelStats, weights: Sequence[FloatArray], alpha: float) -> FloatArray:
    """SmoothQuant's per-channel divisor: a few channels of a transformer's activations run
    10-100x wider than the rest, and one per-tensor scale sized for them leaves the rest a
    handful of levels. Dividing channel j by s_j = amax(x_j)^alpha / amax(w_j)^(1-alpha) and
    multiplying row j of the weight by it moves that spread into the per-channel weight
    scales, where it costs little."""
    if alpha <= 0:
        return np.ones(stats.low.shape, np.float32)
    act = np.maximum(np.abs(stats.low), np.abs(stats.high))
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    s = np.power(np.maximum(act, 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    clipped: FloatArray = np.clip(s, 1e-2, 1e2).astype(np.float32)
    return clipped


# A channel is an outlier when its widest value is more than this many times the
# activation's median channel's (LLM.int8()'s observation, with a bound relative to the
# activation rather than its absolute 6.0, since embedding models' scales differ); at most
# MAX_OUTLIERS of the widest per activation, so the fp32 side product stays a sliver.
OUTLIER_FACTOR = 6.0
MAX_OUTLIERS = 8


def outlier_channels(stats: ChannelStats) -> IndexArray:
    """The activation's outlier channels, ascending (none when it has too few channels for a
    median to mean anything)."""
    amax = np.maximum(np.abs(stats.low), np.abs(stats.high))
    if amax.size < 4 * MAX_OUTLIERS:
        return NO_CHANNELS
    wide = np.flatnonzero(amax > OUTLIER_FACTOR * float(np.median(amax)))
    widest = wide[np.argsort(amax[wide])[::-1][:MAX_OUTLIERS]]
    return np.sort(widest).astype(np.intp)


def activation_plan(
    stats: ChannelStats, weights: Sequence[FloatArray], alpha: float, *, split: bool = False
) -> ActivationPlan:
    """SPLIT: outlier channels (outlier_channels) are left out of the smoothing and the
    range, for the fp32 side product."""
    outliers = outlier_channels(stats) if split else NO_CHANNELS
    rest = np.ones(stats.low.shape, bool)
    rest[outliers] = False
    smooth = smoothing(
        ChannelStats(low=np.where(rest, stats.low, 0), high=np.where(rest, stats.high, 0)),
        weights,
        alpha,
    )
    smooth[outliers] = 1.0
    low = float((stats.low[rest] / smooth[rest]).min())
    high = float((stats.high[rest] / smooth[rest]).max())
    return ActivationPlan(smooth=smooth, quant=activation_quant(low, high), outliers=outliers)


def quantize_weight(
    weight: FloatArray, *, reduce_range: bool
) -> tuple[npt.NDArray[np.int8], FloatArray]:
    """Symmetric s8 per output column of a [in, out] MatMul weight: (codes, scales)."""
    limit = WEIGHT_MAX_REDUCED if reduce_range else WEIGHT_MAX_FULL
    peak = np.abs(weight).max(axis=0)
    scales = np.where(peak > 0, peak / limit, 1.0).astype(np.float32)
    codes = np.clip(np.rint(weight / scales), -limit, limit).astype(np.int8)
    return codes, scales


def int8_weight(
    weight: FloatArray, plan: ActivationPlan, *, reduce_range: bool
) -> tuple[npt.NDArray[np.int8], FloatArray]:
    """A site's [in, out] weight as the int8 product reads it: rows scaled by the smoothing,
    the outlier channels' rows zero (their product is the fp32 side's), then quantize_weight."""
    smoothed = weight * plan.smooth[:, None]
    smoothed[plan.outliers] = 0.0
    return quantize_weight(smoothed, reduce_range=reduce_range)


def approximate_product(
    x: FloatArray, weight: FloatArray, dequantized: FloatArray, plan: ActivationPlan
) -> FloatArray:
    """What the quantized site computes for rows X (numpy): the int8 product of the smoothed,
    u8-coded activation plus the outlier channels' fp32 product."""
    approx: FloatArray = fake_quant_activation(x / plan.smooth, plan.quant) @ dequantized
    if plan.outliers.size:
        approx += x[:, plan.outliers] @ weight[plan.outliers]
    return approx


def fake_quant_activation(x: FloatArray, q: ActivationQuant) -> FloatArray:
    codes = np.clip(np.rint(x / q.scale) + q.zero_point, 0, 255)
    values: FloatArray = ((codes - q.zero_point) * q.scale).astype(np.float32)
    return values


def with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of the graph that also outputs the named intermediate tensors (fp32)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in names:
        if name not in have:
            copy.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            have.add(name)
    return copy


class _Runner:
    """An onnxruntime session over a graph that also outputs the given activations, saved
    beside the source graph so that external data references resolve; basic optimizations
    only, so the tensors are the graph's own."""

    def __init__(self, src: Path, names: Sequence[str]) -> None:
        import onnxruntime as ort

        model = with_outputs(onnx.load(str(src), load_external_data=False), names)
        with tempfile.NamedTemporaryFile(dir=src.parent, suffix=".onnx", delete=False) as f:
            path = Path(f.name)
        try:
            onnx.save(model, str(path))
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            self._session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        finally:
            path.unlink()
        self._names = list(names)

    def run(self, feed: Feeds) -> dict[str, FloatArray]:
        values = self._session.run(self._names, dict(feed))
        return {n: np.asarray(v, np.float32) for n, v in zip(self._names, values, strict=True)}


@dataclass(frozen=True)
class Calibration:
    plans: dict[str, ActivationPlan]
    """Activation name -> how it is quantized."""
    errors: dict[str, float]
    """MatMul node -> its local error: the mean square of (int8 output - fp32 output) over
    the mean square of the fp32 output, on the calibration texts."""
    widened: list[str]
    """The activations whose range covers the stress texts' too."""


def weights_of(model: onnx.ModelProto, sites: Sequence[MatMulSite]) -> dict[str, FloatArray]:
    wanted = {s.weight for s in sites}
    return {
        t.name: numpy_helper.to_array(t).astype(np.float32)
        for t in model.graph.initializer
        if t.name in wanted
    }


# SmoothQuant strengths tried per activation; the one with the least local error wins
# (0: no smoothing; FFN down-projections of all-MiniLM-L6-v2 lose with it, up-projections gain).
SMOOTHING_STRENGTHS = (0.0, 0.25, 0.5, 0.75)
# Token rows per calibration text on which local errors are measured, evenly spaced and as
# many again of the widest (the rare tokens with outsized activations decide which MatMuls
# lose most): enough for a stable ranking, few enough that a 0.6B decoder's fit in memory.
SAMPLED_ROWS_PER_TEXT = 8


def sampled_rows(flat: FloatArray) -> npt.NDArray[np.intp]:
    spread = np.linspace(0, len(flat) - 1, SAMPLED_ROWS_PER_TEXT).astype(np.intp)
    widest = np.argsort(np.abs(flat).max(axis=1))[-SAMPLED_ROWS_PER_TEXT:]
    return np.unique(np.concatenate([spread, widest]))


@dataclass(frozen=True)
class _Pass1:
    """One set of feeds' first pass: channel ranges and sampled rows per activation."""

    low: dict[str, FloatArray]
    high: dict[str, FloatArray]
    sampled: dict[str, FloatArray]


def _first_pass(runner: _Runner, activations: Sequence[str], feeds: Sequence[Feeds]) -> _Pass1:
    low: dict[str, FloatArray] = {}
    high: dict[str, FloatArray] = {}
    samples: dict[str, list[FloatArray]] = {name: [] for name in activations}
    for feed in feeds:
        for name, value in runner.run(feed).items():
            flat = value.reshape(-1, value.shape[-1])
            lo, hi = flat.min(axis=0), flat.max(axis=0)
            low[name] = np.minimum(low[name], lo) if name in low else lo
            high[name] = np.maximum(high[name], hi) if name in high else hi
            samples[name].append(flat[sampled_rows(flat)])
    sampled = {name: np.concatenate(rows) for name, rows in samples.items() if rows}
    return _Pass1(low=low, high=high, sampled=sampled)


# A candidate quantization of one activation: (SmoothQuant strength, whether its range
# also covers the stress texts', whether its outlier channels are split off).
_Choice = tuple[float, bool, bool]
# An activation's outlier channels are split off only where that at least halves its
# readers' error, since a side product costs a Gather, a thin MatMul and an Add over the
# output (all-MiniLM-L6-v2: both FFN inputs of layers 0-3 pass, layers 4-5 do not).
SPLIT_GAIN = 0.5


def calibrate(
    src: Path,
    sites: Sequence[MatMulSite],
    feeds: Sequence[Feeds],
    *,
    stress: Sequence[Feeds] = (),
    strengths: Sequence[float] = SMOOTHING_STRENGTHS,
    reduce_range: bool = True,
) -> Calibration:
    """Two passes of the fp32 graph over the calibration feeds. The first: each activation's
    channel ranges and a few of its rows per text, on which every smoothing strength is
    tried, with the calibration texts' range and with one that also covers the STRESS feeds'
    (inputs far from prose); each activation keeps the choice its readers lose least at,
    counting their error on the calibration rows and on the stress rows alike, so a range
    widens where clipping the stress inputs costs more than the coarser step costs prose
    (attention outputs), and stays where it does not; outlier channels are split off
    (outlier_channels) where that brings the readers' error to SPLIT_GAIN of the best
    unsplit choice's or less. The second: each
    MatMul's local error over every calibration row, with the chosen quantization."""
    activations = sorted({s.activation for s in sites})
    runner = _Runner(src, activations)
    prose = _first_pass(runner, activations, feeds)
    odd = _first_pass(runner, activations, stress) if stress else None
    weights = weights_of(onnx.load(str(src)), sites)
    readers: dict[str, list[MatMulSite]] = {}
    for site in sites:
        readers.setdefault(site.activation, []).append(site)
    ranges = [(alpha, False) for alpha in strengths]
    if odd is not None:
        ranges += [(alpha, True) for alpha in strengths]
    candidates: dict[tuple[str, _Choice], ActivationPlan] = {}
    options: dict[str, list[_Choice]] = {name: [] for name in activations}
    for name in activations:
        for alpha, wide in ranges:
            if wide and odd is not None:
                stats = ChannelStats(
                    low=np.minimum(prose.low[name], odd.low[name]),
                    high=np.maximum(prose.high[name], odd.high[name]),
                )
            else:
                stats = ChannelStats(low=prose.low[name], high=prose.high[name])
            weights_read = [weights[r.weight] for r in readers[name]]
            candidates[name, (alpha, wide, False)] = activation_plan(stats, weights_read, alpha)
            options[name].append((alpha, wide, False))
            # QAttention reads u8 codes and nothing beside them: no side product there.
            if any(r.attention for r in readers[name]):
                continue
            split = activation_plan(stats, weights_read, alpha, split=True)
            if split.outliers.size:
                candidates[name, (alpha, wide, True)] = split
                options[name].append((alpha, wide, True))

    def dequantized(site: MatMulSite, plan: ActivationPlan) -> FloatArray:
        codes, scales = int8_weight(weights[site.weight], plan, reduce_range=reduce_range)
        return codes.astype(np.float32) * scales

    # Relative error of each MatMul, per choice, on each set's sampled rows, summed. One
    # dequantized weight at a time: a 0.6B decoder's weights are 2.4 GB a copy.
    error: dict[tuple[str, _Choice], float] = {}
    for site in sites:
        sets = [rows for rows in (prose, odd) if rows is not None]
        xs = [rows.sampled[site.activation] for rows in sets]
        exacts = [x @ weights[site.weight] for x in xs]
        signals = [max(float(np.square(e).sum()), 1e-30) for e in exacts]
        for choice in options[site.activation]:
            plan = candidates[site.activation, choice]
            deq = dequantized(site, plan)
            w = weights[site.weight]
            error[site.node, choice] = sum(
                float(np.square(approximate_product(x, w, deq, plan) - e).sum()) / signal
                for x, e, signal in zip(xs, exacts, signals, strict=True)
            )
    plans: dict[str, ActivationPlan] = {}
    chosen: dict[str, _Choice] = {}
    for name in activations:
        def sampled_error(choice: _Choice, name: str = name) -> float:
            return sum(error[r.node, choice] for r in readers[name])

        whole = min((c for c in options[name] if not c[2]), key=sampled_error)
        chosen[name] = min(options[name], key=sampled_error)
        if sampled_error(chosen[name]) > SPLIT_GAIN * sampled_error(whole):
            chosen[name] = whole
        plans[name] = candidates[name, chosen[name]]
    chosen_deq = {site.node: dequantized(site, plans[site.activation]) for site in sites}
    # The ranking needs every row: the MatMuls that lose most do so on a few tokens.
    full_noise = dict.fromkeys((s.node for s in sites), 0.0)
    full_signal = dict.fromkeys((s.node for s in sites), 0.0)
    for feed in feeds:
        values = runner.run(feed)
        for site in sites:
            plan = plans[site.activation]
            x = values[site.activation].reshape(-1, plan.smooth.shape[0])
            exact = x @ weights[site.weight]
            approx = approximate_product(x, weights[site.weight], chosen_deq[site.node], plan)
            full_noise[site.node] += float(np.square(approx - exact).sum())
            full_signal[site.node] += float(np.square(exact).sum())
    errors = {n: full_noise[n] / max(full_signal[n], 1e-30) for n in full_noise}
    widened = sorted(name for name, (_, wide, _) in chosen.items() if wide)
    return Calibration(plans=plans, errors=errors, widened=widened)


def split_channels(
    plans: Mapping[str, ActivationPlan], sites: Sequence[MatMulSite], keep_fp32: Iterable[str]
) -> int:
    """How many outlier channels to_qdq multiplies in fp32 (once per activation, however many
    quantized sites read it)."""
    keep = set(keep_fp32)
    read = {s.activation for s in sites if s.node not in keep}
    return sum(int(plans[name].outliers.size) for name in read)


def to_qdq(
    model: onnx.ModelProto,
    sites: Sequence[MatMulSite],
    plans: Mapping[str, ActivationPlan],
    *,
    keep_fp32: Iterable[str] = (),
    reduce_range: bool = True,
) -> onnx.ModelProto:
    """A copy of `model` with every site not in `keep_fp32` reading a QDQ'd activation
    (smoothed first where its plan says) and a QDQ'd per-channel weight, plus, where its
    plan splits outlier channels off, their fp32 product added to its output. A float weight
    stays only where something else still reads it."""
    keep = set(keep_fp32)
    chosen = {s.node: s for s in sites if s.node not in keep}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    quantized_act: dict[str, str] = {}
    gathered_act: dict[str, str] = {}
    new_inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        site = chosen.get(node.name)
        if site is None or node.op_type != ("Attention" if site.attention else "MatMul"):
            nodes.append(node)
            continue
        prefix = f"{node.name}_qdq"
        act = site.activation
        plan = plans[act]
        smoothed = not np.all(plan.smooth == 1.0)
        scale, zp = f"{act}_act_scale", f"{act}_act_zp"
        if act not in quantized_act:
            source = act
            if smoothed:
                inverse = f"{act}_smooth_inverse"
                new_inits.append(
                    numpy_helper.from_array((1.0 / plan.smooth).astype(np.float32), inverse)
                )
                source = f"{act}_smoothed"
                nodes.append(
                    helper.make_node("Mul", [act, inverse], [source], name=f"{act}_smooth")
                )
            new_inits += [
                numpy_helper.from_array(np.array(plan.quant.scale, np.float32), scale),
                numpy_helper.from_array(np.array(plan.quant.zero_point, np.uint8), zp),
            ]
            codes_name = f"{act}_act_u8"
            nodes.append(
                helper.make_node(
                    "QuantizeLinear", [source, scale, zp], [codes_name], name=f"{act}_quantize"
                )
            )
            quantized_act[act] = codes_name
        weight = numpy_helper.to_array(inits[site.weight]).astype(np.float32)
        codes, scales = int8_weight(weight, plan, reduce_range=reduce_range)
        w_codes, w_scale, w_zp = f"{prefix}_w_s8", f"{prefix}_w_scale", f"{prefix}_w_zp"
        new_inits += [
            numpy_helper.from_array(codes, w_codes),
            numpy_helper.from_array(scales, w_scale),
            numpy_helper.from_array(np.zeros(scales.shape, np.int8), w_zp),
        ]
        if site.attention:
            if plan.outliers.size:  # QAttention reads the u8 codes alone: they would be lost
                raise ValueError(f"{act}: a fused Attention's input cannot split channels off")
            nodes.append(
                _qattention(node, quantized_act[act], (scale, zp), (w_codes, w_scale, w_zp))
            )
            continue
        deq_act = f"{prefix}_act"
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [quantized_act[act], scale, zp],
                [deq_act],
                name=f"{prefix}_dequantize_act",
            )
        )
        deq_w = f"{prefix}_w"
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [w_codes, w_scale, w_zp],
                [deq_w],
                name=f"{prefix}_dequantize_w",
                axis=1,
            )
        )
        rewired = onnx.NodeProto()
        rewired.CopyFrom(node)
        rewired.input[0] = deq_act
        rewired.input[1] = deq_w
        if plan.outliers.size:
            if act not in gathered_act:
                index = f"{act}_outlier_channels"
                new_inits.append(numpy_helper.from_array(plan.outliers.astype(np.int64), index))
                gathered_act[act] = f"{act}_outliers"
                gather = helper.make_node(
                    "Gather", [act, index], [gathered_act[act]], name=f"{act}_gather_outliers",
                    axis=-1,
                )  # fmt: skip
                nodes.append(gather)
            side_w, side = f"{prefix}_w_outliers", f"{prefix}_outlier_product"
            new_inits.append(numpy_helper.from_array(weight[plan.outliers], side_w))
            nodes.append(
                helper.make_node(
                    "MatMul", [gathered_act[act], side_w], [side], name=f"{prefix}_outliers"
                )
            )
            int8_out = f"{prefix}_int8_product"
            rewired.output[0] = int8_out
            nodes.append(rewired)
            nodes.append(
                helper.make_node(
                    "Add", [int8_out, side], [node.output[0]], name=f"{prefix}_add_outliers"
                )
            )
            continue
        nodes.append(rewired)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    read = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in read]
    for t in unused:
        graph.initializer.remove(t)
    return out


def _qattention(
    node: onnx.NodeProto, codes: str, act: tuple[str, str], weight: tuple[str, str, str]
) -> onnx.NodeProto:
    """The fused Attention `node` reading u8 activation codes and s8 per-column weights: its
    Q/K/V projection becomes one integer GEMM per head (onnxruntime has no DequantizeLinear
    -> Attention fusion of its own), scores and context stay fp32 as before."""
    scale, zp = act
    w_codes, w_scale, w_zp = weight
    mask = node.input[3] if len(node.input) > 3 else ""
    q = helper.make_node(
        "QAttention",
        [codes, w_codes, node.input[2], scale, w_scale, mask, zp, w_zp],
        list(node.output),
        name=f"{node.name}_int8",
        domain="com.microsoft",
    )
    q.attribute.extend(node.attribute)
    return q


def sensitive_first(errors: Mapping[str, float]) -> list[str]:
    return sorted(errors, key=lambda name: errors[name], reverse=True)


def fp32_steps(count: int, cap: int) -> list[int]:
    """How many of the most sensitive MatMuls to try keeping fp32: 0, 1, 2, 4, ... up to cap."""
    steps = [0]
    k = 1
    while k <= cap:
        steps.append(k)
        k *= 2
    if steps[-1] != cap and cap <= count:
        steps.append(cap)
    return steps


def choose_fp32(
    ranked: Sequence[str],
    score: Callable[[Sequence[str]], float],
    *,
    target: float,
    cap: int,
) -> tuple[list[str], float]:
    """The fewest of the most sensitive MatMuls to keep fp32 (trying 0, 1, 2, 4 ... cap) for
    `score(kept)` (a min cosine) to reach `target`; past the cap, the best score tried."""
    best: tuple[list[str], float] | None = None
    for k in fp32_steps(len(ranked), min(cap, len(ranked))):
        kept = list(ranked[:k])
        got = score(kept)
        if got >= target:
            return kept, got
        if best is None or got > best[1]:
            best = (kept, got)
    assert best is not None
    return best
