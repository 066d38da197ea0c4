"""TEI's gRPC API over loopback, on the fake model: every RPC, error codes, auth, health,
reflection, the Prometheus port, stream order and batching, cancellation, size limits.

The client is generated from TEI's proto with grpcio-tools at test time (grpc_support).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from fake_model import FakeModel
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_support import RunningGrpc, generate_client

from tei_runtime.manifest import Task
from tei_serve.serving import EmbedQuery, Serving
from tei_serve.settings import Settings


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return generate_client(tmp_path_factory.mktemp("tei-client"))


@pytest.fixture
def grpc_serve(tokenizer_json: Path) -> Iterator[Callable[..., RunningGrpc]]:
    running: list[RunningGrpc] = []

    def factory(task: Task = Task.EMBED, *, max_input_length: int = 32,
                **settings: Any) -> RunningGrpc:
        settings.setdefault("hostname", "127.0.0.1")
        settings.setdefault("port", 0)
        settings.setdefault("prometheus_port", 0)
        settings.setdefault("tokenization_workers", 2)
        model = FakeModel(tokenizer_json, task, max_input_length=max_input_length)
        serving = Serving(settings=Settings(grpc=True, **settings), model=model,
                          model_id=f"fake/{task.value}")  # fmt: skip
        r = RunningGrpc(serving)
        running.append(r)
        return r

    yield factory
    for r in running:
        r.serving.model.gate.set()
        r.stop()


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    return err.code(), err.details()


# -- every RPC --------------------------------------------------------------------------------


def test_info(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, max_client_batch_size=7)
    info = stubs.InfoStub(r.channel).Info(pb.InfoRequest())
    assert info.model_id == "fake/embed"
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.max_client_batch_size == 7 and info.max_concurrent_requests == 512
    assert info.model_dtype == "float32" and info.version
    assert not info.HasField("max_batch_requests")


def test_embed_matches_the_core_and_fills_metadata(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    embed = stubs.EmbedStub(r.channel)
    one = embed.Embed(pb.EmbedRequest(inputs="hello world"))
    meta = one.metadata
    assert meta.compute_chars == len("hello world") and meta.compute_tokens == 4
    assert meta.total_time_ns >= meta.inference_time_ns > 0
    # TEI's x-* headers come as the response metadata of unary calls, as over HTTP.
    _, call = embed.Embed.with_call(pb.EmbedRequest(inputs="hello world"))
    headers = dict(call.initial_metadata())
    assert headers["x-compute-type"] == "gpu+optimized"
    assert headers["x-compute-characters"] == "11" and headers["x-compute-tokens"] == "4"
    assert {"x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time",
            "x-inference-time"} <= headers.keys()  # fmt: skip
    raw = embed.Embed(pb.EmbedRequest(inputs="hello world", normalize=False, dimensions=8))
    vec, raw_vec = np.asarray(one.embeddings), np.asarray(raw.embeddings)
    assert vec.shape == (16,) and raw_vec.shape == (8,)
    assert np.isclose(np.linalg.norm(vec), 1.0, atol=1e-5)
    assert not np.isclose(np.linalg.norm(raw_vec), 1.0, atol=1e-3)
    assert np.allclose(vec[:8] / np.linalg.norm(vec[:8]), raw_vec / np.linalg.norm(raw_vec),
                       atol=1e-5)  # fmt: skip
    stream = list(embed.EmbedStream(iter([pb.EmbedRequest(inputs=t) for t in ("a cat", "a dog")])))
    assert [len(s.embeddings) for s in stream] == [16, 16]
    assert not np.allclose(stream[0].embeddings, stream[1].embeddings)


def test_embed_all_and_sparse(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    emb = grpc_serve(Task.EMBED)
    out = stubs.EmbedStub(emb.channel).EmbedAll(pb.EmbedAllRequest(inputs="hello world"))
    assert len(out.token_embeddings) == 4 and len(out.token_embeddings[0].embeddings) == 16
    streamed = list(stubs.EmbedStub(emb.channel).EmbedAllStream(
        iter([pb.EmbedAllRequest(inputs="a"), pb.EmbedAllRequest(inputs="a big cat")])))
    assert [len(s.token_embeddings) for s in streamed] == [3, 5]
    sp = grpc_serve(Task.SPARSE)
    sparse = stubs.EmbedStub(sp.channel).EmbedSparse(pb.EmbedSparseRequest(inputs="hello world"))
    assert len(sparse.sparse_embeddings) == 4  # [CLS] hello world [SEP]
    assert all(v.value > 0 for v in sparse.sparse_embeddings)
    many = list(stubs.EmbedStub(sp.channel).EmbedSparseStream(
        iter([pb.EmbedSparseRequest(inputs="a"), pb.EmbedSparseRequest(inputs="a a")])))
    assert [len(m.sparse_embeddings) for m in many] == [3, 3]
    code, _ = _code(lambda: stubs.EmbedStub(sp.channel).EmbedAll(pb.EmbedAllRequest(inputs="a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_predict_pair_and_streams(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.CLASSIFY)
    predict = stubs.PredictStub(r.channel)
    one = predict.Predict(pb.PredictRequest(inputs="good dog"))
    assert sorted(p.label for p in one.predictions) == ["negative", "neutral", "positive"]
    assert np.isclose(sum(p.score for p in one.predictions), 1.0, atol=1e-5)
    scores = [p.score for p in one.predictions]
    assert scores == sorted(scores, reverse=True)
    raw = predict.Predict(pb.PredictRequest(inputs="good dog", raw_scores=True))
    assert not np.isclose(sum(p.score for p in raw.predictions), 1.0, atol=1e-3)
    pair = predict.PredictPair(pb.PredictPairRequest(inputs=["good dog", "bad cat"]))
    single = predict.PredictPair(pb.PredictPairRequest(inputs=["good dog"]))
    # other batch compositions round differently in the last bits: close, not equal
    assert np.allclose([p.score for p in single.predictions], scores, atol=1e-6)
    assert pair.metadata.compute_chars == len("good dog") + len("bad cat")
    code, text = _code(lambda: predict.PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert text == "`inputs` must have a single or two elements. Given: 3"
    streamed = list(predict.PredictStream(iter([pb.PredictRequest(inputs="good dog")] * 3)))
    assert np.allclose([[p.score for p in s.predictions] for s in streamed], [scores] * 3,
                       atol=1e-6)
    pairs = list(predict.PredictPairStream(iter([
        pb.PredictPairRequest(inputs=["good dog", "bad cat"]),
        pb.PredictPairRequest(inputs=["good dog"])])))  # fmt: skip
    assert np.allclose([p.score for p in pairs[1].predictions], scores, atol=1e-6)
    assert np.allclose([p.score for p in pairs[0].predictions],
                       [p.score for p in pair.predictions], atol=1e-6)


def test_rerank_and_rerank_stream(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.RERANK)
    rerank = stubs.RerankStub(r.channel)
    texts = ["paris is the capital of france", "a cat", "the big city"]
    ranked = rerank.Rerank(pb.RerankRequest(query="what is paris", texts=texts, return_text=True))
    assert sorted(k.index for k in ranked.ranks) == [0, 1, 2]
    assert [k.text for k in ranked.ranks] == [texts[k.index] for k in ranked.ranks]
    assert [k.score for k in ranked.ranks] == sorted((k.score for k in ranked.ranks),
                                                     reverse=True)  # fmt: skip
    # raw_scores and return_text come from the first message only, as in TEI
    messages = [pb.RerankStreamRequest(query="what is paris", text=t, return_text=(i == 0),
                                       raw_scores=(i == 1)) for i, t in enumerate(texts)]
    metrics = r.serving.metrics
    before = metrics.counter_value("te_predict_success")
    streamed = rerank.RerankStream(iter(messages))
    # the stream's pairs are counted once it ends (its histograms once per pair, as TEI)
    assert metrics.counter_value("te_predict_success") == before + len(texts)
    by_index = {k.index: k for k in streamed.ranks}
    assert {i: k.score for i, k in by_index.items()} == pytest.approx(
        {k.index: k.score for k in ranked.ranks}, abs=1e-6)
    assert all(k.text == texts[i] for i, k in by_index.items())
    assert streamed.metadata.compute_chars == sum(len("what is paris") + len(t) for t in texts)
    _, call = rerank.RerankStream.with_call(iter(messages))
    assert dict(call.initial_metadata())["x-compute-characters"] == str(
        streamed.metadata.compute_chars)
    code, text = _code(lambda: rerank.RerankStream(iter([])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text == "`texts` cannot be empty"
    # On a model that is no reranker, TEI answers that before reading the stream.
    embedder = stubs.RerankStub(grpc_serve(Task.EMBED).channel)
    code, text = _code(lambda: embedder.RerankStream(iter([])))
    # TEI's gRPC wording: an embedding model is "not a classifier", a classifier "not a
    # re-ranker", with no "Backend error:" prefix
    assert (code, text) == (grpc.StatusCode.FAILED_PRECONDITION, "model is not a classifier model")
    code, text = _code(lambda: embedder.Rerank(pb.RerankRequest(query="q", texts=["a"])))
    assert (code, text) == (grpc.StatusCode.FAILED_PRECONDITION, "model is not a classifier model")
    classifier = stubs.RerankStub(grpc_serve(Task.CLASSIFY).channel)
    for call in (lambda: classifier.Rerank(pb.RerankRequest(query="q", texts=["a"])),
                 lambda: classifier.RerankStream(iter([]))):  # fmt: skip
        assert _code(call) == (grpc.StatusCode.FAILED_PRECONDITION,
                               "model is not a re-ranker model")  # fmt: skip
    # empty texts are refused before the model type, as TEI does
    code, _ = _code(lambda: embedder.Rerank(pb.RerankRequest(query="q", texts=[])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = _code(lambda: rerank.Rerank(pb.RerankRequest(query="q", texts=[])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # a reranker also answers Predict (TEI's health says so too)
    assert stubs.PredictStub(r.channel).PredictPair(
        pb.PredictPairRequest(inputs=["what is paris", "a cat"])).predictions


def test_instruction_metadata_reaches_the_core(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """TEI's proto has no instruction field: `instruction` (or UTF-8 `instruction-bin`)
    metadata carries it; a cross-encoder refuses one as /rerank does, bad UTF-8 is refused."""
    pb, stubs = client
    r = grpc_serve(Task.RERANK)
    rerank, predict = stubs.RerankStub(r.channel), stubs.PredictStub(r.channel)
    calls = [
        lambda m: rerank.Rerank(pb.RerankRequest(query="q", texts=["a"]), metadata=m),
        lambda m: rerank.RerankStream(iter([pb.RerankStreamRequest(query="q", text="a")]),
                                      metadata=m),
        lambda m: predict.PredictPair(pb.PredictPairRequest(inputs=["q", "a"]), metadata=m),
        lambda m: list(predict.PredictStream(iter([pb.PredictRequest(inputs="a")]), metadata=m)),
    ]  # fmt: skip
    for call in calls:
        assert call(None)  # no instruction: answered
        for metadata in ([("instruction", "find cities")],
                         [("instruction-bin", "trouver les villes é".encode())]):  # fmt: skip
            code, text = _code(lambda c=call, m=metadata: c(m))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, text)
            assert "generative rerankers" in text
        code, text = _code(lambda c=call: c([("instruction-bin", b"\xff\xfe")]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not UTF-8" in text
        # One model: its name is ignored, however it is written.
        assert call([("model-bin", b"\xff"), ("model", "nope")])
    info = stubs.InfoStub(r.channel).Info(pb.InfoRequest(), metadata=[("model-bin", b"\xff")])
    assert info.model_type == pb.MODEL_TYPE_RERANKER


def test_tokenize_and_decode(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    tok = stubs.TokenizeStub(r.channel)
    plain = tok.Tokenize(pb.EncodeRequest(inputs="hello world"))
    code, text = _code(lambda: tok.Tokenize(pb.EncodeRequest(inputs="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert text == "Input validation error: `inputs` cannot be empty"
    assert [t.text for t in plain.tokens] == ["hello", "world"]  # add_special_tokens: false
    full = tok.Tokenize(pb.EncodeRequest(inputs="hello world", add_special_tokens=True))
    assert [t.special for t in full.tokens] == [True, False, False, True]
    assert not full.tokens[0].HasField("start")
    assert (full.tokens[1].start, full.tokens[1].stop) == (0, 5)
    ids = [t.id for t in full.tokens]
    assert tok.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True)).text == "hello world"
    assert "[CLS]" in tok.Decode(pb.DecodeRequest(ids=ids)).text
    streamed = list(tok.TokenizeStream(iter([pb.EncodeRequest(inputs=w) for w in ("a", "a cat")])))
    assert [len(s.tokens) for s in streamed] == [1, 2]
    decoded = list(tok.DecodeStream(iter([pb.DecodeRequest(ids=ids[1:2]),
                                          pb.DecodeRequest(ids=ids[2:3])])))  # fmt: skip
    assert [d.text for d in decoded] == ["hello", "world"]
    # TEI's character limit holds (max_input_length 32 x 250: Tokenize never truncates)
    code, text = _code(lambda: tok.Tokenize(pb.EncodeRequest(inputs="a" * 8001)))
    assert (code, text) == (grpc.StatusCode.INVALID_ARGUMENT, "Input validation error: "
                            "`inputs` must have less than 8000 characters. Given: 8001")
    code, _ = _code(lambda: list(tok.TokenizeStream(iter([pb.EncodeRequest(inputs="a" * 8001)]))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # a long text's answer (built off the event loop past 4096 tokens) is whole and in order
    words = ["hello", "world"] * 3000
    long_model = stubs.TokenizeStub(grpc_serve(Task.EMBED, max_input_length=512).channel)
    big = long_model.Tokenize(pb.EncodeRequest(inputs=" ".join(words)))
    assert [t.text for t in big.tokens] == words
    assert big.tokens[-1].stop == len(" ".join(words))


# -- errors -------------------------------------------------------------------------------------


def test_error_codes(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, max_concurrent_requests=1)
    embed, tok = stubs.EmbedStub(r.channel), stubs.TokenizeStub(r.channel)
    # Empty -> INVALID_ARGUMENT
    code, text = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="")))
    assert (code, text) == (grpc.StatusCode.INVALID_ARGUMENT,
                            "Input validation error: `inputs` cannot be empty")
    # Validation -> INVALID_ARGUMENT (too long without truncate; bad prompt; dimensions)
    long = " ".join(["hello"] * 40)
    code, text = _code(lambda: embed.Embed(pb.EmbedRequest(inputs=long)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "must have less than" in text
    assert len(embed.Embed(pb.EmbedRequest(inputs=long, truncate=True)).embeddings) == 16
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a", prompt_name="nope")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a", dimensions=0)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # proto3 passes an unknown enum number through: refused, never read as the default side
    code, text = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a", truncation_direction=7)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and text.endswith("got 7")
    # Backend (wrong model type) -> FAILED_PRECONDITION
    code, text = _code(lambda: stubs.PredictStub(r.channel).Predict(pb.PredictRequest(inputs="a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a classifier" in text
    code, _ = _code(lambda: stubs.RerankStub(r.channel).Rerank(
        pb.RerankRequest(query="q", texts=["a"])))  # fmt: skip
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    # Backend (the model failed) -> FAILED_PRECONDITION
    r.serving.model.fail_batches = 1
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    # Overloaded -> RESOURCE_EXHAUSTED
    r.serving.model.gate.clear()
    held = embed.Embed.future(pb.EmbedRequest(inputs="a"))
    _wait(lambda: r.serving.admission.permits.available == 0)
    code, text = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="b")))
    assert (code, text) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Model is overloaded")
    r.serving.model.gate.set()
    assert held.result().embeddings
    # Decode: empty ids, and ids no tokenizer has (u32 max) are answered, never a crash
    code, _ = _code(lambda: tok.Decode(pb.DecodeRequest(ids=[])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert tok.Decode(pb.DecodeRequest(ids=[2**32 - 1, 2**32 - 2])).text == ""
    with pytest.raises(ValueError):  # the client's stub refuses an id over u32 itself
        pb.DecodeRequest(ids=[2**32])
    metrics = r.serving.metrics
    # TEI's labels: what its tokenization refuses (empty, too long, unknown prompt, no ids)
    # is "tokenization", the `dimensions` check "validation"
    assert metrics.counter_value("te_request_failure", "tokenization") == 4
    assert metrics.counter_value("te_request_failure", "validation") == 2
    assert metrics.counter_value("te_request_failure", "overloaded") == 1
    assert metrics.counter_value("te_request_failure", "model_type") == 2


def test_unhealthy_is_unavailable_and_health_follows_the_backend(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    health = health_pb2_grpc.HealthStub(r.channel)

    def status(service: str) -> int:
        return int(health.Check(health_pb2.HealthCheckRequest(service=service)).status)

    serving_, not_serving = health_pb2.HealthCheckResponse.SERVING, \
        health_pb2.HealthCheckResponse.NOT_SERVING  # fmt: skip
    assert {s: status(s) for s in ("", "tei.v1.Info", "tei.v1.Tokenize", "tei.v1.Embed",
                                   "tei.v1.Predict", "tei.v1.Rerank")} == {
        "": serving_, "tei.v1.Info": serving_, "tei.v1.Tokenize": serving_,
        "tei.v1.Embed": serving_, "tei.v1.Predict": not_serving, "tei.v1.Rerank": not_serving,
    }  # fmt: skip
    r.serving.model.fail_batches = 2  # the failing batch, then the health probe
    code, _ = _code(lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert r.serving.worker.healthy is False
    assert status("tei.v1.Embed") == not_serving  # the probe failed too
    assert status("tei.v1.Info") == serving_
    assert status("") == serving_  # the next probe works: the backend is back
    assert status("tei.v1.Embed") == serving_
    assert stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")).embeddings
    # Unhealthy -> UNAVAILABLE: a call that reaches a queue that is shutting down
    r.call(r.serving.worker.stop())
    code, text = _code(lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")))
    assert (code, text) == (grpc.StatusCode.UNAVAILABLE, "server is shutting down")


def test_health_of_an_unknown_service_is_not_found_as_tonic_health_answers(
    grpc_serve: Callable[..., RunningGrpc],
) -> None:
    r = grpc_serve(Task.EMBED)
    health = health_pb2_grpc.HealthStub(r.channel)
    ask = health_pb2.HealthCheckRequest(service="tei.v1.Embedd")
    for call in (lambda: health.Check(ask), lambda: list(health.Watch(ask, timeout=10))):
        code, text = _code(call)
        assert (code, text) == (grpc.StatusCode.NOT_FOUND, "service not registered")


def test_watch_sees_a_failed_batch_and_the_recovery(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """TEI's backend reports its health after every batch; a Watch follows it, no Check needed."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    seen: list[int] = []
    watch = health_pb2_grpc.HealthStub(r.channel).Watch(
        health_pb2.HealthCheckRequest(service="tei.v1.Embed"))

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):  # the cancel at the end
            seen.extend(m.status for m in watch)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    serving_, not_serving = health_pb2.HealthCheckResponse.SERVING, \
        health_pb2.HealthCheckResponse.NOT_SERVING  # fmt: skip
    _wait(lambda: seen == [serving_])
    r.serving.model.fail_batches = 1
    code, _ = _code(lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    _wait(lambda: seen == [serving_, not_serving])
    assert stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")).embeddings
    _wait(lambda: seen == [serving_, not_serving, serving_])
    watch.cancel()


def test_auth(grpc_serve: Callable[..., RunningGrpc], client: Any) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, api_key="secret")
    embed = stubs.EmbedStub(r.channel)
    for metadata in (None, [("authorization", "Bearer wrong")], [("authorization", "secret")]):
        code, text = _code(lambda m=metadata: embed.Embed(pb.EmbedRequest(inputs="a"),
                                                          metadata=m))  # fmt: skip
        assert (code, text) == (grpc.StatusCode.UNAUTHENTICATED, "No valid auth token")
    code, _ = _code(lambda: list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a")]))))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = _code(lambda: stubs.RerankStub(r.channel).RerankStream(iter([])))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # TEI reads the first `authorization` value only, and refuses a method its guarded
    # service lacks before it is found missing; an unknown service is UNIMPLEMENTED.
    twice = [("authorization", "Bearer wrong"), ("authorization", "Bearer secret")]
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a"), metadata=twice))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    for method, expected in (("/tei.v1.Embed/Nope", grpc.StatusCode.UNAUTHENTICATED),
                             ("/tei.v1.Nope/Embed", grpc.StatusCode.UNIMPLEMENTED)):  # fmt: skip
        call = r.channel.unary_unary(method)
        code, _ = _code(lambda c=call: c(b""))
        assert code == expected, method
    ok = [("authorization", "Bearer secret")]
    assert embed.Embed(pb.EmbedRequest(inputs="a"), metadata=ok).embeddings
    assert len(list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a")]), metadata=ok))) == 1
    # health and reflection stay open, as in TEI
    health = health_pb2_grpc.HealthStub(r.channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == \
        health_pb2.HealthCheckResponse.SERVING  # fmt: skip


def test_wrong_key_costs_no_tokenization(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, api_key="secret")
    model = r.serving.model
    calls: list[str] = []
    for name in ("encode", "tokenize"):
        real = getattr(model, name)

        def spy(*args: object, _name: str = name, _real: Any = real, **kw: object) -> Any:
            calls.append(_name)
            return _real(*args, **kw)

        setattr(model, name, spy)
    embed, wrong = stubs.EmbedStub(r.channel), [("authorization", "Bearer secreT")]
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="a"), metadata=wrong))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = _code(lambda: list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a")] * 3),
                                                   metadata=wrong)))  # fmt: skip
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = _code(lambda: stubs.TokenizeStub(r.channel).Tokenize(
        pb.EncodeRequest(inputs="a"), metadata=wrong))  # fmt: skip
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert calls == []
    assert embed.Embed(pb.EmbedRequest(inputs="a"), metadata=[("authorization", "Bearer secret")])
    assert "encode" in calls  # the spy does see what an accepted call costs


def test_reflection_lists_the_services(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    r = grpc_serve(Task.EMBED)
    stub = reflection_pb2_grpc.ServerReflectionStub(r.channel)
    [answer] = stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services="")]))  # fmt: skip
    names = {s.name for s in answer.list_services_response.service}
    assert names == {"tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank",
                     "tei.v1.Tokenize", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"}  # fmt: skip
    [file] = stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed")]))
    assert file.file_descriptor_response.file_descriptor_proto
    # A method's full name too (`grpcurl describe tei.v1.Embed.Embed`), as tonic answers it;
    # a method the service lacks stays NOT_FOUND.
    method, missing = stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed.Embed"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed.Nope"),
    ]))  # fmt: skip
    assert method.file_descriptor_response.file_descriptor_proto
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_message_limit_is_teis_4_mib_or_the_payload_limit(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, payload_limit=1000)
    embed = stubs.EmbedStub(r.channel)
    # TEI ignores --payload-limit for gRPC and takes tonic's 4 MiB messages.
    assert embed.Embed(pb.EmbedRequest(inputs="a " * 1_000_000, truncate=True)).embeddings
    big = pb.EmbedRequest(inputs="a " * 2_200_000)
    size = big.ByteSize()
    tonic = (grpc.StatusCode.OUT_OF_RANGE, "Error, message length too large: found "
             f"{size} bytes, the limit is: 4194304 bytes")  # fmt: skip
    assert _code(lambda: embed.Embed(big)) == tonic
    larger = grpc_serve(Task.EMBED, payload_limit=6 * 1024 * 1024)
    assert stubs.EmbedStub(larger.channel).Embed(
        pb.EmbedRequest(inputs="a " * 2_200_000, truncate=True)).embeddings
    # In a stream, the messages before the oversized one are answered first, in order.
    answers: list[Any] = []
    messages = [pb.EmbedRequest(inputs="a"), pb.EmbedRequest(inputs="b"), big]
    stream = stubs.EmbedStub(r.channel).EmbedStream(iter(messages))
    assert _code(lambda: answers.extend(stream)) == tonic
    assert len(answers) == 2
    assert stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")).embeddings
    # Past twice the limit grpc refuses a message from its length prefix, unread: each call
    # holds at most that much (64 MiB each was 1.4 GB for 32 calls).
    huge = pb.EmbedRequest(inputs="a" * (9 * 1024 * 1024))
    code, _ = _code(lambda: embed.Embed(huge))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    # No compressed messages, as tonic without `accept_compressed`: 62 KiB of gzip inflated
    # to a 64 MiB message.
    gzip = stubs.EmbedStub(grpc.insecure_channel(r.target, compression=grpc.Compression.Gzip))
    code, _ = _code(lambda: gzip.Embed(pb.EmbedRequest(inputs="a")))
    assert code is grpc.StatusCode.UNIMPLEMENTED
    assert embed.Embed(pb.EmbedRequest(inputs="a")).embeddings


# -- streams: order, batching, 10,000 messages, cancellation -------------------------------------


def test_stream_messages_batch_together_and_answer_in_order(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    model = r.serving.model
    texts = [f"{w} cat" for w in ("hello", "big", "small", "good", "bad", "a", "the", "world")]
    # one batch held at the gate and one prefetched, so the whole stream queues behind them
    model.gate.clear()
    worker = r.serving.worker
    blocker = stubs.EmbedStub(r.channel).Embed.future(pb.EmbedRequest(inputs="warm up"))
    _wait(model.running.is_set)
    prefetched = stubs.EmbedStub(r.channel).Embed.future(pb.EmbedRequest(inputs="warm"))
    _wait(lambda: worker._slot is not None and len(worker._slot) == 1)
    answers: list[Any] = []
    done = threading.Event()

    def consume() -> None:
        answers.extend(stubs.EmbedStub(r.channel).EmbedStream(
            iter([pb.EmbedRequest(inputs=t) for t in texts])))
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    _wait(lambda: len(worker.queue) == len(texts))
    model.gate.set()
    assert done.wait(30) and blocker.result().embeddings and prefetched.result().embeddings
    assert model.batches == [1, 1, len(texts)]  # the whole stream in one batch
    expected = r.call(r.serving.embed(EmbedQuery(inputs=texts))).vectors  # the core, directly
    assert np.allclose([a.embeddings for a in answers], expected, atol=1e-6)


def test_ten_thousand_messages_in_one_stream(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    words = ["hello", "world", "cat", "dog", "big", "small", "city", "paris"]
    texts = [f"{words[i % 8]} {words[(i // 8) % 8]} {words[(i // 64) % 8]}" for i in range(10_000)]
    answers = list(stubs.EmbedStub(r.channel).EmbedStream(
        iter([pb.EmbedRequest(inputs=t) for t in texts])))  # fmt: skip
    assert len(answers) == 10_000
    distinct = {t: i for i, t in enumerate(texts)}
    for t, i in list(distinct.items())[:50]:  # answer i is text i's vector
        assert np.allclose(answers[i].embeddings, answers[texts.index(t)].embeddings)
    assert not np.allclose(answers[0].embeddings, answers[1].embeddings)
    model = r.serving.model
    assert sum(model.batches) == 10_000
    assert max(model.batches) > 1  # messages ran together, not one by one
    assert r.serving.admission.permits.available == 512


def test_a_client_that_writes_every_message_before_reading_is_answered(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """grpc-go's and grpc.aio's usual pattern: all writes, then the reads. Answers the client
    has not read yet must not hold the stream's window (4 here), or the server stops reading
    once ~a window of them fills the transport and both sides wait on each other."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED, max_concurrent_requests=4, max_input_length=2048)
    text = " ".join(["hello", "world"] * 1500)  # 3000 tokens: ~50 KB per answer
    count = 600  # ~30 MB of answers: 10 MB could wait unread in the transport here
    written = threading.Event()

    def requests() -> Iterator[Any]:
        for _ in range(count):
            yield pb.EncodeRequest(inputs=text)
        written.set()

    answers = stubs.TokenizeStub(r.channel).TokenizeStream(requests(), timeout=120)
    assert written.wait(60), "the server stopped reading the unread client's messages"
    lengths = [len(a.tokens) for a in answers]
    assert lengths == [3000] * count
    assert r.serving.admission.permits.available == 4


def test_a_stream_sends_its_headers_before_the_first_message(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """A client may wait for the response headers (grpc-go's `Header()`) before it writes."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    go = threading.Event()

    def requests() -> Iterator[Any]:
        go.wait(30)
        yield pb.EmbedRequest(inputs="hello world")

    call = stubs.EmbedStub(r.channel).EmbedStream(requests(), timeout=60)
    headers: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=lambda: headers.put(call.initial_metadata()), daemon=True).start()
    try:
        headers.get(timeout=10)
    finally:
        go.set()
    assert [len(a.embeddings) for a in call] == [16]


def test_stream_messages_wait_for_permits_where_unary_calls_are_refused(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED, max_concurrent_requests=2)
    permits = r.serving.admission.permits
    embed = stubs.EmbedStub(r.channel)
    r.serving.model.gate.clear()
    held = [embed.Embed.future(pb.EmbedRequest(inputs=f"held {i}")) for i in range(2)]
    _wait(lambda: permits.available == 0)
    texts = ["a b", "c d", "e f"]
    call = embed.EmbedStream(iter([pb.EmbedRequest(inputs=t) for t in texts]))
    answers: list[Any] = []
    reader = threading.Thread(target=lambda: answers.extend(call), daemon=True)
    reader.start()
    _wait(lambda: permits.waiting >= 1)  # the stream's messages queue for permits, not fail
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="unary")))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # a unary call is still refused at once
    r.serving.model.gate.set()
    assert [len(h.result().embeddings) for h in held] == [16, 16]
    reader.join(10)
    assert call.code() == grpc.StatusCode.OK
    expected = [embed.Embed(pb.EmbedRequest(inputs=t)).embeddings for t in texts]
    assert np.allclose([a.embeddings for a in answers], expected, atol=1e-6)
    _wait(lambda: permits.available == 2 and permits.waiting == 0)


def test_a_malformed_message_is_internal_as_tonic_answers_it(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    raw = r.channel.unary_unary("/tei.v1.Embed/Embed")
    code, text = _code(lambda: raw(b"\x0a\xff\xff\xff"))
    assert code == grpc.StatusCode.INTERNAL and "failed to decode" in text
    stream = r.channel.stream_stream("/tei.v1.Embed/EmbedStream")
    good = pb.EmbedRequest(inputs="a cat").SerializeToString()
    answers: list[bytes] = []
    code, _ = _code(lambda: answers.extend(stream(iter([good, good, b"\x0a\xff\xff\xff"]))))
    assert code == grpc.StatusCode.INTERNAL and len(answers) == 2
    assert stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")).embeddings


def test_a_unary_call_closed_without_its_message_is_answered_at_once(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """A raw client that half-closes a unary call before sending its message gets tonic's
    INTERNAL "Missing request message." at once (grpc's own unary handling answered nothing,
    and the call waited for its deadline, or forever without one); a second message is
    ignored, the first answered."""
    pb, _ = client
    for api_key, metadata in ((None, None), ("secret", [("authorization", "Bearer secret")])):
        r = grpc_serve(Task.EMBED, api_key=api_key)
        for method in ("/tei.v1.Embed/Embed", "/tei.v1.Info/Info", "/tei.v1.Tokenize/Decode"):
            call = r.channel.stream_unary(method)
            started = time.monotonic()
            code, text = _code(lambda c=call, m=metadata: c(iter([]), timeout=20, metadata=m))
            assert (code, text) == (grpc.StatusCode.INTERNAL, "Missing request message.")
            assert time.monotonic() - started < 5, method
        two = pb.EmbedRequest(inputs="a cat").SerializeToString()
        answer = r.channel.stream_unary("/tei.v1.Embed/Embed")(iter([two, two]), timeout=20,
                                                                metadata=metadata)  # fmt: skip
        assert len(pb.EmbedResponse.FromString(answer).embeddings) == 16
    # Without the key, refused before any message is read, as before.
    call = r.channel.stream_unary("/tei.v1.Embed/Embed")
    code, text = _code(lambda: call(iter([]), timeout=20))
    assert (code, text) == (grpc.StatusCode.UNAUTHENTICATED, "No valid auth token")


def test_frequent_keepalive_pings_keep_an_idle_stream_open(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """A client pinging twice a second with nothing to send (grpc-go's and Envoy's keepalives
    do this at 10-30 s) keeps its stream: grpc-core's default ping policy would GOAWAY it
    after a few pings ("too_many_pings"), failing the open call."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    channel = grpc.insecure_channel(r.target, options=[
        ("grpc.keepalive_time_ms", 500), ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ])  # fmt: skip
    sent: queue.Queue[Any] = queue.Queue()
    answers = stubs.EmbedStub(channel).EmbedStream(iter(sent.get, None), timeout=30)
    try:
        sent.put(pb.EmbedRequest(inputs="a cat"))
        assert len(next(answers).embeddings) == 16
        time.sleep(10)  # grpc-core's default policy ended the call in ~4 s of this
        sent.put(pb.EmbedRequest(inputs="a dog"))
        assert len(next(answers).embeddings) == 16
    finally:
        sent.put(None)
        channel.close()


def test_large_request_metadata_is_accepted(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """Request metadata of 64 KiB (a large JWT, tracing baggage) is read, as TEI reads it;
    grpc-core's default refuses past 8 KiB."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    stub = stubs.EmbedStub(r.channel)
    for _ in range(3):
        got = stub.Embed(pb.EmbedRequest(inputs="a cat"), metadata=[("x-big", "a" * 65536)])
        assert len(got.embeddings) == 16


def test_unary_rerank_waits_for_permits_as_teis_does(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    """TEI's gRPC Rerank awaits a permit per text: more texts than permits still answer."""
    pb, stubs = client
    r = grpc_serve(Task.RERANK, max_concurrent_requests=2)
    ranked = stubs.RerankStub(r.channel).Rerank(pb.RerankRequest(query="q", texts=["a", "b", "c"]))
    assert sorted(k.index for k in ranked.ranks) == [0, 1, 2]
    permits = r.serving.admission.permits
    assert permits.available == 2 and permits.waiting == 0


def test_cancelled_stream_leaves_nothing_queued(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    model = r.serving.model
    model.gate.clear()
    sent = threading.Event()

    def requests() -> Iterator[Any]:
        for i in range(20):
            yield pb.EmbedRequest(inputs=f"hello {i}")
        sent.set()
        threading.Event().wait(60)  # the client keeps the stream open until it cancels

    call = stubs.EmbedStub(r.channel).EmbedStream(requests())
    worker = r.serving.worker
    # every message is queued, in the worker's slot, or in the batch held at the gate
    _wait(lambda: len(worker.queue) + len(worker._slot or []) + model.at_gate >= 20)
    held = model.at_gate
    call.cancel()
    _wait(lambda: r.serving.admission.permits.available == 512)  # every message's permit is back
    model.gate.set()
    _wait(lambda: len(worker.queue) == 0)
    assert sum(model.batches) <= held  # at most the batch already at the gate ran
    assert stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a")).embeddings
    # TEI's count: one `dropped` per input not computed because its client left
    url = f"http://127.0.0.1:{r.metrics_port}/metrics"
    _wait(lambda: f'te_request_failure{{err="dropped"}} {20 - held}\n'
          in httpx.get(url, timeout=10).text)  # fmt: skip


# -- metrics, spans, the Prometheus port ----------------------------------------------------------


def test_metrics_are_counted_like_http_and_served_on_the_prometheus_port(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    embed = stubs.EmbedStub(r.channel)
    embed.Embed(pb.EmbedRequest(inputs="a"))
    list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a"), pb.EmbedRequest(inputs="b")])))
    _code(lambda: embed.Embed(pb.EmbedRequest(inputs="")))
    text = httpx.get(f"http://127.0.0.1:{r.metrics_port}/metrics", timeout=10).text
    assert 'te_request_count{method="single"} 4' in text
    assert 'te_request_success{method="single"} 3' in text
    assert 'te_request_failure{err="tokenization"} 1' in text  # TEI's label for an empty input
    assert "te_embed_success 3" in text and "te_embed_duration_count 3.0" in text


def test_spans_like_http_with_the_callers_trace(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from test_tracing import PARENT_ID, TRACE_ID, Collector

    pb, stubs = client
    collector = Collector()
    sink = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, sink)
    sink_port = sink.add_insecure_port("127.0.0.1:0")
    sink.start()
    try:
        r = grpc_serve(Task.EMBED, otlp_endpoint=f"http://127.0.0.1:{sink_port}")
        traceparent = [("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")]
        stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="hello"), metadata=traceparent)
        list(stubs.EmbedStub(r.channel).EmbedStream(iter([pb.EmbedRequest(inputs="a")])))
        _code(lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="")))
        r.stop()  # flushes the spans
    finally:
        sink.stop(grace=None)
    spans = [s for _, s in collector.spans() if s.name == "embed"]
    routes = sorted({a.key: a.value for a in s.attributes}["http.route"].string_value
                    for s in spans)  # fmt: skip
    assert routes == ["/tei.v1.Embed/Embed", "/tei.v1.Embed/Embed", "/tei.v1.Embed/EmbedStream"]
    ours = [s for s in spans if s.trace_id.hex() == TRACE_ID]
    assert len(ours) == 1 and ours[0].parent_span_id.hex() == PARENT_ID
    assert sum(1 for s in spans if s.status.code == 2) == 1  # the empty input: an error span
    children = {s.name for _, s in collector.spans() if s.parent_span_id == ours[0].span_id}
    assert children == {"tokenize", "queue", "inference"}


def _held_at_the_gate(
    grpc_serve: Callable[..., RunningGrpc], client: Any, **settings: Any
) -> tuple[RunningGrpc, Any, Any]:
    """An embedder whose model holds its first batch at the gate, with one Embed call in it:
    (the server, the Embed stub, that call's future)."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED, **settings)
    r.serving.model.gate.clear()
    embed = stubs.EmbedStub(r.channel)
    held = embed.Embed.future(pb.EmbedRequest(inputs="hello world"))
    _wait(r.serving.model.running.is_set)
    return r, embed, held


def test_graceful_stop_answers_the_calls_in_flight(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    r, _, in_flight = _held_at_the_gate(grpc_serve, client)
    model = r.serving.model
    stopping = r.stopping(grace=30)
    _wait(lambda: r.front.health._gracefully_shutting_down)
    assert not stopping.done()  # stop waits for the call the model holds
    model.gate.set()
    assert len(in_flight.result(timeout=30).embeddings) == 16  # answered, not cancelled
    r.stopped_by(stopping)


def test_calls_queued_at_the_end_of_the_grace_period_are_unavailable_not_cancelled(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, _ = client
    r, embed, running = _held_at_the_gate(grpc_serve, client, max_batch_requests=1)
    model = r.serving.model
    queued = [embed.Embed.future(pb.EmbedRequest(inputs=f"later {i}")) for i in range(4)]
    _wait(lambda: len(r.serving.worker.queue) + len(r.serving.worker._slot or []) == 4)
    # grace 3.5 s: what is queued is refused 0.5 s in (SHED_MARGIN_SECONDS before the end)
    stopping = r.stopping(grace=3.5)
    for call in queued:
        with pytest.raises(grpc.RpcError) as refused:
            call.result(timeout=30)
        err: Any = refused.value
        assert err.code() is grpc.StatusCode.UNAVAILABLE
        assert err.details() == "server is shutting down: its grace period is over"
    model.gate.set()
    assert len(running.result(timeout=30).embeddings) == 16  # the running batch finished
    r.stopped_by(stopping)


def test_a_cancelled_call_counts_its_queued_input_as_dropped(
    grpc_serve: Callable[..., RunningGrpc], client: Any
) -> None:
    pb, _ = client
    r, embed, blocker = _held_at_the_gate(grpc_serve, client)
    model = r.serving.model
    leaver = embed.Embed.future(pb.EmbedRequest(inputs="leave"))
    _wait(lambda: len(r.serving.worker.queue) + len(r.serving.worker._slot or []) >= 1)
    leaver.cancel()
    url = f"http://127.0.0.1:{r.metrics_port}/metrics"
    _wait(lambda: r.serving.admission.permits.available == 511)  # the server saw it leave
    model.gate.set()
    assert blocker.result(timeout=30).embeddings
    _wait(lambda: 'te_request_failure{err="dropped"} 1\n' in httpx.get(url, timeout=10).text)


def test_errors_are_logged_as_over_http(
    grpc_serve: Callable[..., RunningGrpc], client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    with caplog.at_level(logging.INFO, logger="tei_serve.access"):
        _code(lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="")))
        _code(lambda: list(stubs.EmbedStub(r.channel).EmbedStream(
            iter([pb.EmbedRequest(inputs="a"), pb.EmbedRequest(inputs="")]))))  # fmt: skip
    failed = [rec for rec in caplog.records if "failed:" in rec.getMessage()]
    assert "failed: Empty INVALID_ARGUMENT: " in failed[0].getMessage()
    assert [(rec.levelno, rec.getMessage().split(" model=")[0]) for rec in failed] == [
        (logging.WARNING, "/tei.v1.Embed/Embed"), (logging.WARNING, "/tei.v1.Embed/EmbedStream")]


def test_a_stream_cancelled_while_answering_is_logged_once(
    grpc_serve: Callable[..., RunningGrpc], client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled between answers (the handler closed at its yield, not cancelled in an
    await), every time: one "the client left" line per stream, and no work left behind."""
    pb, stubs = client
    r = grpc_serve(Task.EMBED)
    with caplog.at_level(logging.INFO, logger="tei_serve.access"):
        for _ in range(5):
            call = stubs.EmbedStub(r.channel).EmbedStream(
                iter([pb.EmbedRequest(inputs=f"hello {i}") for i in range(200)])
            )
            for _, _answer in zip(range(2), call, strict=False):
                pass
            call.cancel()

        def left() -> list[logging.LogRecord]:
            return [rec for rec in caplog.records if "client left" in rec.getMessage()]

        _wait(lambda: len(left()) == 5)
    assert all(rec.getMessage().startswith("/tei.v1.Embed/EmbedStream") for rec in left())
    _wait(lambda: r.serving.admission.permits.available == 512 and not len(r.serving.worker.queue))
