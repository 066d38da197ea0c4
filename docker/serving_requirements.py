"""Print a serving image's requirements: the project's dependencies with its onnxruntime swapped.

    python3 serving_requirements.py pyproject.toml onnxruntime-gpu > requirements.txt

The project's `dependencies` name the CPU `onnxruntime`; the GPU, ROCm and OpenVINO builds
install the same module, so an image must hold exactly one of them. Reading the list from
pyproject.toml at build time keeps the images in step with `pip install .` (no second list to
forget), and versions still come from constraints.txt. Standard library only: it runs in the
image before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# Every distribution that provides the `onnxruntime` module (the ones this project targets).
ORT_BUILDS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-rocm", "onnxruntime-openvino")

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised name: `Foo_Bar.baz` -> `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(match.group(1))


def serving_requirements(pyproject: Path, ort_package: str) -> list[str]:
    if canonical(ort_package) not in ORT_BUILDS:
        raise ValueError(f"{ort_package!r} is not an onnxruntime build ({', '.join(ORT_BUILDS)})")
    project = tomllib.loads(pyproject.read_text())["project"]
    deps: list[str] = list(project["dependencies"])
    kept = [d for d in deps if requirement_name(d) not in ORT_BUILDS]
    if len(kept) != len(deps) - 1:
        raise ValueError(f"{pyproject}: expected exactly one onnxruntime dependency in {deps}")
    return [*kept, canonical(ort_package)]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        lines = serving_requirements(Path(argv[0]), argv[1])
    except ValueError as e:
        print(f"serving_requirements: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
