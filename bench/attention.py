"""Micro-benchmark: onnxruntime's fused attention ops against the unfused subgraph, on CPU.

`python -m bench.attention` answers one question: for the attention core of a grouped-query
rotary decoder used as an embedder (Qwen3-0.6B: 16 query heads, 8 KV heads, head dim 128),
run as one prompt-only pass over a LEFT-padded batch with a causal mask and no KV cache, is any
fused attention op of the installed onnxruntime (CPU provider) faster than the unfused
subgraph our exporter emits today? If none is, fusing decoder attention does not pay on CPU.

Each variant is one small ONNX graph of one layer's attention core. Its inputs are already
projected and already rotary-embedded: Q [B, S, 16*128], K and V [B, S, 8*128], plus whatever
form of the padding mask that op needs. Every mask form is computed once per batch outside the
timed call (numpy), because in a real model it is built once and shared by every layer; the
timed work is what each layer pays. The additive mask is 0 where a query may attend a key
(causal and both real) and float32's lowest value elsewhere, as transformers builds it.

Variants:
- a `unfused`: what tracing transformers' eager attention gives: Reshape/Transpose to
  [B, H, S, D], K and V repeated from 8 to 16 heads (Unsqueeze, Expand, Reshape),
  MatMul(Q, K^T), Mul by 1/sqrt(D), Add of the precomputed additive mask [B, 1, S, S],
  Softmax, MatMul with V, Transpose/Reshape back. The baseline. onnxruntime's own graph
  optimizer already folds the K transpose and the scaling into one FusedMatMul; the rest runs
  op by op, with [B, 16, S, S] scores written and read three times.
- b `mha`: com.microsoft MultiHeadAttention. It has no grouped-query form, so K and V are
  repeated to 16 heads in-graph first (that copy is part of its cost); the causal+padding mask
  goes in as `attention_bias` [B, 1, S, S].
- c `attention23`: the ONNX standard Attention op (opset 23) with q_num_heads=16,
  kv_num_heads=8 on 3D inputs, the same float mask as `attn_mask` and is_causal=0.
- c2 `attention23-bool`: the same op with is_causal=1 and a boolean padding-only mask (the op
  ANDs the two): does its own causal mask combine correctly with left padding? The mask has to
  be [B, 1, S, S] all the same: onnxruntime's CPU kernel rejects a [B, 1, 1, S] key mask whose
  query axis would broadcast. Query rows that are padding see no key at all; the op defines
  their output as zeros, not NaN.
- d `gqa-bias`: com.microsoft GroupQueryAttention, prompt-only (no past KV), seqlens_k = S-1
  for every row and total_sequence_length = S, so the op sees full rows; left padding goes in
  through its `attention_bias` input (padding keys get the lowest float). Its own causal mask
  does the rest.
- d2 `gqa-seqlens`: GroupQueryAttention as it is meant for padding, with seqlens_k = real
  length - 1 and no bias. Its contract is RIGHT padding: the first seqlens_k+1 positions of a
  row are taken as the real ones (that is also where its causal positions start). On our
  left-padded batch that attends to padding and drops real tokens, so it is checked there (and
  expected to be wrong) but timed only on an unpadded batch, labelled as such. Its work does not
  depend on the mask's values, so its time is still comparable with (a)'s on the padded batch.

Every variant is first checked against a float64 numpy reference on the real (non-padding)
positions; one that is wrong there is reported as wrong and not timed. Timing is
`InferenceSession.run` on the CPU provider with ORT_ENABLE_ALL and a fixed intra-op thread
count, with the variants interleaved within each repeat (a, b, c, ..., a, b, c, ...) so that
load on the machine falls on all of them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from bench import procs

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
Feeds = dict[str, npt.NDArray[np.generic]]

# Qwen3-0.6B's attention (hidden 1024 projects to 16 x 128 query and 8 x 128 key/value widths).
QWEN3_HEADS, QWEN3_KV_HEADS, QWEN3_HEAD_DIM = 16, 8, 128
DEFAULT_SHAPES = "1x16,32x64,32x512"
TOLERANCE = 1e-3  # float32 attention over up to 512 keys against a float64 reference
MASKED = float(np.finfo(np.float32).min)  # what transformers puts where attention is not allowed
WARMUPS = 2


class AttentionTiming(msgspec.Struct, frozen=True, kw_only=True):
    """One variant at one (batch, sequence) shape."""

    variant: str  # a, b, c, c2, d, d2
    name: str
    batch: int
    seq: int
    padded: bool  # timed on the left-padded batch; False: on an unpadded one
    correct: bool | None  # on the real positions of the left-padded batch; None: did not run
    max_abs_diff: float | None  # ditto
    unpadded_max_abs_diff: float | None = None  # only for variants timed unpadded
    median_ms: float | None = None  # None: not timed (wrong, or did not run)
    min_ms: float | None = None
    relative_to_unfused: float | None = None  # median / median of (a); < 1 is faster
    note: str = ""


class AttentionRun(msgspec.Struct, frozen=True, kw_only=True):
    cpu: str
    isa: list[str]
    onnxruntime: str
    threads: int
    repeats: int
    heads: int
    kv_heads: int
    head_dim: int
    records: list[AttentionTiming]


@dataclass(frozen=True)
class Dims:
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class Batch:
    """One layer's projected inputs and every form of its mask the variants take."""

    query: FloatArray  # [B, S, H*D]
    key: FloatArray  # [B, S, KV*D]
    value: FloatArray  # [B, S, KV*D]
    mask: IntArray  # [B, S], 1 = real token, 0 = padding (left side)

    @property
    def additive_mask(self) -> FloatArray:
        """[B, 1, S, S]: 0 where query i may attend key j (j <= i, key real), else MASKED."""
        seq = self.mask.shape[1]
        causal = np.tril(np.ones((seq, seq), dtype=bool))
        allowed = causal[None, None, :, :] & (self.mask[:, None, None, :] == 1)
        return np.where(allowed, 0.0, MASKED).astype(np.float32)

    @property
    def lengths(self) -> npt.NDArray[np.int32]:
        lengths: npt.NDArray[np.int32] = self.mask.sum(axis=1, dtype=np.int32)
        return lengths


@dataclass(frozen=True)
class Variant:
    key: str
    name: str
    build: Callable[[Dims], onnx.ModelProto]
    feeds: Callable[[Batch], Feeds]
    timed_padded: bool = True  # False: its padding contract is not ours, time it unpadded


# --- graphs -----------------------------------------------------------------------------------


def _const(name: str, values: list[int] | list[float], dtype: int) -> onnx.NodeProto:
    tensor = helper.make_tensor(name, dtype, [len(values)], values)
    return helper.make_node("Constant", [], [name], value=tensor)


def _scalar(name: str, value: float) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, 1, [], [value]))


def _inputs(dims: Dims) -> list[onnx.ValueInfoProto]:
    """Q, K, V with symbolic batch and sequence, so one session serves every shape."""
    f32 = TensorProto.FLOAT
    return [
        helper.make_tensor_value_info("query", f32, ["B", "S", dims.heads * dims.head_dim]),
        helper.make_tensor_value_info("key", f32, ["B", "S", dims.kv_heads * dims.head_dim]),
        helper.make_tensor_value_info("value", f32, ["B", "S", dims.kv_heads * dims.head_dim]),
    ]


def _additive_mask_input() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("additive_mask", TensorProto.FLOAT, ["B", 1, "S", "S"])


def _output(dims: Dims) -> onnx.ValueInfoProto:
    width = dims.heads * dims.head_dim
    return helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", "S", width])


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    dims: Dims,
    *,
    contrib: bool = False,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "attention_core", inputs, [_output(dims)])
    opsets = [helper.make_opsetid("", 23)]
    if contrib:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    # IR 11 is the first to allow opset 23; pinning it keeps older onnxruntimes able to load
    # what a newer onnx would otherwise stamp with its own latest IR.
    model = helper.make_model(graph, opset_imports=opsets, ir_version=11)
    onnx.checker.check_model(model)
    return model


def _heads_first(name: str, heads: int, dims: Dims, out: str) -> list[onnx.NodeProto]:
    """[B, S, heads*D] -> [B, heads, S, D]."""
    shape = f"{out}_shape"
    return [
        _const(shape, [0, 0, heads, dims.head_dim], TensorProto.INT64),
        helper.make_node("Reshape", [name, shape], [f"{out}_bshd"]),
        helper.make_node("Transpose", [f"{out}_bshd"], [out], perm=[0, 2, 1, 3]),
    ]


def _repeat_kv_heads_first(name: str, dims: Dims, out: str) -> list[onnx.NodeProto]:
    """[B, KV, S, D] -> [B, H, S, D], query head h reading KV head h // group (transformers'
    repeat_kv): a new axis after the KV-head axis, expanded to the group size, then merged."""
    return [
        _const(f"{out}_axis", [2], TensorProto.INT64),
        helper.make_node("Unsqueeze", [name, f"{out}_axis"], [f"{out}_5d"]),
        _const(f"{out}_group", [1, 1, dims.group, 1, 1], TensorProto.INT64),
        helper.make_node("Expand", [f"{out}_5d", f"{out}_group"], [f"{out}_expanded"]),
        _const(f"{out}_shape", [0, dims.heads, -1, dims.head_dim], TensorProto.INT64),
        helper.make_node("Reshape", [f"{out}_expanded", f"{out}_shape"], [out]),
    ]


def _repeat_kv_hidden(name: str, dims: Dims, out: str) -> list[onnx.NodeProto]:
    """[B, S, KV*D] -> [B, S, H*D] in the same head order as _repeat_kv_heads_first."""
    return [
        _const(f"{out}_split", [0, 0, dims.kv_heads, 1, dims.head_dim], TensorProto.INT64),
        helper.make_node("Reshape", [name, f"{out}_split"], [f"{out}_5d"]),
        _const(f"{out}_group", [1, 1, 1, dims.group, 1], TensorProto.INT64),
        helper.make_node("Expand", [f"{out}_5d", f"{out}_group"], [f"{out}_expanded"]),
        _const(f"{out}_merge", [0, 0, -1], TensorProto.INT64),
        helper.make_node("Reshape", [f"{out}_expanded", f"{out}_merge"], [out]),
    ]


def build_unfused(dims: Dims) -> onnx.ModelProto:
    nodes = [
        *_heads_first("query", dims.heads, dims, "q"),
        *_heads_first("key", dims.kv_heads, dims, "k_kv"),
        *_heads_first("value", dims.kv_heads, dims, "v_kv"),
        *_repeat_kv_heads_first("k_kv", dims, "k"),
        *_repeat_kv_heads_first("v_kv", dims, "v"),
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        _scalar("scaling", dims.head_dim**-0.5),
        helper.make_node("Mul", ["scores", "scaling"], ["scaled"]),
        helper.make_node("Add", ["scaled", "additive_mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_bshd"], perm=[0, 2, 1, 3]),
        _const("merge", [0, 0, -1], TensorProto.INT64),
        helper.make_node("Reshape", ["context_bshd", "merge"], ["output"]),
    ]
    return _model(nodes, [*_inputs(dims), _additive_mask_input()], dims)


def build_mha(dims: Dims) -> onnx.ModelProto:
    nodes = [
        *_repeat_kv_hidden("key", dims, "k"),
        *_repeat_kv_hidden("value", dims, "v"),
        # Inputs: query, key, value, bias, key_padding_mask, attention_bias.
        helper.make_node(
            "MultiHeadAttention",
            ["query", "k", "v", "", "", "additive_mask"],
            ["output"],
            domain="com.microsoft",
            num_heads=dims.heads,
        ),
    ]
    return _model(nodes, [*_inputs(dims), _additive_mask_input()], dims, contrib=True)


def _attention23(dims: Dims, mask: onnx.ValueInfoProto, *, is_causal: int) -> onnx.ModelProto:
    node = helper.make_node(
        "Attention",
        ["query", "key", "value", mask.name],
        ["output"],
        q_num_heads=dims.heads,
        kv_num_heads=dims.kv_heads,
        is_causal=is_causal,
    )
    return _model([node], [*_inputs(dims), mask], dims)


def build_attention23(dims: Dims) -> onnx.ModelProto:
    return _attention23(dims, _additive_mask_input(), is_causal=0)


def build_attention23_bool(dims: Dims) -> onnx.ModelProto:
    # onnxruntime's CPU kernel wants the mask's query axis at full length (it rejects a
    # [B, 1, 1, S] key mask), so the padding-only mask comes in as [B, 1, S, S].
    key_mask = helper.make_tensor_value_info("key_mask", TensorProto.BOOL, ["B", 1, "S", "S"])
    return _attention23(dims, key_mask, is_causal=1)


def _gqa_model(dims: Dims, *, with_bias: bool) -> onnx.ModelProto:
    extra = [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    # Inputs: query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
    # cos_cache, sin_cache, position_ids, attention_bias.
    names = ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"]
    if with_bias:
        names += ["", "", "", "additive_mask"]
        extra.append(_additive_mask_input())
    node = helper.make_node(
        "GroupQueryAttention",
        names,
        ["output"],
        domain="com.microsoft",
        num_heads=dims.heads,
        kv_num_heads=dims.kv_heads,
    )
    return _model([node], [*_inputs(dims), *extra], dims, contrib=True)


def build_gqa_bias(dims: Dims) -> onnx.ModelProto:
    return _gqa_model(dims, with_bias=True)


def build_gqa_seqlens(dims: Dims) -> onnx.ModelProto:
    return _gqa_model(dims, with_bias=False)


# --- feeds ------------------------------------------------------------------------------------


def _qkv(batch: Batch) -> Feeds:
    return {"query": batch.query, "key": batch.key, "value": batch.value}


def feeds_additive(batch: Batch) -> Feeds:
    return {**_qkv(batch), "additive_mask": batch.additive_mask}


def feeds_key_mask(batch: Batch) -> Feeds:
    """Padding only (True = real key), repeated over the query axis; the op adds causality."""
    batch_size, seq = batch.mask.shape
    real_keys = (batch.mask == 1)[:, None, None, :]
    return {**_qkv(batch), "key_mask": np.broadcast_to(real_keys, (batch_size, 1, seq, seq)).copy()}


def _total_length(batch: Batch) -> npt.NDArray[np.int32]:
    return np.array(batch.mask.shape[1], dtype=np.int32)


def feeds_gqa_bias(batch: Batch) -> Feeds:
    """Every row declared full length (so GQA puts no padding of its own anywhere); the
    bias hides the left padding."""
    full = np.full(batch.mask.shape[0], batch.mask.shape[1] - 1, dtype=np.int32)
    return {
        **feeds_additive(batch),
        "seqlens_k": full,
        "total_sequence_length": _total_length(batch),
    }


def feeds_gqa_seqlens(batch: Batch) -> Feeds:
    return {
        **_qkv(batch),
        "seqlens_k": batch.lengths - 1,
        "total_sequence_length": _total_length(batch),
    }


VARIANTS = (
    Variant("a", "unfused", build_unfused, feeds_additive),
    Variant("b", "mha", build_mha, feeds_additive),
    Variant("c", "attention23", build_attention23, feeds_additive),
    Variant("c2", "attention23-bool", build_attention23_bool, feeds_key_mask),
    Variant("d", "gqa-bias", build_gqa_bias, feeds_gqa_bias),
    Variant("d2", "gqa-seqlens", build_gqa_seqlens, feeds_gqa_seqlens, timed_padded=False),
)


# --- inputs and reference ---------------------------------------------------------------------


def left_padded_mask(batch: int, seq: int) -> IntArray:
    """Row b has b * seq // (2 * batch) padding tokens at its start: the first row is full,
    the last is close to half padding (a spread like a real mixed-length batch)."""
    mask = np.ones((batch, seq), dtype=np.int64)
    for row in range(batch):
        mask[row, : row * seq // (2 * batch)] = 0
    return mask


def make_batch(dims: Dims, mask: IntArray, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    batch, seq = mask.shape

    def normal(width: int) -> FloatArray:
        return rng.standard_normal((batch, seq, width), dtype=np.float32)

    kv_width = dims.kv_heads * dims.head_dim
    return Batch(normal(dims.heads * dims.head_dim), normal(kv_width), normal(kv_width), mask)


def reference(batch: Batch, dims: Dims) -> npt.NDArray[np.float64]:
    """Causal attention with padding keys excluded, in float64, one row at a time (a
    32 x 16 x 512 x 512 float64 score tensor would be 1 GiB). Padding query rows are left 0."""
    n, seq = batch.mask.shape
    out = np.zeros((n, seq, dims.heads * dims.head_dim))
    for row in range(n):
        q = batch.query[row].astype(np.float64).reshape(seq, dims.heads, dims.head_dim)
        k = batch.key[row].astype(np.float64).reshape(seq, dims.kv_heads, dims.head_dim)
        v = batch.value[row].astype(np.float64).reshape(seq, dims.kv_heads, dims.head_dim)
        k = np.repeat(k, dims.group, axis=1).transpose(1, 2, 0)  # [H, D, S]
        v = np.repeat(v, dims.group, axis=1).transpose(1, 0, 2)  # [H, S, D]
        scores = q.transpose(1, 0, 2) @ k * dims.head_dim**-0.5  # [H, S, S]
        allowed = np.tril(np.ones((seq, seq), dtype=bool)) & (batch.mask[row] == 1)[None, :]
        scores = np.where(allowed, scores, -np.inf)
        real = batch.mask[row] == 1
        scores = scores[:, real]  # padding query rows see no key at all
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out[row, real] = (probs @ v).transpose(1, 0, 2).reshape(int(real.sum()), -1)
    return out


def max_abs_diff_on_real(got: npt.NDArray[np.generic], batch: Batch, dims: Dims) -> float:
    """Worst error over real positions only: what padding rows hold is each op's own business
    (and never reaches a pooled embedding)."""
    real = batch.mask == 1
    diff = np.abs(np.asarray(got, dtype=np.float64)[real] - reference(batch, dims)[real])
    return float(np.nan_to_num(diff, nan=np.inf).max())


# --- sessions and timing ----------------------------------------------------------------------


def make_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4  # a kernel's refusal is caught and reported in the table
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run_output(session: ort.InferenceSession, feeds: Feeds) -> npt.NDArray[np.generic]:
    out = session.run(["output"], feeds)[0]
    assert isinstance(out, np.ndarray)
    return out


def timed_ms(session: ort.InferenceSession, feeds: Feeds) -> float:
    start = time.perf_counter()
    session.run(["output"], feeds)
    return (time.perf_counter() - start) * 1e3


def build_sessions(
    dims: Dims, threads: int
) -> tuple[dict[str, ort.InferenceSession], dict[str, str]]:
    """Sessions per variant key, and why the others could not be built (their error text)."""
    sessions: dict[str, ort.InferenceSession] = {}
    failures: dict[str, str] = {}
    for variant in VARIANTS:
        try:
            sessions[variant.key] = make_session(variant.build(dims), threads)
        except Exception as error:  # the op may be missing from this onnxruntime: say why
            failures[variant.key] = _last_words(error)
    return sessions, failures


def _last_words(error: Exception) -> str:
    """The end of onnxruntime's message, where it says what it checked (its start is a long
    C++ signature)."""
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else "..." + text[-160:]


@dataclass
class Check:
    correct: bool | None
    max_abs_diff: float | None
    unpadded_max_abs_diff: float | None = None
    note: str = ""


def check_variant(
    variant: Variant, session: ort.InferenceSession, padded: Batch, unpadded: Batch, dims: Dims
) -> Check:
    """Correct on the real positions of the left-padded batch, or for a variant timed
    unpadded, on the unpadded batch (its padded error is still reported)."""
    try:
        got = run_output(session, variant.feeds(padded))
        plain = None
        if not variant.timed_padded:
            out = run_output(session, variant.feeds(unpadded))
            plain = max_abs_diff_on_real(out, unpadded, dims)
    except Exception as error:  # a kernel may reject an input form at run time
        return Check(None, None, note=f"run failed: {_last_words(error)}")
    diff = max_abs_diff_on_real(got, padded, dims)
    notes = []
    if not np.isfinite(np.asarray(got, dtype=np.float64)).all():
        # Harmless in this one layer, fatal in a model: the next layer's padding keys get
        # probability 0, but 0 * NaN is NaN.
        notes.append("NaN/inf in output")
    if plain is None:
        return Check(diff <= TOLERANCE, diff, note="; ".join(notes))
    notes.append("wrong on left padding; timed unpadded" if diff > TOLERANCE else "timed unpadded")
    return Check(plain <= TOLERANCE, diff, plain, "; ".join(notes))


def time_interleaved(
    runs: dict[str, tuple[ort.InferenceSession, Feeds]], repeats: int
) -> dict[str, list[float]]:
    """Milliseconds per run, the variants taking turns within each repeat."""
    for _ in range(WARMUPS):
        for session, feeds in runs.values():
            session.run(["output"], feeds)
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(repeats):
        for key, (session, feeds) in runs.items():
            times[key].append(timed_ms(session, feeds))
    return times


def measure_shape(
    sessions: dict[str, ort.InferenceSession],
    failures: dict[str, str],
    dims: Dims,
    shape: tuple[int, int],
    repeats: int,
) -> list[AttentionTiming]:
    batch_size, seq = shape
    padded = make_batch(dims, left_padded_mask(batch_size, seq))
    unpadded = make_batch(dims, np.ones((batch_size, seq), dtype=np.int64))
    checks: dict[str, Check] = {}
    runs: dict[str, tuple[ort.InferenceSession, Feeds]] = {}
    for variant in VARIANTS:
        if variant.key in failures:
            checks[variant.key] = Check(None, None, note=f"not built: {failures[variant.key]}")
            continue
        session = sessions[variant.key]
        check = check_variant(variant, session, padded, unpadded, dims)
        checks[variant.key] = check
        if check.correct:
            feeds_batch = padded if variant.timed_padded else unpadded
            runs[variant.key] = (session, variant.feeds(feeds_batch))
    times = time_interleaved(runs, repeats)
    baseline = statistics.median(times["a"]) if "a" in times else None
    return [_record(v, shape, checks[v.key], times.get(v.key), baseline) for v in VARIANTS]


def _record(
    variant: Variant,
    shape: tuple[int, int],
    check: Check,
    times: list[float] | None,
    baseline: float | None,
) -> AttentionTiming:
    median = statistics.median(times) if times else None
    note = check.note or ("wrong" if check.correct is False else "")
    return AttentionTiming(
        variant=variant.key,
        name=variant.name,
        batch=shape[0],
        seq=shape[1],
        padded=variant.timed_padded,
        correct=check.correct,
        max_abs_diff=check.max_abs_diff,
        unpadded_max_abs_diff=check.unpadded_max_abs_diff,
        median_ms=median,
        min_ms=min(times) if times else None,
        relative_to_unfused=median / baseline if median is not None and baseline else None,
        note=note,
    )


# --- machine and report -----------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _diff(record: AttentionTiming) -> str:
    if record.max_abs_diff is None:
        return "-"
    text = f"{record.max_abs_diff:.1e}"
    if record.unpadded_max_abs_diff is not None:
        text += f" (unpadded {record.unpadded_max_abs_diff:.1e})"
    return text


def _verdict(record: AttentionTiming) -> str:
    if record.correct is None:
        return "-"
    if not record.correct:
        return "WRONG"
    padded_wrong = record.max_abs_diff is None or record.max_abs_diff > TOLERANCE
    return "unpadded only" if record.unpadded_max_abs_diff is not None and padded_wrong else "yes"


def markdown(run: AttentionRun) -> str:
    isa = ", ".join(run.isa) or "no AVX2 or newer"
    lines = [
        f"CPU: {run.cpu} [{isa}]; onnxruntime {run.onnxruntime}; {run.threads} intra-op threads;"
        f" heads {run.heads}/{run.kv_heads} kv, head dim {run.head_dim};"
        f" median and min of {run.repeats} runs",
        "",
        "| B x S | variant | correct | max abs diff (real positions) | median ms | min ms "
        "| vs (a) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in run.records:
        relative = "-" if r.relative_to_unfused is None else f"{r.relative_to_unfused:.2f}x"
        lines.append(
            f"| {r.batch}x{r.seq} | {r.variant} {r.name} | {_verdict(r)} | {_diff(r)} "
            f"| {_ms(r.median_ms)} | {_ms(r.min_ms)} | {relative} | {r.note} |"
        )
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        batch, _, seq = item.strip().lower().partition("x")
        if not batch.isdigit() or not seq.isdigit() or int(batch) < 1 or int(seq) < 1:
            raise argparse.ArgumentTypeError(f"shape {item!r} is not BxS, e.g. 8x128")
        shapes.append((int(batch), int(seq)))
    return shapes


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=parse_shapes(DEFAULT_SHAPES),
        help=f"comma-separated BxS list (default {DEFAULT_SHAPES})",
    )
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed runs per variant")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=procs.cores(),
        help="intra-op threads (default: the CPUs this process may use)",
    )
    parser.add_argument("--json", type=Path, help="also write the records here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.json is not None and not args.json.parent.is_dir():  # before minutes of timing
        raise SystemExit(f"--json {args.json}: no folder {args.json.parent}")
    dims = Dims(QWEN3_HEADS, QWEN3_KV_HEADS, QWEN3_HEAD_DIM)
    sessions, failures = build_sessions(dims, args.threads)
    for key, reason in failures.items():
        print(f"skipping variant {key}: {reason}", file=sys.stderr)
    records: list[AttentionTiming] = []
    for shape in args.shapes:
        records += measure_shape(sessions, failures, dims, shape, args.repeats)
    host = procs.machine({})
    cpu, isa = host.cpu, host.isa
    run = AttentionRun(
        cpu=cpu,
        isa=isa,
        onnxruntime=ort.__version__,
        threads=args.threads,
        repeats=args.repeats,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        records=records,
    )
    print(markdown(run))
    if args.json is not None:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
