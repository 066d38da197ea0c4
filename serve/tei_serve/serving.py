"""The serving core: one operation per TEI capability, whichever front-end calls it.

No transport lives here (no litestar, no grpc, no protobuf). A front-end:

1. Constructs one `Serving(settings=..., model=..., model_id=...)` per loaded model (with
   several, all over one `Shared`: see `tei_serve.models`), calls `start()` inside its
   running event loop before the first request and `await stop()` after the last one (stop
   answers everything already queued, then ends the batching tasks).
2. Maps its wire request to a query Struct (`EmbedQuery`, `PredictQuery`, ...) and awaits the
   operation (`await serving.embed(query)`). Each returns a typed result carrying vectors or
   scores and, for model work, a `Metadata` (characters, tokens, and the tokenization / queue /
   inference / total times in ns) that the front-end turns into headers or its Metadata message
   and hands to `serving.metrics.record(...)`.
3. Catches `tei_serve.errors.TeiError`: every failure an operation raises on purpose is one,
   with `http_status`, `error_type` (TEI's) and `grpc_code`. Anything else is a bug.

Validation (batch size, emptiness, the model's task), admission (one permit per input, none
free: `OverloadedError` at once), tokenization (off the event loop unless tiny), queueing and
post-processing (through `tei_runtime.pooling`) happen here, once.

Cancellation: an operation is a coroutine; cancel the task awaiting it when the caller goes
away (HTTP disconnect, gRPC cancel). The cancellation cancels the operation's queue entries,
which the token-budget queue drops before packing its next batch and the worker skips if it
already took them, and releases the permits: nothing stays queued for a caller that left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Literal, Protocol, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from tei_runtime import errors as rt_errors
from tei_runtime import pooling
from tei_runtime.backend import Output, output_for_task
from tei_runtime.data import SparseVector, Token
from tei_runtime.manifest import Task
from tei_serve.admission import Admission, Tally
from tei_serve.errors import (
    BatchSizeError,
    EmptyError,
    ModelTypeError,
    NaNScoreError,
    UnhealthyError,
    ValidationError,
    empty_input,
    from_runtime,
    refused_while_tokenizing,
)
from tei_serve.metrics import MetricFamilies, Metrics
from tei_serve.model import Input, ServedModel
from tei_serve.routing import shown
from tei_serve.settings import Settings
from tei_serve.tracing import Tracing, make_tracing
from tei_serve.worker import Result, Worker

__all__ = (
    "ClassifierModel",
    "DecodeQuery",
    "Decoded",
    "Direction",
    "EmbedAllQuery",
    "EmbedQuery",
    "Embedded",
    "EmbeddingModel",
    "Metadata",
    "ModelInfo",
    "OpenAIEmbedded",
    "OpenAIQuery",
    "PredictInput",
    "PredictQuery",
    "Prediction",
    "Predictions",
    "Rank",
    "Ranks",
    "RerankQuery",
    "Serving",
    "Shared",
    "Similarities",
    "SimilarityQuery",
    "SparseVectors",
    "TextOrIds",
    "TokenVectors",
    "TokenizeQuery",
    "Tokens",
)

log = logging.getLogger("tei_serve")

FloatArray = npt.NDArray[np.float32]
T = TypeVar("T")


def highest_first(items: Sequence[T], score: Callable[[T], float]) -> list[T]:
    """`items` by descending score as TEI orders predictions and ranks: a stable ascending
    sort, reversed, so tied items come last index first."""
    return sorted(items, key=score)[::-1]

Direction = Literal["left", "right"]
TextOrIds = str | Sequence[int]
"""One input to embed: a text, or token ids (decoded and tokenized again, as TEI does)."""
PredictInput = str | tuple[str, str]
"""One input to classify: a text or a (query, passage) pair."""

_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}


# -- queries ------------------------------------------------------------------------------------
# `truncate=None` means the server's --auto-truncate.


class EmbedQuery(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Sequence[TextOrIds]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None
    normalize: bool = True
    dimensions: int | None = None
    """Matryoshka: keep the first `dimensions` components (before normalizing)."""


class EmbedAllQuery(msgspec.Struct, frozen=True, kw_only=True):
    """For `embed_all` (token vectors) and `embed_sparse` (SPLADE)."""

    inputs: Sequence[TextOrIds]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class SimilarityQuery(msgspec.Struct, frozen=True, kw_only=True):
    source_sentence: str
    sentences: Sequence[str]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class OpenAIQuery(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's /v1/embeddings: always normalized, --auto-truncate, no prompt."""

    inputs: Sequence[TextOrIds]
    model: str | None = None
    dimensions: int | None = None


class PredictQuery(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Sequence[PredictInput]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False
    instruction: str | None = None
    """A generative reranker's instruction (None: its model card's default)."""


class RerankQuery(msgspec.Struct, frozen=True, kw_only=True):
    query: str
    texts: Sequence[str]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False
    return_text: bool = False
    instruction: str | None = None
    """A generative reranker's instruction (None: its model card's default)."""


class TokenizeQuery(msgspec.Struct, frozen=True, kw_only=True):
    inputs: Sequence[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeQuery(msgspec.Struct, frozen=True, kw_only=True):
    ids: Sequence[Sequence[int]]
    skip_special_tokens: bool = True


# -- results ------------------------------------------------------------------------------------


class Metadata(msgspec.Struct, frozen=True, kw_only=True):
    """What one request cost (TEI's gRPC `Metadata`; the HTTP x-* headers)."""

    compute_chars: int
    compute_tokens: int
    tokenization_time_ns: int
    queue_time_ns: int
    """Average over the request's inputs."""
    inference_time_ns: int
    """Average over the request's inputs."""
    total_time_ns: int


def compute_type() -> str:
    """TEI's `x-compute-type` value (env COMPUTE_TYPE, TEI's constant by default)."""
    return os.environ.get("COMPUTE_TYPE", "gpu+optimized")


def _ms(ns: int) -> str:
    return str(ns // 1_000_000)


class Timings(Protocol):
    """What the x-* headers read: `Metadata`, or the gRPC answer's `Metadata` message."""

    @property
    def compute_chars(self) -> int: ...
    @property
    def compute_tokens(self) -> int: ...
    @property
    def total_time_ns(self) -> int: ...
    @property
    def tokenization_time_ns(self) -> int: ...
    @property
    def queue_time_ns(self) -> int: ...
    @property
    def inference_time_ns(self) -> int: ...


def timing_headers(meta: Timings, compute: str) -> dict[str, str]:
    """TEI's x-* headers: on HTTP answers, and as gRPC response metadata of unary calls."""
    return {
        "x-compute-type": compute,
        "x-compute-time": _ms(meta.total_time_ns),
        "x-compute-characters": str(meta.compute_chars),
        "x-compute-tokens": str(meta.compute_tokens),
        "x-total-time": _ms(meta.total_time_ns),
        "x-tokenization-time": _ms(meta.tokenization_time_ns),
        "x-queue-time": _ms(meta.queue_time_ns),
        "x-inference-time": _ms(meta.inference_time_ns),
    }


class Embedded(msgspec.Struct, frozen=True, kw_only=True):
    vectors: FloatArray
    """[n, dim] float32, in input order."""
    metadata: Metadata


class OpenAIEmbedded(msgspec.Struct, frozen=True, kw_only=True):
    vectors: FloatArray
    model: str
    """The served model name."""
    metadata: Metadata


class TokenVectors(msgspec.Struct, frozen=True, kw_only=True):
    vectors: list[FloatArray]
    """Per input [tokens, hidden] float32, special tokens included."""
    metadata: Metadata


class SparseVectors(msgspec.Struct, frozen=True, kw_only=True):
    vectors: list[SparseVector]
    metadata: Metadata


class Similarities(msgspec.Struct, frozen=True, kw_only=True):
    scores: list[float]
    """Cosine of the source sentence with each sentence, in order."""
    metadata: Metadata


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    score: float
    label: str


class Predictions(msgspec.Struct, frozen=True, kw_only=True):
    predictions: list[list[Prediction]]
    """Per input, every label's score, best first."""
    metadata: Metadata


class Rank(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # TEI's field order (index, text, score): a client comparing bodies byte for byte sees
    # the same JSON.
    index: int
    text: str | None = None
    score: float


class Ranks(msgspec.Struct, frozen=True, kw_only=True):
    ranks: list[Rank]
    """Best first."""
    metadata: Metadata


class Tokens(msgspec.Struct, frozen=True, kw_only=True):
    tokens: list[list[Token]]


class Decoded(msgspec.Struct, frozen=True, kw_only=True):
    texts: list[str]


class EmbeddingModel(msgspec.Struct, frozen=True, kw_only=True):
    pooling: str


class ClassifierModel(msgspec.Struct, frozen=True, kw_only=True):
    id2label: dict[str, str]
    label2id: dict[str, int]


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """TEI's /info (and gRPC Info): `model_type` has one key, embedding|classifier|reranker."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    served_model_name: str
    model_type: dict[str, EmbeddingModel | ClassifierModel]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None


def version() -> str:
    try:
        return metadata.version("tei-onnx")
    except metadata.PackageNotFoundError:
        return "0.0.0"


# -- the core -----------------------------------------------------------------------------------


class Shared:
    """What the models of one process share: one tokenizer thread pool (--tokenization-workers
    threads, not that many per model), the te_* metric families and the span exporter."""

    def __init__(self, settings: Settings, *, max_input_length: int, model_label: bool) -> None:
        self.pool = ThreadPoolExecutor(
            max_workers=settings.effective_tokenization_workers(),
            thread_name_prefix="tei-tokenizer",
        )
        self.families = MetricFamilies(max_input_length, model_label=model_label)
        self.tracing: Tracing | None = make_tracing(
            None if settings.disable_spans else settings.otlp_endpoint, settings.otlp_service_name
        )
        """Request spans (--otlp-endpoint), written by the front-ends; None when off (no
        endpoint, or --disable-spans)."""

    def close(self) -> None:
        """Stop the tokenizer pool and flush the spans (after every model has stopped)."""
        self.pool.shutdown(wait=True)
        if self.tracing is not None:
            self.tracing.shutdown()


class Serving:
    """One loaded model's operations. Not thread-safe: call it from its event loop only.

    Built alone (no `shared`), it owns its tokenizer pool, metrics and spans, and `stop()`
    closes them; built over a `Shared`, the owner of that closes it."""

    def __init__(
        self,
        *,
        settings: Settings,
        model: ServedModel,
        model_id: str,
        served_model_name: str | None = None,
        revision: str | None = None,
        shared: Shared | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.model = model
        self.model_id = model_id
        self.revision = revision
        """Its --revision, reported as /info's `model_sha` (TEI's), else the artifact's
        commit."""
        self.served_model_name: str = served_model_name or settings.served_model_name or model_id
        """The name requests pick this model by, and the `model` of OpenAI answers."""
        self._warned_model_name = False
        self.created = int(time.time())
        """When it was loaded (Unix seconds; `created` in GET /v1/models)."""
        self.clock = clock
        self.task: Task = model.manifest.task
        default_name = settings.default_prompt_name
        self.default_prompt_name = (
            default_name if default_name in model.manifest.prompts.prompts else None
        )
        """--default-prompt-name where this model has that prompt (the start refuses a name
        no model has; a model without it, beside one with it, serves without it)."""
        self.output: Output = output_for_task(self.task)
        """The forward this model serves."""
        embeds = self.task in (Task.EMBED, Task.SPARSE)
        self.default_prompt = settings.default_prompt if shared is None or embeds else None
        """--default-prompt, with several models for the embedders only: a query prefix meant
        for the embedder would otherwise show in a reranker's /tokenize, which never scores
        with it."""
        self._owns_shared = shared is None
        self.shared = shared if shared is not None else Shared(
            settings, max_input_length=model.max_input_length, model_label=False
        )
        self.metrics = Metrics(families=self.shared.families, model=self.served_model_name)
        self.worker = Worker(
            model,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_requests=settings.max_batch_requests,
            max_wait=settings.max_queue_wait_ms / 1000.0,
            metrics=self.metrics,
            clock=clock,
        )
        self.admission = Admission(
            model,
            self.worker,
            self.metrics,
            max_concurrent_requests=settings.max_concurrent_requests,
            pool=self.shared.pool,
            default_prompt_name=self.default_prompt_name,
            default_prompt=self.default_prompt,
            clock=clock,
        )
        self.tracing: Tracing | None = self.shared.tracing
        self.info: ModelInfo = self._model_info()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching tasks; call from inside the running event loop."""
        self.worker.start()

    async def stop(self) -> None:
        """Answer every queued entry, then stop the tasks (and, when this model owns them,
        the tokenizer pool and the spans)."""
        await self.worker.stop()
        if self._owns_shared:
            self.shared.close()

    async def health(self) -> None:
        """Return when the model answers; `UnhealthyError` when it does not (a probe runs only
        after a failed batch)."""
        if not self.worker.healthy:
            # A pair: every reranker takes one (a generative one takes nothing else).
            probe_input: Input = ("health", "health") if self.task is Task.RERANK else "health"
            [probe] = await self.offload(lambda: self.model.encode([probe_input], truncate=True))
            await self.worker.probe(probe, self.output)
        if not self.worker.healthy:
            raise UnhealthyError()

    async def offload(self, fn: Callable[[], T]) -> T:
        """Run CPU-heavy work (a large response encode) on the tokenizer pool."""
        return await asyncio.get_running_loop().run_in_executor(self.shared.pool, fn)

    # -- embeddings -----------------------------------------------------------------------

    async def embed(self, q: EmbedQuery) -> Embedded:
        meta = Tally(start=self.clock())
        vectors = await self._pooled(
            q.inputs, meta, truncate=q.truncate, direction=q.truncation_direction,
            prompt_name=q.prompt_name, normalize=q.normalize, dimensions=q.dimensions,
        )  # fmt: skip
        return Embedded(vectors=vectors, metadata=self._metadata(meta))

    async def openai_embed(self, q: OpenAIQuery) -> OpenAIEmbedded:
        meta = Tally(start=self.clock())
        if q.model is not None and q.model not in (self.served_model_name, self.model_id):
            # (a request naming the model by its --model-id picked it: no warning)
            # TEI warns on every such request; OpenAI clients send their own default name
            # with each one, so once is enough to say it, and the rest go to debug.
            log.log(
                logging.DEBUG if self._warned_model_name else logging.WARNING,
                "request model %r is not the served model %r (it answers anyway)",
                shown(q.model), self.served_model_name,
            )
            self._warned_model_name = True
        vectors = await self._pooled(
            q.inputs, meta, truncate=self.settings.auto_truncate, direction="right",
            prompt_name=None, normalize=True, dimensions=q.dimensions,
        )  # fmt: skip
        return OpenAIEmbedded(
            vectors=vectors, model=self.served_model_name, metadata=self._metadata(meta)
        )

    async def similarity(self, q: SimilarityQuery) -> Similarities:
        meta = Tally(start=self.clock())
        if not q.sentences:
            raise EmptyError("`inputs.sentences` cannot be empty")
        vectors = await self._pooled(
            [q.source_sentence, *q.sentences], meta, truncate=q.truncate,
            direction=q.truncation_direction, prompt_name=q.prompt_name, normalize=False,
            dimensions=None,
        )  # fmt: skip
        cosines = pooling.cosine_similarity(vectors[0], vectors[1:])
        return Similarities(scores=[float(c) for c in cosines], metadata=self._metadata(meta))

    async def embed_all(self, q: EmbedAllQuery) -> TokenVectors:
        meta = Tally(start=self.clock())
        self._check_batch_inputs(q.inputs)
        match self.output:
            case Output.LOGITS:
                raise ModelTypeError("Backend error: Model is not an embedding model")
            case Output.SPARSE:
                raise ModelTypeError(
                    "Backend error: `embed_all` is not available for SPLADE models"
                )
        vectors = await self._forward_all(q, Output.TOKENS, meta)
        return TokenVectors(vectors=vectors, metadata=self._metadata(meta))

    async def embed_sparse(self, q: EmbedAllQuery) -> SparseVectors:
        meta = Tally(start=self.clock())
        self._check_batch_inputs(q.inputs)
        if self.output is not Output.SPARSE:
            raise ModelTypeError(
                "Backend error: Model is not an embedding model with SPLADE pooling"
            )
        dense = _stack(await self._forward_all(q, Output.SPARSE, meta))
        return SparseVectors(vectors=pooling.to_sparse(dense), metadata=self._metadata(meta))

    # -- classifiers and rerankers ----------------------------------------------------------

    async def predict(self, q: PredictQuery) -> Predictions:
        meta = Tally(start=self.clock())
        self._check_batch_inputs(q.inputs)
        if self.output is not Output.LOGITS:
            raise ModelTypeError("Backend error: Model is not a classifier model")
        # TEI puts --default-prompt(-name) before a single text to classify, as /tokenize
        # shows it (a pair it refuses with a prompt; here a batch with a pair goes without).
        singles = all(isinstance(i, str) for i in q.inputs)
        scores = await self._scores(
            q.inputs, meta, truncate=q.truncate, direction=q.truncation_direction,
            raw_scores=q.raw_scores, instruction=q.instruction,
            use_prompt=singles and self.model.manifest.generative_rerank is None,
        )  # fmt: skip
        labels = self.model.manifest.labels
        predictions = []
        for row in scores:
            ranked = [Prediction(score=float(s), label=labels.get(i, str(i)))
                      for i, s in enumerate(row)]  # fmt: skip
            predictions.append(highest_first(ranked, lambda p: p.score))
        return Predictions(predictions=predictions, metadata=self._metadata(meta))

    async def rerank(self, q: RerankQuery) -> Ranks:
        meta = Tally(start=self.clock())
        # TEI checks for texts before the model type.
        if not q.texts:
            raise EmptyError("`texts` cannot be empty")
        if self.task is not Task.RERANK:
            raise ModelTypeError("Backend error: model is not a re-ranker model")
        self._check_batch(len(q.texts))
        scores = await self._scores(
            [(q.query, t) for t in q.texts], meta, truncate=q.truncate,
            direction=q.truncation_direction, raw_scores=q.raw_scores, first_label_only=True,
            instruction=q.instruction,
        )  # fmt: skip
        ranks = [
            Rank(index=i, score=float(row[0]), text=q.texts[i] if q.return_text else None)
            for i, row in enumerate(scores)
        ]
        return Ranks(ranks=highest_first(ranks, lambda r: r.score), metadata=self._metadata(meta))

    # -- tokenizer --------------------------------------------------------------------------

    async def tokenize(self, q: TokenizeQuery) -> Tokens:
        if not q.inputs:
            raise EmptyError("`inputs` cannot be empty")
        self._check_batch(len(q.inputs))
        prompt_name, prompt = self.admission.prompt_of(q.prompt_name)

        def work(inputs: Sequence[str]) -> list[list[Token]]:
            rows = self.model.tokenize(
                inputs, add_special_tokens=q.add_special_tokens, prompt_name=prompt_name,
                prompt=prompt,
            )  # fmt: skip
            return [list(row) for row in rows]

        # TEI checks input by input and answers with the first failure in request order, so
        # an empty input answers only when every input before it tokenizes.
        empty_at = next((i for i, text in enumerate(q.inputs) if not text), None)
        if empty_at is not None:
            if empty_at:
                await self._tokenizer_call(lambda: work(q.inputs[:empty_at]))
            raise empty_input()
        return Tokens(tokens=await self._tokenizer_call(lambda: work(q.inputs)))

    async def decode(self, q: DecodeQuery) -> Decoded:
        err = EmptyError("Input validation error: `input_ids` cannot be empty")
        if not q.ids:  # `[]` reads as one input of no ids, as in TEI
            raise err
        self._check_batch(len(q.ids))
        if any(not ids for ids in q.ids):
            raise refused_while_tokenizing(err)

        def work() -> list[str]:
            return list(self.model.decode(q.ids, skip_special_tokens=q.skip_special_tokens))

        return Decoded(texts=await self._tokenizer_call(work))

    # -- shared steps -----------------------------------------------------------------------

    def _check_batch(self, n: int) -> None:
        limit = self.settings.max_client_batch_size
        if n > limit:
            raise BatchSizeError(f"batch size {n} > maximum allowed batch size {limit}")

    def _check_batch_inputs(self, inputs: Sequence[Input]) -> None:
        """TEI's handler checks on the batch as a whole, before anything per input."""
        if not inputs:
            raise EmptyError("`inputs` cannot be empty")
        self._check_batch(len(inputs))

    async def _run(
        self,
        inputs: Sequence[Input],
        output: Output,
        meta: Tally,
        *,
        truncate: bool | None,
        direction: Direction,
        prompt_name: str | None,
        use_prompt: bool = True,
        instruction: str | None = None,
    ) -> list[Result]:
        return await self.admission.run(
            inputs, output, meta=meta,
            truncate=self.settings.auto_truncate if truncate is None else truncate,
            truncation_direction=direction, prompt_name=prompt_name, use_prompt=use_prompt,
            instruction=instruction,
        )  # fmt: skip

    async def _forward_all(
        self, q: EmbedAllQuery, output: Output, meta: Tally
    ) -> list[FloatArray]:
        results = await self._run(
            q.inputs, output, meta, truncate=q.truncate, direction=q.truncation_direction,
            prompt_name=q.prompt_name,
        )  # fmt: skip
        return [r.value for r in results]

    async def _pooled(
        self,
        inputs: Sequence[TextOrIds],
        meta: Tally,
        *,
        truncate: bool | None,
        direction: Direction,
        prompt_name: str | None,
        normalize: bool,
        dimensions: int | None,
    ) -> FloatArray:
        # TEI's order: the batch, then per input the SPLADE and `dimensions` checks, the
        # model type, and the input itself.
        self._check_batch_inputs(inputs)
        if self.output is Output.SPARSE and normalize:
            raise ModelTypeError("Backend error: `normalize` is not available for SPLADE models")
        if dimensions is not None and dimensions <= 0:
            raise ValidationError("Input validation error: `dimensions` should be positive")
        if self.output is Output.LOGITS:
            raise ModelTypeError("Backend error: Model is not an embedding model")
        if dimensions is not None and self.output is Output.EMBEDDING and (
            dimensions > self.model.dimension
        ):
            # TEI checks `dimensions` on each input's result, in request order: the answer is
            # the first input's own failure when it has one, else this.
            await self._run(
                inputs[:1], self.output, Tally(start=self.clock()), truncate=truncate,
                direction=direction, prompt_name=prompt_name,
            )  # fmt: skip
            try:
                pooling.check_dimensions(dimensions, self.model.dimension)
            except rt_errors.ValidationError as e:
                raise from_runtime(e) from e
        results = await self._run(
            inputs, self.output, meta, truncate=truncate, direction=direction,
            prompt_name=prompt_name,
        )  # fmt: skip
        try:
            vectors = pooling.truncate_dimensions(_stack([r.value for r in results]), dimensions)
        except rt_errors.ValidationError as e:
            raise from_runtime(e) from e
        return pooling.normalize(vectors) if normalize else vectors

    async def _scores(
        self,
        inputs: Sequence[PredictInput],
        meta: Tally,
        *,
        truncate: bool | None,
        direction: Direction,
        raw_scores: bool,
        first_label_only: bool = False,
        instruction: str | None = None,
        use_prompt: bool = False,
    ) -> FloatArray:
        """Per input scores: sigmoid for one label, softmax over several, or the logits;
        `use_prompt`: with the server's default prompt before each text."""
        results = await self._run(
            inputs, Output.LOGITS, meta, truncate=truncate, direction=direction, prompt_name=None,
            use_prompt=use_prompt, instruction=instruction,
        )  # fmt: skip
        logits = _stack([r.value for r in results])
        if first_label_only:
            logits = logits[:, :1]
        scores = pooling.scores(logits, raw_scores=raw_scores)
        if np.isnan(scores).any():
            raise NaNScoreError()
        return scores

    async def _tokenizer_call(self, work: Callable[[], T]) -> T:
        try:
            return await self.offload(work)
        except rt_errors.TeiRuntimeError as e:
            raise refused_while_tokenizing(from_runtime(e)) from e

    def _metadata(self, meta: Tally) -> Metadata:
        return Metadata(
            compute_chars=meta.chars,
            compute_tokens=meta.tokens,
            tokenization_time_ns=_ns(meta.tokenization),
            queue_time_ns=_ns(meta.queue),
            inference_time_ns=_ns(meta.inference),
            total_time_ns=_ns(self.clock() - meta.start),
        )

    def _model_info(self) -> ModelInfo:
        m = self.model.manifest
        s = self.settings
        model_type: dict[str, EmbeddingModel | ClassifierModel]
        match self.task:
            case Task.CLASSIFY | Task.RERANK:
                id2label = {str(k): v for k, v in sorted(m.labels.items())}
                label2id = {v: k for k, v in sorted(m.labels.items())}
                kind = "reranker" if self.task is Task.RERANK else "classifier"
                model_type = {kind: ClassifierModel(id2label=id2label, label2id=label2id)}
            case Task.EMBED | Task.SPARSE:
                pooling_name = m.pooling.value.replace("-", "_") if m.pooling else "cls"
                model_type = {"embedding": EmbeddingModel(pooling=pooling_name)}
        precision = self.model.precision.value
        return ModelInfo(
            model_id=self.model_id,
            model_sha=self.revision or m.source.commit_sha,
            model_dtype=_DTYPES.get(precision, precision),
            served_model_name=self.served_model_name,
            model_type=model_type,
            max_concurrent_requests=s.max_concurrent_requests,
            max_input_length=self.model.max_input_length,
            max_batch_tokens=s.max_batch_tokens,
            max_batch_requests=s.max_batch_requests,
            max_client_batch_size=s.max_client_batch_size,
            auto_truncate=s.auto_truncate,
            tokenization_workers=s.effective_tokenization_workers(),
            version=version(),
            sha=os.environ.get("GIT_SHA"),
            docker_label=os.environ.get("DOCKER_LABEL"),
        )


def _stack(rows: list[FloatArray]) -> FloatArray:
    return np.stack(rows).astype(np.float32, copy=False)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
