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
    captured = capsys.readouterr()
    assert captured.err == ""  # TEI writes its logs to stdout
    lines = [line for line in captured.out.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line parses
    assert entries[0]["message"] == "invalid hostname 'd3adb33fcafe', defaulting to 0.0.0.0"
    assert entries[0]["level"] == "WARN"  # tracing's name, not Python's WARNING
    assert entries[0]["filename"] == "tei_serve/settings.py"
    assert isinstance(entries[0]["line_number"], int)
    assert any(str(missing) in e["message"] for e in entries[1:])
    for e in entries:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["timestamp"])


def test_a_request_line_carries_its_span_fields_as_tei_does() -> None:
    from tei_serve.cli import JsonFormatter
    from tei_serve.observe import RequestSpan
    from tei_serve.serving import Metadata

    meta = Metadata(compute_chars=11, compute_tokens=4, total_time_ns=1_203_000,
                    tokenization_time_ns=80_000, queue_time_ns=12_000,
                    inference_time_ns=1_100_000)  # fmt: skip
    span = RequestSpan(name="embed", model="m", meta=meta)
    record = logging.LogRecord("tei_serve.access", logging.INFO, "/x/tei_serve/observe.py", 7,
                               "/embed model=m", None, None)  # fmt: skip
    record.span = span
    entry = json.loads(JsonFormatter().format(record))
    assert entry["span"] == {"name": "embed", "model": "m", "compute_chars": 11,
                             "compute_tokens": 4, "total_time": "1.203ms",
                             "tokenization_time": "80µs", "queue_time": "12µs",
                             "inference_time": "1.1ms"}  # fmt: skip
    assert entry["spans"] == [entry["span"]]
    assert (entry["filename"], entry["line_number"]) == ("tei_serve/observe.py", 7)
    assert "span" not in json.loads(JsonFormatter(spans=False).format(record))  # --disable-spans
