"""A small blocking HTTP client: one keep-alive connection per thread.

http.client rather than httpx/aiohttp because the client shares the 2 cores with the server
under test: its per-request CPU cost is what it steals, and this is about the least.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable

import msgspec


class HttpError(RuntimeError):
    pass


class Client:
    """POSTs JSON to one route; `shape` turns texts into that server's request body and
    `count` reads how many vectors came back (checked, so a 200 with nothing is an error)."""

    def __init__(
        self,
        port: int,
        path: str,
        shape: Callable[[list[str]], object],
        count: Callable[[object], int],
        timeout: float = 600.0,
    ) -> None:
        self.port, self.path, self.shape, self.count = port, path, shape, count
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def post(self, texts: list[str]) -> object:
        body = msgspec.json.encode(self.shape(texts))
        headers = {"Content-Type": "application/json"}
        reused = getattr(self._local, "conn", None) is not None
        conn = self._conn()
        try:
            conn.request("POST", self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._local.conn = None  # a dropped keep-alive connection: the next call redials
            conn.close()
            # The server closed an idle keep-alive connection (uvicorn's 5 s timeout, e.g.
            # between the timed cells and the vectors pass): /embed is idempotent, redial once.
            if reused and isinstance(e, (BrokenPipeError, ConnectionResetError,
                                         http.client.RemoteDisconnected)):  # fmt: skip
                return self.post(texts)
            raise
        if resp.status != 200:
            raise HttpError(f"{resp.status} from {self.path}: {data[:300]!r}")
        out = msgspec.json.decode(data)
        if self.count(out) != len(texts):
            raise HttpError(f"{self.path} answered {self.count(out)} vectors for {len(texts)}")
        return out

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def tei_client(port: int) -> Client:
    return Client(port, "/embed", lambda t: {"inputs": t}, lambda o: len(o))  # type: ignore[arg-type]


def openai_client(port: int, model: str) -> Client:
    return Client(
        port,
        "/embeddings",
        lambda t: {"model": model, "input": t},
        lambda o: len(o["data"]),  # type: ignore[index]
    )


def vectors(client: object, out: object) -> list[list[float]]:
    if getattr(client, "path", "") in ("/embed", "/tei.v1.Embed/EmbedStream"):
        return out  # type: ignore[return-value]
    return [d["embedding"] for d in out["data"]]  # type: ignore[index]
