"""The folder an export is built in, beside its output, and what a killed export left there.

An export builds `.<name>.partial-XXXX` beside the output folder and renames it into place;
Ctrl-C, SIGTERM and every failure remove it. SIGKILL (the OOM killer, `kill -9`) cannot be
caught, so the folder stays: for a large model, gigabytes hidden beside the output. Each
export holds an exclusive `flock` on its folder while it builds; the next export to the same
output removes every partial folder of that name whose lock it can take (its export is dead)
and that has not changed for a minute (one just made, not yet locked, is left alone).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STALE_AFTER_S = 60.0


def _prefix(output_dir: Path) -> str:
    return f".{output_dir.name}.partial-"


def _unlocked(folder: Path) -> bool:
    """Whether no live export holds `folder`'s lock (the lock is released at once)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases the lock, if taken
    return True


def remove_stale(output_dir: Path, *, now: float | None = None) -> list[Path]:
    """Remove the partial folders a killed export of `output_dir` left; returns them."""
    now = time.time() if now is None else now
    removed = []
    for folder in output_dir.parent.glob(_prefix(output_dir) + "*"):
        try:
            old = now - folder.stat().st_mtime > STALE_AFTER_S
        except OSError:
            continue
        if folder.is_dir() and not folder.is_symlink() and old and _unlocked(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@contextlib.contextmanager
def building(output_dir: Path) -> Iterator[Path]:
    """A new partial folder for `output_dir`, locked while the block runs. The caller renames
    it into place or removes it; the lock goes with the block."""
    work = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=_prefix(output_dir)))
    fd = os.open(work, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield work
    finally:
        os.close(fd)
