"""Test hook: stop a process in the middle of a bundle unpack, at a known point.

With TEI_TEST_UNPACK_STOP_FD set to a pipe's write end (inherited from the test), the first
bundle member written to disk is followed by one line on that pipe, then the process blocks
for good, so that the test kills it with the temporary folder half-written. Loaded through
PYTHONPATH by tests/deploy/test_crash_restart.py; a no-op without the variable.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_FD = os.environ.get("TEI_TEST_UNPACK_STOP_FD")

if _FD is not None:
    from tei_bundle import archive

    _original = archive._check_member

    def _stop_after_first(*args: Any) -> None:
        _original(*args)
        if args[-1] is None:  # verifying only, nothing written
            return
        os.write(int(_FD), b"stopped\n")
        threading.Event().wait()  # until SIGKILL

    archive._check_member = _stop_after_first
