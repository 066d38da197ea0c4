"""The serving core without a transport: typed results, typed errors, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from fake_model import FakeModel

from tei_runtime.manifest import Task
from tei_serve.errors import EmptyError, GrpcCode, ModelTypeError, TeiError
from tei_serve.serving import (
    DecodeQuery,
    EmbedQuery,
    PredictQuery,
    RerankQuery,
    Serving,
    TokenizeQuery,
)
from tei_serve.settings import Settings


def _serving(tokenizer_json: Path, task: Task = Task.EMBED, **settings: object) -> Serving:
    model = FakeModel(tokenizer_json, task)
    return Serving(settings=Settings(tokenization_workers=1, **settings),  # type: ignore[arg-type]
                   model=model, model_id="fake")  # fmt: skip


def test_embed_result_and_metadata(tokenizer_json: Path) -> None:
    async def run() -> None:
        serving = _serving(tokenizer_json)
        serving.start()
        try:
            out = await serving.embed(EmbedQuery(inputs=["hello world", "a cat"]))
            tokens = await serving.tokenize(TokenizeQuery(inputs=["hello world"]))
            text = await serving.decode(DecodeQuery(ids=[[t.id for t in tokens.tokens[0]]]))
        finally:
            await serving.stop()
        assert out.vectors.dtype == np.float32 and out.vectors.shape == (2, 16)
        assert np.allclose(np.linalg.norm(out.vectors, axis=1), 1.0, atol=1e-6)
        assert out.metadata.compute_tokens == 4 + 4  # [CLS] ... [SEP] each
        assert out.metadata.compute_chars == len("hello world") + len("a cat")
        assert out.metadata.total_time_ns >= out.metadata.tokenization_time_ns
        assert text.texts == ["hello world"]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("task", "call", "error", "code"),
    [
        (Task.EMBED, "predict", ModelTypeError, GrpcCode.FAILED_PRECONDITION),
        (Task.CLASSIFY, "rerank", ModelTypeError, GrpcCode.FAILED_PRECONDITION),
        (Task.EMBED, "empty", EmptyError, GrpcCode.INVALID_ARGUMENT),
    ],
)
def test_typed_errors(
    tokenizer_json: Path, task: Task, call: str, error: type[TeiError], code: GrpcCode
) -> None:
    async def run() -> None:
        serving = _serving(tokenizer_json, task)
        serving.start()
        try:
            with pytest.raises(error) as caught:
                if call == "predict":
                    await serving.predict(PredictQuery(inputs=["a"]))
                elif call == "rerank":
                    await serving.rerank(RerankQuery(query="q", texts=["a"]))
                else:
                    await serving.embed(EmbedQuery(inputs=[""]))
            assert caught.value.grpc_code is code
        finally:
            await serving.stop()

    asyncio.run(run())


def test_cancelled_caller_leaves_nothing_queued(tokenizer_json: Path) -> None:
    async def run() -> None:
        serving = _serving(tokenizer_json, max_concurrent_requests=8)
        model = serving.model
        assert isinstance(model, FakeModel)
        model.gate.clear()
        serving.start()
        try:
            held = asyncio.create_task(serving.embed(EmbedQuery(inputs=["hello", "world"])))
            await asyncio.to_thread(model.running.wait)  # its batch is in the model
            leaver = asyncio.create_task(serving.embed(EmbedQuery(inputs=["a", "b", "cat"])))
            worker = serving.worker
            while len(worker.queue) + len(worker._slot or []) != 3:  # the leaver is queued
                await asyncio.sleep(0)
            leaver.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leaver
            assert serving.admission.permits.available == 6  # its permits are back at once
            model.gate.set()
            await held
        finally:
            await serving.stop()
        assert model.batches == [2]  # the leaver's inputs never reached the model

    asyncio.run(run())
