"""Hostile and broken bodies over real HTTP, on every JSON route: TEI's 400/422/415, never 5xx."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from support.loopback_server import Running
from tei_runtime.manifest import Task

ROUTES = ["/embed", "/embed_all", "/embed_sparse", "/predict", "/rerank", "/similarity",
          "/tokenize", "/decode", "/v1/embeddings", "/embeddings", "/invocations"]
BODIES: dict[str, tuple[bytes | None, int | set[int]]] = {
    # 400 where `inputs` is read as any JSON; 422 where the route wants another shape there
    # (a string, an object) and stops at the first `[`, as serde does.
    "nested 100,000 deep": (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {400, 422}),
    "NaN literal": (b'{"inputs": NaN}', 400),
    "invalid UTF-8": (None, 400),
    "stops halfway": (b'{"truncate": true, "inputs": "a', {400, 422}),
    "stops before any field": (b'{"truncate": tr', 400),
    "duplicate keys": (None, 422),
    "huge number": (None, 422),
    "past float64": (None, 400),  # serde_json's NumberOutOfRange, a syntax error
}
DUPLICATE = {
    "/rerank": b'{"query": "q", "texts": ["a"], "texts": ["b"]}',
    "/similarity": b'{"inputs": {"source_sentence": "a", "sentences": ["b"]}, '
                   b'"inputs": {"source_sentence": "a", "sentences": ["b"]}}',
    "/decode": b'{"ids": [1], "ids": [2]}',
    "/v1/embeddings": b'{"input": "a", "input": "b"}',
    "/embeddings": b'{"input": "a", "input": "b"}',
}
# Invalid UTF-8 inside a string the route reads (an ignored field is skipped unread).
BAD_UTF8 = {
    "/rerank": b'{"query": "\xff\xfe", "texts": ["a"]}',
    "/similarity": b'{"inputs": {"source_sentence": "\xff\xfe", "sentences": ["b"]}}',
    "/decode": b'{"ids": "\xff\xfe"}',
    "/v1/embeddings": b'{"input": "\xff\xfe"}',
    "/embeddings": b'{"input": "\xff\xfe"}',
}
HUGE = {
    "/rerank": b'{"query": "q", "texts": ["a"], "raw_scores": 123456789012345678901234567890}',
    "/similarity": b'{"inputs": {"source_sentence": "a", "sentences": [12345678901234567890]}}',
    "/decode": b'{"ids": [123456789012345678901234567890]}',
    "/tokenize": b'{"inputs": "a", "add_special_tokens": 123456789012345678901234567890}',
    "/v1/embeddings": b'{"input": "a", "dimensions": 123456789012345678901234567890}',
    "/embeddings": b'{"input": [4294967296]}',
}
OVERFLOW = {
    "/rerank": b'{"query": "q", "texts": ["a"], "raw_scores": 1e999}',
    "/similarity": b'{"inputs": {"source_sentence": "a", "sentences": [1e999]}}',
    "/decode": b'{"ids": [1e999]}',
    "/tokenize": b'{"inputs": "a", "add_special_tokens": 1e999}',
    "/v1/embeddings": b'{"input": "a", "dimensions": 1e999}',
    "/embeddings": b'{"input": [1e999]}',
}




def _body(route: str, case: str, task: Task) -> bytes:
    body, _ = BODIES[case]
    if body is not None:
        return body
    if route == "/invocations" and task is Task.RERANK:
        route = "/rerank"
    table, default = {
        "duplicate keys": (DUPLICATE, b'{"inputs": "a", "inputs": "b"}'),
        "invalid UTF-8": (BAD_UTF8, b'{"inputs": "\xff\xfe"}'),
        "huge number": (HUGE, b'{"inputs": [4294967296]}'),
        "past float64": (OVERFLOW, b'{"inputs": [1e999]}'),
    }[case]
    return table.get(route, default)


@pytest.mark.parametrize("task", [Task.EMBED, Task.RERANK])
def test_every_route_answers_malformed_json_with_tei_errors(
    serve: Callable[..., Running], task: Task
) -> None:
    r = serve(task)
    for route in ROUTES:
        for case, (_, status) in BODIES.items():
            got = r.client.post(route, content=_body(route, case, task),
                                headers={"content-type": "application/json"})
            allowed = status if isinstance(status, set) else {status}
            assert got.status_code in allowed, (route, case, got.status_code, got.text[:300])
            body = got.json()
            kind = body.get("error_type", body.get("type"))
            assert kind == "Validation", (route, case, body)
    metrics = r.client.get("/metrics").text
    assert 'err="inference"' not in metrics


def test_a_non_json_content_type_is_415(embed_server: Running) -> None:
    for route in ROUTES:
        got = embed_server.client.post(route, content=b'{"inputs": "a"}',
                                       headers={"content-type": "text/plain"})
        assert got.status_code == 415, route
        assert got.json().get("error_type", got.json().get("type")) == "Validation"


def test_compressed_bodies_are_read_and_bombs_stop_at_the_limit(
    serve: Callable[..., Running],
) -> None:
    import gzip
    import json
    import random
    import string
    import zlib

    from tei_serve.http.body import INFLATE_ON_LOOP_BYTES

    c = serve(Task.EMBED, payload_limit=10_000).client
    body = b'{"inputs": ["hello world", "a cat"]}'
    plain = c.post("/embed", content=body, headers={"content-type": "application/json"})
    for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        got = c.post("/embed", content=data, headers={"content-type": "application/json",
                                                      "content-encoding": encoding})
        assert got.status_code == 200 and got.json() == plain.json(), encoding
    # a body past INFLATE_ON_LOOP_BYTES compressed is inflated on a worker thread
    rng = random.Random(0)
    texts = ["".join(rng.choice(string.ascii_lowercase + " ") for _ in range(5000))
             for _ in range(32)]  # fmt: skip
    large = json.dumps({"inputs": texts, "truncate": True}).encode()
    assert len(gzip.compress(large)) > INFLATE_ON_LOOP_BYTES
    big = serve(Task.EMBED).client
    plain = big.post("/embed", content=large, headers={"content-type": "application/json"})
    got = big.post("/embed", content=gzip.compress(large),
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert got.status_code == 200 and got.json() == plain.json()
    bomb = gzip.compress(b'{"inputs": "' + b"a" * 1_000_000 + b'"}')
    assert len(bomb) < 10_000
    got = c.post("/embed", content=bomb, headers={"content-type": "application/json",
                                                  "content-encoding": "gzip"})
    assert got.status_code == 413 and got.json()["error_type"] == "Validation"
    got = c.post("/v1/embeddings", content=b"{}", headers={"content-type": "application/json",
                                                           "content-encoding": "br"})
    assert got.status_code == 415 and "Content-Encoding" in got.json()["message"]
