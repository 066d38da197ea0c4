"""tei_serve.low_ports: a process holding CAP_NET_BIND_SERVICE only in its permitted set (as
the image's interpreter does, from its `+p` file capability) binds a port below 1024 once
`prepare_bind` has run, and not before; without the capability it reports that it cannot.

The child drops from root to uid 1000 keeping its permitted capabilities (PR_SET_KEEPCAPS),
which leaves them permitted but not effective: the state the file capability gives.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tei_serve.low_ports import prepare_bind, unprivileged_port_start

PORT = 1023

CHILD = f"""
import ctypes, errno, os, socket, sys
from tei_serve.low_ports import prepare_bind

keep = sys.argv[1] == "keep"
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(8, int(keep), 0, 0, 0) == 0  # PR_SET_KEEPCAPS
os.setresgid(1000, 1000, 1000)
os.setresuid(1000, 1000, 1000)

def bind():
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", {PORT}))
        return "bound"
    except OSError as e:  # the permission check comes before the in-use one
        return "in use" if e.errno == errno.EADDRINUSE else errno.errorcode[e.errno]
    finally:
        s.close()

before = bind()
print(before, prepare_bind({PORT}), bind())
"""


def test_ports_any_user_may_bind() -> None:
    assert prepare_bind(0)
    assert prepare_bind(max(unprivileged_port_start(), 1024))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 1000 keeping capabilities")
@pytest.mark.skipif(unprivileged_port_start() <= PORT, reason="any user may bind low ports here")
@pytest.mark.parametrize(
    ("keep", "expected"),
    [("keep", ["EACCES", "True", "bound"]), ("drop", ["EACCES", "False", "EACCES"])],
)
def test_a_permitted_capability_is_raised_before_binding(keep: str, expected: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, keep], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.replace("in use", "bound").split() == expected
