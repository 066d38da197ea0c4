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


def to_fp16(src: Path, dst: Path, *, external_data: bool) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.convert_float_to_float16(keep_io_types=True, op_block_list=FP16_KEEP_FP32)
    # Adds the com.microsoft opset import the fused ops need; `<dst>.data` as external.save.
    model.save_model_to_file(str(dst), use_external_data_format=external_data)


def to_int8(src: Path, dst: Path, *, external_data: bool) -> None:
    """Dynamic int8 for CPUs, chosen by measurement on all-MiniLM-L6-v2 (this project's 2-CPU
    VM, which has VNNI; 133 mixed texts, min cosine against sentence-transformers, texts/s at
    batch 32 against fp32's 92):

    - QUInt8 weights, all ops: 0.976, 89/s (u8 x u8 has no fast kernel: no gain);
    - QInt8 per-channel, MatMul only: 0.978, 147/s (u8 x s8 pairs saturate int16 sums);
    - the same with reduce_range (7-bit weights, no saturation): 0.983, 149/s;
    - and the first layer's FFN down-projection kept fp32: 0.986, 142/s;
    - the first two layers' (this one): on the benchmark's 256 mixed texts against fp32, 0.988
      instead of 0.982 at the same speed within the noise (228 vs 229 texts/s; the first three
      0.991 at 209/s, all six 0.993 at 189/s). Those early down-projections see the widest
      activations, and one per-tensor scale for the batch is what int8 loses on.

    Attention stays fp32 (MatMul only): quantizing its fused QKV projection cost accuracy.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep_fp32 = early_down_projections(onnx.load(str(src), load_external_data=False))
    try:
        with _quiet_root_logger():
            quantize_dynamic(
                str(src),
                str(dst),
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_exclude=keep_fp32,
                # Writes <dst>.data, the same name external.save uses.
                use_external_data_format=external_data,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
    except (RuntimeError, ValueError) as e:
        raise ExportError(f"int8 quantization failed: {e}") from e


INT8_FP32_DOWN_PROJECTIONS = 2


def early_down_projections(
    model: onnx.ModelProto, count: int = INT8_FP32_DOWN_PROJECTIONS
) -> list[str]:
    """Names of the first `count` MatMuls (in graph order) whose weight narrows its input
    ([intermediate, hidden]: the FFN down-projections of the first layers)."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    found: list[str] = []
    for node in model.graph.node:
        if len(found) == count:
            break
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        dims = shapes.get(node.input[1])
        if dims is not None and len(dims) == 2 and dims[0] > dims[1] * 2:
            found.append(node.name)
    return found
