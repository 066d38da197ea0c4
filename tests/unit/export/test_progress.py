"""Progress off a terminal: a line as each stage starts and one as it ends."""

from __future__ import annotations

import pytest

from tei_export.progress import Progress


def test_each_stage_is_announced_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress()
    assert not progress.console.is_terminal  # pytest captures stderr
    with progress.stage("int8"):
        assert capsys.readouterr().err == "int8 ...\n"  # said before the work, not after
    assert "✓ int8" in capsys.readouterr().err
    with Progress(quiet=True).stage("fp16"):
        pass
    assert capsys.readouterr().err == ""
    with progress.stage("plan", announce=False):
        assert capsys.readouterr().err == ""


def test_quiet_hides_progress_and_notes_not_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A warning says where the artifact differs from sentence-transformers' reading of the
    checkpoint: --quiet (progress and routine notes off) keeps it."""
    quiet = Progress(quiet=True)
    with quiet.stage("fp32"):
        quiet.note("model.int8.onnx: 22 weight products static int8")
        quiet.warn("no 1_Pooling/config.json: using the card's default pooling cls")
    assert capsys.readouterr().err == (
        "! no 1_Pooling/config.json: using the card's default pooling cls\n"
    )
