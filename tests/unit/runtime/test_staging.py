"""Staging folders (tei_runtime.staging): what a killed builder left is removed by the next
run for the same target, never a folder a live process is building."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tei_runtime.staging import remove_abandoned, staging_folder


def _abandoned(folder: Path) -> Path:
    """A staging folder whose process died: nobody holds its lock."""
    (folder / "trace").mkdir(parents=True)
    (folder / "model.fp32.onnx").write_bytes(b"x" * 100)
    return folder


def test_an_abandoned_folder_goes_a_live_one_stays(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    dead = _abandoned(tmp_path / ".artifact.partial-dead_123")
    other_tag = _abandoned(tmp_path / ".artifact.x-dead_123")  # another kind of staging
    other_target = _abandoned(tmp_path / ".other.partial-dead_123")
    with staging_folder(out, "partial-") as live:
        assert live.parent == tmp_path and live.name.startswith(".artifact.partial-")
        assert remove_abandoned(out, "partial-") == [dead]
        assert live.is_dir()
    assert not dead.exists() and other_tag.is_dir() and other_target.is_dir()
    assert remove_abandoned(out, "partial-") == [live]  # its process let go without a rename


def test_a_users_own_hidden_folders_beside_the_target_are_never_removed(
    tmp_path: Path,
) -> None:
    """Only what `staging_folder` names (its tag, then mkdtemp's 8 characters) is taken:
    `.artifact.backup` and the like are the user's."""
    target = tmp_path / "artifact"
    mine = [_abandoned(tmp_path / name) for name in (
        ".artifact.backup", ".artifact.partial-", ".artifact.partial-notes-2024",
        ".artifact.partial-ABCDEFGH", ".artifact.unpack-abcdefgh")]  # fmt: skip
    assert remove_abandoned(target, "partial-") == []
    assert all(folder.is_dir() for folder in mine)
    with pytest.raises(ValueError, match="needs a tag"):
        remove_abandoned(target, "")


def test_a_folder_locked_by_another_descriptor_is_in_use(tmp_path: Path) -> None:
    busy = _abandoned(tmp_path / ".t.x-busy_123")
    fd = os.open(busy, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_abandoned(tmp_path / "t", "x-") == []
    finally:
        os.close(fd)
    assert remove_abandoned(tmp_path / "t", "x-") == [busy]
