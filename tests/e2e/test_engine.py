"""Engine behaviour over real HTTP: overload, batching, client disconnect, SIGTERM."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from support.loopback_server import Running
from support.processes import free_port
from tei_runtime.manifest import Task


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_overload_429_nothing_else_fails(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_concurrent_requests=4)
    r.model.delay = 0.05

    def call(i: int) -> httpx.Response:
        with httpx.Client(base_url=r.url, timeout=30) as c:
            return c.post("/embed", json={"inputs": [f"hello {i}", "world"]})

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(48)))
    codes = [x.status_code for x in results]
    assert set(codes) <= {200, 429}, codes
    assert 200 in codes and 429 in codes
    for x in results:
        if x.status_code == 429:
            assert x.json() == {"error": "Model is overloaded", "error_type": "Overloaded"}
            assert x.headers["retry-after"] == "1"
        else:
            assert "retry-after" not in x.headers
    assert r.serving.admission.permits.available == 4
    metrics = r.client.get("/metrics").text
    assert f'te_request_failure{{err="overloaded"}} {codes.count(429)}' in metrics


def test_overload_is_immediate(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_concurrent_requests=2)
    r.model.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(r.client.post, "/embed", json={"inputs": ["a", "b"]})
        _wait(r.model.running.is_set)
        with httpx.Client(base_url=r.url, timeout=5) as c:
            t0 = time.monotonic()
            assert c.post("/embed", json={"inputs": "x"}).status_code == 429
            assert time.monotonic() - t0 < 1.0
            assert c.post("/tokenize", json={"inputs": "x"}).status_code == 200  # no permit
        r.model.gate.set()
        assert held.result().status_code == 200


def test_requests_are_batched(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED)
    r.model.gate.clear()
    with ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(httpx.post, f"{r.url}/embed", json={"inputs": f"hello {i}"},
                            timeout=30) for i in range(12)]
        worker = r.serving.worker
        # one batch runs (held at the gate), one is prefetched, the rest wait in the queue; the
        # held batch may have taken more than one request if several arrived before it formed
        _wait(lambda: r.model.running.is_set()
              and r.model.at_gate + len(worker.queue) + len(worker._slot or []) == 12)
        r.model.gate.set()
        assert all(f.result().status_code == 200 for f in futs)
    assert sum(r.model.batches) == 12
    assert len(r.model.batches) <= 3


def test_max_batch_requests(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_batch_requests=3)
    r.model.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(r.client.post, "/embed", json={"inputs": ["a"] * 10})
        _wait(lambda: r.model.running.is_set())
        r.model.gate.set()
        assert fut.result().status_code == 200
    assert max(r.model.batches) <= 3 and sum(r.model.batches) == 10


def test_client_disconnect_drops_entries(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_concurrent_requests=8)
    r.model.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(r.client.post, "/embed", json={"inputs": "a"})
        _wait(r.model.running.is_set)
        try:
            httpx.post(f"{r.url}/embed", json={"inputs": ["b", "c", "d"]}, timeout=0.5)
        except httpx.TimeoutException:
            pass
        else:  # pragma: no cover
            raise AssertionError("expected the request to be pending")
        _wait(lambda: r.serving.admission.permits.available == 7)  # the leaver's permits are back
        r.model.gate.set()
        assert blocker.result().status_code == 200
    # As TEI counts it: one per input the batcher dropped from the queue.
    _wait(lambda: 'te_request_failure{err="dropped"} 3\n' in r.client.get("/metrics").text)
    assert 'err="client_gone"' not in r.client.get("/metrics").text
    assert r.model.batches == [1]  # the leaver's entries never ran
    assert r.client.post("/embed", json={"inputs": "e"}).status_code == 200


def _serve_fake(tokenizer_json: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """serve_fake.py (the real CLI serving path over the fake model) on a free port, once its
    /health answers; ARGS as serve_fake.py takes them after the port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "serve_fake.py"), str(tokenizer_json),
         str(port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _wait(up, timeout=30)
    except BaseException:
        proc.kill()
        raise
    return proc, url


def _sigterm_with_requests_queued(
    tokenizer_json: Path, delay_s: str, grace_s: str, requests: int
) -> tuple[list[httpx.Response], str, int]:
    """The fake model served with a short grace period, each request a batch of its own:
    `requests` sent at once, SIGTERM once all are counted; the answers, output, exit code."""
    proc, url = _serve_fake(tokenizer_json, delay_s, grace_s)
    try:
        answers: list[httpx.Response] = []
        lock = threading.Lock()

        def call(i: int) -> None:
            resp = httpx.post(f"{url}/embed", json={"inputs": f"hello {i}"}, timeout=60)
            with lock:
                answers.append(resp)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(requests)]
        for t in threads:
            t.start()
        _wait(lambda: f'te_request_count{{method="single"}} {requests}'
              in httpx.get(f"{url}/metrics", timeout=5).text)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return answers, out, proc.returncode


def test_work_left_at_the_end_of_the_grace_period_is_answered_503(
    tokenizer_json: Path,
) -> None:
    """More queued work than the shutdown grace period (here 4 s) allows: what is still
    queued when it is nearly over is refused with TEI's 503 body, instead of uvicorn
    cancelling the requests at its end (a bare 500 and a traceback each)."""
    answers, out, returncode = _sigterm_with_requests_queued(tokenizer_json, "1.0", "4", 10)
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) == {200, 503}, (statuses, out[-3000:])  # ~3 ran, the rest refused
    for r in answers:
        if r.status_code == 503:
            assert r.json() == {"error": "server is shutting down: its grace period is over",
                                "error_type": "Unhealthy"}  # fmt: skip
    assert returncode == 0, out[-3000:]
    assert "Exception in ASGI application" not in out and "Traceback" not in out
    assert "queued inputs refused with 503" in out


def test_a_long_first_batch_running_at_sigterm_moves_the_refusal_earlier(
    tokenizer_json: Path,
) -> None:
    """SIGTERM while the first batch (2.5 s here) still runs: no batch has ended to say how
    long one takes, so the refusal must go by the running one, not by the fixed margin alone
    (1.5 s of a 4 s grace: the batch started then would be cut at the end, a bare 500)."""
    answers, out, returncode = _sigterm_with_requests_queued(tokenizer_json, "2.5", "4", 4)
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200, 503, 503, 503], (statuses, out[-3000:])
    assert returncode == 0, out[-3000:]
    assert "Traceback" not in out

def _eight_in_flight_then(
    tokenizer_json: Path, signals: list[signal.Signals]
) -> tuple[list[int], str, int, str]:
    """Eight /embed requests accepted by the served fake model, then `signals` sent 0.3 s
    apart: their statuses, the output, the exit code and the server's URL."""
    proc, url = _serve_fake(tokenizer_json, "0.3")
    try:
        results: list[int] = []
        lock = threading.Lock()

        def call(i: int) -> None:
            resp = httpx.post(f"{url}/embed", json={"inputs": f"hello {i}"}, timeout=30)
            with lock:
                results.append(resp.status_code)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        _wait(lambda: 'te_request_count{method="single"} 8'
              in httpx.get(f"{url}/metrics", timeout=5).text)  # all eight accepted
        for n, sig in enumerate(signals):
            if n:
                time.sleep(0.3)
            proc.send_signal(sig)
        for t in threads:
            t.join(timeout=30)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return results, out, proc.returncode, url


def test_sigterm_answers_in_flight_then_exits_0(tokenizer_json: Path) -> None:
    results, out, returncode, url = _eight_in_flight_then(tokenizer_json, [signal.SIGTERM])
    assert results == [200] * 8
    assert returncode == 0, out
    assert "served" in out
    try:
        httpx.get(f"{url}/health", timeout=1)
    except httpx.TransportError:
        pass
    else:  # pragma: no cover
        raise AssertionError("server still accepting after SIGTERM")


def test_a_second_sigint_does_not_cut_the_requests_in_flight(tokenizer_json: Path) -> None:
    """Ctrl-C twice (an impatient operator): uvicorn force-quits on the second and every
    request in flight got a bare 500; as TEI, the second is ignored and all are answered."""
    results, out, returncode, _ = _eight_in_flight_then(
        tokenizer_json, [signal.SIGINT, signal.SIGINT]
    )
    assert results == [200] * 8, out[-3000:]
    assert returncode == 0, out[-3000:]
    assert "Traceback" not in out


def test_a_client_that_reads_nothing_does_not_hold_the_shutdown(tokenizer_json: Path) -> None:
    """A client whose answer sits unread in the server's buffer at SIGTERM: a graceful close
    waited for it to drain, the whole grace period (20 s here); it is dropped at once."""
    import socket

    proc, url = _serve_fake(tokenizer_json, "0", "20")
    try:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"inputs": ["hello world " * 580] * 32}).encode()  # under 32 x 250
        request = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request * 2)  # answers of MBs, read by no one
            time.sleep(3)  # tokenized and written, the server's buffer full
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            took = time.monotonic() - started
        assert proc.returncode == 0, out[-3000:]
        assert took < 10, f"shutdown waited {took:.1f} s on a client that reads nothing"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stalled_upload_is_answered_503_and_does_not_hold_the_shutdown(
    tokenizer_json: Path,
) -> None:
    """A request whose body stopped arriving at SIGTERM held the exit for the whole grace
    period (20 s here), then got uvicorn's bare 500 and an ERROR traceback; an upload still
    arriving may finish."""
    import socket

    proc, url = _serve_fake(tokenizer_json, "0", "20")
    try:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"inputs": "hello world"}).encode()
        head = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        with socket.create_connection((host, int(port)), timeout=30) as stalled, \
                socket.create_connection((host, int(port)), timeout=30) as slow:  # fmt: skip
            stalled.sendall(head + body[:5])
            slow.sendall(head + body[:5])
            time.sleep(0.5)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            for piece in range(5, len(body)):  # the slow one keeps sending, 1 byte / 0.3 s
                time.sleep(0.3)
                slow.sendall(body[piece:piece + 1])
            slow_answer = slow.recv(65536)
            stalled_answer = stalled.recv(65536)
            out, _ = proc.communicate(timeout=60)
            took = time.monotonic() - started
        assert proc.returncode == 0, out[-3000:]
        assert took < 12, f"shutdown waited {took:.1f} s on a stalled upload"
        assert slow_answer.startswith(b"HTTP/1.1 200"), slow_answer[:200]
        assert stalled_answer.startswith(b"HTTP/1.1 503"), stalled_answer[:200]
        assert stalled_answer.endswith(
            b'{"error":"server is shutting down","error_type":"Unhealthy"}'
        )
        assert "Traceback" not in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_every_error_answer_is_logged_as_its_kind(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    r = serve(Task.EMBED)
    with caplog.at_level(logging.INFO, logger="tei_serve.access"):
        assert r.client.post("/embed", json={"inputs": ""}).status_code == 400
        assert r.client.post("/embed", json={"inputs": "a", "dimensions": 0}).status_code == 422
        r.model.fail_batches = 1
        assert r.client.post("/embed", json={"inputs": "a"}).status_code == 424
        assert r.client.post("/nowhere", json={}).status_code == 404
    failed = [(rec.levelno, rec.getMessage()) for rec in caplog.records
              if "failed:" in rec.getMessage()]  # fmt: skip
    assert [level for level, _ in failed] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert failed[0][1].startswith("/embed model=") and "Empty 400" in failed[0][1]
    assert "Backend 424" in failed[2][1]


def test_an_unhandled_exception_is_one_logged_500_with_its_traceback(
    serve: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    r = serve(Task.EMBED)

    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a bug")

    r.serving.embed = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="tei_serve"):
        got = r.client.post("/embed", json={"inputs": "a"})
    assert got.status_code == 500
    assert got.json() == {"error": "internal error: RuntimeError", "error_type": "Backend"}
    failed = [rec for rec in caplog.records if "failed:" in rec.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert failed[0].exc_info is not None and "a bug" in caplog.text
    assert len([rec for rec in caplog.records if rec.levelno >= logging.ERROR]) == 1
