"""torch -> fp32 ONNX with dynamic batch and sequence axes (TorchScript exporter).

The TorchScript exporter, not dynamo: onnxruntime's attention fusion matches its graphs and not
the dynamo exporter's (measured in DEVELOPERS.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from tei_export.errors import ExportError
from tei_export.plan import ExportPlan
from tei_export.reference import ExportModule, example_inputs, traceable_attention

_SEQ_OUTPUTS = {"token_embeddings"}


def trace(module: ExportModule, plan: ExportPlan, out_path: Path, vocab_size: int) -> None:
    args = tuple(example_inputs(plan, [7, 5], vocab_size))
    axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in plan.inputs}
    for name in plan.outputs:
        axes[name] = {0: "batch", 1: "sequence"} if name in _SEQ_OUTPUTS else {0: "batch"}
    try:
        with warnings.catch_warnings(), traceable_attention(module, plan), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(out_path),
                input_names=list(plan.inputs),
                output_names=list(plan.outputs),
                dynamic_axes=axes,
                opset_version=plan.opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except (RuntimeError, TypeError, ValueError) as e:
        raise ExportError(f"tracing {plan.card.family} to ONNX failed: {e}") from e
