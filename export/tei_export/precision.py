"""fp16 and int8 variants derived from an fp32 graph (the fused one, or the plain one for the
CPU classes a card names)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import onnx

from tei_export import external, quantize, validate
from tei_export.calibration import calibration_texts, stress_texts
from tei_export.errors import ExportError
from tei_export.plan import ExportPlan

IntArray = npt.NDArray[np.int64]

# Kept in fp32 inside the fp16 graph: reductions and exponentials that overflow or lose the
# small differences embeddings are made of.
FP16_KEEP_FP32 = [
    "LayerNormalization",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "Softmax",
    "ReduceMean",
    "ReduceSum",
    "Pow",
    "Sqrt",
    "Div",
    "Exp",
    "Log",
    "Log1p",
    "Erf",
]


def to_fp16(src: Path, dst: Path, *, external_data: bool) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(keep_io_types=True, op_block_list=FP16_KEEP_FP32)
    # Adds the com.microsoft opset import the fused ops need; `<dst>.data` as external.save.
    model.save_model_to_file(str(dst), use_external_data_format=external_data)


# The int8 variant's bar on the calibration texts (min cosine of each text's vector against
# the fp32 graph's) for keeping no more MatMuls fp32. all-MiniLM-L6-v2 reaches 0.9927-0.9932
# with every MatMul int8 and its outlier channels split off (0.9945-0.9953 on the benchmark's
# mixed texts; before the split, 0.978 all int8 and 0.985 with two kept fp32); its calibration
# texts are harder (eight scripts, code, emoji).
INT8_CALIBRATION_TARGET = 0.985
# Calibration texts are cut here: longer inputs add cost, not new ranges.
MAX_CALIBRATION_LENGTH = 512


class Int8Result(msgspec.Struct, frozen=True, kw_only=True):
    quantized: int
    kept_fp32: list[str]
    calibration_min_cosine: float
    """Min cosine of the int8 graph's vectors against the fp32 graph's on the calibration
    texts."""
    widened: int
    """Activations whose range was widened to cover the stress texts (quantize.calibrate)."""
    split_channels: int
    """Outlier channels multiplied in fp32 beside their integer GEMMs (quantize.calibrate)."""


def _feed(plan: ExportPlan, ids: IntArray, type_ids: IntArray) -> dict[str, IntArray]:
    by_name = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": type_ids,
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None, :],
    }
    return {name: by_name[name] for name in plan.inputs}


def calibration_feeds(
    plan: ExportPlan, tokenizer_json: Path, texts: Sequence[str] | None = None
) -> list[dict[str, IntArray]]:
    """Each calibration text (or each of TEXTS) as its own batch of one, tokenized by the
    model's tokenizer."""
    from tei_runtime.tokenization import Tokenizer

    tokenizer = Tokenizer(
        tokenizer_json, max_input_length=min(plan.max_input_length, MAX_CALIBRATION_LENGTH)
    )
    chosen = list(texts) if texts is not None else calibration_texts()
    return [
        _feed(plan, np.array([enc.ids], np.int64), np.array([enc.type_ids], np.int64))
        for enc in tokenizer.encode(chosen, truncate=True, truncation_direction="right")
    ]


def random_id_feeds(plan: ExportPlan, vocab_size: int) -> list[dict[str, IntArray]]:
    """The export validation's batches of random ids (its lengths, padding and seeds): the
    int8 graph is scored on them too (not calibrated on them), because a model's activations
    on long or random inputs can leave the ranges its calibration texts gave, and a reranker's
    scores are compared across a batch there."""
    from tei_export.reference import example_inputs

    return [
        {
            name: tensor.numpy()
            for name, tensor in zip(
                plan.inputs,
                example_inputs(plan, batch.lengths, vocab_size, padding_side=batch.padding_side),
                strict=True,
            )
        }
        for batch in validate.length_grid(plan)
    ]


def batch_vectors(output: npt.NDArray[np.float32], mask: IntArray) -> npt.NDArray[np.float32]:
    """The vectors validation compares for one batch, a row each: token rows mean-pooled
    under the mask, other rows (pooled vectors, logits, scores) as they are."""
    out = np.asarray(output, np.float32)
    if out.ndim == 3:
        weights = mask[..., None].astype(np.float32)
        out = (out * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
    return out


def text_vectors(per_text: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    """One row per text from each text's (batch of one) output: token rows averaged, pooled
    rows (or scores) as they are."""
    return np.stack(
        [np.asarray(o, np.float32).reshape(-1, o.shape[-1]).mean(axis=0) for o in per_text]
    )


def to_int8(
    plan: ExportPlan,
    tokenizer_json: Path,
    src: Path,
    dst: Path,
    *,
    vocab_size: int,
    external_data: bool,
) -> Int8Result:
    """Static int8 (tei_export.quantize): activations calibrated on the calibration texts
    with the model's own tokenizer, so a text's vector does not depend on its batch; the
    most sensitive MatMuls by measured local error stay fp32 until the graph's vectors reach
    INT8_CALIBRATION_TARGET against fp32, on the calibration texts and on random ids
    (every MatMul fp32 at worst: a model int8 cannot carry stays exact rather than failing
    its export; the export's log counts what was kept). A fused Attention op's Q/K/V
    projection is a site like a MatMul (a QAttention when quantized)."""
    import onnxruntime as ort

    feeds = calibration_feeds(plan, tokenizer_json)
    model = onnx.load(str(src))
    sites = quantize.matmul_sites(model)
    if not sites:
        raise ExportError("int8: the graph has no MatMul with a constant weight to quantize")
    stress = calibration_feeds(plan, tokenizer_json, stress_texts())
    calib = quantize.calibrate(src, sites, feeds, stress=stress)
    output = list(plan.outputs)

    def vectors(path: Path) -> list[npt.NDArray[np.float32]]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # The last output is the vector users get: pooled, logits or sparse, else tokens;
        # one set of vectors for the calibration texts, one per validation batch.
        texts = text_vectors([session.run(output, dict(feed))[-1] for feed in feeds])
        return [texts] + [
            batch_vectors(session.run(output, dict(feed))[-1], feed["attention_mask"])
            for feed in random_feeds
        ]

    random_feeds = random_id_feeds(plan, vocab_size)
    reference = vectors(src)

    def score(kept: Sequence[str]) -> float:
        candidate = quantize.to_qdq(model, sites, calib.plans, keep_fp32=kept)
        external.save(candidate, dst, external=external_data)
        return validate.min_agreement(vectors(dst), reference)

    ranked = quantize.sensitive_first(calib.errors)
    kept, reached = quantize.choose_fp32(
        ranked, score, target=INT8_CALIBRATION_TARGET, cap=len(ranked)
    )
    external.save(quantize.to_qdq(model, sites, calib.plans, keep_fp32=kept), dst,
                  external=external_data)  # fmt: skip
    return Int8Result(
        quantized=len(sites) - len(kept), kept_fp32=kept, calibration_min_cosine=reached,
        widened=len(calib.widened),
        split_channels=quantize.split_channels(calib.plans, sites, kept),
    )
