"""A helper process that ends with the process that started it."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """Linux: SIGTERM this process when its parent dies (docker stop, kill -9, a closed
    terminal), so a child (an export, its validation) does not run on alone; staging folders
    remove the rest at the next run. `parent`: the pid that started this one, where known, so
    a parent already gone before this call ends it too. Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
