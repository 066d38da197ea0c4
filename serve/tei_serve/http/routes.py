"""TEI's HTTP routes as thin adapters: decode the body, pick the model, call its `Serving`,
encode, add headers.

`build_routes(models)` returns the handlers. The model is picked by `Models.pick` (the rules
are `tei_serve.routing`'s) from the body's `model` field, else the `x-model` header.
Protected routes carry the API-key guard; /health, /ping, GET /, /metrics and the docs do
not. `observe` runs an operation under
`tei_serve.observe.observed` (metrics, span, log line; shared with any other front-end) and
cancels it when the client leaves.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, assert_never

import msgspec
from litestar import Request, Response, post, route
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.handlers.http_handlers import HTTPRouteHandler
from litestar.params import FromPath

from tei_runtime.manifest import Task
from tei_serve.auth import ApiKey
from tei_serve.errors import (
    BodyError,
    ClientGoneError,
    ModelChoiceError,
    OverloadedError,
    UnauthorizedError,
    UnknownModelError,
)
from tei_serve.http.body import read_body
from tei_serve.http.docs import docs_routes
from tei_serve.http.errors import BareResponse
from tei_serve.http.floats import json_array, json_scores
from tei_serve.http.protocol import (
    DECODERS,
    ENCODER,
    GET_HEAD,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    Named,
    OpenAIEmbedding,
    OpenAIModel,
    OpenAIModelList,
    OpenAIRequest,
    OpenAIResponse,
    OpenAIUsage,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    SparseValue,
    TokenizeRequest,
    VertexRequest,
    decode,
    direction_of,
    parse_ids,
    parse_inputs,
    parse_predict_inputs,
)
from tei_serve.metrics import Family, Method
from tei_serve.models import Models
from tei_serve.observe import R, observed
from tei_serve.routing import Route
from tei_serve.serving import (
    DecodeQuery,
    EmbedAllQuery,
    EmbedQuery,
    Metadata,
    OpenAIQuery,
    Prediction,
    PredictQuery,
    Rank,
    RerankQuery,
    Serving,
    SimilarityQuery,
    TokenizeQuery,
    compute_type,
    timing_headers,
)

T = TypeVar("T")
Scored = TypeVar("Scored", Rank, Prediction)
AnyRequest = Request[Any, Any, Any]
RouteRun = Callable[[AnyRequest, bytes, "Serving | None"], Awaitable[Response[bytes]]]
"""A route's body handler: the request, its body, the model already picked (None: pick)."""
JSON = "application/json"
MODEL_HEADER = "x-model"
OWNED_BY = "tei-onnx"

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


def auth_guard(
    api_key: ApiKey,
) -> Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], Awaitable[None]]:
    """`--api-key`'s check, as a route guard. A guard runs before the handler: a refused
    request reads no body and tokenizes nothing. Async because Litestar runs a sync guard on a
    worker thread: a thread hop per request."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        if not api_key.accepts_header(connection.headers.get("authorization", "")):
            raise UnauthorizedError()

    return guard


def _tei_scores(items: list[Scored]) -> list[Scored]:
    """Each score as the float TEI's JSON text of it reads back as (float32's shortest
    digits; tei_serve.http.floats)."""
    scores = json_scores([item.score for item in items])
    return [msgspec.structs.replace(item, score=score)
            for item, score in zip(items, scores, strict=True)]  # fmt: skip


def _method(batch: bool) -> Method:
    return "batch" if batch else "single"


def _model_header(request: AnyRequest) -> str | None:
    """The `x-model` header as UTF-8 (HTTP hands header bytes over as latin-1), so a served
    name such as `café` can be picked by header as by the body."""
    value = request.headers.get(MODEL_HEADER)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def _named(body: bytes) -> object:
    """The body's `model` field (None: none); a body that does not decode is reported by the
    route it reaches."""
    try:
        named: Named = DECODERS[Named].decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    return named.model


def build_routes(front: Serving | Models) -> list[HTTPRouteHandler]:
    models = Models.of(front)
    settings = models.settings
    compute = compute_type()
    info_json = ENCODER.encode(models.info)
    openai_models = {
        s.served_model_name: OpenAIModel(id=s.served_model_name, object="model",
                                         created=s.created, owned_by=OWNED_BY)
        for s in models.servings
    }  # fmt: skip
    model_list = ENCODER.encode(OpenAIModelList(object="list", data=list(openai_models.values())))
    guards = [] if settings.api_key is None else [auth_guard(ApiKey(settings.api_key))]

    def body_of(request: AnyRequest) -> Awaitable[bytes]:
        return read_body(request, settings.payload_limit)

    def respond(content: bytes, meta: Metadata | None = None) -> Response[bytes]:
        headers = timing_headers(meta, compute) if meta is not None else None
        return Response(content=content, status_code=200, media_type=JSON, headers=headers)

    def pick(
        request: AnyRequest, route: Route, named: object, method: Method | None = None
    ) -> Serving:
        """The model for `route`: the body's `model` field, else the `x-model` header. The
        error handler counts a failure after this under the picked model; a request counted
        in `te_request_count` gives its `method`, so that one no model takes is counted too."""
        if named is not None and not isinstance(named, str):
            if models.several:  # it was meant to pick one: say so rather than guess
                models.count_unrouted(method)
                raise ModelChoiceError("`model` must be a served model's name (a string)")
            named = None  # one model: ignored, as TEI's server ignores the field
        serving = models.pick(route, named or _model_header(request), method)
        request.state.model = serving.served_model_name
        return serving

    def observe(
        serving: Serving, request: AnyRequest, handler: str, method: Method, family: Family,
        n: int, work: Coroutine[Any, Any, R],
    ) -> Awaitable[R]:
        """`work` cancelled if the client leaves, under the request's metrics, span and log."""
        return observed(
            serving, until_disconnect(request, work), handler=handler, route=request.url.path,
            carrier=request.headers, method=method, family=family, n=n,
        )  # fmt: skip

    # -- one function per operation, shared by its route and `/` ------------------------------

    async def run_embed(
        request: AnyRequest, body: bytes, chosen: Serving | None = None
    ) -> Response[bytes]:
        req = decode(body, EmbedRequest)
        inputs, batch = parse_inputs(req.inputs)
        serving = chosen or pick(request, Route.EMBED, req.model, _method(batch))
        q = EmbedQuery(
            inputs=inputs, truncate=req.truncate, prompt_name=req.prompt_name,
            truncation_direction=direction_of(req.truncation_direction),
            normalize=req.normalize, dimensions=req.dimensions,
        )  # fmt: skip
        r = await observe(serving, request, "embed", _method(batch), "embed", len(inputs),
                          serving.embed(q))  # fmt: skip
        return respond(ENCODER.encode(json_array(r.vectors)), r.metadata)

    def embed_all_query(req: EmbedAllRequest) -> tuple[EmbedAllQuery, bool]:
        inputs, batch = parse_inputs(req.inputs)
        q = EmbedAllQuery(
            inputs=inputs, truncate=req.truncate, prompt_name=req.prompt_name,
            truncation_direction=direction_of(req.truncation_direction),
        )  # fmt: skip
        return q, batch

    async def run_embed_sparse(
        request: AnyRequest, body: bytes, chosen: Serving | None = None
    ) -> Response[bytes]:
        req = decode(body, EmbedAllRequest)
        q, batch = embed_all_query(req)
        serving = chosen or pick(request, Route.EMBED_SPARSE, req.model, _method(batch))
        r = await observe(serving, request, "embed_sparse", _method(batch), "embed", len(q.inputs),
                           serving.embed_sparse(q))  # fmt: skip
        out = [
            [SparseValue(index=i, value=v)
             for i, v in zip(s.indices, json_scores(s.values), strict=True)]
            for s in r.vectors
        ]  # fmt: skip
        return respond(ENCODER.encode(out), r.metadata)

    async def run_similarity(
        request: AnyRequest, body: bytes, chosen: Serving | None = None
    ) -> Response[bytes]:
        req = decode(body, SimilarityRequest)
        serving = chosen or pick(request, Route.SIMILARITY, req.model, "batch")
        p = req.parameters
        q = SimilarityQuery(
            source_sentence=req.inputs.source_sentence, sentences=req.inputs.sentences,
            truncate=p.truncate if p else None, prompt_name=p.prompt_name if p else None,
            truncation_direction=direction_of(p.truncation_direction) if p else "right",
        )  # fmt: skip
        n = 1 + len(q.sentences)
        r = await observe(serving, request, "similarity", "batch", "embed", n,
                          serving.similarity(q))  # fmt: skip
        return respond(ENCODER.encode(json_scores(r.scores)), r.metadata)

    async def run_predict(
        request: AnyRequest, body: bytes, chosen: Serving | None = None
    ) -> Response[bytes]:
        req = decode(body, PredictRequest)
        inputs, batch = parse_predict_inputs(req.inputs)
        serving = chosen or pick(request, Route.PREDICT, req.model, _method(batch))
        q = PredictQuery(
            inputs=inputs, truncate=req.truncate, raw_scores=req.raw_scores,
            truncation_direction=direction_of(req.truncation_direction),
            instruction=req.instruction,
        )  # fmt: skip
        r = await observe(serving, request, "predict", _method(batch), "predict", len(inputs),
                           serving.predict(q))  # fmt: skip
        predictions = [_tei_scores(p) for p in r.predictions]
        return respond(ENCODER.encode(predictions if batch else predictions[0]), r.metadata)

    async def run_rerank(
        request: AnyRequest, body: bytes, chosen: Serving | None = None
    ) -> Response[bytes]:
        req = decode(body, RerankRequest)
        serving = chosen or pick(request, Route.RERANK, req.model, "batch")
        q = RerankQuery(
            query=req.query, texts=req.texts, truncate=req.truncate, raw_scores=req.raw_scores,
            truncation_direction=direction_of(req.truncation_direction),
            return_text=req.return_text, instruction=req.instruction,
        )  # fmt: skip
        r = await observe(serving, request, "rerank", "batch", "predict", len(req.texts),
                           serving.rerank(q))  # fmt: skip
        return respond(ENCODER.encode(_tei_scores(r.ranks)), r.metadata)

    # -- routes ---------------------------------------------------------------------------

    @post("/embed", guards=guards)
    async def embed(request: AnyRequest) -> Response[bytes]:
        return await run_embed(request, await body_of(request))

    @post("/embed_all", guards=guards)
    async def embed_all(request: AnyRequest) -> Response[bytes]:
        req = decode(await body_of(request), EmbedAllRequest)
        q, batch = embed_all_query(req)
        serving = pick(request, Route.EMBED_ALL, req.model, _method(batch))
        r = await observe(serving, request, "embed_all", _method(batch), "embed", len(q.inputs),
                           serving.embed_all(q))  # fmt: skip
        content = await serving.offload(lambda: ENCODER.encode([json_array(v) for v in r.vectors]))
        return respond(content, r.metadata)

    @post("/embed_sparse", guards=guards)
    async def embed_sparse(request: AnyRequest) -> Response[bytes]:
        return await run_embed_sparse(request, await body_of(request))

    @post(["/v1/embeddings", "/embeddings"], guards=guards)
    async def openai_embed(request: AnyRequest) -> Response[bytes]:
        req = decode(await body_of(request), OpenAIRequest)
        inputs, batch = parse_inputs(req.input, field="input")
        serving = pick(request, Route.OPENAI, req.model, _method(batch))
        q = OpenAIQuery(inputs=inputs, model=req.model, dimensions=req.dimensions)
        r = await observe(serving, request, "openai_embed", _method(batch), "embed", len(inputs),
                           serving.openai_embed(q))  # fmt: skip
        base64_out = req.encoding_format == "base64"
        data = [
            OpenAIEmbedding(
                object="embedding", index=i,
                embedding=base64.b64encode(row.astype("<f4").tobytes()).decode()
                if base64_out else json_array(row),
            )
            for i, row in enumerate(r.vectors)
        ]  # fmt: skip
        tokens = r.metadata.compute_tokens
        body = OpenAIResponse(object="list", data=data, model=r.model,
                              usage=OpenAIUsage(prompt_tokens=tokens, total_tokens=tokens))
        return respond(ENCODER.encode(body), r.metadata)

    @post("/similarity", guards=guards)
    async def similarity(request: AnyRequest) -> Response[bytes]:
        return await run_similarity(request, await body_of(request))

    @post("/predict", guards=guards)
    async def predict(request: AnyRequest) -> Response[bytes]:
        return await run_predict(request, await body_of(request))

    @post("/rerank", guards=guards)
    async def rerank(request: AnyRequest) -> Response[bytes]:
        return await run_rerank(request, await body_of(request))

    @post(["/", "/invocations"], guards=guards)
    async def invocations(request: AnyRequest) -> Response[bytes]:
        body = await body_of(request)
        named = _named(body) if models.several else None
        serving = pick(request, Route.ANY, named)
        match serving.task:
            case Task.CLASSIFY:
                return await run_predict(request, body, serving)
            case Task.RERANK:
                return await run_rerank(request, body, serving)
            case Task.EMBED | Task.SPARSE:
                if settings.similarity_root:
                    return await run_similarity(request, body, serving)
                if serving.task is Task.SPARSE:
                    return await run_embed_sparse(request, body, serving)
                return await run_embed(request, body, serving)
            case _:
                assert_never(serving.task)

    @post("/vertex", guards=guards)
    async def vertex(request: AnyRequest) -> Response[bytes]:
        """Vertex AI's route, which TEI always registers: each instance is answered as its own
        request (a rerank one where it reads as one, else the model's own route), together;
        the first failing instance, in order, is the answer. As in TEI, every instance is
        decoded before any runs, so a malformed one is the answer and nothing is computed."""
        instances = decode(await body_of(request), VertexRequest).instances
        calls: list[tuple[RouteRun, bytes, Serving | None]] = []
        for i, raw in enumerate(bytes(r) for r in instances):
            if i % 1000 == 999:  # ~10 ms of decoding: let other requests and probes in
                await asyncio.sleep(0)
            try:
                decode(raw, RerankRequest, nested_in=2)
            except BodyError:
                pass
            else:
                calls.append((run_rerank, raw, None))
                continue
            named = _named(raw) if models.several else None
            # An instance whose model cannot be picked fails before any model: not under the
            # one the instance before it picked.
            request.state.model = None
            serving = pick(request, Route.ANY, named)
            run: RouteRun
            shape: type[msgspec.Struct]
            match serving.task:
                case Task.CLASSIFY | Task.RERANK:
                    run, shape = run_predict, PredictRequest
                case Task.SPARSE:
                    run, shape = run_embed_sparse, EmbedAllRequest
                case Task.EMBED:
                    run, shape = run_embed, EmbedRequest
                case _:
                    assert_never(serving.task)
            # raises the instance's body error before anything runs; in the body, an
            # instance sits in `instances` in the request's object: two levels down
            decode(raw, shape, nested_in=2)
            calls.append((run, raw, serving))

        # Each instance takes at least one permit as it starts, and all start before any
        # ends: past every model's permits together, some instance among the first `bound`
        # is refused 429, so the answer (the first failure in order) is found there. The
        # rest are never started: 110k instances cost ~30 s of the event loop and 2 GB.
        bound = sum(s.admission.permits.total for s in models.servings) + 1
        answers = await asyncio.gather(
            *(run(request, raw, serving) for run, raw, serving in calls[:bound]),
            return_exceptions=True,
        )
        bodies: list[bytes] = []
        for a in answers:
            if isinstance(a, BaseException):
                raise a
            bodies.append(a.content)
        if len(calls) > bound:  # cannot all have passed; refused as the next would have been
            raise OverloadedError()
        return respond(b'{"predictions":[' + b",".join(bodies) + b"]}")

    @post("/tokenize", guards=guards)
    async def tokenize(request: AnyRequest) -> Response[bytes]:
        req = decode(await body_of(request), TokenizeRequest)
        serving = pick(request, Route.TOKENIZE, req.model)
        inputs = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        q = TokenizeQuery(inputs=inputs, add_special_tokens=req.add_special_tokens,
                          prompt_name=req.prompt_name)  # fmt: skip
        return respond(ENCODER.encode((await serving.tokenize(q)).tokens))

    @post("/decode", guards=guards)
    async def decode_ids(request: AnyRequest) -> Response[bytes]:
        req = decode(await body_of(request), DecodeRequest)
        serving = pick(request, Route.DECODE, req.model)
        q = DecodeQuery(ids=parse_ids(req.ids), skip_special_tokens=req.skip_special_tokens)
        return respond(ENCODER.encode((await serving.decode(q)).texts))

    @route("/info", http_method=GET_HEAD, guards=guards)
    async def info() -> Response[bytes]:
        return respond(info_json)

    # `/models` beside `/v1/models`, as `/embeddings` beside `/v1/embeddings`: a client given
    # the server's root as its base URL finds both.
    @route(["/v1/models", "/models"], http_method=GET_HEAD, guards=guards)
    async def list_models() -> Response[bytes]:
        return respond(model_list)

    @route(["/v1/models/{model_id:path}", "/models/{model_id:path}"], http_method=GET_HEAD,
           guards=guards)  # fmt: skip
    async def retrieve_model(model_id: FromPath[str]) -> Response[bytes]:
        # Litestar keeps the separator in a path parameter, and folds the `//` of an id that
        # is an absolute path (`--model-id /data/model`): the id is either.
        name = model_id.removeprefix("/")
        for candidate in (name, "/" + name):
            if candidate in openai_models:
                return respond(ENCODER.encode(openai_models[candidate]))
        for candidate in (name, "/" + name):  # a --model-id names its model, as in requests
            ids = [s for s in models.servings if s.model_id == candidate]
            if len(ids) == 1:
                return respond(ENCODER.encode(openai_models[ids[0].served_model_name]))
        err = UnknownModelError(f"The model `{name}` does not exist; served models: "
                                f"{', '.join(openai_models)}")  # fmt: skip
        err.failure_label = None  # a lookup, not a request TEI would count
        raise err

    @route(["/health", "/ping"], http_method=GET_HEAD)
    async def health() -> Response[bytes]:
        await models.health()
        return BareResponse(200)

    @route("/", http_method=GET_HEAD)
    async def root_health() -> Response[bytes]:
        await models.health()
        return BareResponse(200)

    @route("/metrics", http_method=GET_HEAD)
    async def metrics() -> Response[bytes]:
        # TEI's route returns a String: axum's `text/plain; charset=utf-8`, no format version
        # (the --prometheus-port listener's header is metrics.CONTENT_TYPE). Litestar appends
        # the charset.
        return Response(content=models.families.render(), media_type="text/plain")

    return [
        embed, embed_all, embed_sparse, openai_embed, similarity, predict, rerank, invocations,
        vertex, tokenize, decode_ids, info, list_models, retrieve_model, health, root_health,
        metrics, *docs_routes(),
    ]
