from __future__ import annotations

import json

import pytest
from rt_artifacts import Built

from tei_runtime.__main__ import main


def test_print_host_without_artifact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-host"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "CPUExecutionProvider" in report["host"]["providers"]
    assert report["host"]["usable_cores"] >= 1


def test_print_host_with_artifact(
    embed_artifact: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--print-host", str(embed_artifact.root), "--intra-op-threads", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["choice"]["provider"] == "CPUExecutionProvider"
    assert report["choice"]["intra_op_threads"] == 2
    assert report["variant"]["file"] == "model.fp32.onnx"


def test_print_host_reports_an_impossible_choice(
    embed_artifact: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--print-host", str(embed_artifact.root), "--device", "cuda"]) == 1
    assert "onnxruntime-gpu" in json.loads(capsys.readouterr().out)["error"]


def test_without_flag_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err
