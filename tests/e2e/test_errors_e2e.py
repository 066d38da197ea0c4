"""Every error class, auth, CORS and the body limits over real HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from support.loopback_server import Running
from tei_runtime.manifest import Task


def _err(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == kind
    return str(body["error"])


def test_empty_400(embed_server: Running) -> None:
    c = embed_server.client
    assert "cannot be empty" in _err(c.post("/embed", json={"inputs": []}), 400, "Empty")
    _err(c.post("/embed", json={"inputs": ""}), 400, "Empty")
    _err(c.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}}),
         400, "Empty")
    _err(c.post("/tokenize", json={"inputs": []}), 400, "Empty")
    # TEI's texts: `[]` is one input of no ids; "" is refused by /tokenize as by /embed.
    assert _err(c.post("/embed", json={"inputs": []}), 400, "Empty") == (
        "Input validation error: `inputs` cannot be empty")
    for ids in ([], [[]], [[5], []]):
        assert _err(c.post("/decode", json={"ids": ids}), 400, "Empty") == (
            "Input validation error: `input_ids` cannot be empty")
    for inputs in ("", ["a", ""]):
        assert _err(c.post("/tokenize", json={"inputs": inputs}), 400, "Empty") == (
            "Input validation error: `inputs` cannot be empty")


def test_empty_token_ids_400(embed_server: Running) -> None:
    """An empty list of token ids is an empty input, as "" is (TEI's `EncodingInput::is_empty`);
    it used to be embedded as a vector of zeros."""
    c = embed_server.client
    for path in ("/embed", "/embed_all"):
        for inputs in ([[]], [[], "a"], ["a", [5, 6], []]):
            _err(c.post(path, json={"inputs": inputs}), 400, "Empty")
    r = c.post("/v1/embeddings", json={"input": [[5], []]})
    assert r.status_code == 400 and r.json()["type"] == "Empty", r.text


def test_validation_422(embed_server: Running) -> None:
    c = embed_server.client
    msg = _err(c.post("/embed", json={"inputs": ["a"] * 33}), 422, "Validation")
    assert msg == "batch size 33 > maximum allowed batch size 32"
    assert _err(c.post("/embed", json={"inputs": "a", "dimensions": 0}), 422, "Validation") == (
        "Input validation error: `dimensions` should be positive")
    assert _err(c.post("/embed", json={"inputs": "a", "dimensions": 999}), 422,
                "Validation") == ("Input validation error: `dimensions` should be smaller than "
                                  "the maximum embedding dimension.")
    # TEI's character pre-check with truncation off: max_input_length (32) * 250 characters.
    for inputs in ("a" * 8001, ["b", "a" * 8001], [1] * 8001):
        assert _err(c.post("/embed", json={"inputs": inputs, "truncate": False}), 422,
                    "Validation") == ("Input validation error: `inputs` must have less than "
                                      "8000 characters. Given: 8001")
    assert c.post("/embed", json={"inputs": "a" * 8000, "truncate": False}).status_code == 200
    assert c.post("/embed", json={"inputs": "a" * 8001}).status_code == 200
    _err(c.post("/embed", json={"inputs": "a", "prompt_name": "nope"}), 422, "Validation")
    _err(c.post("/embed", json={"inputs": [99999]}), 422, "Validation")
    _err(c.post("/embed", json={"truncate": True}), 422, "Validation")  # missing field
    _err(c.post("/embed", json={"inputs": 5}), 422, "Validation")  # wrong type
    _err(c.post("/embed", json={"inputs": "a", "normalize": "yes"}), 422, "Validation")
    assert c.get("/metrics").text.count('te_request_failure{err="batch_size"} 1') == 1


def test_openai_error_shape(embed_server: Running) -> None:
    r = embed_server.client.post("/v1/embeddings", json={"input": ["a"] * 40})
    assert r.status_code == 422
    assert r.json() == {"message": "batch size 40 > maximum allowed batch size 32",
                        "code": 422, "type": "Validation"}
    # a body error names OpenAI's field, `input`, not TEI's `inputs`
    for bad in ([["a"]], [1.5], [True, False], 5):
        r = embed_server.client.post("/v1/embeddings", json={"input": bad})
        assert r.status_code == 422 and "`input` must be a string" in r.json()["message"], bad


def test_model_type_424(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED)
    _err(r.client.post("/predict", json={"inputs": "a"}), 424, "Backend")
    _err(r.client.post("/rerank", json={"query": "a", "texts": ["b"]}), 424, "Backend")
    _err(r.client.post("/embed_sparse", json={"inputs": "a"}), 424, "Backend")
    c = serve(Task.CLASSIFY).client
    _err(c.post("/embed", json={"inputs": "a"}), 424, "Backend")
    _err(c.post("/rerank", json={"query": "a", "texts": ["b"]}), 424, "Backend")
    s = serve(Task.SPARSE).client
    assert _err(s.post("/embed_all", json={"inputs": "a"}), 424, "Backend") == (
        "Backend error: `embed_all` is not available for SPLADE models")
    assert _err(s.post("/embed", json={"inputs": "a"}), 424, "Backend") == (
        "Backend error: `normalize` is not available for SPLADE models")
    assert _err(r.client.post("/embed_sparse", json={"inputs": "a"}), 424, "Backend") == (
        "Backend error: Model is not an embedding model with SPLADE pooling")


def test_rerank_empty_texts(serve: Callable[..., Running]) -> None:
    c = serve(Task.RERANK).client
    _err(c.post("/rerank", json={"query": "a", "texts": []}), 400, "Empty")
    # TEI checks for texts before the model type.
    e = serve(Task.EMBED).client
    _err(e.post("/rerank", json={"query": "a", "texts": []}), 400, "Empty")
    # then the model type, then the batch size
    _err(e.post("/rerank", json={"query": "a", "texts": ["b"] * 33}), 424, "Backend")
    assert _err(c.post("/rerank", json={"query": "a", "texts": ["b"] * 33}), 422,
                "Validation") == "batch size 33 > maximum allowed batch size 32"  # fmt: skip


def test_predict_inputs_as_tei_reads_them(serve: Callable[..., Running]) -> None:
    """TEI's visitor: the first element decides between one input and a batch of lists."""
    c = serve(Task.CLASSIFY).client
    for inputs in ([], ["a", ["b"]], [["a"], "b"], ["a", "b", "c"], [["a", "b", "c"]]):
        _err(c.post("/predict", json={"inputs": inputs}), 422, "Validation")
    assert len(c.post("/predict", json={"inputs": [["a"], ["b", "c"]]}).json()) == 2
    assert isinstance(c.post("/predict", json={"inputs": ["a", "b"]}).json()[0], dict)


def test_body_errors_are_json(serve: Callable[..., Running]) -> None:
    c = serve(Task.EMBED, payload_limit=1000).client
    _err(c.post("/embed", content=b"{not json", headers={"content-type": "application/json"}),
         400, "Validation")
    _err(c.post("/embed", content=b'{"inputs": "a"}'), 415, "Validation")
    _err(c.post("/embed", content=b'{"inputs": "a"}', headers={"content-type": "text/plain"}),
         415, "Validation")
    big = {"inputs": "hello " * 400}
    _err(c.post("/embed", json=big), 413, "Validation")
    assert c.post("/embed", json={"inputs": "hello"}).status_code == 200


def test_backend_failure_424_then_recovers(embed_server: Running) -> None:
    c = embed_server.client
    embed_server.model.fail_batches = 2  # the batch and the health probe
    _err(c.post("/embed", json={"inputs": "a"}), 424, "Backend")
    r = c.get("/health")
    assert r.status_code == 503
    assert r.json() == {"error": "unhealthy", "error_type": "Unhealthy"}
    healthy = c.get("/health")  # the probe works again
    # TEI's healthy answer: 200, no body, no content-type (axum's `()`)
    assert healthy.status_code == 200 and healthy.content == b""
    assert "content-type" not in healthy.headers
    assert c.post("/embed", json={"inputs": "a"}).status_code == 200
    assert 'te_request_failure{err="inference"} 1' in c.get("/metrics").text


def test_wrong_api_key_costs_no_tokenization(serve: Callable[..., Running]) -> None:
    r = serve(Task.RERANK, api_key="s3cret")
    calls: list[str] = []
    for name in ("encode", "tokenize"):
        real = getattr(r.model, name)

        def spy(*args: object, _name: str = name, _real: Any = real, **kw: object) -> Any:
            calls.append(_name)
            return _real(*args, **kw)

        setattr(r.model, name, spy)
    wrong = {"authorization": "Bearer s3cres"}
    for path, body in (("/rerank", {"query": "q", "texts": ["a", "b"]}),
                       ("/predict", {"inputs": "a"}), ("/tokenize", {"inputs": "a"}),
                       ("/", {"query": "q", "texts": ["a"]})):
        assert r.client.post(path, json=body, headers=wrong).status_code == 401
    assert calls == []
    ok = {"authorization": "Bearer s3cret"}
    assert r.client.post("/rerank", json={"query": "q", "texts": ["a"]}, headers=ok).is_success
    assert "encode" in calls  # the spy does see what an accepted request costs


def test_api_key(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED, api_key="s3cret")
    c = r.client
    no = c.post("/embed", json={"inputs": "a"})
    assert no.status_code == 401 and no.content == b""
    assert "content-type" not in no.headers  # as TEI's auth layer answers it
    assert c.post("/embed", json={"inputs": "a"},
                  headers={"authorization": "Bearer wrong"}).status_code == 401
    ok = c.post("/embed", json={"inputs": "a"}, headers={"authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert c.get("/info").status_code == 401
    for path in ("/health", "/metrics", "/ping"):
        assert c.get(path).status_code == 200, path
    # TEI's auth layer answers before its router: a method the path lacks is 401 without
    # the key, 405 with it; a path no route has is 404 either way.
    wrong_method = c.get("/embed")
    assert wrong_method.status_code == 401 and wrong_method.content == b""
    keyed = c.get("/embed", headers={"authorization": "Bearer s3cret"})
    assert keyed.status_code == 405 and "POST" in keyed.headers["allow"]
    assert c.get("/nowhere").status_code == 404


@pytest.mark.parametrize("origins", [None, ("http://allowed.example",)])
def test_cors(serve: Callable[..., Running], origins: tuple[str, ...] | None) -> None:
    """TEI's tower-http CorsLayer: every OPTIONS is a preflight answered 200 with no body (the
    method and headers asked for are not checked, the browser checks them), before routes and
    the API key; every answer carries `vary` and the origin header where the origin is
    allowed (any origin: `*` on every answer)."""
    c = serve(Task.EMBED, cors_allow_origin=origins, api_key="k").client
    ask = {"access-control-request-method": "POST"}
    stainless = "Authorization, Content-Type, X-Stainless-Lang, x-stainless-retry-count"
    default = {"content-type", "authorization", "x-model"}
    for path, headers, allowed in (
        ("/embed", {"access-control-request-headers": "content-type"}, {"content-type"}),
        ("/embed", {"access-control-request-headers": "x-other"}, {"x-other"}),
        # openai's JavaScript SDK: its own headers beside the key, all allowed
        ("/v1/embeddings", {"access-control-request-headers": stainless},
         {"authorization", "content-type", "x-stainless-lang", "x-stainless-retry-count"}),
        # a header list that is not one is not echoed back: the default list
        ("/embed", {"access-control-request-headers": "x-a, b@c: d"}, default),
        # a browser app sends its API key and picks a model by header
        ("/nowhere", {}, default),
    ):  # fmt: skip
        pre = c.options(path, headers={"origin": "http://allowed.example", **ask, **headers})
        assert (pre.status_code, pre.content) == (200, b""), path
        assert pre.headers["access-control-allow-methods"] == "GET,POST"
        assert pre.headers["access-control-allow-origin"] == ("*" if origins is None
                                                              else "http://allowed.example")
        assert "origin" in pre.headers["vary"]
        named = {h.strip() for h in pre.headers["access-control-allow-headers"].split(",")}
        assert named == allowed, headers
    key = {"authorization": "Bearer k"}
    r = c.post("/embed", json={"inputs": "a"}, headers={"origin": "http://allowed.example", **key})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] in ("*", "http://allowed.example")
    refused = c.post("/embed", json={"inputs": "a"}, headers={"origin": "http://allowed.example"})
    assert refused.status_code == 401 and "origin" in refused.headers["vary"]
    other = c.post("/embed", json={"inputs": "a"}, headers={"origin": "http://evil.example", **key})
    bare = c.get("/health")  # no Origin header
    if origins:
        assert "access-control-allow-origin" not in other.headers
        assert "access-control-allow-origin" not in bare.headers
        pre = c.options("/embed", headers={"origin": "http://evil.example", **ask})
        assert pre.status_code == 200 and "access-control-allow-origin" not in pre.headers
    else:
        assert other.headers["access-control-allow-origin"] == "*"
        assert bare.headers["access-control-allow-origin"] == "*"


def test_bodies_refused_before_any_handler_are_not_counted(serve: Callable[..., Running]) -> None:
    """TEI's extractors refuse a body that is not JSON, not the route's shape, too large or not
    sent as JSON before a handler runs, so `te_request_failure` does not move; nor does an
    unknown name on GET /v1/models/{name}."""
    c = serve(Task.EMBED, payload_limit=100).client
    refused = [
        c.post("/embed", content=b"{nope", headers={"content-type": "application/json"}),
        c.post("/embed", json={"inputs": 5}),
        c.post("/embed", content=b'{"inputs": "a"}', headers={"content-type": "text/plain"}),
        c.post("/embed", json={"inputs": "a" * 200}),
        c.get("/v1/models/nope"),
    ]
    assert [r.status_code for r in refused] == [400, 422, 415, 413, 404]
    assert "te_request_failure{" not in c.get("/metrics").text
    assert c.post("/embed", json={"inputs": ""}).status_code == 400  # a handler's refusal
    assert 'te_request_failure{err="tokenization"} 1' in c.get("/metrics").text


def test_unknown_route_is_a_bare_404(embed_server: Running) -> None:
    """TEI's axum router answers a path it lacks with the status alone."""
    for r in (embed_server.client.get("/nope"), embed_server.client.post("/v1/nope", json={})):
        assert r.status_code == 404 and r.content == b""
        assert "content-type" not in r.headers


def test_paths_match_exactly_as_axums_router(embed_server: Running) -> None:
    """`/embed/` and `//embed` are not `/embed` on TEI; `/docs/` is its Swagger page."""
    import http.client
    from urllib.parse import quote, urlsplit

    c = embed_server.client
    body = {"inputs": "hello"}
    assert c.post("/embed", json=body).status_code == 200
    host = urlsplit(embed_server.url)
    # http.client sends the path as written (httpx reads `//embed` as a host).
    for path in ("/embed/", "//embed", "/v1//embeddings", "/v1/embeddings/", "/health/",
                 "/%65mbed", "/v1/%65mbeddings", "/v1/models/", "/models/"):  # fmt: skip
        conn = http.client.HTTPConnection(host.hostname or "", host.port)
        try:
            method = "POST" if "embed" in path else "GET"
            conn.request(method, path, body=b'{"inputs": "hello"}',
                         headers={"content-type": "application/json"})  # fmt: skip
            r = conn.getresponse()
            assert (r.status, r.read()) == (404, b""), path
            assert r.headers["access-control-allow-origin"] == "*"  # CORS labels it, as TEI's
        finally:
            conn.close()
    assert c.get("/docs/").status_code == 200
    assert c.get("/docs").status_code == 200
    served = c.get("/v1/models").json()["data"][0]["id"]
    assert c.get("/v1/models/" + quote(served, safe="")).json()["id"] == served
    # the same without /v1, as /embeddings beside /v1/embeddings
    assert c.get("/models").json() == c.get("/v1/models").json()
    assert c.get("/models/" + quote(served, safe="")).json()["id"] == served
    assert c.options("/embed/").status_code == 200  # a preflight, answered before routing
    assert "te_request_failure{" not in c.get("/metrics").text


def test_405_names_the_allowed_methods(embed_server: Running) -> None:
    r = embed_server.client.get("/embed")
    assert r.status_code == 405 and r.content == b""
    assert r.headers["allow"] == "POST"  # RFC 9110: a 405 says what is allowed; axum's form
    r = embed_server.client.post("/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET,HEAD"


def test_first_failing_input_in_request_order_wins(embed_server: Running) -> None:
    """TEI checks a batch input by input (its tokenization included) and answers with the
    first failure; `dimensions` is checked before any input."""
    c = embed_server.client
    long = "word " * 60  # over the tiny model's 32 tokens
    too_long = _err(c.post("/embed", json={"inputs": [long, ""], "truncate": False}), 422,
                    "Validation")  # fmt: skip
    assert too_long.startswith("Input validation error: `inputs` must have less than 32 tokens")
    assert _err(c.post("/embed", json={"inputs": ["", long], "truncate": False}), 400,
                "Empty") == "Input validation error: `inputs` cannot be empty"  # fmt: skip
    unknown = _err(c.post("/embed", json={"inputs": ["a", ""], "prompt_name": "nope"}), 422,
                   "Validation")  # fmt: skip
    assert "nope" in unknown
    for body in ({"inputs": "", "dimensions": 0}, {"inputs": ["a", ""], "dimensions": 0}):
        assert _err(c.post("/embed", json=body), 422, "Validation") == (
            "Input validation error: `dimensions` should be positive")
    r = c.post("/v1/embeddings", json={"input": "", "dimensions": 0})
    assert r.status_code == 422 and "`dimensions` should be positive" in r.json()["message"]
    # TEI's failure labels: what tokenization refuses is "tokenization", the rest
    # "validation" (above: one too long, one empty, one unknown prompt; 3 `dimensions`)
    metrics = c.get("/metrics").text
    assert 'te_request_failure{err="tokenization"} 3' in metrics
    assert 'te_request_failure{err="validation"} 3' in metrics
    # the batch as a whole comes first: empty and oversized batches
    assert _err(c.post("/embed", json={"inputs": ["a"] * 33, "dimensions": 0}), 422,
                "Validation") == "batch size 33 > maximum allowed batch size 32"  # fmt: skip


def test_every_route_answers_its_first_failing_input(serve: Callable[..., Running]) -> None:
    """TEI's order on the routes that check after tokenizing: an oversized `dimensions` is
    each input's own (late) check, /tokenize and /decode check input by input after the
    batch size, and /vertex decodes every instance before running any."""
    c = serve(Task.EMBED).client
    too_wide = ("Input validation error: `dimensions` should be smaller than the maximum "
                "embedding dimension.")  # fmt: skip
    long = "word " * 60  # over the tiny model's 32 tokens
    assert _err(c.post("/embed", json={"inputs": ["a", ""], "dimensions": 999}), 422,
                "Validation") == too_wide  # fmt: skip
    assert _err(c.post("/embed", json={"inputs": ["", "a"], "dimensions": 999}), 400,
                "Empty") == "Input validation error: `inputs` cannot be empty"  # fmt: skip
    assert "less than 32 tokens" in _err(c.post("/embed", json={
        "inputs": [long, "a"], "dimensions": 999, "truncate": False}), 422, "Validation")
    r = c.post("/v1/embeddings", json={"input": ["a", ""], "dimensions": 999})
    assert r.status_code == 422 and r.json()["message"] == too_wide, r.text
    # /tokenize: an unknown prompt (or an input over the character limit) before an empty one
    assert "nope" in _err(c.post("/tokenize", json={"inputs": ["x", ""], "prompt_name": "nope"}),
                          422, "Validation")  # fmt: skip
    assert _err(c.post("/tokenize", json={"inputs": ["", "x"], "prompt_name": "nope"}), 400,
                "Empty") == "Input validation error: `inputs` cannot be empty"  # fmt: skip
    # /decode: the batch size before an empty id list
    assert _err(c.post("/decode", json={"ids": [[]] + [[5]] * 32}), 422, "Validation") == (
        "batch size 33 > maximum allowed batch size 32")
    # /vertex: a malformed instance answers even after one that would fail when run, and
    # nothing runs
    before = c.get("/metrics").text
    bad = c.post("/vertex", json={"instances": [{"inputs": ""}, {"foo": 1}]})
    assert _err(bad, 422, "Validation").endswith("missing required field `inputs`")
    assert _count(c.get("/metrics").text, "te_embed_count") == _count(before, "te_embed_count")


def _count(metrics: str, name: str) -> float:
    """A counter's value in a Prometheus text page (0 when it has no sample yet)."""
    for line in metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_batch_checks_come_before_the_model_type(serve: Callable[..., Running]) -> None:
    c = serve(Task.EMBED).client
    for route, inputs in (("/embed_sparse", ["a"] * 33), ("/predict", [["a"]] * 33)):
        assert _err(c.post(route, json={"inputs": inputs}), 422, "Validation") == (
            "batch size 33 > maximum allowed batch size 32")
    # `[]` is one input of no token ids in TEI: the model check answers first
    _err(c.post("/embed_sparse", json={"inputs": []}), 424, "Backend")
    assert _err(c.post("/embed_all", json={"inputs": []}), 400, "Empty") == (
        "Input validation error: `inputs` cannot be empty")


def test_inputs_are_counted_where_tei_counts_them(serve: Callable[..., Running]) -> None:
    """te_embed_count / te_predict_count count the inputs that pass the request's checks and
    reach tokenization, as TEI's `Infer::embed` / `Infer::predict` do."""
    c = serve(Task.EMBED).client

    def counts() -> tuple[float, float]:
        lines = c.get("/metrics").text.splitlines()
        embed = [float(x.split()[1]) for x in lines if x.startswith("te_embed_count ")]
        predict = [float(x.split()[1]) for x in lines if x.startswith("te_predict_count ")]
        return sum(embed), sum(predict)  # an unset counter is not on the page at all

    refused = [
        ("/embed", {"inputs": ["a"] * 33}),  # batch size
        ("/embed", {"inputs": ["a", "b"], "dimensions": 0}),
        ("/embed_sparse", {"inputs": ["a", "b"]}),  # not a SPLADE model
        ("/predict", {"inputs": "a"}),  # not a classifier
        ("/rerank", {"query": "q", "texts": ["a", "b"]}),
    ]
    for route, body in refused:
        assert c.post(route, json=body).status_code in (422, 424)
    assert counts() == (0, 0)
    assert c.post("/embed", json={"inputs": ["a", "b"]}).status_code == 200
    # both inputs reach tokenization, where the empty one is refused
    assert c.post("/embed", json={"inputs": ["a", ""]}).status_code == 400
    assert counts() == (4, 0)
