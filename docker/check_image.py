"""Fail a serving image's build unless it holds exactly the onnxruntime build it was meant to.

    python check_image.py --onnxruntime onnxruntime-gpu

Checks, in the image's own interpreter: exactly one distribution providing the `onnxruntime`
module and it is the expected one (two would overwrite each other's files); none of the
export-time packages (torch, transformers, ...); no C compiler on PATH; `onnxruntime` imports.
Standard library only.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import shutil
import sys
from collections.abc import Callable, Iterable

ORT_BUILDS = frozenset(
    {
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-rocm",
        "onnxruntime-openvino",
        "onnxruntime-directml",
        "onnxruntime-qnn",
        "onnxruntime-training",
    }
)
# Export-time only: the serving images run ONNX graphs and never need these.
FORBIDDEN = frozenset(
    {
        "torch",
        "transformers",
        "optimum",
        "optimum-onnx",
        "sentence-transformers",
        "onnx",
        "tensorflow",
        "jax",
    }
)
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "nvcc", "hipcc")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> set[str]:
    return {canonical(d.metadata["Name"]) for d in importlib.metadata.distributions()}


def problems(
    expected_ort: str,
    distributions: Iterable[str],
    which: Callable[[str], str | None] = shutil.which,
) -> list[str]:
    names = {canonical(d) for d in distributions}
    found: list[str] = []
    builds = sorted(names & ORT_BUILDS)
    if builds != [canonical(expected_ort)]:
        found.append(
            f"onnxruntime builds installed: {builds or 'none'}; expected only {expected_ort}"
        )
    found += [f"{name} is installed (export-time only)" for name in sorted(names & FORBIDDEN)]
    found += [f"compiler on PATH: {path}" for tool in COMPILERS if (path := which(tool))]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--onnxruntime", required=True, help="the expected onnxruntime build")
    args = parser.parse_args(argv)
    found = problems(args.onnxruntime, installed())
    try:
        ort = importlib.import_module("onnxruntime")
        print(f"onnxruntime {ort.__version__}: {', '.join(ort.get_available_providers())}")
    except ImportError as e:
        found.append(f"onnxruntime does not import: {e}")
    for line in found:
        print(f"check_image: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
