"""JSON_OUTPUT: every line tei-serve logs is one JSON object, from the first (what reading the
settings warns about, such as Docker's HOSTNAME) on, with TEI's RFC 3339 UTC timestamps."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tei_serve.cli import main


@pytest.fixture
def root_handlers() -> Iterator[None]:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    yield
    root.handlers[:] = saved
    root.setLevel(level)


@pytest.mark.usefixtures("root_handlers")
def test_json_output_lines_are_all_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOSTNAME", "d3adb33fcafe")  # a container id, as Docker sets it
    monkeypatch.setenv("JSON_OUTPUT", "true")
    missing = tmp_path / "no-such-model"
    assert main(["--model-id", str(missing), "--port", "0", "--prometheus-port", "0"]) != 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line parses
    assert entries[0]["message"] == "invalid hostname 'd3adb33fcafe', defaulting to 0.0.0.0"
    assert entries[0]["level"] == "WARNING"
    assert any(str(missing) in e["message"] for e in entries[1:])
    for e in entries:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["timestamp"])
