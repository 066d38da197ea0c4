"""SIGKILL, then restart on the same bundle and hub cache: the second start is clean.

- A server killed with SIGKILL while answering concurrent /embed requests restarts on the
  same bundle and cache, reuses the verified unpack and answers the same vector.
- A process killed in the middle of a bundle unpack (stopped at a known point by the
  unpack_stop/sitecustomize.py hook, then SIGKILLed) leaves a half-written temporary folder;
  it is never served, the next start removes it and unpacks again. A temporary folder whose
  unpack is still running (its process holds the folder's flock) is left alone.
No container is involved: real processes, real signals.
"""

from __future__ import annotations

import os
import signal
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
from tei_bundle import archive as bundle

HERE = Path(__file__).resolve().parent
TEI_SERVE = Path(sys.executable).with_name("tei-serve")
TEXT = "What is Deep Learning?"


def _stop_hook_env(write_fd: int) -> dict[str, str]:
    return {
        "TEI_TEST_UNPACK_STOP_FD": str(write_fd),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "unpack_stop"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }


class Server:
    """tei-serve on a bundle with its own hub cache (the folder the bundle unpacks into)."""

    def __init__(
        self,
        tar: Path,
        cache: Path,
        extra_env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "HUGGINGFACE_HUB_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1",
            **(extra_env or {}),
        }
        env.pop("MODEL_ID", None)
        self.proc = subprocess.Popen(
            [
                str(TEI_SERVE),
                "--model-id",
                str(tar),
                "--port",
                str(self.port),
                "--hostname",
                "127.0.0.1",
                "--prometheus-port",
                "0",
                "--json-output",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            pass_fds=pass_fds,
        )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                out = self.proc.stdout.read() if self.proc.stdout else ""
                raise AssertionError(f"tei-serve exited with {self.proc.returncode}:\n{out}")
            assert time.monotonic() < deadline, "tei-serve did not become healthy in time"
            time.sleep(0.2)

    def embed(self, inputs: str | list[str]) -> np.ndarray:
        r = httpx.post(f"{self.url}/embed", json={"inputs": inputs}, timeout=60)
        assert r.status_code == 200, r.text
        return np.array(r.json(), dtype=np.float32)

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        assert self.proc.returncode == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def _entries(folder: Path) -> dict[str, int]:
    """name -> inode of each entry: a reused unpack keeps its inode, a new one does not."""
    return {p.name: p.stat().st_ino for p in folder.iterdir()} if folder.is_dir() else {}


class Load:
    """Client threads posting /embed back to back until the server dies under them."""

    def __init__(self, url: str, clients: int) -> None:
        self.answered = 0
        self.failed = 0
        self.changed = threading.Condition()
        self.threads = [
            threading.Thread(target=self._client, args=(url, i), daemon=True)
            for i in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _client(self, url: str, index: int) -> None:
        texts = [f"{TEXT} client {index} item {j}" for j in range(8)]
        with httpx.Client(timeout=60) as client:
            while True:
                try:
                    ok = client.post(f"{url}/embed", json={"inputs": texts}).status_code == 200
                except httpx.TransportError:
                    ok = False
                with self.changed:
                    if ok:
                        self.answered += 1
                    else:
                        self.failed += 1
                    self.changed.notify_all()
                if not ok:
                    return

    def wait_answered(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.answered >= count or self.failed, 300)
            assert not self.failed, "a request failed before the kill"

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=120)


@pytest.fixture(scope="module")
def minilm_bundle(minilm_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.write_bundle(minilm_artifact, tmp_path_factory.mktemp("bundle") / "minilm.tar")


@pytest.mark.slow
def test_sigkill_under_load_then_restart_serves_the_same_vector(
    minilm_bundle: Path, minilm_artifact: Path, tmp_path: Path, servers: list[Server]
) -> None:
    cache = tmp_path / "hub"
    unpacked = cache / "tei-onnx" / "bundles"
    first = Server(minilm_bundle, cache)
    servers.append(first)
    first.wait_healthy()
    before = first.embed(TEXT)
    entries = _entries(unpacked)
    assert len(entries) == 1 and not next(iter(entries)).startswith("."), entries

    load = Load(first.url, clients=8)
    load.wait_answered(16)  # requests are in flight on every client when the kill lands
    first.sigkill()
    load.join()
    assert load.failed == 8  # every client saw the server die

    second = Server(minilm_bundle, cache)
    servers.append(second)
    second.wait_healthy()
    after = second.embed(TEXT)
    assert _entries(unpacked) == entries  # the verified unpack was reused, nothing added
    np.testing.assert_array_equal(after, before)
    expected = tei_runtime.load(minilm_artifact, device="cpu").embed([TEXT])
    np.testing.assert_allclose(after, expected, atol=1e-6)


def _stopped_mid_unpack(
    start: Callable[[dict[str, str], int], subprocess.Popen[str]],
) -> subprocess.Popen[str]:
    """Start a process with the unpack_stop hook and return once it is stopped mid-unpack."""
    read_fd, write_fd = os.pipe()
    try:
        proc = start(_stop_hook_env(write_fd), write_fd)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as signal_pipe:
        line = signal_pipe.readline()  # EOF instead if the process died first
    assert line == b"stopped\n", proc.communicate(timeout=60)[0]
    return proc


def _unpack_process(
    tar: Path, dest: Path
) -> Callable[[dict[str, str], int], subprocess.Popen[str]]:
    code = "import sys; from tei_bundle.archive import unpack; unpack(sys.argv[1], sys.argv[2])"

    def start(env: dict[str, str], fd: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(tar), str(dest)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(fd,),
        )

    return start


def test_a_live_unpack_is_left_alone_and_a_killed_one_is_removed(
    toy_artifact: Path, tmp_path: Path
) -> None:
    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    dest = tmp_path / "unpacked" / "toy"
    proc = _stopped_mid_unpack(_unpack_process(tar, dest))
    try:
        [partial] = list(dest.parent.glob(".toy.*"))
        assert any(p.is_file() for p in partial.rglob("*"))  # half-written
        assert bundle.remove_abandoned(dest, bundle.UNPACK_TAG) == []  # alive: still its own
        assert partial.is_dir()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert not dest.exists()  # nothing half-unpacked under the real name
    assert bundle.remove_abandoned(dest, bundle.UNPACK_TAG) == [partial]
    assert list(dest.parent.iterdir()) == []
    # The user's own hidden folders beside it are not an unpack's leftovers.
    (dest.parent / ".toy.backup").mkdir()
    (dest.parent / ".toy.backup" / "notes.txt").write_text("precious")
    assert bundle.unpack(tar, dest) == dest
    bundle.verify_folder(dest)
    assert (dest.parent / ".toy.backup" / "notes.txt").read_text() == "precious"


@pytest.mark.slow
def test_sigkill_during_unpack_then_restart_unpacks_again(
    minilm_bundle: Path, minilm_artifact: Path, tmp_path: Path, servers: list[Server]
) -> None:
    cache = tmp_path / "hub"
    unpacked = cache / "tei-onnx" / "bundles"

    def start(env: dict[str, str], fd: int) -> subprocess.Popen[str]:
        server = Server(minilm_bundle, cache, extra_env=env, pass_fds=(fd,))
        servers.append(server)
        return server.proc

    proc = _stopped_mid_unpack(start)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    [partial] = _entries(unpacked)
    assert partial.startswith(".minilm-"), partial  # only the temporary folder, half-written

    second = Server(minilm_bundle, cache)
    servers.append(second)
    second.wait_healthy()
    [name] = _entries(unpacked)  # the half-written folder is gone, the verified one is there
    assert not name.startswith(".") and name == partial[1:].rsplit(".", 1)[0]
    expected = tei_runtime.load(minilm_artifact, device="cpu").embed([TEXT])
    np.testing.assert_allclose(second.embed(TEXT), expected, atol=1e-6)
