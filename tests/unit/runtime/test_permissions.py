"""Published folders 0755 and files 0644, narrowed (never widened) by the process umask."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tei_runtime.permissions import current_umask, publish_file, publish_tree


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    before = os.umask(0o022)
    os.umask(before)

    def set_umask(mask: int) -> None:
        os.umask(mask)

    yield set_umask
    os.umask(before)


def _private_tree(parent: Path) -> Path:
    root = Path(tempfile.mkdtemp(dir=parent))  # 0700, as the exporter's work folder
    (root / "sub").mkdir(mode=0o700)
    (root / "a.onnx").write_bytes(b"x")
    (root / "a.onnx").chmod(0o600)
    (root / "sub" / "b.json").write_bytes(b"{}")
    (root / "sub" / "b.json").chmod(0o600)
    return root


@pytest.mark.parametrize(("mask", "folder", "file"),
                         [(0o022, 0o755, 0o644), (0o002, 0o755, 0o644), (0o077, 0o700, 0o600),
                          (0o027, 0o750, 0o640)])
def test_publish_tree(
    tmp_path: Path, umask: Callable[[int], None], mask: int, folder: int, file: int
) -> None:
    root = _private_tree(tmp_path)
    umask(mask)
    assert current_umask() == mask
    publish_tree(root)
    assert _mode(root) == folder and _mode(root / "sub") == folder
    assert _mode(root / "a.onnx") == file and _mode(root / "sub" / "b.json") == file


def test_publish_file(tmp_path: Path, umask: Callable[[int], None]) -> None:
    fd, name = tempfile.mkstemp(dir=tmp_path)  # 0600, as the bundle writer's temporary file
    os.close(fd)
    umask(0o022)
    publish_file(Path(name))
    assert _mode(Path(name)) == 0o644


def test_reading_the_umask_leaves_it_unchanged(umask: Callable[[int], None]) -> None:
    umask(0o027)
    assert current_umask() == 0o027
    assert current_umask() == 0o027
