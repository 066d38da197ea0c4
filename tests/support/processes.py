"""Helpers for tests that run `tei-serve` as a real process on loopback."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_health(proc: subprocess.Popen[str], url: str, timeout: float) -> None:
    """Poll `url`/health until it answers 200; fail with the server's output if the process
    exits first, or after `timeout` seconds (first-start exports take minutes)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            output = proc.communicate()[0] or ""
            raise AssertionError(f"tei-serve exited with {proc.returncode}:\n{output[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"tei-serve did not become healthy in {timeout:.0f} s")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
