"""gRPC test support: the real gRPC front-end on loopback in a thread, and a client generated
from TEI's proto with grpcio-tools at test time.

`generate_client(dir)` runs grpc_tools.protoc on serve/tei_serve/grpc/tei.proto (TEI's proto,
copied unchanged) into `dir`; the tests import the `tei_pb2` / `tei_pb2_grpc` written there,
unmodified.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from tei_serve.grpc.server import GrpcServer
from tei_serve.models import Models
from tei_serve.serving import Serving

PROTO = Path(__file__).resolve().parents[2] / "serve" / "tei_serve" / "grpc" / "tei.proto"


def generate_client(out: Path) -> tuple[ModuleType, ModuleType]:
    """protoc TEI's proto into `out` and import the result (tei_pb2, tei_pb2_grpc)."""
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={out}",
         f"--grpc_python_out={out}", PROTO.name],
        check=True,
    )  # fmt: skip
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")


class RunningGrpc:
    """A `GrpcServer` over `serving` (or several models) on 127.0.0.1, its event loop in a
    thread of its own."""

    def __init__(self, serving: Serving | Models) -> None:
        self.models = Models.of(serving)
        self.serving = self.models.first
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.front = GrpcServer(serving)
        self.call(self.front.start())
        self.port = self.front.port
        self.target = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.target)
        self.stopped = False

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def metrics_port(self) -> int:
        return self.front.metrics_port.port

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.channel.close()
        self.call(self.front.stop(grace=5))
        self._end_loop()

    def stopping(self, grace: float) -> concurrent.futures.Future[None]:
        """Begin the server's graceful stop (a test watches the calls in flight meanwhile);
        `stopped_by` then waits for it and ends the loop."""
        return asyncio.run_coroutine_threadsafe(self.front.stop(grace=grace), self.loop)

    def stopped_by(self, stopping: concurrent.futures.Future[None]) -> None:
        stopping.result(timeout=30)
        self.stopped = True
        self.channel.close()
        self._end_loop()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
