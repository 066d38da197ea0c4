"""The server over the real runtime and real exported artifacts (fixtures in tests/conftest.py).

Skipped until the lead's session fixtures (`minilm_artifact`, `tiny_*_artifact`) exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Running, start
from openapi_check import errors, response_schema

import tei_runtime

pytestmark = pytest.mark.slow


def _artifact(request: pytest.FixtureRequest, name: str) -> Path:
    try:
        path = request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"fixture {name} is not provided (tests/conftest.py)")
    assert isinstance(path, Path)
    return path


@pytest.fixture
def real(request: pytest.FixtureRequest) -> Iterator[Running]:
    name: str = request.param
    model = tei_runtime.load(_artifact(request, name))
    r = start(model)
    yield r
    r.stop()


@pytest.mark.parametrize("real", ["minilm_artifact"], indirect=True)
def test_minilm_embed_matches_runtime(real: Running) -> None:
    texts = ["What is Deep Learning?", "Paris is the capital of France. " * 40, "a"]
    r = real.client.post("/embed", json={"inputs": texts})
    assert r.status_code == 200
    served = np.asarray(r.json())
    model = real.model
    direct = np.stack([model.forward_embed(model.encode([t]))[0] for t in texts])
    direct /= np.linalg.norm(direct, axis=1, keepdims=True)
    assert served.shape == (3, 384)
    assert np.allclose(served, direct, atol=1e-4)
    info = real.client.get("/info").json()
    assert info["max_input_length"] == 256
    assert errors(info, response_schema("/info", "get", 200)) == []
    oa = real.client.post("/v1/embeddings", json={"input": texts[0]}).json()
    assert np.allclose(oa["data"][0]["embedding"], served[0], atol=1e-5)
    sim = real.client.post("/similarity", json={
        "inputs": {"source_sentence": "What is Deep Learning?",
                   "sentences": ["What is deep learning?", "I like cheese"]}}).json()
    assert sim[0] > sim[1]


@pytest.mark.parametrize("real", ["tiny_reranker_artifact"], indirect=True)
def test_tiny_reranker(real: Running) -> None:
    ranks = real.client.post("/rerank", json={"query": "q", "texts": ["a", "b c"]})
    assert ranks.status_code == 200
    assert errors(ranks.json(), response_schema("/rerank", "post", 200)) == []


@pytest.mark.parametrize("real", ["tiny_classifier_artifact"], indirect=True)
def test_tiny_classifier(real: Running) -> None:
    out = real.client.post("/predict", json={"inputs": [["a"], ["b", "c"]]})
    assert out.status_code == 200
    assert errors(out.json(), response_schema("/predict", "post", 200)) == []


@pytest.mark.parametrize("real", ["tiny_splade_artifact"], indirect=True)
def test_tiny_splade(real: Running) -> None:
    out = real.client.post("/embed_sparse", json={"inputs": ["hello world", "a"]})
    assert out.status_code == 200
    assert errors(out.json(), response_schema("/embed_sparse", "post", 200)) == []
    assert real.client.post("/embed_all", json={"inputs": "a"}).status_code == 424
