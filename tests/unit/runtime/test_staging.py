"""Staging folders (tei_runtime.staging): what a killed builder left is removed by the next
run for the same target, never a folder a live process is building."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tei_runtime.staging import remove_abandoned, staging_folder


def _abandoned(folder: Path) -> Path:
    """A staging folder whose process died: nobody holds its lock."""
    (folder / "trace").mkdir(parents=True)
    (folder / "model.fp32.onnx").write_bytes(b"x" * 100)
    return folder


def test_an_abandoned_folder_goes_a_live_one_stays(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    dead = _abandoned(tmp_path / ".artifact.partial-dead")
    other_tag = _abandoned(tmp_path / ".artifact.x-dead")  # another kind of staging
    other_target = _abandoned(tmp_path / ".other.partial-dead")
    with staging_folder(out, "partial-") as live:
        assert live.parent == tmp_path and live.name.startswith(".artifact.partial-")
        assert remove_abandoned(out, "partial-") == [dead]
        assert live.is_dir()
    assert not dead.exists() and other_tag.is_dir() and other_target.is_dir()
    assert remove_abandoned(out, "partial-") == [live]  # its process let go without a rename


def test_a_folder_locked_by_another_descriptor_is_in_use(tmp_path: Path) -> None:
    busy = _abandoned(tmp_path / ".t.busy")
    fd = os.open(busy, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_abandoned(tmp_path / "t") == []
    finally:
        os.close(fd)
    assert remove_abandoned(tmp_path / "t") == [busy]
