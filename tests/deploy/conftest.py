"""Deployment tests: images (bake + Dockerfile), bundles, air-gapped serving, Kubernetes, Ray.

`toy_artifact` is the runtime tests' tiny artifact (tests/unit/runtime/rt_artifacts.py: a real
onnx graph and tokenizer that `tei_runtime.load` runs), for fast tests of whole round trips;
the real all-MiniLM-L6-v2 artifact (`minilm_artifact`, tests/conftest.py) is for slow ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "runtime"))

from rt_artifacts import Spec, write_artifact  # noqa: E402


@pytest.fixture
def toy_artifact(tmp_path: Path) -> Path:
    return write_artifact(tmp_path / "toy", Spec()).root


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The images' build times and sizes (test_container.py), whatever the verbosity."""
    from containers import FIGURES

    if FIGURES:
        terminalreporter.section("images")
        for line in FIGURES:
            terminalreporter.write_line(line)
