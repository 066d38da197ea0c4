"""HTTP handlers: decode, validate, call `Infer`, encode, add TEI's x-* headers.

Every handler is built by `build_routes(server)` as a closure over the running `Server`.
Protected routes carry the API-key guard; /health, /ping, GET /, /metrics and the docs do not.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from litestar import Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.handlers.http_handlers import HTTPRouteHandler

from tei_runtime import errors as rt_errors
from tei_runtime.manifest import Task
from tei_serve.errors import (
    BatchSizeError,
    BodyError,
    EmptyError,
    ModelTypeError,
    TeiError,
    UnauthorizedError,
    UnhealthyError,
    ValidationError,
)
from tei_serve.infer import Meta, map_runtime_error
from tei_serve.metrics import CONTENT_TYPE
from tei_serve.model import Array, Input
from tei_serve.protocol import (
    ENCODER,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    OpenAIEmbedding,
    OpenAIRequest,
    OpenAIResponse,
    OpenAIUsage,
    Prediction,
    PredictRequest,
    Rank,
    RerankRequest,
    SimilarityRequest,
    SimpleToken,
    SparseValue,
    TokenizeRequest,
    decode,
    parse_ids,
    parse_inputs,
    parse_predict_inputs,
)
from tei_serve.worker import Op

if TYPE_CHECKING:
    from tei_serve.app import Server

log = logging.getLogger("tei_serve.access")

T = TypeVar("T")
AnyRequest = Request[Any, Any, Any]
JSON = "application/json"


class ClientGoneError(TeiError):
    """The client closed the connection before its answer was ready."""

    status = 499
    metric = None


SWAGGER_HTML = """<!doctype html>
<html><head><title>Text Embeddings Inference</title><meta charset="utf-8"/>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"/></head>
<body><div id="swagger-ui"></div>
<script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/api-doc/openapi.json", dom_id: "#swagger-ui"});</script>
</body></html>
"""


def openapi_document() -> bytes:
    return resources.files("tei_serve").joinpath("openapi.json").read_bytes()


async def _wait_disconnect(request: AnyRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: AnyRequest, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`, cancelling it (and so dropping its queued entries) if the client leaves."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGoneError("client disconnected")


def _is_json(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == JSON or (mime.startswith("application/") and mime.endswith("+json"))


async def read_body(request: AnyRequest) -> bytes:
    if not _is_json(request.headers.get("content-type", "")):
        raise BodyError("Expected request with `Content-Type: application/json`", status=415)
    return await request.body()


def _norm_rows(x: Array) -> Array:
    norms = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Array = (x / norms).astype(np.float32)
    return out


def _sigmoid(x: Array) -> Array:
    out: Array = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    return out


def _softmax(x: Array) -> Array:
    z = x.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    out: Array = (z / z.sum(axis=-1, keepdims=True)).astype(np.float32)
    return out


def build_routes(srv: Server) -> list[HTTPRouteHandler]:
    settings = srv.settings
    manifest = srv.model.manifest
    task = manifest.task
    labels = manifest.labels
    compute_type = os.environ.get("COMPUTE_TYPE", "gpu+optimized")

    def auth_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if settings.api_key is None:
            return
        if connection.headers.get("authorization") != f"Bearer {settings.api_key}":
            raise UnauthorizedError()

    guards = [auth_guard]

    # -- helpers ---------------------------------------------------------------------------

    def truncate_of(value: bool | None) -> bool:
        return settings.auto_truncate if value is None else value

    def check_batch(n: int) -> None:
        if n > settings.max_client_batch_size:
            raise BatchSizeError(
                f"batch size {n} > maximum allowed batch size {settings.max_client_batch_size}"
            )

    def check_not_empty(inputs: Sequence[Input]) -> None:
        for inp in inputs:
            if (isinstance(inp, str) and not inp) or (
                isinstance(inp, tuple) and not (inp[0] or inp[1])
            ):
                raise EmptyError("Input validation error: `inputs` cannot be empty")

    def headers(meta: Meta) -> dict[str, str]:
        total = srv.clock() - meta.start
        return {
            "x-compute-type": compute_type,
            "x-compute-time": str(int(total * 1000)),
            "x-compute-characters": str(meta.chars),
            "x-compute-tokens": str(meta.tokens),
            "x-total-time": str(int(total * 1000)),
            "x-tokenization-time": str(int(meta.tokenization * 1000)),
            "x-queue-time": str(int(meta.queue * 1000)),
            "x-inference-time": str(int(meta.inference * 1000)),
        }

    def record(meta: Meta, method: str, family: str, n: int) -> None:
        m = srv.metrics
        total = srv.clock() - meta.start
        m.inc("te_request_success", method)
        m.request_duration.observe(total)
        m.request_tokenization.observe(meta.tokenization)
        m.request_queue.observe(meta.queue)
        m.request_inference.observe(meta.inference)
        if family == "embed":
            m.inc("te_embed_success", by=n)
            m.embed_duration.observe(total)
            m.embed_tokenization.observe(meta.tokenization)
            m.embed_queue.observe(meta.queue)
            m.embed_inference.observe(meta.inference)
        elif family == "predict":
            m.inc("te_predict_success", by=n)
            m.predict_duration.observe(total)
            m.predict_tokenization.observe(meta.tokenization)
            m.predict_queue.observe(meta.queue)
            m.predict_inference.observe(meta.inference)

    def respond(content: bytes, meta: Meta | None = None) -> Response[bytes]:
        return Response(
            content=content, status_code=200, media_type=JSON,
            headers=headers(meta) if meta else None,
        )

    async def guarded(
        request: AnyRequest,
        handler: str,
        work: Callable[[Meta], Awaitable[tuple[bytes, str, str, int]]],
    ) -> Response[bytes]:
        """Time, count, trace and log one inference request; cancel it if the client leaves.

        `handler` is TEI's name for what runs (its span name: `/` runs `embed`, `rerank` ...).
        """
        meta = Meta(start=srv.clock())

        def trace(error: Exception | None = None) -> None:
            if srv.tracing is not None:
                srv.tracing.record(
                    handler, request.url.path, request.headers, meta, srv.clock() - meta.start,
                    error=error,
                )  # fmt: skip

        try:
            content, method, family, n = await until_disconnect(request, _run(work, meta))
        except Exception as e:
            trace(e)
            raise
        record(meta, method, family, n)
        trace()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "%s %s inputs=%d tokens=%d total_ms=%.1f queue_ms=%.1f inference_ms=%.1f",
                request.method, request.url.path, n, meta.tokens,
                (srv.clock() - meta.start) * 1000, meta.queue * 1000, meta.inference * 1000,
            )
        return respond(content, meta)

    async def _run(
        work: Callable[[Meta], Awaitable[tuple[bytes, str, str, int]]], meta: Meta
    ) -> tuple[bytes, str, str, int]:
        return await work(meta)

    def count(method: str, family: str, n: int) -> None:
        srv.metrics.inc("te_request_count", method)
        if family == "embed":
            srv.metrics.inc("te_embed_count", by=n)
        elif family == "predict":
            srv.metrics.inc("te_predict_count", by=n)

    # -- shared engines --------------------------------------------------------------------

    async def pooled(
        inputs: Sequence[Input],
        meta: Meta,
        *,
        truncate: bool,
        direction: str,
        prompt_name: str | None,
        normalize: bool,
        dimensions: int | None,
    ) -> list[Array]:
        if task in (Task.CLASSIFY, Task.RERANK):
            raise ModelTypeError("Backend error: Model is not an embedding model")
        if task is Task.SPARSE and normalize:
            raise ModelTypeError("`normalize` is not available for SPLADE models")
        if dimensions is not None and dimensions <= 0:
            raise ValidationError("`dimensions` should be positive")
        op = Op.SPARSE if task is Task.SPARSE else Op.EMBED
        results = await srv.infer.run(
            inputs, op, truncate=truncate, truncation_direction=direction,
            prompt_name=prompt_name, meta=meta,
        )
        rows = np.stack([r.value for r in results]).astype(np.float32, copy=False)
        if dimensions is not None:
            if dimensions > rows.shape[-1]:
                raise ValidationError(
                    f"`dimensions` ({dimensions}) is larger than the model's embedding size "
                    f"({rows.shape[-1]})"
                )
            rows = rows[:, :dimensions]
        if normalize:
            rows = _norm_rows(rows)
        return list(rows)

    async def logits(
        inputs: Sequence[Input], meta: Meta, *, truncate: bool, direction: str
    ) -> list[Array]:
        results = await srv.infer.run(
            inputs, Op.LOGITS, truncate=truncate, truncation_direction=direction,
            meta=meta, use_prompt=False,
        )
        return [r.value for r in results]

    # -- embedding routes ------------------------------------------------------------------

    async def do_embed(req: EmbedRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        inputs, batch = parse_inputs(req.inputs)
        method = "batch" if batch else "single"
        count(method, "embed", len(inputs))
        check_batch(len(inputs))
        check_not_empty(inputs)
        rows = await pooled(
            inputs, meta, truncate=truncate_of(req.truncate), direction=req.truncation_direction,
            prompt_name=req.prompt_name, normalize=req.normalize, dimensions=req.dimensions,
        )
        return ENCODER.encode([r.tolist() for r in rows]), method, "embed", len(inputs)

    async def do_embed_all(req: EmbedAllRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        inputs, batch = parse_inputs(req.inputs)
        method = "batch" if batch else "single"
        count(method, "embed", len(inputs))
        if task in (Task.CLASSIFY, Task.RERANK):
            raise ModelTypeError("Backend error: Model is not an embedding model")
        if task is Task.SPARSE:
            raise ModelTypeError("`embed_all` is not available for SPLADE models")
        check_batch(len(inputs))
        check_not_empty(inputs)
        results = await srv.infer.run(
            inputs, Op.TOKENS, truncate=truncate_of(req.truncate),
            truncation_direction=req.truncation_direction, prompt_name=req.prompt_name,
            meta=meta,
        )
        values = [r.value for r in results]

        def encode() -> bytes:
            return ENCODER.encode([v.tolist() for v in values])

        content = await srv.infer.off_loop(encode)
        assert isinstance(content, bytes)
        return content, method, "embed", len(inputs)

    async def do_embed_sparse(req: EmbedAllRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        inputs, batch = parse_inputs(req.inputs)
        method = "batch" if batch else "single"
        count(method, "embed", len(inputs))
        if task is not Task.SPARSE:
            raise ModelTypeError("Model is not an embedding model with SPLADE pooling")
        check_batch(len(inputs))
        check_not_empty(inputs)
        rows = await pooled(
            inputs, meta, truncate=truncate_of(req.truncate), direction=req.truncation_direction,
            prompt_name=req.prompt_name, normalize=False, dimensions=None,
        )
        out = []
        for row in rows:
            (nz,) = np.nonzero(row)
            out.append([SparseValue(index=int(i), value=float(row[i])) for i in nz])
        return ENCODER.encode(out), method, "embed", len(inputs)

    async def do_openai(req: OpenAIRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        inputs, batch = parse_inputs(req.input, field="input")
        method = "batch" if batch else "single"
        count(method, "embed", len(inputs))
        if req.model is not None and req.model != srv.served_model_name:
            log.warning("request model %r is not the served model %r", req.model,
                        srv.served_model_name)
        check_batch(len(inputs))
        check_not_empty(inputs)
        rows = await pooled(
            inputs, meta, truncate=settings.auto_truncate, direction="right",
            prompt_name=None, normalize=True, dimensions=req.dimensions,
        )
        data = []
        for i, row in enumerate(rows):
            emb: list[float] | str
            if req.encoding_format == "base64":
                emb = base64.b64encode(row.astype("<f4").tobytes()).decode()
            else:
                emb = row.tolist()
            data.append(OpenAIEmbedding(object="embedding", embedding=emb, index=i))
        body = OpenAIResponse(
            object="list", data=data, model=srv.served_model_name,
            usage=OpenAIUsage(prompt_tokens=meta.tokens, total_tokens=meta.tokens),
        )
        return ENCODER.encode(body), method, "embed", len(inputs)

    async def do_similarity(req: SimilarityRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        params = req.parameters
        sentences = req.inputs.sentences
        inputs: list[Input] = [req.inputs.source_sentence, *sentences]
        count("batch", "embed", len(inputs))
        if not sentences:
            raise EmptyError("`inputs.sentences` cannot be empty")
        check_batch(len(inputs))
        check_not_empty(inputs)
        rows = await pooled(
            inputs, meta,
            truncate=truncate_of(params.truncate if params else None),
            direction=params.truncation_direction if params else "right",
            prompt_name=params.prompt_name if params else None,
            normalize=False, dimensions=None,
        )
        src = rows[0].astype(np.float64)
        scores = []
        for row in rows[1:]:
            r = row.astype(np.float64)
            denom = float(np.linalg.norm(src) * np.linalg.norm(r))
            scores.append(float(src @ r) / denom if denom else 0.0)
        return ENCODER.encode(scores), "batch", "embed", len(inputs)

    # -- classifier routes -----------------------------------------------------------------

    def predictions(row: Array, raw: bool) -> list[Prediction]:
        if raw:
            scores = row
        elif row.shape[-1] == 1:
            scores = _sigmoid(row)
        else:
            scores = _softmax(row)
        if np.isnan(scores).any():
            raise NaNScoreError()
        preds = [
            Prediction(score=float(s), label=labels.get(i, str(i))) for i, s in enumerate(scores)
        ]
        preds.sort(key=lambda p: p.score, reverse=True)
        return preds

    async def do_predict(req: PredictRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        inputs, batch = parse_predict_inputs(req.inputs)
        method = "batch" if batch else "single"
        count(method, "predict", len(inputs))
        if task not in (Task.CLASSIFY, Task.RERANK):
            raise ModelTypeError("Backend error: Model is not a classifier model")
        check_batch(len(inputs))
        check_not_empty(inputs)
        rows = await logits(
            inputs, meta, truncate=truncate_of(req.truncate), direction=req.truncation_direction
        )
        preds = [predictions(r, req.raw_scores) for r in rows]
        content = ENCODER.encode(preds if batch else preds[0])
        return content, method, "predict", len(inputs)

    async def do_rerank(req: RerankRequest, meta: Meta) -> tuple[bytes, str, str, int]:
        count("batch", "predict", len(req.texts))
        if task is not Task.RERANK:
            raise ModelTypeError("Backend error: model is not a re-ranker model")
        if not req.texts:
            raise EmptyError("`texts` cannot be empty")
        check_batch(len(req.texts))
        inputs: list[Input] = [(req.query, t) for t in req.texts]
        check_not_empty(inputs)
        rows = await logits(
            inputs, meta, truncate=truncate_of(req.truncate), direction=req.truncation_direction
        )
        ranks = []
        for i, row in enumerate(rows):
            score = float(row[0]) if req.raw_scores else float(_sigmoid(row[:1])[0])
            if math.isnan(score):
                raise NaNScoreError()
            ranks.append(
                Rank(index=i, score=score, text=req.texts[i] if req.return_text else None)
            )
        ranks.sort(key=lambda r: r.score, reverse=True)
        return ENCODER.encode(ranks), "batch", "predict", len(inputs)

    # -- handlers --------------------------------------------------------------------------

    @post("/embed", guards=guards)
    async def embed(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), EmbedRequest)
        return await guarded(request, "embed", lambda m: do_embed(req, m))

    @post("/embed_all", guards=guards)
    async def embed_all(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), EmbedAllRequest)
        return await guarded(request, "embed_all", lambda m: do_embed_all(req, m))

    @post("/embed_sparse", guards=guards)
    async def embed_sparse(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), EmbedAllRequest)
        return await guarded(request, "embed_sparse", lambda m: do_embed_sparse(req, m))

    @post(["/v1/embeddings", "/embeddings"], guards=guards)
    async def openai_embed(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), OpenAIRequest)
        return await guarded(request, "openai_embed", lambda m: do_openai(req, m))

    @post("/similarity", guards=guards)
    async def similarity(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), SimilarityRequest)
        return await guarded(request, "similarity", lambda m: do_similarity(req, m))

    @post("/predict", guards=guards)
    async def predict(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), PredictRequest)
        return await guarded(request, "predict", lambda m: do_predict(req, m))

    @post("/rerank", guards=guards)
    async def rerank(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), RerankRequest)
        return await guarded(request, "rerank", lambda m: do_rerank(req, m))

    @post(["/", "/invocations"], guards=guards)
    async def invocations(request: AnyRequest) -> Response[bytes]:
        body = await read_body(request)
        if task is Task.CLASSIFY:
            p = decode(body, PredictRequest)
            return await guarded(request, "predict", lambda m: do_predict(p, m))
        if task is Task.RERANK:
            r = decode(body, RerankRequest)
            return await guarded(request, "rerank", lambda m: do_rerank(r, m))
        if os.environ.get("TASK") == "sentence-similarity":
            s = decode(body, SimilarityRequest)
            return await guarded(request, "similarity", lambda m: do_similarity(s, m))
        if task is Task.SPARSE:
            sp = decode(body, EmbedAllRequest)
            return await guarded(request, "embed_sparse", lambda m: do_embed_sparse(sp, m))
        e = decode(body, EmbedRequest)
        return await guarded(request, "embed", lambda m: do_embed(e, m))

    @post("/tokenize", guards=guards)
    async def tokenize(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), TokenizeRequest)
        inputs = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        if not inputs:
            raise EmptyError("`inputs` cannot be empty")
        check_batch(len(inputs))
        prompt_name = req.prompt_name or srv.infer.default_prompt_name

        def work() -> bytes:
            toks = srv.model.tokenize(
                inputs, add_special_tokens=req.add_special_tokens, prompt_name=prompt_name
            )
            return ENCODER.encode([
                [SimpleToken(id=t.id, text=t.text, special=t.special,
                             start=None if t.special else t.start,
                             stop=None if t.special else t.stop) for t in seq]
                for seq in toks
            ])

        return respond(await _offload(work))

    @post("/decode", guards=guards)
    async def decode_ids(request: AnyRequest) -> Response[bytes]:
        req = decode(await read_body(request), DecodeRequest)
        ids = parse_ids(req.ids)
        check_batch(len(ids))

        def work() -> bytes:
            texts = srv.model.decode(ids, skip_special_tokens=req.skip_special_tokens)
            return ENCODER.encode(list(texts))

        return respond(await _offload(work))

    async def _offload(work: Callable[[], bytes]) -> bytes:
        try:
            out = await srv.infer.off_loop(work)
        except rt_errors.TeiRuntimeError as e:
            mapped = map_runtime_error(e)
            if mapped is None:
                raise
            raise mapped from e
        assert isinstance(out, bytes)
        return out

    @get("/info", guards=guards)
    async def info() -> Response[bytes]:
        return respond(srv.info_json)

    async def health_response() -> Response[bytes]:
        if not srv.worker.healthy:
            await srv.worker.probe(Op.LOGITS if task in (Task.CLASSIFY, Task.RERANK)
                                   else Op.SPARSE if task is Task.SPARSE else Op.EMBED)
        if not srv.worker.healthy:
            raise UnhealthyError()
        return Response(content=b"", status_code=200)

    @get(["/health", "/ping"])
    async def health() -> Response[bytes]:
        return await health_response()

    @get("/")
    async def root_health() -> Response[bytes]:
        return await health_response()

    @get("/metrics")
    async def metrics() -> Response[bytes]:
        return Response(content=srv.metrics.render(), media_type=CONTENT_TYPE)

    @get("/docs")
    async def docs() -> Response[str]:
        return Response(content=SWAGGER_HTML, media_type="text/html")

    @get(["/api-doc/openapi.json", "/openapi.json"])
    async def openapi() -> Response[bytes]:
        return respond(srv.openapi_json)

    return [
        embed, embed_all, embed_sparse, openai_embed, similarity, predict, rerank, invocations,
        tokenize, decode_ids, info, health, root_health, metrics, docs, openapi,
    ]


class NaNScoreError(TeiError):
    status = 424
    metric = "inference"

    def __init__(self) -> None:
        super().__init__("score is NaN")
