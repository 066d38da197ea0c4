"""A folder built beside its target and renamed into place, and what a killed builder left.

`tei-export` builds an artifact and `tei-bundle` unpacks one this way: a hidden temporary
folder beside the target, flocked by its process while in use, so that a later run can tell an
abandoned folder (SIGKILL, the OOM killer, power loss: the kernel drops the lock with the
process) from one still being built, and remove only the abandoned ones. Making and locking a
folder happen under a shared lock on the parent, which `remove_abandoned` takes exclusively:
it never sees a folder that is made but not yet locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def flocked(path: Path, operation: int) -> Iterator[None]:
    """flock on a folder (its own descriptor): released on exit and when the process dies."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


# What tempfile.mkdtemp appends to the prefix: 8 of these characters.
_RANDOM_PART = re.compile(r"[a-z0-9_]{8}")


def _prefix(target: Path, tag: str) -> str:
    if not tag:
        # Without a tag of its own, `.<name>.*` would take in a user's `.<name>.backup`.
        raise ValueError("a staging folder needs a tag naming what builds it")
    return f".{target.name}.{tag}"


def _is_staging(folder: Path, prefix: str) -> bool:
    return _RANDOM_PART.fullmatch(folder.name.removeprefix(prefix)) is not None


@contextlib.contextmanager
def staging_folder(target: Path, tag: str) -> Iterator[Path]:
    """A new hidden folder `.<target name>.<tag><random>` beside `target`, flocked by this
    process while the block runs; the caller renames it into place or removes it."""
    with flocked(target.parent, fcntl.LOCK_SH):
        tmp = Path(tempfile.mkdtemp(prefix=_prefix(target, tag), dir=target.parent))
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        os.close(fd)


def aside_path(target: Path, tag: str) -> Path:
    """Where `target` is renamed before it is removed or replaced: a name of the staging
    pattern nobody locks, so `remove_abandoned(target, tag)` sweeps it where the process
    that moved it died before removing it."""
    return target.with_name(_prefix(target, tag) + secrets.token_hex(4))


def remove_abandoned(target: Path, tag: str) -> list[Path]:
    """Remove the staging folders for `target` of this `tag` whose process is gone; returns
    them. One still in use holds its lock and is left alone; a folder whose name is not
    exactly what `staging_folder` makes is never touched."""
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    prefix = _prefix(target, tag)
    with flocked(target.parent, fcntl.LOCK_EX):
        for tmp in sorted(target.parent.glob(glob.escape(prefix) + "*")):
            if tmp.is_symlink() or not tmp.is_dir() or not _is_staging(tmp, prefix):
                continue
            try:
                with flocked(tmp, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    shutil.rmtree(tmp)
            except BlockingIOError:
                continue  # held: its process is still building it
            except FileNotFoundError:
                continue  # its own process finished (renamed it) or failed meanwhile
            removed.append(tmp)
    return removed
