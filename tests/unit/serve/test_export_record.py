"""A first-start export is reused only while what it was made from stands: the checkpoint
folder's files, the hub commit of its branch, and the exporter. The exporter is faked here;
tests/e2e/test_first_start_options.py restarts a real server on a re-saved checkpoint."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest

import tei_export.fingerprint
from support.imports import hide_package
from tei_runtime.manifest import Precision
from tei_serve import model_source
from tei_serve.export_record import ExportRecord, read_record, record_path, why_stale

SHA_A = "a" * 40
SHA_B = "b" * 40


class FakeExporter:
    """Stands in for tei_export.api.export_model: counts exports and what they were asked,
    and writes a manifest listing the precisions asked for (every one by default)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.overwrites: list[bool] = []
        self.precisions: list[list[str] | None] = []
        monkeypatch.setattr(model_source, "export", self)

    def __call__(
        self, model: str, out: Path, *, overwrite: bool = False,
        precisions: list[str] | None = None, **_: Any,
    ) -> Path:  # fmt: skip
        assert overwrite == out.exists()  # the exporter refuses an existing folder otherwise
        self.overwrites.append(overwrite)
        self.precisions.append(precisions)
        out.mkdir(parents=True, exist_ok=True)
        written = precisions or ["fp32", "fp16", "int8"]
        variants = [{"precision": p, "file": f"model.{p}.onnx"} for p in written]
        (out / "manifest.json").write_text(json.dumps({"variants": variants}))
        return out


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 128)
    return folder


def _save_again(checkpoint: Path) -> None:
    """What save_pretrained into the same folder does: new bytes, maybe the same size."""
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"\1" * 128)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_folder_saved_again_is_exported_again(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    first, _ = model_source.resolve(str(checkpoint), cache_dir=cache)
    assert model_source.resolve(str(checkpoint), cache_dir=cache)[0] == first
    assert exporter.overwrites == [False]
    assert read_record(first) is not None

    _save_again(checkpoint)
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        again, _ = model_source.resolve(str(checkpoint), cache_dir=cache)
    assert again == first and exporter.overwrites == [False, True]
    assert "exporting" in caplog.text and "the checkpoint changed since" in caplog.text
    model_source.resolve(str(checkpoint), cache_dir=cache)
    assert exporter.overwrites == [False, True]


def test_new_exporter_exports_again(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    model_source.resolve(str(checkpoint), cache_dir=cache)
    monkeypatch.setattr(tei_export.fingerprint, "exporter_fingerprint", lambda: "0123456789abcdef")
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache)
    assert exporter.overwrites == [False, True]
    record = read_record(out)
    assert record is not None and record.exporter == "0123456789abcdef"


def test_export_from_before_records_is_made_again_once(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache)
    record_path(out).unlink()
    model_source.resolve(str(checkpoint), cache_dir=cache)
    model_source.resolve(str(checkpoint), cache_dir=cache)
    assert exporter.overwrites == [False, True]


def test_unreadable_record_counts_as_none(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    record_path(out).write_text("{not json")
    assert read_record(out) is None


@pytest.mark.parametrize("absent", ["tei_export", "torch", "transformers", "onnx"])
def test_without_the_exporter_a_cached_export_is_served(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch, absent: str
) -> None:
    """A serving-only install cannot export again: it serves what the cache holds. Every
    install ships tei_export's modules; a serving-only one lacks the stack they run on."""
    FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache)
    record_path(out).unlink()
    _save_again(checkpoint)
    hide_package(monkeypatch, absent)
    monkeypatch.setattr(model_source, "export", None)  # never called
    assert model_source.resolve(str(checkpoint), cache_dir=cache)[0] == out


def _hub_cache_with(cache: Path, model: str, commit: str) -> None:
    """A hub cache as huggingface_hub leaves it, with `main` pointing at COMMIT."""
    repo = cache / f"models--{model.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text('{"model_type": "bert"}')


def test_hub_branch_that_moved_is_exported_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    exporter = FakeExporter(monkeypatch)
    cache = tmp_path / "hub"
    _hub_cache_with(cache, "org/model", SHA_A)
    out, _ = model_source.resolve("org/model", cache_dir=str(cache))
    record = read_record(out)
    assert record is not None and record.source == SHA_A
    model_source.resolve("org/model", cache_dir=str(cache))
    assert exporter.overwrites == [False]

    _hub_cache_with(cache, "org/model", SHA_B)  # what a download of the new head leaves
    model_source.resolve("org/model", cache_dir=str(cache))
    assert exporter.overwrites == [False, True]
    record = read_record(out)
    assert record is not None and record.source == SHA_B


def test_pinned_commit_needs_no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")  # empty: the commit is the revision itself
    out, _ = model_source.resolve("org/model", revision=SHA_A, cache_dir=cache)
    model_source.resolve("org/model", revision=SHA_A, cache_dir=cache)
    record = read_record(out)
    assert exporter.overwrites == [False] and record is not None and record.source == SHA_A


def test_unknown_hub_commit_keeps_the_export() -> None:
    """Offline with the branch's ref gone from the cache: nothing says it moved."""
    recorded = ExportRecord(exporter="e", source=SHA_A)
    assert why_stale(recorded, ExportRecord(exporter="e", source=None)) is None
    assert why_stale(recorded, ExportRecord(exporter="e", source=SHA_B)) is not None
    assert why_stale(None, ExportRecord(exporter="e", source=None)) is not None


def test_read_only_cache_serves_its_export(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    exporter = FakeExporter(monkeypatch)
    cache = tmp_path / "hub"
    out, _ = model_source.resolve(str(checkpoint), cache_dir=str(cache))
    _save_again(checkpoint)
    monkeypatch.setattr(
        model_source.os, "access", lambda path, mode: Path(path) != cache / "tei-onnx"
    )  # root may ignore file modes: the check is faked instead of chmod
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        assert model_source.resolve(str(checkpoint), cache_dir=str(cache))[0] == out
    assert exporter.overwrites == [False]
    assert "read-only" in caplog.text and "the checkpoint changed since" in caplog.text


def test_a_start_exports_the_precision_it_runs_and_a_later_one_adds_its_own(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The default CPU start needs fp32 only; a later --dtype int8 start exports again with
    int8 added and fp32 kept, so the first server's graph is still there for its restarts."""
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    fp32, int8 = [Precision.FP32], [Precision.INT8]
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache, precisions=fp32)
    assert exporter.precisions == [["fp32"]]
    assert model_source.exported_precisions(out) == {Precision.FP32}
    model_source.resolve(str(checkpoint), cache_dir=cache, precisions=fp32)
    assert exporter.overwrites == [False]

    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        again, _ = model_source.resolve(str(checkpoint), cache_dir=cache, precisions=int8)
    assert again == out and exporter.overwrites == [False, True]
    assert exporter.precisions[-1] == ["fp32", "int8"]
    assert "it has no int8 variant" in caplog.text
    for wanted in (fp32, int8, None):  # None: whatever it holds serves (an artifact does)
        model_source.resolve(str(checkpoint), cache_dir=cache, precisions=wanted)
    assert exporter.overwrites == [False, True]


def test_an_export_made_again_keeps_every_precision_it_had(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    model_source.resolve(str(checkpoint), cache_dir=cache)  # every variant
    _save_again(checkpoint)
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache, precisions=[Precision.FP16])
    assert exporter.precisions == [None, ["fp32", "fp16", "int8"]]
    assert model_source.exported_precisions(out) == set(Precision)


def test_a_read_only_cache_without_the_precision_serves_what_it_has(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Served as it is with a warning naming the folder and the precision; the load then
    fails for an explicit --dtype (ProviderError: the variants it has) or runs the best one it
    has for auto."""
    exporter = FakeExporter(monkeypatch)
    cache = tmp_path / "hub"
    fp32 = [Precision.FP32]
    out, _ = model_source.resolve(str(checkpoint), cache_dir=str(cache), precisions=fp32)
    monkeypatch.setattr(
        model_source.os, "access", lambda path, mode: Path(path) != cache / "tei-onnx"
    )
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        served, _ = model_source.resolve(
            str(checkpoint), cache_dir=str(cache), precisions=[Precision.INT8]
        )
    assert served == out and exporter.overwrites == [False]
    assert "read-only" in caplog.text and "no int8 variant" in caplog.text


def test_a_manifest_that_cannot_be_read_names_no_precisions(tmp_path: Path) -> None:
    assert model_source.exported_precisions(tmp_path) is None
    (tmp_path / "manifest.json").write_text("{not json")
    assert model_source.exported_precisions(tmp_path) is None
    (tmp_path / "manifest.json").write_text('{"variants": [{"precision": "fp8"}]}')
    assert model_source.exported_precisions(tmp_path) == frozenset()


def test_an_install_without_the_exporter_lacking_the_precision_says_so(
    tmp_path: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    FakeExporter(monkeypatch)
    cache = str(tmp_path / "hub")
    out, _ = model_source.resolve(str(checkpoint), cache_dir=cache, precisions=[Precision.FP32])
    hide_package(monkeypatch, "torch")
    monkeypatch.setattr(model_source, "export", None)  # never called
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        served, _ = model_source.resolve(
            str(checkpoint), cache_dir=cache, precisions=[Precision.INT8]
        )
    assert served == out
    assert "no int8 variant" in caplog.text and "no exporter" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tei_serve"):
        model_source.resolve(str(checkpoint), cache_dir=cache, precisions=[Precision.FP32])
    assert caplog.text == ""
