"""`python -m tei_runtime --print-host [ARTIFACT]`: what the probe found and what load() would use.

Prints JSON for operators; loads no session, so it is safe on a busy host.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from tei_runtime.artifact import open_artifact
from tei_runtime.errors import TeiRuntimeError
from tei_runtime.host import CpuClass, probe
from tei_runtime.loader import graph_form, pick_variant, plan
from tei_runtime.manifest import Variant


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tei-runtime", description=__doc__)
    parser.add_argument("--print-host", action="store_true", help="print the host probe")
    parser.add_argument("artifact", nargs="?", type=Path, help="artifact folder to plan for")
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda|tensorrt|rocm|openvino")
    parser.add_argument("--dtype", default="auto", help="auto|float32|float16|int8 (or fp32, fp16)")
    parser.add_argument("--intra-op-threads", type=int, default=None)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--graph", default="auto", help="auto|fused|plain: the CPU graph load(graph=...) takes"
    )
    return parser


def variant_reason(variant: Variant, cpu: CpuClass, *, forced: bool = False) -> str:
    if forced:
        return f"the {variant.graph.value} graph, as asked (--graph)"
    if cpu in variant.hosts:
        return f"the {variant.graph.value} graph, measured faster on {cpu.value} hosts"
    return f"the {variant.precision.value} default ({variant.graph.value} graph)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.print_host:
        _parser().error(
            "nothing to do: --print-host is the one action (what this host runs the artifact "
            "with); embed from Python (tei_runtime.load) or serve it (tei-serve)"
        )
    host = probe()
    report: dict[str, object] = {
        "host": {**msgspec.to_builtins(host), "usable_cores": host.usable_cores}
    }
    if args.artifact is not None:
        try:
            artifact = open_artifact(args.artifact)
            choice = plan(
                artifact,
                host,
                device=args.device,
                dtype=args.dtype,
                intra_op_threads=args.intra_op_threads,
                max_batch_tokens=args.max_batch_tokens,
                cache_dir=args.cache_dir,
            )
            variant = pick_variant(artifact.manifest, choice, host, graph_form(args.graph))
        except TeiRuntimeError as e:
            report["error"] = str(e)
            sys.stdout.write(msgspec.json.format(msgspec.json.encode(report)).decode() + "\n")
            return 1
        report["choice"] = msgspec.to_builtins(choice)
        report["variant"] = {
            "name": variant.name,
            "file": variant.file,
            "graph": variant.graph.value,
            "cpu_class": host.cpu_class.value,
            "why": variant_reason(variant, host.cpu_class, forced=args.graph != "auto"),
        }
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report)).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
