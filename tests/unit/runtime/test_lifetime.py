"""A child that asked to die with its parent ends when the parent is killed outright."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

CHILD = (
    "import os, sys, time\n"
    "from tei_runtime.lifetime import die_with_parent\n"
    "if sys.argv[1] != 'no':\n"
    "    die_with_parent(int(sys.argv[1]) if sys.argv[1] != '-' else None)\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(120)\n"
)
# The parent starts the child and waits; it is SIGKILLed, so it runs no cleanup of its own.
PARENT = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], stdout=None)\n"
    "child.wait()\n"
)


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
@pytest.mark.parametrize("asked", [True, False])
def test_a_child_ends_with_its_killed_parent(asked: bool) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, "-" if asked else "no"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=30)
        if asked:
            assert _gone(child, 10), "the child outlived its killed parent"
        else:  # the control: a child that did not ask outlives its parent
            assert not _gone(child, 2)
    finally:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        parent.kill()


def test_a_parent_already_gone_ends_the_child() -> None:
    """The pid that started it is not its parent any more (died before the call)."""
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(os.getpid() + 1_000_000)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == -signal.SIGTERM and run.stdout == ""
