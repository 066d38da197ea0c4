"""tei-export MODEL OUTPUT_DIR: a Hugging Face checkpoint to a validated ONNX artifact."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from tei_export.cards import CardError, load_cards, supported_families
from tei_export.errors import ExportError, InterruptedAfterWriting, Terminated
from tei_runtime.errors import ProviderError
from tei_runtime.manifest import Pooling, Precision, Task
from tei_runtime.providers import precision_named


def _opset_floors() -> str:
    """The model cards that need a higher opset than the lowest offered, for --help."""
    floors = [f"{c.family} {c.fusion.min_opset}+" for c in load_cards() if c.fusion.min_opset]
    return "some families need more: " + ", ".join(floors) if floors else "any family"


def _precisions(value: str) -> list[Precision]:
    names = [v.strip() for v in value.split(",")]
    try:  # the names --dtype takes too (float16, FP16), so one spelling works everywhere
        precisions = [precision_named(v) for v in names]
    except ProviderError as e:
        raise argparse.ArgumentTypeError(
            f"{value!r}: a comma-separated list of fp32, fp16, int8"
        ) from e
    if len(set(precisions)) < len(precisions):
        raise argparse.ArgumentTypeError(f"{value!r}: a precision is named twice")
    return precisions


# The opsets the exporters, onnxruntime's fusions and its quantizer all handle.
OPSETS = range(14, 24)


def _opset(value: str) -> int:
    try:
        opset = int(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from e
    if opset not in OPSETS:
        raise argparse.ArgumentTypeError(
            f"{opset}: choose an opset from {OPSETS.start} to {OPSETS.stop - 1}"
        )
    return opset


class _Formatter(argparse.HelpFormatter):
    """Never wraps inside a name: model types such as xlm-roberta carry hyphens."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
            break_on_hyphens=False,
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tei-export",
        formatter_class=_Formatter,
        description=(
            "Export a Hugging Face checkpoint (local folder or hub id) to a tei-onnx artifact: "
            "fused ONNX graphs (fp32, fp16, int8), tokenizer, pooling and prompts, and a "
            "manifest with checksums and validation figures against PyTorch."
        ),
        epilog=f"Supported families (model_type where it differs): {supported_families()}.",
    )
    p.add_argument("model", help="local checkpoint folder or Hugging Face hub id")
    p.add_argument("output_dir", type=Path, help="artifact folder to create")
    p.add_argument("--revision", help="hub revision (branch, tag or commit)")
    p.add_argument(
        "--hf-token",
        default=os.environ.get("HF_TOKEN"),
        help="hub token for private models (default: $HF_TOKEN)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=os.environ.get("HUGGINGFACE_HUB_CACHE"),
        help="hub cache folder (default: huggingface_hub's, or $HUGGINGFACE_HUB_CACHE)",
    )
    p.add_argument(
        "--task",
        # choices of plain strings: a wrong value is answered with the list, not a type error
        choices=[t.value for t in Task],
        help="override task detection (default: from the architecture, as TEI does); "
        "`--task rerank` on a *ForCausalLM exports a generative reranker (Qwen3-Reranker: "
        "the yes/no answer logits, prompt from the model card)",
    )
    p.add_argument(
        "--pooling",
        choices=[p.value for p in Pooling],
        help="override pooling (default: 1_Pooling/config.json, else the model card's)",
    )
    p.add_argument(
        "--dense-path",
        metavar="FOLDER",
        help="the one Dense module folder to put into the graph, e.g. 2_Dense_256 when the "
        "checkpoint ships several (default: the Dense modules modules.json lists, as TEI)",
    )
    p.add_argument(
        "--adapter",
        metavar="TASK",
        help="the task LoRA adapter to merge into the weights, for checkpoints that carry "
        "some (jina-embeddings-v3: retrieval.query, retrieval.passage, separation, "
        "classification, text-matching); its task instruction becomes the default prompt "
        "(default: none, the base weights)",
    )
    p.add_argument(
        "--variants",
        type=_precisions,
        default=[Precision.FP32, Precision.FP16, Precision.INT8],
        help="comma-separated precisions to write: fp32,fp16,int8 (default: all three)",
    )
    p.add_argument("--opset", type=_opset, default=17,
                   help=f"ONNX opset, {OPSETS.start}-{OPSETS.stop - 1} (default: 17; "
                        f"{_opset_floors()})")
    p.add_argument(
        "--trust-remote-code", action="store_true", help="allow the model's own Python code"
    )
    p.add_argument(
        "--external-data",
        action="store_true",
        help="write each graph's weights to <graph>.data even when it fits in one file "
        "(automatic over ~2 GB)",
    )
    p.add_argument(
        "--plain-graphs",
        action="store_true",
        help="also write the plain traced graphs (fp32, int8), which onnxruntime fuses at "
        "load, where the model card names no CPU class for them: `tei-runtime --print-host "
        "--graph plain` and load(graph=\"plain\") can then run them to compare on this host "
        "(default: only where the card measured them faster)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTPUT_DIR if it is an earlier artifact (a tei-onnx manifest.json and "
        "only the files it names) or an empty folder; anything else is refused",
    )
    p.add_argument("--quiet", action="store_true",
                   help="no progress display or notes, and no warnings from transformers "
                   "(the export's own warnings still print: where the artifact differs from "
                   "what sentence-transformers makes of the checkpoint, or an option did "
                   "nothing)")
    return p


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


# Python's default for these ends the process at once, leaving the partial folder.
_UNWINDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:  # torch, transformers and onnx take seconds to import: Ctrl-C may land here
        from tei_export.api import export_model
    except KeyboardInterrupt:
        print("tei-export: interrupted; nothing was written", file=sys.stderr)
        return 130
    except ImportError as e:  # a serving-only install ships this module, not its stack
        print(f"tei-export: error: the exporter needs {e.name or e}, which is not installed: "
              f"install tei-onnx with its `export` extra (from a checkout: "
              f"pip install '.[export]')", file=sys.stderr)  # fmt: skip
        return 1

    # Only the main thread may set a handler (an in-process caller on another keeps its own).
    in_main = threading.current_thread() is threading.main_thread()
    signals = _UNWINDING_SIGNALS if in_main else ()
    previous = {sig: signal.signal(sig, _terminate) for sig in signals}
    try:
        return _export(args, export_model)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _export(args: argparse.Namespace, export_model: Callable[..., Path]) -> int:
    try:
        export_model(
            args.model,
            args.output_dir,
            revision=args.revision,
            token=args.hf_token,
            cache_dir=args.cache_dir,
            task=Task(args.task) if args.task else None,
            pooling=Pooling(args.pooling) if args.pooling else None,
            precisions=args.variants,
            trust_remote_code=args.trust_remote_code,
            opset=args.opset,
            overwrite=args.overwrite,
            external_data=args.external_data,
            dense_path=args.dense_path,
            adapter=args.adapter,
            plain_graphs=args.plain_graphs,
            quiet=args.quiet,
        )
    except (ExportError, CardError) as e:
        print(f"tei-export: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a quota, a read-only file system: the system's words
        # Not every OSError carries its file (onnx's writer, a C extension, raises none):
        # then the output folder is what the user can act on.
        where = f": {e.filename}" if e.filename else f" writing {Path(args.output_dir).resolve()}"
        print(f"tei-export: error: {e.strerror or e}{where}; nothing was written",
              file=sys.stderr)  # fmt: skip
        return 1
    except InterruptedAfterWriting as done:
        what = (signal.Signals(done.interrupt.signum).name
                if isinstance(done.interrupt, Terminated) else "interrupted")  # fmt: skip
        print(f"tei-export: {what} after the artifact was written: {done.output_dir} is "
              "complete", file=sys.stderr)  # fmt: skip
        return 0
    except KeyboardInterrupt:
        print("tei-export: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Terminated as t:
        print(f"tei-export: {signal.Signals(t.signum).name}: stopped; nothing was written",
              file=sys.stderr)  # fmt: skip
        return 128 + t.signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
