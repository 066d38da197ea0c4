from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rt_artifacts import ArtifactFactory, Built

from tei_runtime.__main__ import main
from tei_runtime.checksum import sha256_file


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


def test_print_host_graph_flag(embed_artifact: Built, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-host", str(embed_artifact.root), "--graph", "fused"]) == 0
    variant = json.loads(capsys.readouterr().out)["variant"]
    assert (variant["graph"], variant["why"]) == ("fused", "the fused graph, as asked (--graph)")
    # this artifact has no plain graph: the same refusal load() gives
    assert main(["--print-host", str(embed_artifact.root), "--graph", "plain"]) == 1
    assert "no plain fp32 graph" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.parametrize("argv", [[], ["artifacts/minilm"]])
def test_without_flag_says_what_to_do(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "usage" in err and "error: nothing to do: --print-host is the one action" in err


def _unloadable(built: Built) -> Path:
    """The artifact with a graph onnxruntime cannot parse, its checksum updated to match."""
    graph = built.root / "model.fp32.onnx"
    graph.write_bytes(b"not an onnx graph" * 64)
    manifest = json.loads((built.root / "manifest.json").read_text())
    for variant in manifest["variants"]:
        if variant["file"] == graph.name:
            variant["sha256"] = sha256_file(graph)
    (built.root / "manifest.json").write_text(json.dumps(manifest))
    return built.root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_model_onnxruntime_cannot_load_is_a_one_line_error(
    make_artifact: ArtifactFactory,
) -> None:
    """tei-serve ends with the runtime's error on one line (TeiRuntimeError is every CLI's
    one base class), not a traceback; tei-runtime does the same for a broken manifest."""
    root = _unloadable(make_artifact())
    serve = _run("-m", "tei_serve", "--model-id", str(root), "--port", "0", "--dtype", "float32")
    assert serve.returncode == 1, serve.stderr
    assert "Traceback" not in serve.stderr
    [line] = [x for x in serve.stderr.splitlines() if "ERROR" in x]
    assert "onnxruntime cannot load it" in line

    (root / "manifest.json").write_text("{ not json")
    runtime = _run("-m", "tei_runtime", "--print-host", str(root))
    assert runtime.returncode == 1
    assert "Traceback" not in runtime.stderr
    assert "manifest.json" in json.loads(runtime.stdout)["error"]
