"""`python -m bench.report` refuses what is not a bench output folder, and writes nothing then."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report


@pytest.mark.parametrize("argv", [["--help"], ["-h"]])
def test_help_prints_usage_and_writes_no_folder(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        report.main(argv)
    assert done.value.code == 0
    assert "usage: python -m bench.report" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_a_folder_without_results_is_an_error_not_an_empty_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        report.main([str(tmp_path)])
    assert done.value.code == 2
    assert "holds no <model>/results.json" in capsys.readouterr().err
    assert not (tmp_path / "summary.md").exists()
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "missing")])
    assert not (tmp_path / "missing").exists()
