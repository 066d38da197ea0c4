"""Several models in one server, over loopback HTTP and gRPC, on fake models: routing by the
body's `model`, the `x-model` header and gRPC metadata, the 422/404 answers, /v1/models,
/info's list, per-model metrics labels, and health that needs every model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import msgspec
import numpy as np
import pytest
import uvicorn
from fake_model import FakeModel
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_support import RunningGrpc, generate_client

from support.loopback_server import loopback, run_uvicorn
from tei_runtime.manifest import Prompts, Task
from tei_serve.cli import check_default_prompt_name
from tei_serve.models import LoadedModel, Models, build_models
from tei_serve.settings import SettingsError


class Multi:
    def __init__(self, models: Models) -> None:
        self.models = models
        self.uv: uvicorn.Server
        self.thread: threading.Thread
        self.uv, self.thread, url = run_uvicorn(models)
        self.client = httpx.Client(base_url=url, timeout=30)

    def fake(self, name: str) -> FakeModel:
        [serving] = [s for s in self.models.servings if s.served_model_name == name]
        model = serving.model
        assert isinstance(model, FakeModel)
        return model

    def stop(self) -> None:
        self.client.close()
        self.uv.should_exit = True
        self.thread.join(timeout=30)


def _models(tokenizer_json: Path, **settings: Any) -> Models:
    loaded = [
        LoadedModel(model=FakeModel(tokenizer_json, task), model_id=f"org/{name}",
                    served_model_name=name)
        for name, task in (("emb", Task.EMBED), ("rr", Task.RERANK), ("cls", Task.CLASSIFY))
    ]  # fmt: skip
    return build_models(loopback(**settings), loaded)


@pytest.fixture
def multi(tokenizer_json: Path) -> Iterator[Multi]:
    m = Multi(_models(tokenizer_json))
    yield m
    for s in m.models.servings:
        s.model.gate.set()  # type: ignore[attr-defined]
    m.stop()


def _error(r: httpx.Response, status: int, *needles: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == "Validation"
    for needle in needles:
        assert needle in body["error"]
    return str(body["error"])


def test_each_route_goes_to_the_one_model_that_can_answer(multi: Multi) -> None:
    c = multi.client
    emb = c.post("/embed", json={"inputs": "hello world"})
    assert emb.status_code == 200 and np.asarray(emb.json()).shape == (1, 16)
    assert multi.fake("emb").batches and not multi.fake("rr").batches
    rank = c.post("/rerank", json={"query": "what", "texts": ["a cat", "a dog"]})
    assert rank.status_code == 200 and len(rank.json()) == 2
    assert multi.fake("rr").batches and not multi.fake("cls").batches
    assert c.post("/embed_all", json={"inputs": "hello"}).status_code == 200
    assert c.post("/similarity", json={"inputs": {"source_sentence": "a",
                                                  "sentences": ["a", "b"]}}).status_code == 200
    oa = c.post("/v1/embeddings", json={"input": "hello"})
    assert oa.status_code == 200 and oa.json()["model"] == "emb"


def test_a_name_in_the_body_or_header_picks_the_model(multi: Multi) -> None:
    c = multi.client
    by_body = c.post("/predict", json={"inputs": "good dog", "model": "cls"}).json()
    assert sorted(p["label"] for p in by_body) == ["negative", "neutral", "positive"]
    by_header = c.post("/predict", json={"inputs": "good dog"}, headers={"x-model": "rr"})
    assert [p["label"] for p in by_header.json()] == ["LABEL_0"]
    # the body's field wins over the header
    both = c.post("/predict", json={"inputs": "good dog", "model": "cls"},
                  headers={"x-model": "rr"})  # fmt: skip
    assert len(both.json()) == 3
    tokens = c.post("/tokenize", json={"inputs": "hello world", "model": "emb"})
    assert [t["text"] for t in tokens.json()[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    ids = [t["id"] for t in tokens.json()[0]]
    decoded = c.post("/decode", json={"ids": ids}, headers={"x-model": "rr"})
    assert decoded.json() == ["hello world"]
    # `/` dispatches by the named model's task
    root = c.post("/", json={"query": "what", "texts": ["a", "b"], "model": "rr"})
    assert root.status_code == 200 and {"index", "score"} <= set(root.json()[0])
    root_embed = c.post("/", json={"inputs": "hello"}, headers={"x-model": "emb"})
    assert np.asarray(root_embed.json()).shape == (1, 16)
    oa = c.post("/v1/embeddings", json={"input": "hello", "model": "emb"})
    assert oa.status_code == 200 and oa.json()["model"] == "emb"


def test_no_choice_among_several_is_422_naming_them(multi: Multi) -> None:
    c = multi.client
    _error(c.post("/predict", json={"inputs": "good"}), 422, "`rr`", "`cls`", "`model`")
    _error(c.post("/tokenize", json={"inputs": "hello"}), 422, "`emb`", "`rr`", "`cls`")
    _error(c.post("/decode", json={"ids": [2, 3]}), 422, "several models")
    _error(c.post("/", json={"inputs": "hello"}), 422,
           "several models can answer /, /invocations and /vertex (gRPC Info)")  # fmt: skip
    _error(c.post("/embed_sparse", json={"inputs": "hello"}), 422,
           "no served model can answer /embed_sparse (gRPC EmbedSparse)")  # fmt: skip


def test_unknown_and_unable_models(multi: Multi) -> None:
    c = multi.client
    _error(c.post("/embed", json={"inputs": "a", "model": "nope"}), 404, "`nope`",
           "emb (embed)", "rr (rerank)")  # fmt: skip
    _error(c.post("/rerank", json={"query": "q", "texts": ["a"]}, headers={"x-model": "nope"}),
           404, "`nope`")  # fmt: skip
    _error(c.post("/embed", json={"inputs": "a", "model": "rr"}), 422,
           "`rr` (rerank) cannot answer /embed (gRPC Embed)")  # fmt: skip
    oa = c.post("/v1/embeddings", json={"input": "hello", "model": "text-embedding-3-small"})
    assert oa.status_code == 404
    body = oa.json()
    assert set(body) == {"message", "code", "type"}
    assert body["code"] == 404 and body["type"] == "Validation"
    assert "`text-embedding-3-small`" in body["message"]
    _error(c.post("/embed", json={"inputs": "a", "model": 3}), 422, "`model` must be")
    _error(c.post("/", json={"inputs": "a", "model": [3]}), 422, "`model` must be")


def test_models_list_and_info(multi: Multi) -> None:
    c = multi.client
    listed = c.get("/v1/models").json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == ["emb", "rr", "cls"]
    for m in listed["data"]:
        assert m["object"] == "model" and isinstance(m["created"], int) and m["owned_by"]
        assert c.get(f"/v1/models/{m['id']}").json() == m  # OpenAI's `models.retrieve`
        # by its --model-id too, as a request may name it (and with the slash encoded)
        assert c.get(f"/v1/models/org/{m['id']}").json() == m
        assert c.get(f"/v1/models/org%2F{m['id']}").json() == m
    missing = c.get("/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["type"] == "Validation" and "`nope` does not exist" in (
        missing.json()["message"])
    # the same routes without /v1 answer the same, errors in OpenAI's shape included
    assert c.get("/models").json() == listed
    bare = c.get("/models/nope")
    assert (bare.status_code, bare.json()) == (404, missing.json())
    info = c.get("/info").json()
    assert info["model_id"] == "org/emb" and info["served_model_name"] == "emb"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert [(m["served_model_name"], m["model_id"], list(m["model_type"]))
            for m in info["models"]] == [("emb", "org/emb", ["embedding"]),
                                         ("rr", "org/rr", ["reranker"]),
                                         ("cls", "org/cls", ["classifier"])]  # fmt: skip


def test_metrics_carry_the_model_label(multi: Multi) -> None:
    c = multi.client
    assert c.post("/embed", json={"inputs": ["a", "b"]}).status_code == 200
    assert c.post("/rerank", json={"query": "q", "texts": ["a", "b", "c"]}).status_code == 200
    assert c.post("/embed", json={"inputs": "a", "model": "rr"}).status_code == 422
    assert c.post("/embed", json={"inputs": [], "model": "emb"}).status_code == 400
    text = c.get("/metrics").text
    assert 'te_request_count{model="emb",method="batch"} 1' in text
    assert 'te_request_count{model="rr",method="batch"} 1' in text
    assert 'te_embed_success{model="emb"} 2' in text
    assert 'te_predict_success{model="rr"} 3' in text
    assert 'te_embed_duration_count{model="emb"} 2.0' in text  # once per input, as TEI
    assert 'te_queue_size{model="cls"} 0.0' in text
    # failed once the model was picked: its label (`[]` is one empty input, which TEI's
    # tokenization refuses); failed routing: none
    assert 'te_request_failure{model="emb",err="tokenization"} 1' in text
    assert 'te_request_failure{err="validation"} 1' in text
    # ... and the request no model took is counted as received, with no label either: TEI
    # counts a request before anything fails it, so failures never outnumber requests
    assert 'te_request_count{method="single"} 1' in text
    for named, status in (("nope", 404), (5, 422)):
        r = c.post("/rerank", json={"query": "q", "texts": ["a"], "model": named})
        assert r.status_code == status
    assert c.post("/tokenize", json={"inputs": "a", "model": "nope"}).status_code == 404
    text = c.get("/metrics").text
    assert 'te_request_count{method="batch"} 2' in text  # /tokenize counts no request, as TEI
    assert 'te_request_failure{err="validation"} 4' in text
    assert c.post("/embed", json={"inputs": "a", "dimensions": 0}).status_code == 422
    assert 'te_request_failure{model="emb",err="validation"} 1' in c.get("/metrics").text
    # /vertex: an instance naming no served model fails before any model, not under the
    # model the instance before it picked
    vertex = {"instances": [{"inputs": "a", "model": "emb"}, {"inputs": "b", "model": "nope"}]}
    assert c.post("/vertex", json=vertex).status_code == 404
    text = c.get("/metrics").text
    assert 'te_request_failure{model="emb",err="validation"} 1' in text
    assert 'te_request_failure{err="validation"} 5' in text


def test_health_needs_every_model(multi: Multi) -> None:
    c = multi.client
    assert c.get("/health").status_code == 200
    rr = multi.fake("rr")
    rr.fail_batches = 2  # the failing batch, then the probe /health runs
    assert c.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 424
    sick = c.get("/health")
    assert sick.status_code == 503 and "rr" in sick.json()["error"]
    assert c.post("/embed", json={"inputs": "a"}).status_code == 200  # the others still serve
    assert c.get("/health").status_code == 200  # the probe passes again: healthy


# -- gRPC -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return generate_client(tmp_path_factory.mktemp("tei-client"))


def test_grpc_picks_by_the_model_metadata(tokenizer_json: Path, client: Any) -> None:
    pb, stubs = client
    r = RunningGrpc(_models(tokenizer_json, grpc=True))
    try:
        predict = stubs.PredictStub(r.channel)
        cls = predict.Predict(pb.PredictRequest(inputs="good dog"), metadata=[("model", "cls")])
        assert len(cls.predictions) == 3
        rr = predict.Predict(pb.PredictRequest(inputs="good dog"), metadata=[("model", "rr")])
        assert [p.label for p in rr.predictions] == ["LABEL_0"]
        # one able model: no name needed
        emb = stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="hello"))
        assert len(emb.embeddings) == 16
        ranked = stubs.RerankStub(r.channel).Rerank(pb.RerankRequest(query="q", texts=["a"]))
        assert len(ranked.ranks) == 1
        info = stubs.InfoStub(r.channel)
        assert info.Info(pb.InfoRequest()).model_id == "org/emb"
        named = info.Info(pb.InfoRequest(), metadata=[("model", "rr")])
        assert named.model_id == "org/rr" and named.model_type == pb.MODEL_TYPE_RERANKER
        failures = [
            (lambda: predict.Predict(pb.PredictRequest(inputs="a")),
             grpc.StatusCode.INVALID_ARGUMENT, "several models"),
            (lambda: predict.Predict(pb.PredictRequest(inputs="a"), metadata=[("model", "x")]),
             grpc.StatusCode.NOT_FOUND, "`x`"),
            (lambda: stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs="a"),
                                                      metadata=[("model", "rr")]),
             grpc.StatusCode.INVALID_ARGUMENT, "cannot answer /embed (gRPC Embed)"),
            (lambda: list(predict.PredictStream(iter([pb.PredictRequest(inputs="a")]))),
             grpc.StatusCode.INVALID_ARGUMENT, "several models"),
            (lambda: stubs.RerankStub(r.channel).RerankStream(
                iter([pb.RerankStreamRequest(query="q", text="a")]),
                metadata=[("model", "emb")]),
             grpc.StatusCode.INVALID_ARGUMENT, "cannot answer /rerank (gRPC Rerank)"),
        ]  # fmt: skip
        for call, code, needle in failures:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == code and needle in err.value.details()  # type: ignore[attr-defined]
        # A bad instruction for a named model is counted under that model.
        families = r.models.families
        before = families.counter_value("te_request_failure", "validation", model="rr")
        with pytest.raises(grpc.RpcError):
            stubs.RerankStub(r.channel).Rerank(pb.RerankRequest(query="q", texts=["a"]),
                                               metadata=[("model", "rr"),
                                                         ("instruction-bin", b"\xff")])  # fmt: skip
        after = families.counter_value("te_request_failure", "validation", model="rr")
        assert after == before + 1
        health = health_pb2_grpc.HealthStub(r.channel)
        services = ("", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank")

        def statuses() -> set[int]:
            return {health.Check(health_pb2.HealthCheckRequest(service=s)).status
                    for s in services}  # fmt: skip

        assert statuses() == {health_pb2.HealthCheckResponse.SERVING}
        rr = r.models.servings[1].model
        assert isinstance(rr, FakeModel)
        rr.fail_batches = 4  # the failing batch, then the probes the next three Checks run
        with pytest.raises(grpc.RpcError) as failed:
            stubs.RerankStub(r.channel).Rerank(pb.RerankRequest(query="q", texts=["a"]))
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]

        def check(service: str) -> int:
            status: int = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            return status

        # one model down: the server ("") and the services that model answers; the embedder's
        # Embed stays SERVING
        assert check("") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert check("tei.v1.Embed") == health_pb2.HealthCheckResponse.SERVING
        assert check("tei.v1.Rerank") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert statuses() == {health_pb2.HealthCheckResponse.SERVING}  # the probe passes
    finally:
        r.stop()


def test_grpc_names_and_failure_labels_as_http_has_them(tokenizer_json: Path, client: Any) -> None:
    """`model-bin` names a model whose name is not ASCII; the first name given wins (as
    HTTP's first `x-model`); a failure after the pick counts under the picked model; a
    stream naming no served model ends NOT_FOUND even with no message."""
    pb, stubs = client
    loaded = [LoadedModel(model=FakeModel(tokenizer_json, task), model_id=f"org/{name}",
                          served_model_name=name)
              for name, task in (("café", Task.EMBED), ("cls", Task.CLASSIFY))]  # fmt: skip
    r = RunningGrpc(build_models(loopback(grpc=True), loaded))
    try:
        info = stubs.InfoStub(r.channel)
        cafe = "café".encode()
        for metadata, want in (([("model-bin", cafe)], "org/café"),
                               ([("model", "cls"), ("model-bin", cafe)], "org/cls"),
                               ([("model-bin", cafe), ("model", "cls")], "org/café"),
                               ([("model-bin", b"cls"), ("model", "nope")], "org/cls"),
                               ):  # fmt: skip
            assert info.Info(pb.InfoRequest(), metadata=metadata).model_id == want, metadata
        families = r.models.families
        tok, predict = stubs.TokenizeStub(r.channel), stubs.PredictStub(r.channel)
        bad_calls: list[tuple[str, Callable[[], object]]] = [
            ("café", lambda: tok.Tokenize(pb.EncodeRequest(inputs=""),
                                          metadata=[("model-bin", cafe)])),
            ("cls", lambda: tok.Decode(pb.DecodeRequest(ids=[]), metadata=[("model", "cls")])),
            ("café", lambda: stubs.EmbedStub(r.channel).Embed(
                pb.EmbedRequest(inputs="a", truncation_direction=7),
                metadata=[("model-bin", cafe)])),
            ("cls", lambda: predict.PredictPair(pb.PredictPairRequest(inputs=["a", "b", "c"]),
                                                metadata=[("model", "cls")])),
        ]  # fmt: skip
        for name, call in bad_calls:
            counts = {label: families.counter_value("te_request_failure", label, model=name)
                      for label in ("validation", "tokenization")}  # fmt: skip
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            after = {label: families.counter_value("te_request_failure", label, model=name)
                     for label in counts}  # fmt: skip
            assert sum(after.values()) == sum(counts.values()) + 1, (name, after)
        for stream in (stubs.EmbedStub(r.channel).EmbedStream, tok.TokenizeStream):
            with pytest.raises(grpc.RpcError) as err:
                list(stream(iter([]), metadata=[("model", "nope")]))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    finally:
        r.stop()


def test_default_prompt_name_where_the_model_has_it_and_utf8_header_names(
    tokenizer_json: Path,
) -> None:
    with_prompt = FakeModel(tokenizer_json, Task.EMBED)
    without = FakeModel(tokenizer_json, Task.EMBED)
    without.manifest = msgspec.structs.replace(without.manifest, prompts=Prompts())
    loaded = [LoadedModel(model=with_prompt, model_id="org/a", served_model_name="café"),
              LoadedModel(model=without, model_id="org/b", served_model_name="b")]  # fmt: skip
    settings = loopback(default_prompt_name="query")
    check_default_prompt_name(settings, loaded)  # one has it: the other serves without it
    m = Multi(build_models(settings, loaded))
    try:
        assert [s.default_prompt_name for s in m.models.servings] == ["query", None]
        for name, first in (("café", "query"), ("b", "hello")):
            r = m.client.post("/tokenize", json={"inputs": "hello", "model": name})
            assert r.status_code == 200, r.text
            assert r.json()[0][1]["text"] == first
            # The header names it too, sent as UTF-8 bytes.
            r = m.client.post("/tokenize", json={"inputs": "hello"},
                              headers={"x-model": name.encode()})  # fmt: skip
            assert r.status_code == 200, r.text
            assert r.json()[0][1]["text"] == first
    finally:
        with_prompt.gate.set()
        without.gate.set()
        m.stop()
    with pytest.raises(SettingsError, match="not a prompt of any model"):
        check_default_prompt_name(settings, [loaded[1], loaded[1]])
    # One model: TEI's start-up refusals.
    with pytest.raises(SettingsError, match="no prompts were found"):
        check_default_prompt_name(settings, [loaded[1]])
    with pytest.raises(SettingsError, match=r"Available prompts: \['query'\]"):
        check_default_prompt_name(loopback(default_prompt_name="passage"), [loaded[0]])


def test_default_prompt_prefixes_the_embedders_only(tokenizer_json: Path) -> None:
    """--default-prompt is an embedder's query prefix: beside it, a reranker's /tokenize
    shows what the reranker scores, without it. Alone, a reranker keeps TEI's behaviour."""
    m = Multi(_models(tokenizer_json, default_prompt="query "))
    try:
        first = {}
        for name in ("emb", "rr", "cls"):
            r = m.client.post("/tokenize", json={"inputs": "hello", "model": name})
            assert r.status_code == 200, r.text
            first[name] = r.json()[0][1]["text"]
        assert first == {"emb": "query", "rr": "hello", "cls": "hello"}
    finally:
        for s in m.models.servings:
            s.model.gate.set()  # type: ignore[attr-defined]
        m.stop()
    alone = build_models(loopback(default_prompt="query "),
                         [LoadedModel(model=FakeModel(tokenizer_json, Task.RERANK),
                                      model_id="org/rr", served_model_name="rr")])  # fmt: skip
    assert [s.default_prompt for s in alone.servings] == ["query "]


def test_each_model_sheds_its_queue_by_its_own_batches_at_shutdown(tokenizer_json: Path) -> None:
    """A slow reranker beside a fast embedder: at a shutdown, the reranker's queue is refused
    early enough for its long batch to finish, the embedder's only when its own short batches
    call for it (one margin for all, the longest batch of any model, refused the embedder's
    queue ~10 s early)."""
    import asyncio

    models = _models(tokenizer_json)
    emb, rr, cls = models.servings
    emb.worker.longest_batch_s, rr.worker.longest_batch_s, cls.worker.longest_batch_s = (
        0.1, 10.0, 0.2)  # fmt: skip

    async def watch() -> list[bool]:
        stop = models.watch_the_deadline(grace=5.0, margin=1.0)
        await asyncio.sleep(0.3)  # a tick or two: nothing else comes due meanwhile
        stop()
        return [s.worker._closing for s in models.servings]

    assert asyncio.run(watch()) == [False, True, False]
