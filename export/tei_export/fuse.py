"""Offline graph fusion with onnxruntime's transformer optimizer, and fused-op accounting."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import onnx

from tei_export import external
from tei_export.errors import ExportError
from tei_export.plan import ExportPlan

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "QAttention")
FUSED_OPS = (
    *ATTENTION_OPS,
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization",
    "QEmbedLayerNormalization",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "RotaryEmbedding",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "QuantizeLinear",  # static int8: one per quantized activation
)


def count_fused_ops(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    counts = collections.Counter(node.op_type for node in graph.node)
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def expected_counts(plan: ExportPlan) -> dict[str, int]:
    fusion = plan.card.fusion
    expected = {op: n * plan.num_hidden_layers for op, n in fusion.expected_per_layer.items()}
    for op, n in fusion.expected.items():
        expected[op] = expected.get(op, 0) + n
    return expected


def check_fusion(plan: ExportPlan, counts: dict[str, int]) -> None:
    missing = {
        op: (counts.get(op, 0), want)
        for op, want in expected_counts(plan).items()
        if counts.get(op, 0) < want
    }
    if missing:
        detail = ", ".join(f"{op} {got}/{want}" for op, (got, want) in missing.items())
        raise ExportError(
            f"fusion incomplete for {plan.card.family}: {detail} (got/expected); refusing to "
            f"ship an unfused graph as optimized"
        )
    has_attention = any(counts.get(op, 0) for op in ATTENTION_OPS)
    if not has_attention and plan.card.fusion.attention_unfused_reason is None:
        raise ExportError(
            f"no fused attention op in the {plan.card.family} graph; the card expects one"
        )


def fuse(plan: ExportPlan, src: Path, dst: Path, *, external_data: bool) -> dict[str, int]:
    optimizer = plan.card.fusion.optimizer
    if optimizer == "none":
        external.save(onnx.load(str(src)), dst, external=external_data)
    else:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions(optimizer)
        # Residual Add + LayerNormalization stay two ops: SkipLayerNormalization's CPU kernel
        # is several times slower than the pair (tei_runtime.session), and GPU providers
        # fuse the pair themselves when they load the graph.
        options.enable_skip_layer_norm = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # opt_level 0: only the Python fusions, so the saved graph carries no
            # host-specific rewrites from onnxruntime's own optimizer.
            model = optimize_model(
                str(src),
                model_type=optimizer,
                num_heads=plan.num_attention_heads,
                hidden_size=plan.encoder_hidden_size,
                opt_level=0,
                optimization_options=options,
            )
        # Adds the com.microsoft opset import the fused ops need; `<dst>.data` as external.save.
        model.save_model_to_file(str(dst), use_external_data_format=external_data)
    counts = count_fused_ops(dst)
    check_fusion(plan, counts)
    return counts
