"""fp16 and int8 variants derived from the fused fp32 graph."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx

from tei_export.errors import ExportError

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


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    # onnxruntime.quantization logs type-inference chatter on the root logger; the validation
    # step, not these messages, decides whether the variant is good.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def to_fp16(src: Path, dst: Path) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(keep_io_types=True, op_block_list=FP16_KEEP_FP32)
    model.save_model_to_file(str(dst))


def to_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 for CPUs, chosen by measurement on all-MiniLM-L6-v2 (AVX2, no VNNI; 133
    mixed texts, min cosine against sentence-transformers, texts/s against fp32's 92):

    - QUInt8 weights, all ops: 0.976, 89/s (u8 x u8 has no fast kernel: no gain);
    - QInt8 per-channel, MatMul only: 0.978, 147/s (u8 x s8 pairs saturate int16 sums);
    - the same with reduce_range (7-bit weights, no saturation): 0.983, 149/s: this one.

    Attention stays fp32 (MatMul only): quantizing its fused QKV projection cost accuracy.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        with _quiet_root_logger():
            quantize_dynamic(
                str(src),
                str(dst),
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,
                op_types_to_quantize=["MatMul"],
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
    except (RuntimeError, ValueError) as e:
        raise ExportError(f"int8 quantization failed: {e}") from e
