"""The gRPC twin of http_client.Client: one EmbedStream call per `post`, one channel per thread.

`post(texts)` streams the texts as one EmbedRequest message each over a single
`tei.v1.Embed/EmbedStream` call and returns the vectors in order, so a "batch 32" gRPC cell
sends 32 messages per call where the HTTP cell sends 32 inputs per /embed request.
"""

from __future__ import annotations

import threading

import grpc

from bench.http_client import HttpError
from tei_serve.grpc import tei_pb2, tei_pb2_grpc


class GrpcUnavailableError(HttpError):
    """Nothing listens yet (the server is starting)."""


class GrpcClient:
    path = "/tei.v1.Embed/EmbedStream"

    def __init__(self, port: int, timeout: float = 600.0) -> None:
        self.target = f"127.0.0.1:{port}"
        self.timeout = timeout
        self._local = threading.local()
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()

    def _stub(self) -> tei_pb2_grpc.EmbedStub:
        stub = getattr(self._local, "stub", None)
        if stub is None:
            channel = grpc.insecure_channel(self.target)
            with self._lock:
                self._channels.append(channel)
            # grpcio-tools writes the stub class without annotations
            stub = self._local.stub = tei_pb2_grpc.EmbedStub(channel)  # type: ignore[no-untyped-call]
        return stub

    def post(self, texts: list[str]) -> list[list[float]]:
        # truncate=True: a gRPC message's truncate is false unless set (HTTP's defaults to
        # --auto-truncate, true), and the bench's long texts sit at the model's maximum.
        messages = (tei_pb2.EmbedRequest(inputs=t, truncate=True) for t in texts)
        try:
            out = [list(r.embeddings)
                   for r in self._stub().EmbedStream(messages, timeout=self.timeout)]
        except grpc.RpcError as e:
            code = e.code()
            if code is grpc.StatusCode.UNAVAILABLE:
                raise GrpcUnavailableError(f"{self.target}: {e.details()}") from e
            raise HttpError(f"{code} from {self.path}: {e.details()}") from e
        if len(out) != len(texts):
            raise HttpError(f"{self.path} answered {len(out)} vectors for {len(texts)}")
        return out

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
        self._local = threading.local()
