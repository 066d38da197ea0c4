"""--model-id resolution and TEI's start-up length rule."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from tei_serve import model_source
from tei_serve.cli import check_limits
from tei_serve.settings import Settings, SettingsError


def test_artifact_folder_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    assert model_source.resolve(str(tmp_path)) == (tmp_path, str(tmp_path))


def test_cached_export_reused(tmp_path: Path) -> None:
    key = model_source.cache_key("org/model", None, None, label="org/model")
    out = tmp_path / "tei-onnx" / key
    out.mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    assert model_source.resolve("org/model", cache_dir=str(tmp_path)) == (out, "org/model")
    assert key.startswith("org--model-")


def test_cache_key_depends_on_revision_and_pooling() -> None:
    keys = {model_source.cache_key("m", r, p) for r in (None, "v2") for p in (None, "cls")}
    assert len(keys) == 4


def test_missing_exporter_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("tei_export"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(model_source.ModelSourceError, match=r"tei-onnx\[export\]"):
        model_source.resolve("org/model", cache_dir=str(tmp_path))


def test_export_called_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_export(model: str, out: Path, **_: Any) -> Path:
        calls.append(out)
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        return out

    monkeypatch.setattr(model_source, "export", fake_export)
    first = model_source.resolve("org/model", cache_dir=str(tmp_path))
    second = model_source.resolve("org/model", cache_dir=str(tmp_path))
    assert first == second and len(calls) == 1


def test_hub_cache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert model_source.hub_cache(None) == tmp_path
    assert model_source.hub_cache("/data") == Path("/data")


def test_length_rule() -> None:
    check_limits(Settings(max_batch_tokens=512), 512)
    check_limits(Settings(max_batch_tokens=256), 512)  # auto-truncate: a warning
    with pytest.raises(SettingsError):
        check_limits(Settings(max_batch_tokens=256, auto_truncate=False), 512)
