"""Every route over real HTTP on loopback, served from real exported artifacts.

The artifacts come from the session fixtures in tests/conftest.py: the real all-MiniLM-L6-v2
and tiny random-weight BERT reranker, classifier and SPLADE checkpoints. Each response body is
checked against TEI's OpenAPI schema and its numbers against `tei_runtime` called in-process.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openapi_check import errors, response_schema

import tei_runtime
from support.loopback_server import Running, start

pytestmark = pytest.mark.slow

TEXTS = ["What is Deep Learning?", "Paris is the capital of France. " * 40, "a", "Grüß Gott 👋"]


def _schema_ok(r: httpx.Response, path: str, method: str = "post") -> Any:
    assert r.status_code == 200, r.text
    body = r.json()
    assert errors(body, response_schema(path, method, 200)) == []
    return body


def _error(r: httpx.Response, status: int, error_type: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error_type"] == error_type
    assert isinstance(r.json()["error"], str)


def _serve(artifact: Path, **settings: Any) -> Iterator[Running]:
    r = start(tei_runtime.load(artifact), **settings)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def minilm(minilm_artifact: Path) -> Iterator[Running]:
    yield from _serve(minilm_artifact, api_key="secret", cors_allow_origin=("https://app.example",))


@pytest.fixture(scope="module")
def reranker(tiny_reranker_artifact: Path) -> Iterator[Running]:
    yield from _serve(tiny_reranker_artifact)


@pytest.fixture(scope="module")
def classifier(tiny_classifier_artifact: Path) -> Iterator[Running]:
    yield from _serve(tiny_classifier_artifact)


@pytest.fixture(scope="module")
def splade(tiny_splade_artifact: Path) -> Iterator[Running]:
    yield from _serve(tiny_splade_artifact, payload_limit=4000)


AUTH = {"Authorization": "Bearer secret"}


@pytest.mark.parametrize(
    "options", [{}, {"normalize": False}, {"dimensions": 64}], ids=["default", "raw", "dims"]
)
def test_minilm_embed_is_bitwise_runtime(minilm: Running, options: dict[str, Any]) -> None:
    """/embed post-processes through tei_runtime.pooling, as Model.embed does: same bits."""
    body = minilm.client.post("/embed", json={"inputs": TEXTS, **options}, headers=AUTH)
    served = np.asarray(_schema_ok(body, "/embed"), dtype=np.float64).astype(np.float32)
    direct = minilm.model.embed(TEXTS, **options)
    assert served.dtype == direct.dtype
    assert np.array_equal(served, direct)


def test_minilm_embed_matches_runtime(minilm: Running) -> None:
    served = np.asarray(_schema_ok(minilm.client.post("/embed", json={"inputs": TEXTS},
                                                      headers=AUTH), "/embed"))
    direct = minilm.model.embed(TEXTS)
    assert served.shape == (4, 384)
    assert np.allclose(served, direct, atol=1e-5)
    raw = np.asarray(minilm.client.post(
        "/embed", json={"inputs": TEXTS[0], "normalize": False}, headers=AUTH).json()[0])
    cut = np.asarray(minilm.client.post(
        "/embed", json={"inputs": TEXTS[0], "dimensions": 64}, headers=AUTH).json()[0])
    assert np.allclose(cut, raw[:64] / np.linalg.norm(raw[:64]), atol=1e-5)
    # `inputs` as token ids embeds the same as the text they came from
    ids = [t["id"] for t in minilm.client.post(
        "/tokenize", json={"inputs": TEXTS[0]}, headers=AUTH).json()[0]]
    by_ids = minilm.client.post("/embed", json={"inputs": ids}, headers=AUTH).json()
    assert np.allclose(by_ids[0], served[0], atol=1e-5)
    # As TEI: ids are decoded and tokenized again ("hell", "##o" is "hello"), and a prompt
    # given for ids goes before their text.
    hello = minilm.client.post("/embed", json={"inputs": "hello"}, headers=AUTH).json()
    split = minilm.client.post("/embed", json={"inputs": [101, 3109, 2080, 102]}, headers=AUTH)
    assert np.allclose(split.json()[0], hello[0], atol=1e-5)
    assert split.headers["x-compute-tokens"] == "3"
    prompted = minilm.model.embed([ids], prompt="query: ")
    assert np.allclose(prompted[0], minilm.model.embed(["query: " + TEXTS[0]])[0], atol=1e-6)


def test_minilm_aliases_and_dispatch(minilm: Running) -> None:
    c = minilm.client
    first = np.asarray(c.post("/embed", json={"inputs": TEXTS[0]}, headers=AUTH).json()[0])
    for path in ("/", "/invocations"):
        body = c.post(path, json={"inputs": TEXTS[0]}, headers=AUTH).json()
        assert np.allclose(body[0], first, atol=1e-6)
    for path in ("/v1/embeddings", "/embeddings"):
        oa = c.post(path, json={"input": [TEXTS[0], "x"], "model": "m"}, headers=AUTH)
        body = _schema_ok(oa, "/v1/embeddings")
        assert np.allclose(body["data"][0]["embedding"], first, atol=1e-6)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    b64 = c.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64",
                                         "dimensions": 32}, headers=AUTH).json()
    vec = struct.unpack("<32f", base64.b64decode(b64["data"][0]["embedding"]))
    assert np.allclose(vec, first[:32] / np.linalg.norm(first[:32]), atol=1e-5)


def test_minilm_similarity_tokenize_decode_embed_all(minilm: Running) -> None:
    c = minilm.client
    sim = _schema_ok(c.post("/similarity", json={"inputs": {
        "source_sentence": "What is Deep Learning?",
        "sentences": ["What is deep learning?", "I like cheese"]}}, headers=AUTH), "/similarity")
    assert sim[0] > 0.9 > sim[1]
    toks = _schema_ok(c.post("/tokenize", json={"inputs": ["Hello world"]}, headers=AUTH),
                      "/tokenize")[0]
    # TEI answers the slice of the input at the offsets, not the normalized token
    assert [t["text"] for t in toks] == ["[CLS]", "Hello", "world", "[SEP]"]
    assert (toks[1]["start"], toks[1]["stop"]) == (0, 5)
    ids = [t["id"] for t in toks]
    text = _schema_ok(c.post("/decode", json={"ids": ids}, headers=AUTH), "/decode")
    assert text == ["hello world"]
    tokens = c.post("/embed_all", json={"inputs": "Hello world"}, headers=AUTH)
    assert np.asarray(_schema_ok(tokens, "/embed_all")).shape == (1, 4, 384)


def test_minilm_info_health_metrics_docs(minilm: Running) -> None:
    c = minilm.client
    info = _schema_ok(c.get("/info", headers=AUTH), "/info", "get")
    assert info["max_input_length"] == 256 and info["model_type"] == {"embedding": {
        "pooling": "mean"}}
    for path in ("/health", "/ping", "/"):
        r = c.get(path)  # no key needed; as TEI: no body, no content-type
        assert r.status_code == 200 and r.content == b"" and "content-type" not in r.headers
    metrics = c.get("/metrics")
    assert metrics.status_code == 200
    for name in ("te_request_count", "te_embed_count", "te_queue_size", "te_batch_next_size"):
        assert name in metrics.text
    assert c.get("/docs", headers=AUTH).headers["content-type"].startswith("text/html")
    spec = c.get("/openapi.json", headers=AUTH).json()
    assert "/embed" in spec["paths"]


def test_minilm_auth_cors_and_errors(minilm: Running) -> None:
    c = minilm.client
    assert c.post("/embed", json={"inputs": "a"}).status_code == 401
    assert c.post("/embed", json={"inputs": "a"},
                  headers={"Authorization": "Bearer wrong"}).status_code == 401
    pre = c.options("/embed", headers={"Origin": "https://app.example",
                                       "Access-Control-Request-Method": "POST"})
    assert pre.headers.get("access-control-allow-origin") == "https://app.example"
    _error(c.post("/embed", json={"inputs": []}, headers=AUTH), 400, "Empty")
    _error(c.post("/embed", json={"inputs": TEXTS[1], "truncate": False}, headers=AUTH),
           422, "Validation")
    _error(c.post("/embed", json={"inputs": ["a"] * 33}, headers=AUTH), 422, "Validation")
    unknown = c.post("/embed", json={"inputs": "a", "prompt_name": "query"}, headers=AUTH)
    _error(unknown, 422, "Validation")
    assert unknown.json()["error"] == (  # TEI's text (it names its flag for the field too)
        "Input validation error: `default-prompt-name` is set to `query` but no prompts were "
        "found in the Sentence Transformers configuration")
    # axum, under TEI, answers a JSON syntax error 400 and a type error 422
    _error(c.post("/embed", content=b"{not json", headers={**AUTH,
           "Content-Type": "application/json"}), 400, "Validation")
    _error(c.post("/embed", json={"inputs": 3}, headers=AUTH), 422, "Validation")
    # TEI's ids are u32: 2^40 fails to deserialize (422) before the tokenizer sees it
    _error(c.post("/decode", json={"ids": [2**40]}, headers=AUTH), 422, "Validation")
    _error(c.post("/predict", json={"inputs": "a"}, headers=AUTH), 424, "Backend")
    _error(c.post("/rerank", json={"query": "q", "texts": ["a"]}, headers=AUTH), 424, "Backend")
    _error(c.post("/embed_sparse", json={"inputs": "a"}, headers=AUTH), 424, "Backend")
    oa = c.post("/v1/embeddings", json={"input": []}, headers=AUTH)
    assert oa.status_code == 400 and set(oa.json()) == {"message", "code", "type"}


def test_reranker_routes(reranker: Running) -> None:
    c = reranker.client
    texts = ["Paris is in France", "bananas are yellow", "the capital of France"]
    ranks = _schema_ok(c.post("/rerank", json={"query": "where is Paris?", "texts": texts,
                                               "return_text": True}), "/rerank")
    scores = reranker.model.predict([("where is Paris?", t) for t in texts])[:, 0]
    assert [r["index"] for r in ranks] == list(np.argsort(-scores))
    assert np.allclose([r["score"] for r in ranks], np.sort(scores)[::-1], atol=1e-5)
    assert [r["text"] for r in ranks] == [texts[r["index"]] for r in ranks]
    raw = c.post("/rerank", json={"query": "where is Paris?", "texts": texts,
                                  "raw_scores": True}).json()
    logits = reranker.model.predict([("where is Paris?", t) for t in texts], raw_scores=True)
    assert np.allclose(sorted(r["score"] for r in raw), np.sort(logits[:, 0]), atol=1e-5)
    via_root = c.post("/", json={"query": "where is Paris?", "texts": texts}).json()
    assert [r["index"] for r in via_root] == [r["index"] for r in ranks]
    info = _schema_ok(c.get("/info"), "/info", "get")
    assert "reranker" in info["model_type"]
    _error(c.post("/embed", json={"inputs": "a"}), 424, "Backend")
    _error(c.post("/rerank", json={"query": "q", "texts": []}), 400, "Empty")


def test_classifier_routes(classifier: Running) -> None:
    c = classifier.client
    out = _schema_ok(c.post("/predict", json={"inputs": "I love it"}), "/predict")
    labels = classifier.model.manifest.labels
    assert sorted(p["label"] for p in out) == sorted(labels.values())
    probs = classifier.model.predict(["I love it"])[0]
    best = int(np.argmax(probs))
    assert out[0]["label"] == labels[best] and abs(out[0]["score"] - probs[best]) < 1e-5
    pair = _schema_ok(c.post("/predict", json={"inputs": [["I love it", "me too"]]}),
                      "/predict")
    pair_probs = classifier.model.predict([("I love it", "me too")])[0]
    assert abs(pair[0][0]["score"] - pair_probs.max()) < 1e-5
    batch = c.post("/predict", json={"inputs": [["a"], ["b", "c"]], "raw_scores": True}).json()
    assert len(batch) == 2
    via_root = c.post("/invocations", json={"inputs": "I love it"}).json()
    assert via_root == out
    _error(c.post("/embed", json={"inputs": "a"}), 424, "Backend")


def test_splade_routes_and_payload_limit(splade: Running) -> None:
    c = splade.client
    body = _schema_ok(c.post("/embed_sparse", json={"inputs": ["hello world", "a"]}),
                      "/embed_sparse")
    expect = splade.model.embed_sparse(["hello world", "a"])
    for got, want in zip(body, expect, strict=True):
        assert [e["index"] for e in got] == want.indices
        assert np.allclose([e["value"] for e in got], want.values, atol=1e-4)
    via_root = c.post("/", json={"inputs": ["hello world", "a"]}).json()
    assert [[e["index"] for e in row] for row in via_root] == [v.indices for v in expect]
    _error(c.post("/embed_all", json={"inputs": "a"}), 424, "Backend")
    big = c.post("/embed_sparse", json={"inputs": "word " * 2000})
    _error(big, 413, "Validation")
    assert c.get("/health").status_code == 200  # still serving
