"""Putting a finished artifact in place: an earlier one survives a failed replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tei_export import api
from tei_export.errors import ExportError


def _artifact(folder: Path, text: str) -> Path:
    """A folder --overwrite may replace: a manifest.json of tei-onnx's shape, marked `text`."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"schema_version": 1, "variants": [],
                                                      "mark": text}))  # fmt: skip
    return folder


def _mark(folder: Path) -> str:
    mark: str = json.loads((folder / "manifest.json").read_text())["mark"]
    return mark


def _refuse_renames(monkeypatch: pytest.MonkeyPatch, folder: Path, error: BaseException) -> None:
    """Renaming FOLDER raises ERROR (a mount point's EBUSY, Ctrl-C at that instant)."""
    real_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self == folder:
            raise error
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)


def test_a_new_artifact_replaces_the_old_one_whole(tmp_path: Path) -> None:
    out = _artifact(tmp_path / "artifact", "old")
    aside = api._move_into_place(_artifact(tmp_path / ".artifact.partial-x", "new"), out, True)
    assert _mark(out) == "new"
    # the old one set aside whole, for the caller to remove once the new one is in place
    assert aside is not None and _mark(aside) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [aside.name, "artifact"]
    fresh = tmp_path / "fresh"
    assert api._move_into_place(_artifact(tmp_path / ".fresh.partial-y", "first"), fresh,
                                False) is None  # fmt: skip
    assert _mark(fresh) == "first"


def test_an_interrupted_replace_puts_the_old_artifact_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between setting the old artifact aside and renaming the new one in (the old
    code deleted the old one first: an interrupt there lost both)."""
    out = _artifact(tmp_path / "artifact", "old")
    work = _artifact(tmp_path / ".artifact.partial-x", "new")
    _refuse_renames(monkeypatch, work, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        api._move_into_place(work, out, True)
    assert _mark(out) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".artifact.partial-x", "artifact"]


def test_what_appeared_meanwhile_is_replaced_only_as_at_the_start(tmp_path: Path) -> None:
    """The start's check again at the end: a folder made at the output while the export ran
    is kept without --overwrite, and with it replaced only if it is an artifact or empty."""
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    work = _artifact(tmp_path / ".artifact.partial-x", "new")
    with pytest.raises(ExportError, match="appeared while the export ran"):
        api._move_into_place(work, out, False)
    with pytest.raises(ExportError, match="is not an artifact folder"):
        api._move_into_place(work, out, True)
    assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == [
        "notes.txt"
    ]
    (out / "notes.txt").unlink()  # an empty folder: refused as at the start, unless told
    with pytest.raises(ExportError, match="appeared while the export ran"):
        api._move_into_place(work, out, False)
    api._move_into_place(work, out, True)
    assert _mark(out) == "new"
    other = _artifact(tmp_path / "other", "someone else's")
    with pytest.raises(ExportError, match="appeared while the export ran"):
        api._move_into_place(_artifact(tmp_path / ".other.partial-y", "mine"), other, False)
    assert _mark(other) == "someone else's"


def test_a_rename_the_system_refuses_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _artifact(tmp_path / "artifact", "old")
    _refuse_renames(monkeypatch, out, OSError(16, "Device or resource busy"))
    with pytest.raises(ExportError, match=r"cannot move the artifact into .*: Device or resource"):
        api._move_into_place(_artifact(tmp_path / ".artifact.partial-x", "new"), out, True)
    assert _mark(out) == "old"


def test_output_mistakes_are_found_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match=r"afile is a file, not a folder"):
        api._prepare_output(tmp_path / "afile" / "sub" / "out", overwrite=False)
    assert not (tmp_path / "afile" / "sub").exists()
    # a mount point (docker run -v ...:/out) cannot be renamed: said before hours of work
    mounted = _artifact(tmp_path / "out", "old")
    api._prepare_output(mounted, overwrite=True)  # the probe renames it aside and back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "out"]
    _refuse_renames(monkeypatch, mounted, OSError(16, "Device or resource busy"))
    with pytest.raises(ExportError, match=r"cannot be replaced .*a mount point.*a folder inside"):
        api._prepare_output(mounted, overwrite=True)
    api._prepare_output(mounted / "model", overwrite=False)
    assert _mark(mounted) == "old"


def test_overwrite_replaces_no_folder_a_manifest_json_alone_marks(tmp_path: Path) -> None:
    """A browser extension's or a web app's folder has a manifest.json too: --overwrite must
    not take it, nor an artifact a user put files of their own into."""
    extension = tmp_path / "extension"
    (extension / "src").mkdir(parents=True)
    (extension / "manifest.json").write_text('{"manifest_version": 3, "name": "mine"}')
    (extension / "src" / "background.js").write_text("console.log(1)")
    with pytest.raises(ExportError, match=r"its manifest\.json is not a tei-onnx manifest"):
        api._prepare_output(extension, overwrite=True)
    (extension / "manifest.json").write_text("not json")
    with pytest.raises(ExportError, match="is not a tei-onnx manifest"):
        api._prepare_output(extension, overwrite=True)
    assert (extension / "src" / "background.js").read_text() == "console.log(1)"

    artifact = _artifact(tmp_path / "artifact", "old")
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["variants"] = [{"file": "model.fp32.onnx", "external_data": {"model.fp32.data": "x"}}]
    manifest["tokenizer_files"] = ["tokenizer.json"]
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    for name in ("model.fp32.onnx", "model.fp32.data", "tokenizer.json"):
        (artifact / name).write_text(name)
    api._prepare_output(artifact, overwrite=True)  # every file named: replaceable
    (artifact / "NOTES.md").write_text("mine")
    (artifact / "runs").mkdir()
    with pytest.raises(ExportError, match=r"does not name \(NOTES\.md, runs\)"):
        api._prepare_output(artifact, overwrite=True)
    work = _artifact(tmp_path / ".artifact.partial-x", "new")
    with pytest.raises(ExportError, match="does not name"):  # checked again at the end
        api._move_into_place(work, artifact, True)
    assert (artifact / "NOTES.md").read_text() == "mine" and _mark(artifact) == "old"
