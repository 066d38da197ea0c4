"""Putting a finished artifact in place: an earlier one survives a failed replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tei_export import api


def _artifact(folder: Path, text: str) -> Path:
    folder.mkdir()
    (folder / "manifest.json").write_text(text)
    return folder


def test_a_new_artifact_replaces_the_old_one_whole(tmp_path: Path) -> None:
    out = _artifact(tmp_path / "artifact", "old")
    api._move_into_place(_artifact(tmp_path / ".artifact.partial-x", "new"), out)
    assert (out / "manifest.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # nothing set aside
    fresh = tmp_path / "fresh"
    api._move_into_place(_artifact(tmp_path / ".fresh.partial-y", "first"), fresh)
    assert (fresh / "manifest.json").read_text() == "first"


def test_an_interrupted_replace_puts_the_old_artifact_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between setting the old artifact aside and renaming the new one in (the old
    code deleted the old one first: an interrupt there lost both)."""
    out = _artifact(tmp_path / "artifact", "old")
    work = _artifact(tmp_path / ".artifact.partial-x", "new")
    real_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self == work:
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        api._move_into_place(work, out)
    assert (out / "manifest.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".artifact.partial-x", "artifact"]
