"""Modes for what the tools publish (artifacts, bundles, unpacked bundles).

They are written in private temporary places (`mkdtemp` gives 0700, `mkstemp` 0600) and renamed
into place; without this the result stays readable by its writer alone, and a server running
as another user (the images' user 1000) is refused. Published folders get 0755 and files 0644,
narrowed by the process umask when that is stricter.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

FOLDER_MODE = 0o755
FILE_MODE = 0o644

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process umask (reading it means setting it; the lock keeps two readers apart)."""
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def publish_file(path: Path) -> None:
    """`path` readable by every user, as far as the umask allows."""
    path.chmod(FILE_MODE & ~current_umask())


def publish_tree(root: Path) -> None:
    """`root`, its folders and files readable (folders searchable) as far as the umask allows."""
    mask = current_umask()
    root.chmod(FOLDER_MODE & ~mask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            sub = Path(folder) / name
            if not sub.is_symlink():
                sub.chmod(FOLDER_MODE & ~mask)
        for name in files:
            file = Path(folder) / name
            if not file.is_symlink():
                file.chmod(FILE_MODE & ~mask)
