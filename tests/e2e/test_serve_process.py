"""`tei-serve` as a real process, started the way the README's `just serve` starts it.

No --model-id: the default all-MiniLM-L6-v2 checkpoint is exported into the hub cache on the
first start and reused on the second; the README's curl command answers; SIGTERM with
requests in flight answers all of them and exits 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import tei_runtime
from support.processes import free_port
from tei_runtime.host import probe
from tei_runtime.loader import precision_for
from tei_runtime.manifest import Precision
from tei_serve import model_source

pytestmark = pytest.mark.slow

TEI_SERVE = Path(sys.executable).with_name("tei-serve")


def _wait(ready: Callable[[], bool], timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"tei-serve exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError("tei-serve did not become healthy in time")
        time.sleep(0.2)


class Process:
    def __init__(self, cache: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HUGGINGFACE_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
        env.pop("MODEL_ID", None)
        self.proc = subprocess.Popen(
            [str(TEI_SERVE), "--port", str(self.port), "--hostname", "127.0.0.1",
             "--prometheus-port", "0", "--json-output", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def logs(self) -> list[dict[str, str]]:
        out, _ = self.proc.communicate(timeout=60)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in started:
        p.kill()


def test_default_model_export_curl_reuse_and_sigterm(
    tmp_path: Path, processes: list[Process]
) -> None:
    cache = tmp_path / "hub"
    first = Process(cache)
    processes.append(first)
    _wait(first.healthy, timeout=300, proc=first.proc)

    curl = shutil.which("curl")
    body = json.dumps({"inputs": "What is Deep Learning?"})
    if curl:  # the README's command, verbatim but for the port
        out = subprocess.run(
            [curl, "-s", f"localhost:{first.port}/embed", "-d", body,
             "-H", "Content-Type: application/json"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout
    else:
        out = httpx.post(f"{first.url}/embed", content=body,
                         headers={"Content-Type": "application/json"}).text
    served = np.asarray(json.loads(out))
    artifacts = list((cache / "tei-onnx").glob("*/manifest.json"))
    assert len(artifacts) == 1
    direct = tei_runtime.load(artifacts[0].parent).embed(["What is Deep Learning?"])
    assert served.shape == (1, 384)
    assert np.allclose(served, direct, atol=1e-5)
    # A start with the default dtype exports the one precision it runs (fp32 on a CPU).
    runs = precision_for(probe())
    assert model_source.exported_precisions(artifacts[0].parent) == {runs}

    first.proc.send_signal(signal.SIGTERM)
    logs = first.logs()
    assert first.proc.returncode == 0
    messages = [e["message"] for e in logs]
    assert any(m.startswith("exporting ") for m in messages)
    ready = [m for m in messages if m.startswith("ready: ")]
    assert len(ready) == 1
    assert "model=sentence-transformers/all-MiniLM-L6-v2" in ready[0]
    assert "provider=CPUExecutionProvider" in ready[0] and "variant=fp32" in ready[0]
    # The request's line carries TEI's span fields, durations in Rust's format.
    [access] = [e for e in logs if e["target"] == "tei_serve.access"]
    assert access["level"] == "INFO" and access["span"]["name"] == "embed"
    assert access["span"]["compute_tokens"] > 0
    assert re.fullmatch(r"\d+(\.\d+)?(s|ms|µs|ns)", access["span"]["total_time"])

    # Second start, in int8: exported again with int8 added (the first one's kept); SIGTERM
    # with requests in flight.
    second = Process(cache, "--dtype", "int8")
    processes.append(second)
    _wait(second.healthy, timeout=300, proc=second.proc)
    assert model_source.exported_precisions(artifacts[0].parent) == {runs, Precision.INT8}
    statuses: list[int] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        texts = [f"request {i} text {j} " * 20 for j in range(32)]
        r = httpx.post(f"{second.url}/embed", json={"inputs": texts}, timeout=120)
        with lock:
            statuses.append(r.status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()

    def all_accepted() -> bool:
        metrics = httpx.get(f"{second.url}/metrics", timeout=5).text
        return 'te_request_count{method="batch"} 6' in metrics

    _wait(all_accepted, timeout=60, proc=second.proc)
    second.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=120)
    assert statuses == [200] * 6
    logs = second.logs()
    assert second.proc.returncode == 0
    messages = [e["message"] for e in logs]
    assert any("it has no int8 variant" in m for m in messages if m.startswith("exporting "))
    assert any("variant=int8" in m for m in messages if m.startswith("ready: "))
    assert not second.healthy()

    # Third start, the default dtype again: the artifact is reused as it is.
    third = Process(cache)
    processes.append(third)
    _wait(third.healthy, timeout=120, proc=third.proc)
    third.proc.send_signal(signal.SIGTERM)
    messages = [e["message"] for e in third.logs()]
    assert third.proc.returncode == 0
    assert not any(m.startswith("exporting ") for m in messages)
    assert any(f"variant={runs.value}" in m for m in messages if m.startswith("ready: "))


def test_sigterm_while_exporting_stops_at_once_and_leaves_nothing(
    tmp_path: Path, processes: list[Process]
) -> None:
    """docker stop of a server still exporting its model: without a handler of its own the
    server, PID 1 in its container, would ignore SIGTERM until killed; here it stops the
    export child, which removes its partial folder, and exits 0 with one line."""
    cache = tmp_path / "hub"
    server = Process(cache)
    processes.append(server)
    root = cache / "tei-onnx"
    deadline = time.monotonic() + 300
    while not (root.is_dir() and any(".partial-" in p.name for p in root.iterdir())):
        assert server.proc.poll() is None, "tei-serve ended before its export began"
        assert time.monotonic() < deadline, "no export under way after 300 s"
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    logs = server.logs()
    assert time.monotonic() - stopped < 60
    assert server.proc.returncode == 0
    messages = [e["message"] for e in logs]
    assert "stopped by SIGTERM while starting" in messages, messages[-5:]
    assert not any(m.startswith("ready: ") for m in messages)
    left = [p.name for p in root.iterdir() if not p.name.endswith(".lock")]
    assert left == [], left


def test_a_port_in_use_ends_the_start_with_one_line_and_exit_1(
    tmp_path: Path, tiny_reranker_artifact: Path
) -> None:
    """Over HTTP as with --grpc: a port another process holds is exit status 1 and one error
    line naming it, no traceback (uvicorn alone would exit 3)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        for mode in ([], ["--grpc"]):
            run = subprocess.run(
                [str(TEI_SERVE), "--model-id", str(tiny_reranker_artifact), "--port", str(taken),
                 "--hostname", "127.0.0.1", "--prometheus-port", "0", *mode],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "HUGGINGFACE_HUB_CACHE": str(tmp_path)},
            )  # fmt: skip
            assert run.returncode == 1, (mode, run.returncode, run.stderr[-2000:])
            assert "Traceback" not in run.stderr, run.stderr[-2000:]
            assert str(taken) in run.stderr
            assert " ready: " not in run.stderr  # "ready" only once the port is bound
    finally:
        holder.close()


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 on this host")
def test_ipv6_wildcard_takes_ipv4_clients_as_tei_does(
    tmp_path: Path, tiny_reranker_artifact: Path
) -> None:
    """`--hostname ::` (TEI's images are often run with it) answers 127.0.0.1 and ::1 on both
    the API port and the Prometheus port; a taken port is one line and exit 1."""
    port, metrics = free_port(), free_port()
    env = {**os.environ, "HUGGINGFACE_HUB_CACHE": str(tmp_path), "LOG_LEVEL": "trace"}
    proc = subprocess.Popen(
        [str(TEI_SERVE), "--model-id", str(tiny_reranker_artifact), "--port", str(port),
         "--hostname", "::", "--prometheus-port", str(metrics)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        _wait(lambda: _answers(f"http://127.0.0.1:{port}/health"), 120, proc)
        for host in ("127.0.0.1", "[::1]"):
            assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200
            scraped = httpx.get(f"http://{host}:{metrics}/metrics", timeout=5)
            assert scraped.status_code == 200 and "te_" in scraped.text
        taken = subprocess.run(
            [str(TEI_SERVE), "--model-id", str(tiny_reranker_artifact), "--port", str(port),
             "--hostname", "::", "--prometheus-port", "0"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert taken.returncode == 1 and "Traceback" not in taken.stderr, taken.stderr[-2000:]
        assert f"cannot listen on [::]:{port}" in taken.stderr
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:]
    assert "LOG_LEVEL" not in out  # trace, which TEI takes, is read without a fallback


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False
