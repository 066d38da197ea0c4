"""Assemble the running server: model + metrics + worker + infer + Litestar app."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata

from litestar import Litestar
from litestar.config.cors import CORSConfig

from tei_runtime.manifest import Task
from tei_serve.errors import make_exception_handler
from tei_serve.infer import Infer
from tei_serve.metrics import Metrics
from tei_serve.metrics_port import MetricsPort
from tei_serve.model import ModelLike
from tei_serve.protocol import ENCODER, ClassifierModel, EmbeddingModel, Info
from tei_serve.routes import build_routes, openapi_document
from tei_serve.settings import Settings
from tei_serve.tracing import Tracing, make_tracing
from tei_serve.worker import Worker

log = logging.getLogger("tei_serve")

_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}


def version() -> str:
    try:
        return metadata.version("tei-onnx")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@dataclass
class Server:
    settings: Settings
    model: ModelLike
    model_id: str
    clock: Callable[[], float] = time.perf_counter
    metrics: Metrics = field(init=False)
    worker: Worker = field(init=False)
    infer: Infer = field(init=False)
    tracing: Tracing | None = field(init=False)
    info_json: bytes = field(init=False)
    openapi_json: bytes = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.metrics = Metrics(self.model.max_input_length)
        self.worker = Worker(
            self.model,
            max_batch_tokens=s.max_batch_tokens,
            max_batch_requests=s.max_batch_requests,
            max_wait=s.max_queue_wait_ms / 1000.0,
            metrics=self.metrics,
            clock=self.clock,
        )
        self.infer = Infer(
            self.model,
            self.worker,
            self.metrics,
            max_concurrent_requests=s.max_concurrent_requests,
            tokenization_workers=s.effective_tokenization_workers(),
            default_prompt_name=s.default_prompt_name,
            default_prompt=s.default_prompt,
            clock=self.clock,
        )
        self.tracing = make_tracing(
            None if s.disable_spans else s.otlp_endpoint, s.otlp_service_name
        )
        self.info_json = ENCODER.encode(self.info())
        self.openapi_json = openapi_document()

    @property
    def served_model_name(self) -> str:
        return self.settings.served_model_name or self.model_id

    def info(self) -> Info:
        m = self.model.manifest
        model_type: dict[str, EmbeddingModel | ClassifierModel]
        if m.task in (Task.CLASSIFY, Task.RERANK):
            id2label = {str(k): v for k, v in sorted(m.labels.items())}
            label2id = {v: k for k, v in sorted(m.labels.items())}
            kind = "reranker" if m.task is Task.RERANK else "classifier"
            model_type = {kind: ClassifierModel(id2label=id2label, label2id=label2id)}
        else:
            pooling = m.pooling.value.replace("-", "_") if m.pooling is not None else "cls"
            model_type = {"embedding": EmbeddingModel(pooling=pooling)}
        precision = getattr(self.model.precision, "value", self.model.precision)
        return Info(
            model_id=self.model_id,
            model_sha=self.settings.revision or m.source.commit_sha,
            model_dtype=_DTYPES.get(str(precision), str(precision)),
            served_model_name=self.served_model_name,
            model_type=model_type,
            max_concurrent_requests=self.settings.max_concurrent_requests,
            max_input_length=self.model.max_input_length,
            max_batch_tokens=self.settings.max_batch_tokens,
            max_batch_requests=self.settings.max_batch_requests,
            max_client_batch_size=self.settings.max_client_batch_size,
            auto_truncate=self.settings.auto_truncate,
            tokenization_workers=self.settings.effective_tokenization_workers(),
            version=version(),
            sha=os.environ.get("GIT_SHA"),
            docker_label=os.environ.get("DOCKER_LABEL"),
        )


def build_app(server: Server) -> Litestar:
    s = server.settings

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        metrics_port = MetricsPort(server.metrics.render, s.hostname, s.prometheus_port)
        await metrics_port.start()
        server.worker.start()
        try:
            yield
        finally:
            # The ASGI server has answered every accepted request by now; finish the queue.
            await server.worker.stop()
            await metrics_port.close()
            server.infer.close()
            if server.tracing is not None:
                server.tracing.shutdown()

    origins = list(s.cors_allow_origin) if s.cors_allow_origin else ["*"]
    cors = CORSConfig(
        allow_origins=["*"] if "*" in origins else origins,
        allow_methods=["GET", "POST"],
        allow_headers=["content-type"],
    )
    handler = make_exception_handler(server.metrics)
    return Litestar(
        route_handlers=build_routes(server),
        exception_handlers={Exception: handler},  # type: ignore[dict-item]
        cors_config=cors,
        request_max_body_size=s.payload_limit,
        openapi_config=None,
        lifespan=[lifespan],
        logging_config=None,
    )
