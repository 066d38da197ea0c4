"""Our response bodies against the schemas of TEI's own OpenAPI document (v1.9.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openapi_check import SPEC, errors, response_schema

from support.loopback_server import Running
from tei_runtime.manifest import Task

CASES: list[tuple[Task, str, str, dict[str, Any] | None, int]] = [
    (Task.EMBED, "/embed", "post", {"inputs": ["hello world", "cat"]}, 200),
    (Task.EMBED, "/embed", "post", {"inputs": []}, 400),
    (Task.EMBED, "/embed", "post", {"inputs": "a", "dimensions": 0}, 422),
    (Task.EMBED, "/embed_all", "post", {"inputs": "hello"}, 200),
    (Task.EMBED, "/similarity", "post",
     {"inputs": {"source_sentence": "a", "sentences": ["a", "b"]}}, 200),
    (Task.EMBED, "/tokenize", "post", {"inputs": "hello world"}, 200),
    (Task.EMBED, "/decode", "post", {"ids": [2, 5, 3]}, 200),
    (Task.EMBED, "/v1/embeddings", "post", {"input": "hello"}, 200),
    (Task.EMBED, "/v1/embeddings", "post", {"input": "hello", "encoding_format": "base64"},
     200),
    (Task.EMBED, "/info", "get", None, 200),
    (Task.EMBED, "/predict", "post", {"inputs": "a"}, 424),
    (Task.SPARSE, "/embed_sparse", "post", {"inputs": "hello hello"}, 200),
    (Task.CLASSIFY, "/predict", "post", {"inputs": "good"}, 200),
    (Task.CLASSIFY, "/predict", "post", {"inputs": [["good"], ["bad", "good"]]}, 200),
    (Task.CLASSIFY, "/info", "get", None, 200),
    (Task.RERANK, "/rerank", "post", {"query": "q", "texts": ["a", "b"], "return_text": True},
     200),
    (Task.RERANK, "/info", "get", None, 200),
]


@pytest.mark.parametrize(("task", "path", "method", "body", "status"), CASES)
def test_response_matches_tei_schema(
    serve: Callable[..., Running], task: Task, path: str, method: str,
    body: dict[str, Any] | None, status: int,
) -> None:
    c = serve(task).client
    r = c.post(path, json=body) if method == "post" else c.get(path)
    assert r.status_code == status, r.text
    schema = response_schema(path, method, 424 if status == 424 else status)
    assert errors(r.json(), schema) == []


def test_spec_copy_is_tei_193() -> None:
    assert SPEC["info"]["version"] == "1.9.3"


def test_the_served_document_has_the_several_model_api(serve: Callable[..., Running]) -> None:
    """What tei-onnx adds to TEI's document: the `model` field of the request bodies, the
    `models` list of /info and OpenAI's /v1/models routes, whose answer fits it."""
    r = serve(Task.EMBED)
    served = r.client.get("/api-doc/openapi.json").json()
    schemas = served["components"]["schemas"]
    for body in ("EmbedRequest", "EmbedAllRequest", "EmbedSparseRequest", "PredictRequest",
                 "RerankRequest", "SimilarityRequest", "TokenizeRequest", "DecodeRequest"):
        assert "model" in schemas[body]["properties"], body
    assert "models" in schemas["Info"]["properties"]
    assert {"/v1/models", "/v1/models/{model_id}"} <= set(served["paths"])
    listed = r.client.get("/v1/models").json()
    assert set(listed) == set(schemas["OpenAIModelList"]["required"])
    assert set(listed["data"][0]) == set(schemas["OpenAIModel"]["required"])
