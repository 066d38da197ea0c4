"""Two real models in one server: the real all-MiniLM-L6-v2 and a tiny BERT reranker.

Over loopback HTTP every route answers from the right model (numbers equal to the runtime's
own), a name in the body or the `x-model` header picks one, no choice among several is 422
naming them, an unknown name on /v1/embeddings is OpenAI's 404; /v1/models, /info, per-model
metrics and /health. gRPC picks by the `model` metadata key. As processes: one `tei-serve`
with both uses less memory than two, and a model that cannot load fails the whole start with
one line naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from grpc_support import RunningGrpc, generate_client

import tei_runtime
from support.loopback_server import loopback, run_uvicorn
from support.multi_model_memory import Comparison, compare
from tei_runtime.model import Model
from tei_serve.models import LoadedModel, Models, build_models

pytestmark = pytest.mark.slow

TEI_SERVE = Path(sys.executable).with_name("tei-serve")
EMB, RR = "all-MiniLM-L6-v2", "reranker"
TEXTS = ["What is Deep Learning?", "Paris is the capital of France.", "a"]


class Loaded:
    def __init__(self, minilm: Path, reranker: Path) -> None:
        # one intra-op thread each, as the CLI splits 2 cores between two models
        self.minilm: Model = tei_runtime.load(minilm, intra_op_threads=1)
        self.reranker: Model = tei_runtime.load(reranker, intra_op_threads=1)

    def models(self, **settings: Any) -> Models:
        return build_models(loopback(**settings), [
            LoadedModel(model=self.minilm, model_id=str(self.minilm.manifest.source.model_id),
                        served_model_name=EMB),
            LoadedModel(model=self.reranker, model_id="tiny/reranker", served_model_name=RR),
        ])  # fmt: skip


@pytest.fixture(scope="module")
def loaded(minilm_artifact: Path, tiny_reranker_artifact: Path) -> Loaded:
    return Loaded(minilm_artifact, tiny_reranker_artifact)


class Server:
    def __init__(self, models: Models) -> None:
        self.models = models
        self.uv: uvicorn.Server
        self.thread: threading.Thread
        self.uv, self.thread, url = run_uvicorn(models)
        self.client = httpx.Client(base_url=url, timeout=60)

    def stop(self) -> None:
        self.client.close()
        self.uv.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(loaded: Loaded) -> Iterator[Server]:
    s = Server(loaded.models())
    yield s
    s.stop()


def test_every_route_answers_from_the_right_model(server: Server, loaded: Loaded) -> None:
    c = server.client
    emb = np.asarray(c.post("/embed", json={"inputs": TEXTS}).json())
    assert np.allclose(emb, loaded.minilm.embed(TEXTS), atol=1e-5)
    by_name = np.asarray(c.post("/embed", json={"inputs": TEXTS, "model": EMB}).json())
    assert np.allclose(by_name, emb, atol=1e-6)
    oa = c.post("/v1/embeddings", json={"input": TEXTS[0], "model": EMB}).json()
    assert oa["model"] == EMB and np.allclose(oa["data"][0]["embedding"], emb[0], atol=1e-5)
    sim = c.post("/similarity", json={"inputs": {"source_sentence": TEXTS[0],
                                                 "sentences": TEXTS[:2]}}).json()
    assert sim[0] == pytest.approx(1.0, abs=1e-5)
    tokens = np.asarray(c.post("/embed_all", json={"inputs": "Hello world"}).json())
    assert tokens.shape == (1, 4, 384)
    root = np.asarray(c.post("/", json={"inputs": TEXTS[0]}, headers={"x-model": EMB}).json())
    assert np.allclose(root, emb[:1], atol=1e-5)

    pairs = [("what is paris", t) for t in TEXTS]
    direct = loaded.reranker.predict(pairs, raw_scores=True)[:, 0]
    ranks = c.post("/rerank", json={"query": "what is paris", "texts": TEXTS,
                                    "raw_scores": True}).json()  # fmt: skip
    served = {r["index"]: r["score"] for r in ranks}
    assert np.allclose([served[i] for i in range(len(TEXTS))], direct, atol=1e-5)
    predicted = c.post("/predict", json={"inputs": ["what is paris", TEXTS[1]],
                                         "raw_scores": True}).json()  # fmt: skip
    assert predicted[0]["score"] == pytest.approx(float(direct[1]), abs=1e-5)
    by_header = c.post("/", json={"query": "q", "texts": ["a", "b"]}, headers={"x-model": RR})
    assert by_header.status_code == 200 and len(by_header.json()) == 2

    # the tokenizers differ only by model: each answers its own
    emb_ids = c.post("/tokenize", json={"inputs": "Hello world", "model": EMB}).json()
    rr_ids = c.post("/tokenize", json={"inputs": "Hello world"}, headers={"x-model": RR}).json()
    assert [t["text"] for t in emb_ids[0]] == ["[CLS]", "Hello", "world", "[SEP]"]
    assert [t["id"] for t in rr_ids[0]] == [
        t.id for t in loaded.reranker.tokenize(["Hello world"])[0]]
    text = c.post("/decode", json={"ids": [t["id"] for t in emb_ids[0]], "model": EMB}).json()
    assert text == ["hello world"]


def test_choices_and_their_errors(server: Server) -> None:
    c = server.client
    none = c.post("/tokenize", json={"inputs": "hello"})
    assert none.status_code == 422 and none.json()["error_type"] == "Validation"
    assert f"`{EMB}`" in none.json()["error"] and f"`{RR}`" in none.json()["error"]
    wrong = c.post("/rerank", json={"query": "q", "texts": ["a"], "model": EMB})
    assert wrong.status_code == 422
    assert "cannot answer /rerank (gRPC Rerank)" in wrong.json()["error"]
    unknown = c.post("/v1/embeddings", json={"input": "hello", "model": "text-embedding-3"})
    assert unknown.status_code == 404
    assert unknown.json()["code"] == 404 and "`text-embedding-3`" in unknown.json()["message"]
    tei_unknown = c.post("/embed", json={"inputs": "a"}, headers={"x-model": "nope"})
    assert tei_unknown.status_code == 404 and tei_unknown.json()["error_type"] == "Validation"


def test_models_info_metrics_health(server: Server) -> None:
    c = server.client
    listed = c.get("/v1/models").json()
    assert listed["object"] == "list"
    assert [(m["id"], m["object"]) for m in listed["data"]] == [(EMB, "model"), (RR, "model")]
    info = c.get("/info").json()
    assert info["served_model_name"] == EMB and info["max_input_length"] == 256
    assert [m["served_model_name"] for m in info["models"]] == [EMB, RR]
    assert list(info["models"][1]["model_type"]) == ["reranker"]
    assert c.post("/embed", json={"inputs": "a"}).status_code == 200
    assert c.post("/rerank", json={"query": "q", "texts": ["a", "b"]}).status_code == 200
    metrics = c.get("/metrics").text
    assert f'te_embed_success{{model="{EMB}"}}' in metrics
    assert f'te_predict_success{{model="{RR}"}}' in metrics
    assert f'te_batch_next_size_count{{model="{RR}"}}' in metrics
    assert f'te_request_count{{model="{RR}",method="batch"}}' in metrics
    assert c.get("/health").status_code == 200


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return generate_client(tmp_path_factory.mktemp("tei-client"))


def test_grpc_picks_by_metadata(loaded: Loaded, client: Any) -> None:
    import grpc

    pb, stubs = client
    r = RunningGrpc(loaded.models(grpc=True))
    try:
        tokenize = stubs.TokenizeStub(r.channel)
        emb = tokenize.Tokenize(pb.EncodeRequest(inputs="Hello world", add_special_tokens=True),
                                metadata=[("model", EMB)])  # fmt: skip
        assert [t.text for t in emb.tokens] == ["[CLS]", "Hello", "world", "[SEP]"]
        vec = stubs.EmbedStub(r.channel).Embed(pb.EmbedRequest(inputs=TEXTS[0], truncate=True))
        assert np.allclose(vec.embeddings, loaded.minilm.embed(TEXTS[:1])[0], atol=1e-5)
        ranked = stubs.RerankStub(r.channel).Rerank(
            pb.RerankRequest(query="q", texts=["a", "b"]), metadata=[("model", RR)])
        assert len(ranked.ranks) == 2
        with pytest.raises(grpc.RpcError) as err:
            tokenize.Tokenize(pb.EncodeRequest(inputs="a"), metadata=[("model", "nope")])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as err:
            tokenize.Tokenize(pb.EncodeRequest(inputs="a"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    finally:
        r.stop()


def test_one_process_uses_less_memory_than_two(
    minilm_artifact: Path, tiny_reranker_artifact: Path
) -> None:
    result: Comparison = compare(minilm_artifact, tiny_reranker_artifact)
    print("\n" + "\n".join(result.lines([EMB, RR])))
    two_servers = result.first.rss_mb + result.second.rss_mb
    assert result.together.rss_mb < two_servers
    assert result.together.pss_mb < result.first.pss_mb + result.second.pss_mb


def test_a_model_that_cannot_load_fails_the_start_naming_it(
    minilm_artifact: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{}")
    proc = subprocess.run(
        [str(TEI_SERVE), "--model-id", str(minilm_artifact), "--model-id", str(broken),
         "--port", "0", "--prometheus-port", "0", "--json-output"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    errors = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    errors = [e for e in errors if e["level"] == "ERROR"]
    assert len(errors) == 1
    assert errors[0]["message"].startswith(f"model {broken} could not load: ")
