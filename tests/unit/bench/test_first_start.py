"""bench.first_start's parts that need no export: the table, and a start that dies or hangs
reported as one error naming the command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import first_start


def test_table_has_a_row_per_start_and_a_column_per_round() -> None:
    lines = first_start.table([[15.5, 1.0, 35.3, 0.9], [15.3, 1.04, 35.9, 0.85]])
    assert lines[0] == "| start | round 1 s | round 2 s |"
    assert len(lines) == 2 + len(first_start.STEPS)
    assert lines[2] == "| first start, empty hub cache | 15.5 | 15.3 |"
    assert lines[-1] == "| --dtype int8 again | 0.9 | 0.8 |"


def _fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """tei-serve replaced by a Python script of BODY that never serves."""
    script = tmp_path / "tei-serve"
    script.write_text(f"#!{sys.executable}\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr(first_start, "tei_serve", lambda: str(script))


def test_a_server_that_exits_is_an_error_with_its_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_server(tmp_path, monkeypatch, "import sys; sys.exit('no model here')")
    with pytest.raises(first_start.StartError, match="exited 1: no model here"):
        first_start.time_to_healthy(tmp_path, 1, (), timeout_s=30)


def test_a_server_that_never_answers_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_server(tmp_path, monkeypatch, "import time; time.sleep(60)")
    with pytest.raises(first_start.StartError, match="not healthy after 1 s"):
        first_start.time_to_healthy(tmp_path, 1, (), timeout_s=1)


def test_rounds_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        first_start.main(["--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
