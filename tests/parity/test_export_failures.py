"""The exporter's failure modes, end to end: a clear one-line error and nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.tiny_models import build_checkpoint
from tei_runtime.manifest import GraphForm, read_manifest

pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tei_export", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _assert_failed_cleanly(
    result: subprocess.CompletedProcess[str], out: Path, *words: str
) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tei-export: error: ")
    for word in words:
        assert word in lines[0]
    assert not out.exists()
    siblings = list(out.parent.iterdir()) if out.parent.is_dir() else []
    leftovers = [p.name for p in siblings if p.name.startswith(f".{out.name}.")]
    assert leftovers == []  # no partial artifact, scratch copy or set-aside artifact


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("ck") / "bert", "bert", st_pooling="mean")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_missing_tokenizer_json(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    (checkpoint / "tokenizer.json").unlink()
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "tokenizer.json")


def test_unsupported_architecture_lists_supported(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(model_type="gpt2", architectures=["GPT2Model"])
    (checkpoint / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "GPT2Model", "bert", "qwen3")


def test_unwritable_output_folder(tmp_path: Path, tiny_bert: Path) -> None:
    # A file where the parent folder should be: unwritable even for root (CI runs as root).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    out = blocker / "artifact"
    result = _cli(str(tiny_bert), str(out))
    assert result.returncode == 1
    assert f"{blocker} is a file, not a folder" in result.stderr  # not "File exists"
    assert result.stderr.count("\n") == 1


def test_read_only_output_folder(tmp_path: Path, tiny_bert: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        probe = parent / "probe"
        try:
            probe.write_text("")
            probe.unlink()
            root_ignores_modes = True
        except PermissionError:
            root_ignores_modes = False
        out = parent / "artifact"
        result = _cli(str(tiny_bert), str(out))
        if root_ignores_modes:
            assert result.returncode == 0  # root writes anyway; the export must still succeed
        else:
            _assert_failed_cleanly(result, out, "cannot write to")
    finally:
        parent.chmod(0o700)


def test_corrupted_weights(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    weights.write_bytes(bytes(data[: len(data) // 2]))
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "cannot load the weights")


def test_garbage_weights(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    (checkpoint / "model.safetensors").write_bytes(b"\x00" * 4096)
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "cannot load the weights")


def test_a_nan_weight_is_named_before_any_work(tmp_path: Path, tiny_bert: Path) -> None:
    """One NaN weight made every output NaN and failed deep in int8 calibration, or in
    validation, with a traceback."""
    from safetensors.numpy import load_file, save_file

    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    weights = load_file(str(checkpoint / "model.safetensors"))
    name = next(k for k in sorted(weights) if k.endswith("query.weight"))
    weights[name][0, 0] = float("nan")
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out" / "artifact"
    for variants in ("fp32", "fp32,int8"):
        _assert_failed_cleanly(_cli(str(checkpoint), str(out), "--variants", variants), out,
                               "NaN or infinite", name.split(".", 1)[-1])  # fmt: skip


def test_missing_weights_are_named_not_filled_with_noise(tmp_path: Path, tiny_bert: Path) -> None:
    """transformers fills a weight the checkpoint lacks with random values; the export would
    then ship noise (or fail validation, blaming itself). The error names the weights."""
    from safetensors.torch import load_file, save_file

    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    weights = load_file(checkpoint / "model.safetensors")
    gone = sorted(k for k in weights if k.endswith("attention.self.query.weight"))[-1]
    save_file({k: v for k, v in weights.items() if k != gone}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    out = tmp_path / "out" / "artifact"
    name = gone.removeprefix("bert.")
    _assert_failed_cleanly(_cli(str(checkpoint), str(out), "--variants", "fp32"), out,
                           "lacks weights", name)  # fmt: skip
    # A bare encoder's unused pooler may be missing (embedding checkpoints often lack it).
    pooler = {k: v for k, v in weights.items() if ".pooler." not in f".{k}"}
    if len(pooler) < len(weights):
        save_file(pooler, checkpoint / "model.safetensors", metadata={"format": "pt"})
        done = _cli(str(checkpoint), str(out), "--variants", "fp32")
        assert done.returncode == 0, done.stderr


def test_a_config_with_fewer_layers_than_its_weights_is_refused(
    tmp_path: Path, tiny_bert: Path
) -> None:
    """transformers builds the model config.json describes and drops the layers it has no room
    for; the validation compares against that same truncated model, so only this says so."""
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    config = json.loads((checkpoint / "config.json").read_text())
    layers = config["num_hidden_layers"]
    assert layers >= 2
    config["num_hidden_layers"] = layers - 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out), "--variants", "fp32"), out,
                           "no room for", f"encoder.layer.{layers - 1}.*")  # fmt: skip


def test_remote_code_needs_the_flag(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    config["architectures"] = ["CustomModel"]  # no class of transformers: its code is needed
    (checkpoint / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "--trust-remote-code")


def test_existing_output_needs_overwrite(tmp_path: Path, tiny_bert: Path) -> None:
    out = tmp_path / "artifact"
    first = _cli(str(tiny_bert), str(out), "--variants", "fp32")
    assert first.returncode == 0, first.stderr
    # bert.toml names no class for the plain graph: only the fused one.
    assert sorted(p.name for p in out.glob("*.onnx")) == ["model.fp32.onnx"]
    manifest = (out / "manifest.json").read_bytes()
    second = _cli(str(tiny_bert), str(out), "--variants", "fp32")
    assert second.returncode == 1
    assert "--overwrite" in second.stderr
    assert (out / "manifest.json").read_bytes() == manifest
    third = _cli(str(tiny_bert), str(out), "--variants", "fp32,int8", "--overwrite",
                 "--plain-graphs")  # fmt: skip
    assert third.returncode == 0, third.stderr
    files = sorted(p.name for p in out.glob("*.onnx"))
    assert files == [
        "model.fp32.onnx", "model.fp32.plain.onnx", "model.int8.onnx", "model.int8.plain.onnx"
    ]
    # For no class: the fused graphs stay the default everywhere.
    plain = [v for v in read_manifest(out).variants if v.graph is GraphForm.PLAIN]
    assert [(v.name, v.hosts) for v in plain] == [("fp32-plain", []), ("int8-plain", [])]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # the old one removed


def test_overwrite_replaces_only_an_artifact(tmp_path: Path, tiny_bert: Path) -> None:
    """--overwrite never deletes the checkpoint, a folder of other things or a file: each is
    refused, in one line, before any work."""
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    before = sorted(p.name for p in checkpoint.iterdir())
    itself = _cli(str(checkpoint), str(checkpoint), "--overwrite")
    assert itself.returncode == 1 and "not an artifact folder" in itself.stderr, itself.stderr
    assert sorted(p.name for p in checkpoint.iterdir()) == before
    (tmp_path / "thesis.txt").write_text("important")
    parent = _cli(str(checkpoint), str(tmp_path), "--overwrite")
    assert parent.returncode == 1 and "not an artifact folder" in parent.stderr
    assert (tmp_path / "thesis.txt").read_text() == "important"
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    file_out = _cli(str(checkpoint), str(a_file), "--overwrite")
    assert file_out.returncode == 1 and "is a file" in file_out.stderr
    assert a_file.read_text() == "x"
    # An artifact folder that holds the checkpoint is not replaced either (even where its
    # manifest names the checkpoint's folder as one of its files).
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "manifest.json").write_text('{"schema_version": 1, "variants": [{"file": "ck"}]}')
    inside = _copy(tiny_bert, holder / "ck")
    held = _cli(str(inside), str(holder), "--overwrite")
    assert held.returncode == 1 and "holds the checkpoint" in held.stderr, held.stderr
    assert sorted(p.name for p in inside.iterdir()) == before
    # A manifest.json alone is no artifact: a web app's folder is refused, nothing taken.
    webapp = tmp_path / "webapp"
    (webapp / "src").mkdir(parents=True)
    (webapp / "manifest.json").write_text('{"name": "my app", "start_url": "/"}')
    (webapp / "src" / "index.js").write_text("main()")
    app = _cli(str(checkpoint), str(webapp), "--overwrite")
    assert app.returncode == 1 and "not a tei-onnx manifest" in app.stderr, app.stderr
    assert (webapp / "src" / "index.js").read_text() == "main()"
    for result in (itself, parent, file_out, held, app):
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_failed_export_takes_away_the_folders_it_made(tmp_path: Path, tiny_bert: Path) -> None:
    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "nope"}))
    out = tmp_path / "new" / "deep" / "artifact"
    _assert_failed_cleanly(_cli(str(checkpoint), str(out)), out, "nope")
    assert not (tmp_path / "new").exists()


def test_failure_after_tracing_leaves_nothing(tmp_path: Path, tiny_bert: Path) -> None:
    """A tolerance nobody can meet fails validation, the last stage: still nothing is left."""
    from tei_export import api
    from tei_export.errors import ExportError

    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    out = tmp_path / "out" / "artifact"
    original = api.validate.validate

    def failing(*args: object, **kwargs: object) -> object:
        original(*args, **kwargs)  # type: ignore[arg-type]
        raise ExportError("fp32: min cosine under tolerance")

    api.validate.validate = failing  # type: ignore[assignment]
    try:
        with pytest.raises(ExportError):
            api.export_model(str(checkpoint), out, quiet=True, precisions=["fp32"])
    finally:
        api.validate.validate = original
    assert not out.exists()
    assert not out.parent.exists()  # the export made it, and took it away again


def test_quiet_export_prints_nothing(tmp_path: Path, tiny_bert: Path) -> None:
    """--quiet also silences the libraries' own bars (transformers 5's "Loading weights")."""
    out = tmp_path / "artifact"
    result = _cli(str(tiny_bert), str(out), "--variants", "fp32")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert (out / "manifest.json").is_file()


def test_quiet_still_prints_the_exports_own_notes(tmp_path: Path, tiny_bert: Path) -> None:
    """A note says where the artifact differs from sentence-transformers' reading of the
    checkpoint (here: no pooling config, so the card's default pooling): --quiet keeps it."""
    import shutil

    checkpoint = _copy(tiny_bert, tmp_path / "ck")
    shutil.rmtree(checkpoint / "1_Pooling")
    (checkpoint / "modules.json").unlink()
    result = _cli(str(checkpoint), str(tmp_path / "artifact"), "--variants", "fp32")
    assert result.returncode == 0, result.stderr
    assert "no 1_Pooling/config.json" in result.stderr, result.stderr
    assert "✓" not in result.stderr  # no progress
    # an option that does nothing says so: plain graphs are fp32 and int8 only
    fp16 = _cli(str(checkpoint), str(tmp_path / "fp16"), "--variants", "fp16", "--plain-graphs")
    assert fp16.returncode == 0, fp16.stderr
    assert "--plain-graphs does nothing here" in fp16.stderr, fp16.stderr


def test_an_interrupt_after_the_artifact_is_in_place_says_it_is_complete(
    tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Ctrl-C while the summary prints (or the replaced artifact is removed) comes after the
    rename: the artifact is whole, so the CLI says so and exits 0, not "nothing written"."""
    from tei_export.cli import main
    from tei_export.progress import Progress

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "summary", interrupted)
    out = tmp_path / "artifact"
    assert main([str(tiny_bert), str(out), "--variants", "fp32", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == f"tei-export: interrupted after the artifact was written: {out} is complete\n"
    import tei_runtime

    assert tei_runtime.load(out).embed(["a cat"]).shape == (1, 32)


def test_what_a_killed_export_left_is_swept_by_the_next(tmp_path: Path, tiny_bert: Path) -> None:
    """SIGKILL leaves the scratch copies (a hub layout's native weights, a converted
    tokenizer) and an artifact set aside by --overwrite; the next export into the same place
    removes them (no process holds their lock any more)."""
    out = tmp_path / "artifact"
    for name in (".artifact.scratch-dead_123", ".artifact.replaced-0a1b2c3d",
                 ".artifact.partial-dead_123", ".artifact.backup"):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * 1024)
    result = _cli(str(tiny_bert), str(out), "--variants", "fp32")
    assert result.returncode == 0, result.stderr
    # the user's own hidden folder beside it stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [".artifact.backup", "artifact"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_mid_export_leaves_nothing(
    tmp_path: Path, tiny_bert: Path, sig: signal.Signals
) -> None:
    """docker stop / a job's kill (SIGTERM), a closed terminal or SSH session (SIGHUP): once
    the partial folder exists it ends the export with 128 + the signal and removes that
    folder, as Ctrl-C does."""
    out = tmp_path / "out" / "artifact"
    out.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tei_export", str(tiny_bert), str(out), "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not any(".partial-" in p.name for p in out.parent.iterdir()):
            assert proc.poll() is None, "the export ended before its partial folder was seen"
            assert time.monotonic() < deadline, "no partial folder after 300 s"
            time.sleep(0.005)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, stderr
    assert f"tei-export: {sig.name}: stopped; nothing was written" in stderr
    assert list(out.parent.iterdir()) == []
