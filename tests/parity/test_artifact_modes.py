"""An exported artifact is readable by other users (the images' user 1000), not 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_export_publishes_folder_0755_files_0644(tiny_reranker_artifact: Path) -> None:
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(tiny_reranker_artifact.stat().st_mode) == 0o755 & ~mask
    files = [p for p in tiny_reranker_artifact.rglob("*") if p.is_file()]
    assert files
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o644 & ~mask}
