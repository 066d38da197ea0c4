"""Every route over real HTTP, for every model type."""

from __future__ import annotations

import base64
import logging
import re
import struct
from collections.abc import Callable

import numpy as np
import pytest

from support.loopback_server import Running
from tei_runtime.manifest import Task

TIMING = ("x-compute-type", "x-compute-time", "x-compute-characters", "x-compute-tokens",
          "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def test_embed_single_and_batch(embed_server: Running) -> None:
    c = embed_server.client
    r = c.post("/embed", json={"inputs": "What is Deep Learning?"})
    assert r.status_code == 200
    single = r.json()
    assert len(single) == 1 and len(single[0]) == 16
    assert abs(np.linalg.norm(single[0]) - 1) < 1e-5
    for h in TIMING:
        assert h in r.headers
    assert r.headers["x-compute-characters"] == "22"
    assert r.headers["x-compute-tokens"] == "7"
    batch = c.post("/embed", json={"inputs": ["What is Deep Learning?", "hello"]}).json()
    assert len(batch) == 2
    assert np.allclose(batch[0], single[0], atol=1e-6)


def test_embed_options(embed_server: Running) -> None:
    c = embed_server.client
    raw = c.post("/embed", json={"inputs": "hello world", "normalize": False}).json()[0]
    cut = c.post("/embed", json={"inputs": "hello world", "dimensions": 4}).json()[0]
    assert len(cut) == 4
    expect = np.asarray(raw[:4]) / np.linalg.norm(raw[:4])  # slice, then normalize
    assert np.allclose(cut, expect, atol=1e-6)
    ids = c.post("/tokenize", json={"inputs": "hello world"}).json()[0]
    by_ids = c.post("/embed", json={"inputs": [t["id"] for t in ids], "normalize": False})
    assert np.allclose(by_ids.json()[0], raw, atol=1e-6)
    # unknown fields are accepted, as TEI does
    assert c.post("/embed", json={"inputs": "a", "whatever": 1}).status_code == 200
    # `model` is not TEI's field: one model ignores any value, a string or not
    for model in (3, {"name": "x"}, None, "other"):
        assert c.post("/embed", json={"inputs": "a", "model": model}).status_code == 200
        assert c.post("/tokenize", json={"inputs": "a", "model": model}).status_code == 200
    prompted = c.post("/embed", json={"inputs": "hello", "prompt_name": "query"})
    assert prompted.status_code == 200
    assert prompted.headers["x-compute-tokens"] == "4"


def test_truncation(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_input_length=8)
    long = " ".join(["hello"] * 20)
    assert r.client.post("/embed", json={"inputs": long}).status_code == 200
    err = r.client.post("/embed", json={"inputs": long, "truncate": False})
    assert err.status_code == 422
    assert err.json()["error_type"] == "Validation"
    assert "must have less than 8 tokens" in err.json()["error"]
    left = r.client.post("/embed_all", json={"inputs": long + " world",
                                             "truncation_direction": "Left"}).json()
    assert len(left[0]) == 8


def test_auto_truncate_false_default(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, max_input_length=8, auto_truncate=False)
    long = " ".join(["hello"] * 20)
    assert r.client.post("/embed", json={"inputs": long}).status_code == 422
    assert r.client.post("/embed", json={"inputs": long, "truncate": True}).status_code == 200


def test_embed_all(embed_server: Running) -> None:
    out = embed_server.client.post("/embed_all", json={"inputs": ["hello world", "a"]}).json()
    assert [len(x) for x in out] == [4, 3]
    assert len(out[0][0]) == 16


def test_openai_model_name_mismatch_is_warned_once(
    embed_server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenAI clients send their default `model` with every request: answered (as TEI does),
    said once at WARNING, never echoed whole."""
    c = embed_server.client
    caplog.set_level(logging.DEBUG, logger="tei_serve")
    for name in ("text-embedding-3-small", "text-embedding-3-small", "m" * 100_000):
        assert c.post("/v1/embeddings", json={"input": "cat", "model": name}).status_code == 200
    said = [r for r in caplog.records if "is not the served model" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "DEBUG", "DEBUG"]
    assert "text-embedding-3-small" in said[0].getMessage()
    assert len(said[2].getMessage()) < 300


def test_openai(embed_server: Running) -> None:
    c = embed_server.client
    r = c.post("/v1/embeddings", json={"input": ["hello world", "cat"], "model": "x"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == "fake/embed"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    floats = body["data"][0]["embedding"]
    b64 = c.post("/embeddings", json={"input": "hello world", "encoding_format": "base64"})
    raw = base64.b64decode(b64.json()["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert np.allclose(decoded, floats, atol=1e-6)
    dims = c.post("/v1/embeddings", json={"input": "hello world", "dimensions": 3}).json()
    assert len(dims["data"][0]["embedding"]) == 3
    assert abs(np.linalg.norm(dims["data"][0]["embedding"]) - 1) < 1e-5


def test_similarity(embed_server: Running) -> None:
    r = embed_server.client.post("/similarity", json={
        "inputs": {"source_sentence": "hello world", "sentences": ["hello world", "cat dog"]}})
    assert r.status_code == 200
    scores = r.json()
    assert len(scores) == 2 and abs(scores[0] - 1) < 1e-5 and scores[1] < 0.999


def test_root_answers_similarity_under_tei_task_env(serve: Callable[..., Running]) -> None:
    """TEI's TASK=sentence-similarity: `/` and `/invocations` of an embedder answer like
    /similarity (huggingface_hub's sentence_similarity posts there)."""
    r = serve(Task.EMBED, similarity_root=True)
    body = {"inputs": {"source_sentence": "a cat", "sentences": ["a cat", "the stock market"]}}
    expected = r.client.post("/similarity", json=body).json()
    assert len(expected) == 2
    for path in ("/", "/invocations"):
        assert r.client.post(path, json=body).json() == expected
    plain = serve(Task.EMBED)
    assert plain.client.post("/", json=body).status_code == 422  # an /embed body there


def _floats(value: object) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v)]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    return []


def test_floats_are_written_as_tei_writes_float32(serve: Callable[..., Running]) -> None:
    """TEI (serde_json) writes each float32 with its shortest digits, so clients parse the
    same Python floats from both; the float64 a float32 widens to is another float."""
    texts = ["the cat sat on the mat", "stock markets fell", "a dog"]
    calls = {
        Task.EMBED: [("/embed", {"inputs": texts}), ("/embed_all", {"inputs": texts[:1]}),
                     ("/v1/embeddings", {"input": texts, "model": "x"}),
                     ("/similarity", {"inputs": {"source_sentence": texts[0],
                                                 "sentences": texts[1:]}})],
        Task.SPARSE: [("/embed_sparse", {"inputs": texts})],
        Task.CLASSIFY: [("/predict", {"inputs": texts[0]}),
                        ("/predict", {"inputs": [[t] for t in texts], "raw_scores": True})],
        Task.RERANK: [("/rerank", {"query": "cat", "texts": texts, "raw_scores": True})],
    }  # fmt: skip
    for task, posts in calls.items():
        r = serve(task)
        for path, body in posts:
            got = r.client.post(path, json=body)
            assert got.status_code == 200, (path, got.text)
            values = _floats(got.json())
            assert len(values) > 1, path
            shortest = [float(np.format_float_positional(np.float32(v), unique=True))
                        for v in values]  # fmt: skip
            assert values == shortest, path


def test_tokenize_decode(embed_server: Running) -> None:
    c = embed_server.client
    toks = c.post("/tokenize", json={"inputs": "Hello world"}).json()
    assert [t["special"] for t in toks[0]] == [True, False, False, True]
    assert toks[0][1] == {"id": toks[0][1]["id"], "text": "Hello", "special": False,
                          "start": 0, "stop": 5}
    plain = c.post("/tokenize", json={"inputs": ["a", "b"], "add_special_tokens": False}).json()
    assert [len(x) for x in plain] == [1, 1]
    ids = [t["id"] for t in toks[0]]
    assert c.post("/decode", json={"ids": ids}).json() == ["hello world"]
    both = c.post("/decode", json={"ids": [ids, ids], "skip_special_tokens": False}).json()
    assert len(both) == 2 and "[CLS]" in both[0]


def test_tokenize_keeps_teis_character_limit(embed_server: Running) -> None:
    """/tokenize never truncates, so TEI's limit of max_input_length (32) x 250 characters
    always holds: the first input over it answers, as /embed with truncation off does."""
    c = embed_server.client
    for inputs in ("a" * 8001, ["b", "a" * 8001]):
        err = c.post("/tokenize", json={"inputs": inputs})
        assert err.status_code == 422 and err.json() == {
            "error": "Input validation error: `inputs` must have less than 8000 characters. "
                     "Given: 8001", "error_type": "Validation"}  # fmt: skip
    assert c.post("/tokenize", json={"inputs": "a" * 8000}).status_code == 200


@pytest.mark.parametrize("default", [{"default_prompt": "query "},
                                     {"default_prompt_name": "query"}])  # fmt: skip
def test_tokenize_shows_the_default_prompt(serve: Callable[..., Running],
                                           default: dict[str, str]) -> None:  # fmt: skip
    """/tokenize prompts an input as /embed does: --default-prompt(-name) where the request
    names no prompt; an empty `prompt_name` is a name no model has (422), as in TEI."""
    plain = serve(Task.EMBED).client
    named = plain.post("/tokenize", json={"inputs": "hello", "prompt_name": "query"}).json()
    assert [t["text"] for t in named[0]] == ["[CLS]", "query", "hello", "[SEP]"]
    c = serve(Task.EMBED, **default).client
    assert c.post("/tokenize", json={"inputs": "hello"}).json() == named
    assert c.post("/embed", json={"inputs": "hello"}).json() == plain.post(
        "/embed", json={"inputs": "hello", "prompt_name": "query"}).json()
    for client in (plain, c):
        empty = client.post("/tokenize", json={"inputs": "hello", "prompt_name": ""})
        assert empty.status_code == 422 and empty.json()["error_type"] == "Validation"


def test_predict_puts_the_default_prompt_before_a_single_text(
    serve: Callable[..., Running],
) -> None:
    """As TEI's tokenizer does (and /tokenize shows): `good` is classified as `query good`;
    pairs go without it (TEI refuses a pair under a default prompt)."""
    plain = serve(Task.CLASSIFY).client
    prompted = serve(Task.CLASSIFY, default_prompt="query ").client
    assert prompted.post("/predict", json={"inputs": "good"}).json() == plain.post(
        "/predict", json={"inputs": "query good"}).json()
    assert prompted.post("/predict", json={"inputs": "good"}).json() != plain.post(
        "/predict", json={"inputs": "good"}).json()
    pair = {"inputs": ["good", "bad"]}
    assert prompted.post("/predict", json=pair).json() == plain.post("/predict", json=pair).json()


def test_sparse(serve: Callable[..., Running]) -> None:
    r = serve(Task.SPARSE)
    out = r.client.post("/embed_sparse", json={"inputs": ["hello hello", "cat"]}).json()
    assert len(out) == 2
    assert all(v["value"] > 0 for v in out[0])
    assert sorted(v["index"] for v in out[0]) == [v["index"] for v in out[0]]
    assert r.client.post("/", json={"inputs": "cat"}).json()[0] == out[1]
    dense = r.client.post("/embed", json={"inputs": "cat", "normalize": False})
    assert dense.status_code == 200


def test_predict(serve: Callable[..., Running]) -> None:
    r = serve(Task.CLASSIFY)
    single = r.client.post("/predict", json={"inputs": "good"}).json()
    assert [p["label"] for p in single] != [] and len(single) == 3
    assert abs(sum(p["score"] for p in single) - 1) < 1e-5
    assert single == sorted(single, key=lambda p: -p["score"])
    pair = r.client.post("/predict", json={"inputs": ["good", "bad"]}).json()
    assert isinstance(pair[0], dict)  # a pair is ONE input
    batch = r.client.post("/predict", json={"inputs": [["good"], ["good", "bad"]]}).json()
    assert len(batch) == 2 and isinstance(batch[0], list)
    raw = r.client.post("/predict", json={"inputs": "good", "raw_scores": True}).json()
    assert abs(sum(p["score"] for p in raw) - 1) > 1e-3
    assert r.client.post("/invocations", json={"inputs": "good"}).json() == single


def test_rerank(serve: Callable[..., Running]) -> None:
    r = serve(Task.RERANK)
    body = {"query": "what is deep learning", "texts": ["cat", "deep learning", "dog"]}
    ranks = r.client.post("/rerank", json=body).json()
    assert sorted(x["index"] for x in ranks) == [0, 1, 2]
    assert ranks == sorted(ranks, key=lambda x: -x["score"])
    assert all("text" not in x for x in ranks)
    assert all(0 < x["score"] < 1 for x in ranks)
    with_text = r.client.post("/rerank", json={**body, "return_text": True}).json()
    assert {x["text"] for x in with_text} == set(body["texts"])
    assert all(list(x) == ["index", "text", "score"] for x in with_text)  # TEI's key order
    raw = r.client.post("/rerank", json={**body, "raw_scores": True}).json()
    assert [x["index"] for x in raw] == [x["index"] for x in ranks]
    assert r.client.post("/", json=body).json() == ranks
    assert r.client.post("/predict", json={"inputs": ["q", "d"]}).status_code == 200


def test_tied_scores_come_in_teis_order(serve: Callable[..., Running]) -> None:
    """TEI sorts ascending (stable) and reverses: tied texts come last index first."""
    r = serve(Task.RERANK)
    texts = ["same", "same", "other", "same"]
    ranks = r.client.post("/rerank", json={"query": "q", "texts": texts}).json()
    assert [x["index"] for x in ranks if texts[x["index"]] == "same"] == [3, 1, 0]
    assert ranks == sorted(ranks, key=lambda x: -x["score"])


def test_vertex_answers_each_instance_as_its_own_request(
    serve: Callable[..., Running],
) -> None:
    """TEI's /vertex: a rerank-shaped instance reranks, others take the model's route."""
    e = serve(Task.EMBED).client
    instances = [{"inputs": "a cat"}, {"inputs": ["a dog", "the mat"], "normalize": False}]
    got = e.post("/vertex", json={"instances": instances})
    assert got.status_code == 200, got.text
    assert got.json() == {"predictions": [e.post("/embed", json=i).json() for i in instances]}
    assert e.post("/vertex", json={"instances": []}).json() == {"predictions": []}
    bad = e.post("/vertex", json={"instances": [{"inputs": "a"}, {"nope": 1}]})
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"
    # TEI answers serde's own words for an instance, without axum's body-rejection prefix.
    assert bad.json()["error"] == "Object missing required field `inputs`"
    rerank = {"query": "q", "texts": ["a", "b"]}
    assert e.post("/vertex", json={"instances": [rerank]}).status_code == 424
    assert e.post("/vertex", json={"inputs": "a"}).status_code == 422
    r = serve(Task.RERANK).client
    both = r.post("/vertex", json={"instances": [rerank, {"inputs": ["q", "a"]}]}).json()
    assert both["predictions"] == [r.post("/rerank", json=rerank).json(),
                                   r.post("/predict", json={"inputs": ["q", "a"]}).json()]
    s = serve(Task.SPARSE).client
    sparse = s.post("/vertex", json={"instances": [{"inputs": "a cat"}]}).json()
    assert sparse["predictions"] == [s.post("/embed_sparse", json={"inputs": "a cat"}).json()]


def test_vertex_past_every_permit_starts_no_more_instances_than_can_pass(
    serve: Callable[..., Running],
) -> None:
    """More instances than permits: TEI's answer is a 429 (or an earlier instance's own
    failure), found among the first permits + 1 instances; the rest are never started (110k
    instances used to take ~30 s of the event loop and 2 GB)."""
    r = serve(Task.EMBED, max_concurrent_requests=3)
    c = r.client
    many = c.post("/vertex", json={"instances": [{"inputs": "a"}] * 5000})
    assert many.status_code == 429 and many.json()["error_type"] == "Overloaded"
    started = c.get("/metrics").text
    counted = re.search(r'^te_request_count\{method="single"\} (\d+)$', started, re.MULTILINE)
    assert counted is not None and int(counted.group(1)) <= 4, started
    # An earlier instance's own failure still comes first; within the permits all pass.
    first = c.post("/vertex", json={"instances": [{"inputs": ""}] + [{"inputs": "a"}] * 50})
    assert first.status_code == 400 and first.json()["error_type"] == "Empty"
    ok = c.post("/vertex", json={"instances": [{"inputs": "a"}] * 3})
    assert ok.status_code == 200 and len(ok.json()["predictions"]) == 3


def test_a_model_named_by_an_absolute_path_is_retrieved(serve: Callable[..., Running]) -> None:
    """`--model-id /data/model` names the model by its path; OpenAI's models.retrieve asks
    for `/v1/models//data/model`, whose doubled slash the router folds."""
    c = serve(Task.EMBED, served_model_names=("/data/model",)).client
    (listed,) = c.get("/v1/models").json()["data"]
    assert listed["id"] == "/data/model"
    assert c.get("/v1/models//data/model").json() == listed
    assert c.get("/v1/models/data/model").json() == listed
    assert c.get("/v1/models//data/other").status_code == 404


def test_health_info_metrics_docs(embed_server: Running) -> None:
    c = embed_server.client
    for path in ("/health", "/ping", "/"):
        r = c.get(path)
        assert r.status_code == 200 and r.content == b""
    for path in ("/health", "/ping", "/", "/info", "/metrics", "/v1/models", "/docs",
                 "/docs/swagger-ui.css", "/api-doc/openapi.json", "/openapi.json"):  # fmt: skip
        r = c.head(path)  # axum's `get` answers HEAD; load balancers probe with it
        assert r.status_code == 200 and r.content == b"", path
    assert c.get("/metrics").headers["content-type"] == "text/plain; charset=utf-8"
    (listed,) = c.get("/v1/models").json()["data"]
    assert "/" in listed["id"]  # a hub id: OpenAI's models.retrieve path holds its slash
    assert c.get(f"/v1/models/{listed['id']}").json() == listed
    info = c.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_batch_tokens"] == 16384 and info["max_client_batch_size"] == 32
    c.post("/embed", json={"inputs": ["a", "b"]})
    text = c.get("/metrics").text
    for name in ("te_request_count{method=\"batch\"}", "te_request_success",
                 "te_embed_count", "te_request_duration_bucket", "te_queue_size",
                 "te_batch_next_size_bucket", "te_batch_next_tokens_bucket",
                 "te_request_input_length_bucket", "te_embed_inference_duration_bucket"):
        assert name in text, name
    assert "_total" not in text and "_created" not in text
    busy = re.search(r"^tei_onnx_model_busy_seconds (\S+)$", text, re.MULTILINE)
    assert busy is not None and float(busy.group(1)) > 0, text
    # Once per input, as TEI records them: the counts equal te_embed_success.
    assert "te_embed_success 2" in text and "te_embed_duration_count 2.0" in text
    assert "te_embed_inference_duration_count 2.0" in text
    assert "te_request_duration_count 1.0" in text
    assert "swagger" in c.get("/docs").text.lower()
    spec = c.get("/api-doc/openapi.json").json()
    assert "/embed" in spec["paths"]


@pytest.mark.parametrize("task", [Task.EMBED, Task.CLASSIFY, Task.RERANK, Task.SPARSE])
def test_info_model_type(serve: Callable[..., Running], task: Task) -> None:
    info = serve(task).client.get("/info").json()
    kind = {Task.EMBED: "embedding", Task.SPARSE: "embedding", Task.CLASSIFY: "classifier",
            Task.RERANK: "reranker"}[task]
    assert list(info["model_type"]) == [kind]
