"""TEI's `tei.v1` services as thin adapters over `Serving`.

Each RPC maps its proto message to a core query, awaits the operation through the one record
path (`observe.observed`: metrics, span, log line), and maps the result to the proto answer
with its `Metadata` filled as TEI fills it. A `TeiError` ends the call with its gRPC code and
its text (TEI's mapping: Validation and Empty INVALID_ARGUMENT, Tokenizer and Backend
FAILED_PRECONDITION, Overloaded RESOURCE_EXHAUSTED, Unhealthy UNAVAILABLE).

As in TEI, a message's `truncate` is used as sent (proto3: false unless set) rather than
--auto-truncate, `normalize` is true unless set, and each message of a stream is one request
(`single`), answered in order. The messages of a stream run concurrently (at most
`stream_window` at a time, TEI's GRPC_MAX_PARALLEL_STREAM_REQUESTS, and never more than
--max-concurrent-requests) so the batcher packs them together. As in TEI, a stream message
that finds no free permit waits for one (`admission.waiting_for_permits`), and so does a
unary Rerank, where other unary calls end RESOURCE_EXHAUSTED at once. Unary answers and
RerankStream's carry TEI's x-* timing headers as response metadata.

With several models, a call picks its model by the `model` metadata key (`Models.pick`, the
rules of `tei_serve.routing`): a name not served ends it NOT_FOUND, no name where several
models could answer, or a model that cannot, INVALID_ARGUMENT. Info describes the named
model, else the first.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from tei_runtime.manifest import Task
from tei_serve import observe
from tei_serve.admission import waiting_for_permits
from tei_serve.errors import (
    ClientGoneError,
    MalformedMessageError,
    MessageTooLargeError,
    ModelTypeError,
    TeiError,
    ValidationError,
)
from tei_serve.grpc import tei_pb2 as pb
from tei_serve.grpc.streams import answer_in_order
from tei_serve.metrics import Family, Method
from tei_serve.models import Models
from tei_serve.routing import Route
from tei_serve.serving import (
    DecodeQuery,
    Direction,
    EmbedAllQuery,
    EmbedQuery,
    Metadata,
    PredictInput,
    PredictQuery,
    Ranks,
    RerankQuery,
    Serving,
    TokenizeQuery,
    compute_type,
    highest_first,
    timing_headers,
)

log = logging.getLogger("tei_serve")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
if TYPE_CHECKING:  # generic only in the type stubs
    Context: TypeAlias = aio.ServicerContext[Any, Any]
    Handlers: TypeAlias = dict[str, grpc.RpcMethodHandler[Any, Any]]

DEFAULT_STREAM_WINDOW = 1024
"""TEI's default GRPC_MAX_PARALLEL_STREAM_REQUESTS."""
MODEL_KEY = "model"
"""The call metadata key that names the served model (several models only)."""
INSTRUCTION_KEY = "instruction"
"""The call metadata key holding a generative reranker's instruction (TEI's proto has no field
for it); `instruction-bin` carries it as UTF-8 bytes, since text metadata must be ASCII."""
_INLINE_TOKENS = 4096
"""A Tokenize answer of more tokens is built on the tokenizer pool, not the event loop."""

_MODEL_TYPES = {
    Task.EMBED: pb.MODEL_TYPE_EMBEDDING,
    Task.SPARSE: pb.MODEL_TYPE_EMBEDDING,
    Task.CLASSIFY: pb.MODEL_TYPE_CLASSIFIER,
    Task.RERANK: pb.MODEL_TYPE_RERANKER,
}


def stream_window(front: Serving | Models, env: Mapping[str, str] = os.environ) -> int:
    raw = env.get("GRPC_MAX_PARALLEL_STREAM_REQUESTS", "")
    window = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_STREAM_WINDOW
    return min(window, front.settings.max_concurrent_requests)


TEI_MESSAGE_LIMIT = 4 * 1024 * 1024
"""TEI's gRPC server ignores --payload-limit and keeps tonic's 4 MiB message limit."""

def message_limit(payload_limit: int) -> int:
    """The larger of TEI's limit and --payload-limit: a TEI client's message always fits,
    and an operator can still raise it."""
    return max(payload_limit, TEI_MESSAGE_LIMIT)


def transport_limit(payload_limit: int) -> int:
    """What grpc itself takes of one message: over `message_limit` but under this, a message
    is answered as TEI answers it (OUT_OF_RANGE, by `decoder`, after a stream's earlier
    answers); over this, grpc refuses it from its length prefix (RESOURCE_EXHAUSTED) without
    reading it. grpc holds a whole message before `decoder` sees it, so this bounds what each
    call holds: at 64 MiB, 32 calls took the server from 0.26 to 1.4 GB."""
    return min(2 * message_limit(payload_limit), 2**31 - 1)  # grpc takes a 32-bit int


def direction(value: int) -> Direction:
    """The message's truncation side. proto3 hands an unknown enum number through as it is;
    TEI's handler panics on one (the client sees its connection drop), ours refuses it."""
    if value == pb.TRUNCATION_DIRECTION_LEFT:
        return "left"
    if value == pb.TRUNCATION_DIRECTION_RIGHT:
        return "right"
    raise ValidationError(
        f"`truncation_direction` must be TRUNCATION_DIRECTION_RIGHT (0) or "
        f"TRUNCATION_DIRECTION_LEFT (1), got {value}"
    )


def metadata_message(meta: Metadata) -> pb.Metadata:
    return pb.Metadata(
        compute_chars=meta.compute_chars,
        compute_tokens=meta.compute_tokens,
        total_time_ns=meta.total_time_ns,
        tokenization_time_ns=meta.tokenization_time_ns,
        queue_time_ns=meta.queue_time_ns,
        inference_time_ns=meta.inference_time_ns,
    )


def _optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def predict_input(inputs: list[str]) -> PredictInput:
    """PredictPair's `inputs`: one text, or a (query, passage) pair."""
    if len(inputs) == 1:
        return inputs[0]
    if len(inputs) == 2:
        return (inputs[0], inputs[1])
    raise ValidationError(f"`inputs` must have a single or two elements. Given: {len(inputs)}")


@dataclass(frozen=True)
class Malformed:
    """A message that did not decode, handed on so the call ends with a status, not a log."""

    error: MalformedMessageError


def decoder(message: type[Any], limit: int) -> Callable[[bytes], Any]:
    """The message's parser, turning a decode failure into `Malformed` (grpc would answer it
    UNKNOWN and log a traceback per message), and a message over `limit` bytes too: the
    server lets larger ones through to here, so that one is answered OUT_OF_RANGE as tonic
    does, after the answers to a stream's earlier messages (grpc's own limit would answer
    RESOURCE_EXHAUSTED at once, ahead of them)."""

    def parse(data: bytes) -> Any:
        if len(data) > limit:
            return Malformed(MessageTooLargeError(len(data), limit))
        try:
            return message.FromString(data)
        except DecodeError as e:
            name = message.DESCRIPTOR.full_name
            text = f"failed to decode Protobuf message: {name}: {e}"
            return Malformed(MalformedMessageError(text))

    return parse


def _decoded(request: Req | Malformed) -> Req:
    if isinstance(request, Malformed):
        raise request.error
    return request


@dataclass(frozen=True)
class _Ranked:
    ranks: list[pb.Rank]
    metadata: Metadata


@dataclass
class Call:
    """One call's context and the route it called (`/tei.v1.Embed/EmbedStream`)."""

    context: Context
    route: str
    picked: str | None = None
    """The served model the call was routed to, once it is: its failures count under it."""

    def headers(self) -> dict[str, str]:
        """The call's metadata (a `traceparent` continues the caller's trace)."""
        return {k: v for k, v in self.context.invocation_metadata() or () if isinstance(v, str)}

    def model(self) -> str | None:
        """The served model the call names (its `model` metadata, or `model-bin` for a name
        that is not ASCII), if any; the first one given, as HTTP reads `x-model`."""
        return self._text(MODEL_KEY)

    def instruction(self) -> str | None:
        """The instruction the call sets for a generative reranker, if any."""
        return self._text(INSTRUCTION_KEY)

    def _text(self, key: str) -> str | None:
        """The first `key` (ASCII text) or `key-bin` (UTF-8 bytes) metadata value."""
        for name, value in self.context.invocation_metadata() or ():
            if name == key and isinstance(value, str):
                return value
            if name == f"{key}-bin" and isinstance(value, bytes):
                try:
                    return value.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValidationError(f"`{key}-bin` metadata is not UTF-8: {e}") from e
        return None


class TeiServices:
    """The five `tei.v1` services over the served models, as method handlers to register."""

    def __init__(self, front: Serving | Models, *, window: int | None = None) -> None:
        self.models = Models.of(front)
        self.window = window if window is not None else stream_window(self.models)
        self.compute = compute_type()
        self.message_limit = message_limit(self.models.settings.payload_limit)
        self.stopping = False
        """Set when the server begins to stop: a call cancelled from then on was cut by the
        shutdown, not left by its client."""

    def pick(self, route: Route, call: Call, method: Method | None = None) -> Serving:
        # With one model the name is ignored, so it is not read either (a name that is not
        # UTF-8 is no error then). `method`: the call is counted in te_request_count.
        serving = self.models.pick(
            route, call.model() if self.models.several else None, method
        )
        call.picked = serving.served_model_name
        return serving

    # -- the error path and the record path -----------------------------------------------

    async def fail(self, call: Call, err: TeiError) -> NoReturn:
        """End the call with the error's gRPC code and text, counted and logged as HTTP
        counts and logs it: under the model the call was routed to, once it was."""
        if err.model is None:
            err.model = call.picked
        observe.log_failure(call.route, err, err.grpc_code.name)
        if err.failure_label is not None:
            self.models.families.failure(err.failure_label, model=err.model)
        await call.context.abort(grpc.StatusCode[err.grpc_code.name], err.message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def answered(self, call: Call, work: Awaitable[Resp]) -> Resp:
        try:
            return await work
        except TeiError as e:
            await self.fail(call, e)
        except asyncio.CancelledError:
            self.left(call)
            raise

    def left(self, call: Call) -> None:
        """A call cancelled by its client (or whose client went away), logged once as HTTP
        logs a client that leaves (the worker counts its dropped inputs, as TEI does); not
        so when the shutdown cut it."""
        if self.stopping:
            return
        gone = ClientGoneError("call cancelled")
        gone.model = call.picked
        observe.log_failure(call.route, gone, "CANCELLED")

    def observed(
        self, call: Call, serving: Serving, work: Awaitable[observe.R], *, handler: str,
        family: Family, n: int | Callable[[observe.R], int] = 1, method: Method = "single",
    ) -> Awaitable[observe.R]:
        return observe.observed(
            serving, work, handler=handler, route=call.route, carrier=call.headers(),
            method=method, family=family, n=n,
        )  # fmt: skip

    async def streamed(
        self, call: Call, requests: AsyncIterator[Req], answer: Callable[[Req], Awaitable[Resp]]
    ) -> AsyncGenerator[Resp, None]:
        # The response headers go out at once, as tonic's do for TEI's streams: a client may
        # wait for them (grpc-go's `Header()`, grpc.aio's `initial_metadata()`) before it
        # writes its first message.
        await call.context.send_initial_metadata(())
        try:
            self.known_model(call)
            async for response in answer_in_order(
                requests, lambda r: waiting_for_permits(answer(r)), window=self.window
            ):
                yield response
        except TeiError as e:
            await self.fail(call, e)

    def known_model(self, call: Call) -> None:
        """A stream naming a model that is not served ends NOT_FOUND even with no message
        (each message picks its model, for its own route, as it comes)."""
        if self.models.several and call.model():
            self.models.described(call.model())

    async def send_timing(self, context: Context, response: Any) -> None:
        """TEI's x-* headers as the response metadata of an answer that carries `Metadata`
        (the unary calls and RerankStream, as TEI's gRPC server sends them)."""
        if "metadata" not in response.DESCRIPTOR.fields_by_name:
            return
        headers = timing_headers(response.metadata, self.compute)
        await context.send_initial_metadata(tuple(headers.items()))

    # -- Info -------------------------------------------------------------------------------

    async def info(self, _request: pb.InfoRequest, call: Call) -> pb.InfoResponse:
        # With one model the name is not read (as `pick`): odd metadata is no error then.
        serving = self.models.described(call.model() if self.models.several else None)
        i = serving.info
        return pb.InfoResponse(
            version=i.version, sha=i.sha, docker_label=i.docker_label, model_id=i.model_id,
            model_sha=i.model_sha, model_dtype=i.model_dtype,
            model_type=_MODEL_TYPES[serving.task],
            max_concurrent_requests=i.max_concurrent_requests,
            max_input_length=i.max_input_length, max_batch_tokens=i.max_batch_tokens,
            max_batch_requests=i.max_batch_requests,
            max_client_batch_size=i.max_client_batch_size,
            tokenization_workers=i.tokenization_workers,
        )  # fmt: skip

    # -- Embed ------------------------------------------------------------------------------

    async def _embed(self, req: pb.EmbedRequest, call: Call) -> pb.EmbedResponse:
        normalize = _optional(req, "normalize")
        serving = self.pick(Route.EMBED, call, "single")
        q = EmbedQuery(
            inputs=[req.inputs], truncate=req.truncate,
            truncation_direction=direction(req.truncation_direction),
            prompt_name=_optional(req, "prompt_name"),
            normalize=True if normalize is None else normalize,
            dimensions=_optional(req, "dimensions"),
        )  # fmt: skip
        r = await self.observed(call, serving, serving.embed(q), handler="embed",
                                family="embed", n=1)  # fmt: skip
        return pb.EmbedResponse(embeddings=r.vectors[0], metadata=metadata_message(r.metadata))

    async def _embed_sparse(
        self, req: pb.EmbedSparseRequest, call: Call
    ) -> pb.EmbedSparseResponse:
        serving = self.pick(Route.EMBED_SPARSE, call, "single")
        r = await self.observed(call, serving, serving.embed_sparse(_embed_all_query(req)),
                                handler="embed_sparse", family="embed", n=1)  # fmt: skip
        v = r.vectors[0]
        values = [pb.SparseValue(index=i, value=x) for i, x in zip(v.indices, v.values,
                                                                     strict=True)]  # fmt: skip
        return pb.EmbedSparseResponse(
            sparse_embeddings=values, metadata=metadata_message(r.metadata)
        )

    async def _embed_all(self, req: pb.EmbedAllRequest, call: Call) -> pb.EmbedAllResponse:
        serving = self.pick(Route.EMBED_ALL, call, "single")
        r = await self.observed(call, serving, serving.embed_all(_embed_all_query(req)),
                                handler="embed_all", family="embed", n=1)  # fmt: skip
        tokens = [pb.TokenEmbedding(embeddings=row) for row in r.vectors[0]]
        return pb.EmbedAllResponse(token_embeddings=tokens, metadata=metadata_message(r.metadata))

    # -- Predict ----------------------------------------------------------------------------

    async def _predict_one(
        self, inputs: str | list[str], req: pb.PredictRequest | pb.PredictPairRequest, call: Call
    ) -> pb.PredictResponse:
        serving = self.pick(Route.PREDICT, call, "single")
        item = inputs if isinstance(inputs, str) else predict_input(inputs)
        q = PredictQuery(inputs=[item], truncate=req.truncate, raw_scores=req.raw_scores,
                         truncation_direction=direction(req.truncation_direction),
                         instruction=call.instruction())  # fmt: skip
        r = await self.observed(call, serving, serving.predict(q), handler="predict",
                                family="predict", n=1)  # fmt: skip
        predictions = [pb.Prediction(score=p.score, label=p.label) for p in r.predictions[0]]
        return pb.PredictResponse(predictions=predictions, metadata=metadata_message(r.metadata))

    async def _predict(self, req: pb.PredictRequest, call: Call) -> pb.PredictResponse:
        return await self._predict_one(req.inputs, req, call)

    async def _predict_pair(
        self, req: pb.PredictPairRequest, call: Call
    ) -> pb.PredictResponse:
        return await self._predict_one(list(req.inputs), req, call)

    # -- Rerank -----------------------------------------------------------------------------

    async def _rerank(self, req: pb.RerankRequest, call: Call) -> pb.RerankResponse:
        serving = self.pick(Route.RERANK, call, "batch")
        q = RerankQuery(
            query=req.query, texts=list(req.texts), truncate=req.truncate,
            truncation_direction=direction(req.truncation_direction),
            raw_scores=req.raw_scores, return_text=req.return_text,
            instruction=call.instruction(),
        )  # fmt: skip

        async def ranked() -> Ranks:
            if q.texts and serving.task is not Task.RERANK:  # TEI: empty texts, then this
                raise not_a_reranker(serving.task)
            # As TEI's gRPC Rerank: each pair waits for a permit rather than failing at once.
            return await waiting_for_permits(serving.rerank(q))

        r = await self.observed(call, serving, ranked(), handler="rerank", family="predict",
                                n=len(q.texts), method="batch")  # fmt: skip
        ranks = [pb.Rank(index=k.index, score=k.score, text=k.text) for k in r.ranks]
        return pb.RerankResponse(ranks=ranks, metadata=metadata_message(r.metadata))

    async def rerank_stream(
        self, requests: AsyncIterator[pb.RerankStreamRequest], context: Context
    ) -> pb.RerankResponse:
        """One (query, text) pair per message, ranked together once the client is done;
        `raw_scores` and `return_text` are read from the first message, as TEI does."""
        call = Call(context, "/tei.v1.Rerank/RerankStream")
        try:
            serving = self.pick(Route.RERANK, call)
            if serving.task is not Task.RERANK:  # TEI checks before reading the stream
                raise not_a_reranker(serving.task)
            instruction = call.instruction()
        except TeiError as e:
            await self.fail(call, e)
        first: list[pb.RerankStreamRequest] = []

        async def score(message: pb.RerankStreamRequest) -> tuple[float, str, Metadata]:
            m = _decoded(message)
            if not first:  # answers start in message order: this is message 0
                first.append(m)
            q = RerankQuery(query=m.query, texts=[m.text], truncate=m.truncate,
                            truncation_direction=direction(m.truncation_direction),
                            raw_scores=first[0].raw_scores,
                            instruction=instruction)  # fmt: skip
            r = await serving.rerank(q)
            return r.ranks[0].score, m.text, r.metadata

        async def rank_all() -> _Ranked:
            started = serving.clock()
            scored = [s async for s in answer_in_order(
                requests, lambda m: waiting_for_permits(score(m)), window=self.window)]  # fmt: skip
            if not scored:
                raise ValidationError("`texts` cannot be empty")
            return_text = first[0].return_text
            ranks = highest_first(
                [pb.Rank(index=i, score=s, text=text if return_text else None)
                 for i, (s, text, _) in enumerate(scored)], lambda k: k.score)  # fmt: skip
            meta = _summed([m for _, _, m in scored], serving.clock() - started)
            return _Ranked(ranks=ranks, metadata=meta)

        try:
            # the number of pairs is known only at the stream's end: counted from the answer
            r = await self.observed(call, serving, rank_all(), handler="rerank",
                                    family="predict", n=lambda r: len(r.ranks),
                                    method="batch")  # fmt: skip
        except TeiError as e:
            await self.fail(call, e)
        response = pb.RerankResponse(ranks=r.ranks, metadata=metadata_message(r.metadata))
        await self.send_timing(context, response)
        return response

    # -- Tokenize ---------------------------------------------------------------------------

    async def _tokenize(self, req: pb.EncodeRequest, call: Call) -> pb.EncodeResponse:
        serving = self.pick(Route.TOKENIZE, call)
        q = TokenizeQuery(inputs=[req.inputs], add_special_tokens=req.add_special_tokens,
                          prompt_name=_optional(req, "prompt_name"))  # fmt: skip
        [tokens] = (await serving.tokenize(q)).tokens

        def message() -> pb.EncodeResponse:
            return pb.EncodeResponse(tokens=[
                pb.SimpleToken(id=t.id, text=t.text, special=t.special, start=t.start,
                               stop=t.stop)
                for t in tokens
            ])  # fmt: skip

        # A 4 MB text is ~500k tokens, seconds of message building: off the event loop, so
        # health checks and other calls are not held up (a 1 s probe timeout would fail).
        return message() if len(tokens) <= _INLINE_TOKENS else await serving.offload(message)

    async def _decode(self, req: pb.DecodeRequest, call: Call) -> pb.DecodeResponse:
        q = DecodeQuery(ids=[list(req.ids)], skip_special_tokens=req.skip_special_tokens)
        [text] = (await self.pick(Route.DECODE, call).decode(q)).texts
        return pb.DecodeResponse(text=text)

    # -- registration -----------------------------------------------------------------------

    def unary(
        self, route: str, fn: Callable[[Req, Call], Awaitable[Resp]], request: type[Any],
        response: type[Any],
    ) -> grpc.RpcMethodHandler[Any, Any]:
        # Registered as a client-streaming method (the same on the wire): grpc's own unary
        # handling starts no handler for a call half-closed before its message and answers
        # nothing, so that call waited for its deadline, or forever without one.
        async def behaviour(requests: AsyncIterator[Req | Malformed], context: Context) -> Resp:
            req = await anext(aiter(requests), None)
            if req is None:  # tonic's answer to a unary call without its message
                await context.abort(grpc.StatusCode.INTERNAL, "Missing request message.")
            call = Call(context, route)

            async def decoded_then_answered() -> Resp:
                return await fn(_decoded(req), call)

            answer = await self.answered(call, decoded_then_answered())
            await self.send_timing(context, answer)
            return answer

        return grpc.stream_unary_rpc_method_handler(
            behaviour, decoder(request, self.message_limit), response.SerializeToString
        )

    def stream(
        self, route: str, fn: Callable[[Req, Call], Awaitable[Resp]], request: type[Any],
        response: type[Any],
    ) -> grpc.RpcMethodHandler[Any, Any]:
        async def behaviour(requests: AsyncIterator[Req], context: Context) -> AsyncIterator[Resp]:
            # grpc.aio tells a streaming handler by `inspect.isasyncgenfunction`
            call = Call(context, route)
            answers = self.streamed(call, requests, lambda req: fn(_decoded(req), call))
            try:
                async for answer in answers:
                    yield answer
            except (asyncio.CancelledError, GeneratorExit):
                # The client cancelled: in an await (CancelledError, from inside `answers`) or
                # while an answer was on its way out (this generator closed at its yield).
                # Logged once for the stream, however many of its messages were in flight.
                self.left(call)
                raise
            finally:
                await answers.aclose()  # now, not at garbage collection: in-flight work stops

        return grpc.stream_stream_rpc_method_handler(
            behaviour, decoder(request, self.message_limit), response.SerializeToString
        )

    def handlers(self) -> dict[str, Handlers]:
        """Method handlers per full service name, for `add_registered_method_handlers`."""
        unary, stream = self.unary, self.stream
        tables: dict[str, dict[str, tuple[Any, ...]]] = {
            "tei.v1.Info": {"Info": (unary, self.info, pb.InfoRequest, pb.InfoResponse)},
            "tei.v1.Embed": {
                "Embed": (unary, self._embed, pb.EmbedRequest, pb.EmbedResponse),
                "EmbedStream": (stream, self._embed, pb.EmbedRequest, pb.EmbedResponse),
                "EmbedSparse": (unary, self._embed_sparse, pb.EmbedSparseRequest,
                                pb.EmbedSparseResponse),
                "EmbedSparseStream": (stream, self._embed_sparse, pb.EmbedSparseRequest,
                                      pb.EmbedSparseResponse),
                "EmbedAll": (unary, self._embed_all, pb.EmbedAllRequest, pb.EmbedAllResponse),
                "EmbedAllStream": (stream, self._embed_all, pb.EmbedAllRequest,
                                   pb.EmbedAllResponse),
            },
            "tei.v1.Predict": {
                "Predict": (unary, self._predict, pb.PredictRequest, pb.PredictResponse),
                "PredictPair": (unary, self._predict_pair, pb.PredictPairRequest,
                                pb.PredictResponse),
                "PredictStream": (stream, self._predict, pb.PredictRequest, pb.PredictResponse),
                "PredictPairStream": (stream, self._predict_pair, pb.PredictPairRequest,
                                      pb.PredictResponse),
            },
            "tei.v1.Rerank": {
                "Rerank": (unary, self._rerank, pb.RerankRequest, pb.RerankResponse),
            },
            "tei.v1.Tokenize": {
                "Tokenize": (unary, self._tokenize, pb.EncodeRequest, pb.EncodeResponse),
                "TokenizeStream": (stream, self._tokenize, pb.EncodeRequest, pb.EncodeResponse),
                "Decode": (unary, self._decode, pb.DecodeRequest, pb.DecodeResponse),
                "DecodeStream": (stream, self._decode, pb.DecodeRequest, pb.DecodeResponse),
            },
        }  # fmt: skip
        out: dict[str, Handlers] = {
            service: {
                name: make(f"/{service}/{name}", fn, request, response)
                for name, (make, fn, request, response) in methods.items()
            }
            for service, methods in tables.items()
        }
        out["tei.v1.Rerank"]["RerankStream"] = grpc.stream_unary_rpc_method_handler(
            self.rerank_stream, decoder(pb.RerankStreamRequest, self.message_limit),
            pb.RerankResponse.SerializeToString,
        )
        return out


def _embed_all_query(req: pb.EmbedSparseRequest | pb.EmbedAllRequest) -> EmbedAllQuery:
    return EmbedAllQuery(inputs=[req.inputs], truncate=req.truncate,
                         truncation_direction=direction(req.truncation_direction),
                         prompt_name=_optional(req, "prompt_name"))  # fmt: skip


def _summed(parts: list[Metadata], total_s: float) -> Metadata:
    """One answer for many inputs: TEI's sums of characters and tokens, per-input averages of
    the stage times."""
    n = max(1, len(parts))
    return Metadata(
        compute_chars=sum(m.compute_chars for m in parts),
        compute_tokens=sum(m.compute_tokens for m in parts),
        tokenization_time_ns=sum(m.tokenization_time_ns for m in parts) // n,
        queue_time_ns=sum(m.queue_time_ns for m in parts) // n,
        inference_time_ns=sum(m.inference_time_ns for m in parts) // n,
        total_time_ns=int(total_s * 1e9),
    )


def not_a_reranker(task: Task) -> ModelTypeError:
    """TEI's gRPC Rerank wording (no "Backend error:" prefix, unlike its HTTP route): a
    classifier is "not a re-ranker", an embedding model "not a classifier"."""
    what = "re-ranker" if task is Task.CLASSIFY else "classifier"
    return ModelTypeError(f"model is not a {what} model")
