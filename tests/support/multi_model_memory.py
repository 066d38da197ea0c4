"""Memory of one `tei-serve` serving two models against two single-model servers.

    .venv/bin/python tests/support/multi_model_memory.py ARTIFACT_A ARTIFACT_B

Starts three servers one after another (A alone, B alone, A and B together), each answered
one request per model once healthy, and reads its resident set (VmRSS) and proportional set
(Pss, /proc/PID/smaps_rollup) before stopping it. Prints the figures and the saving; the
slow test `tests/e2e/test_multi_model_real.py` asserts the one process is below the sum.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

TEI_SERVE = Path(sys.executable).with_name("tei-serve")


@dataclass(frozen=True)
class Memory:
    rss_mb: float
    pss_mb: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kb(path: Path, field: str) -> float:
    m = re.search(rf"^{field}:\s+(\d+) kB", path.read_text(), re.M)
    if m is None:
        raise RuntimeError(f"no {field} in {path}")
    return int(m.group(1)) / 1024


def _one_request_each(client: httpx.Client) -> None:
    """Each model answers once (arenas and caches grown as in service)."""
    for model in client.get("/v1/models").json()["data"]:
        name = model["id"]
        info = client.get("/info").json()
        listed = info.get("models", [info])
        [kind] = next(m["model_type"] for m in listed if m["served_model_name"] == name)
        if kind == "embedding":
            r = client.post("/embed", json={"inputs": ["memory probe"] * 8, "model": name})
        else:
            r = client.post("/rerank", json={"query": "memory", "texts": ["probe"] * 8,
                                             "model": name})  # fmt: skip
        r.raise_for_status()


def measure(artifacts: Sequence[Path], *, timeout: float = 300.0) -> Memory:
    """Serve `artifacts` from one tei-serve, answer once per model, read its memory."""
    port = _free_port()
    args = [str(TEI_SERVE), "--port", str(port), "--hostname", "127.0.0.1",
            "--prometheus-port", "0"]  # fmt: skip
    for artifact in artifacts:
        args += ["--model-id", str(artifact)]
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_ID", "SERVED_MODEL_NAME")}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            text=True)  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"tei-serve exited {proc.returncode}: "
                                       f"{proc.stderr.read() if proc.stderr else ''}")  # fmt: skip
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("tei-serve did not become healthy in time")
                time.sleep(0.2)
            _one_request_each(client)
        proc_dir = Path(f"/proc/{proc.pid}")
        return Memory(rss_mb=_kb(proc_dir / "status", "VmRSS"),
                      pss_mb=_kb(proc_dir / "smaps_rollup", "Pss"))  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class Comparison:
    first: Memory
    second: Memory
    together: Memory

    def lines(self, names: Sequence[str]) -> list[str]:
        a, b, both = self.first, self.second, self.together
        rows = [
            (f"{names[0]} alone", a), (f"{names[1]} alone", b),
            ("two servers (sum)", Memory(a.rss_mb + b.rss_mb, a.pss_mb + b.pss_mb)),
            ("one server, both models", both),
        ]  # fmt: skip
        out = ["| server | RSS MB | PSS MB |", "| --- | ---: | ---: |"]
        out += [f"| {what} | {m.rss_mb:.0f} | {m.pss_mb:.0f} |" for what, m in rows]
        saved = a.rss_mb + b.rss_mb - both.rss_mb
        out.append(f"one process saves {saved:.0f} MB RSS "
                   f"({saved / (a.rss_mb + b.rss_mb):.0%} of two servers)")  # fmt: skip
        return out


def compare(first: Path, second: Path) -> Comparison:
    return Comparison(first=measure([first]), second=measure([second]),
                      together=measure([first, second]))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="multi_model_memory.py",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("first", type=Path, help="artifact folder of the first model")
    parser.add_argument("second", type=Path, help="artifact folder of the second model")
    args = parser.parse_args(argv)
    result = compare(args.first, args.second)
    for line in result.lines([args.first.name, args.second.name]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
