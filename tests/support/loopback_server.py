"""A real tei-serve HTTP app on uvicorn over loopback, in a thread of the test process."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from tei_serve.cli import uvicorn_config
from tei_serve.model import ServedModel
from tei_serve.models import Models
from tei_serve.serving import Serving
from tei_serve.settings import Settings


@dataclass
class Running:
    serving: Serving
    uv: uvicorn.Server
    thread: threading.Thread
    url: str
    client: httpx.Client

    @property
    def model(self) -> Any:
        return self.serving.model

    def stop(self) -> None:
        self.client.close()
        self.uv.should_exit = True
        self.thread.join(timeout=30)


def loopback(**settings: Any) -> Settings:
    """Settings of a test server: loopback, free ports, two tokenizer threads."""
    settings.setdefault("hostname", "127.0.0.1")
    settings.setdefault("port", 0)
    settings.setdefault("prometheus_port", 0)
    settings.setdefault("tokenization_workers", 2)
    return Settings(**settings)


def start(model: ServedModel, **settings: Any) -> Running:
    serving = Serving(settings=loopback(**settings), model=model,
                      model_id=model.manifest.source.model_id)
    uv, thread, url = run_uvicorn(serving)
    return Running(serving, uv, thread, url, httpx.Client(base_url=url, timeout=30))


def run_uvicorn(front: Serving | Models) -> tuple[uvicorn.Server, threading.Thread, str]:
    """The HTTP app over `front` on uvicorn in a thread; returns once it listens."""
    uv = uvicorn.Server(uvicorn_config(front))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        if not thread.is_alive():
            raise RuntimeError("server did not start")
        threading.Event().wait(0.01)
    port = uv.servers[0].sockets[0].getsockname()[1]
    return uv, thread, f"http://127.0.0.1:{port}"
