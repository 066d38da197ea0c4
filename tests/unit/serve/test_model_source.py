"""--model-id resolution and TEI's start-up length rule."""

from __future__ import annotations

import builtins
import hashlib
from pathlib import Path
from typing import Any

import pytest

from tei_runtime import manifest as manifest_module
from tei_runtime.manifest import Task
from tei_serve import cli, model_source
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


def test_cache_key_depends_on_the_task_and_keeps_the_old_key_without_one() -> None:
    keys = {model_source.cache_key("m", None, None, task=t) for t in (None, *Task)}
    assert len(keys) == 1 + len(Task)
    # Artifacts exported on first start before --task existed are found again.
    old_digest = hashlib.sha256(b"org/model\0None\0None").hexdigest()[:16]
    assert model_source.cache_key("org/model", None, None) == f"org--model-{old_digest}"


def test_task_reaches_the_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks: list[Task | None] = []

    def fake_export(model: str, out: Path, *, task: Task | None = None, **_: Any) -> Path:
        tasks.append(task)
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        return out

    monkeypatch.setattr(model_source, "export", fake_export)
    detected, _ = model_source.resolve("org/model", cache_dir=str(tmp_path))
    reranker, _ = model_source.resolve("org/model", cache_dir=str(tmp_path), task=Task.RERANK)
    assert tasks == [None, Task.RERANK] and detected != reranker


def test_task_that_an_artifact_is_not_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = type("Manifest", (), {"task": Task.EMBED, "max_input_length": 128})()
    monkeypatch.setattr(cli, "resolve", lambda *_, **__: (tmp_path, "my-artifact"))
    monkeypatch.setattr(manifest_module, "read_manifest", lambda _: manifest)
    with pytest.raises(SettingsError, match=r"`embed` artifact and --task asks for `rerank`"):
        cli.load_model(Settings(), "my-artifact", task=Task.RERANK)


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
