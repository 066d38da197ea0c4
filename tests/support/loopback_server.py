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


def served_embeddings(model: ServedModel, texts: list[str]) -> Any:
    """`/embed` of `texts` from `model` served on loopback: float32 [n, dim] (numpy)."""
    import numpy as np

    running = start(model)
    try:
        r = running.client.post("/embed", json={"inputs": texts})
        assert r.status_code == 200, r.text
        return np.asarray(r.json(), dtype=np.float32)
    finally:
        running.stop()


def served_logits(model: ServedModel, inputs: list[str] | list[tuple[str, str]]) -> Any:
    """`/predict` with `raw_scores` of single texts or pairs from `model` served on loopback:
    float32 [n, labels] in the head's label order (TEI answers each row sorted by score)."""
    import numpy as np

    labels = model.manifest.labels
    column = {name: index for index, name in labels.items()}
    running = start(model)
    try:
        body = {"inputs": [list(i) if isinstance(i, tuple) else [i] for i in inputs],
                "raw_scores": True}  # fmt: skip
        r = running.client.post("/predict", json=body)
        assert r.status_code == 200, r.text
        rows = np.zeros((len(inputs), len(labels)), dtype=np.float32)
        for row, predictions in enumerate(r.json()):
            for prediction in predictions:
                rows[row, column[prediction["label"]]] = prediction["score"]
        return rows
    finally:
        running.stop()
