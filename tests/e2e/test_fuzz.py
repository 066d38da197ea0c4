"""Property-based fuzzing of the HTTP API, driven by TEI's own OpenAPI document (Schemathesis).

Every operation of TEI's document (tests/e2e/tei-openapi.json, v1.9.3) is fuzzed against the
real server (the app on uvicorn over loopback, as `tei-serve` runs it) with the real
all-MiniLM-L6-v2 artifact, and against a tiny random-weight reranker: schema examples,
coverage cases (boundaries, each constraint broken, other media types and methods) and random
fuzzing, positive and negative. A case fails on any 5xx, any status the document does not list
for the operation, a content type it does not list, a body that does not match the document's
schema for that status, or an error whose `error_type` TEI never answers with that status.
Operations for other model types (/predict, /rerank on an embedding model, /embed on a
reranker) must answer TEI's documented error, never a 5xx.

Where TEI's own server departs from its document, the test follows the server: `AS_SERVED`
lists each departure and why; nothing else is relaxed. Schemathesis' negative-data check is not
used: TEI accepts more than its document says (lowercase `truncation_direction`, unknown
fields, token ids past int32), and so do we.

Bounded for CI: a fixed seed and `TEI_FUZZ_MAX_EXAMPLES` (100) random cases per operation
besides the examples and coverage cases; about 1,550 requests per server. Locally
`TEI_FUZZ_SEED=<n>` fuzzes with another seed (`pytest -s` prints what was sent).
"""

from __future__ import annotations

import copy
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from openapi_check import SPEC
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import tei_runtime
from support.loopback_server import Running, start

pytestmark = pytest.mark.slow

ERROR = {"$ref": "#/components/schemas/ErrorResponse"}
OPENAI_ERROR = {"$ref": "#/components/schemas/OpenAICompatErrorResponse"}
OPENAI_PATHS = frozenset({"/v1/embeddings"})

# The same seed gives the same cases with the same Schemathesis and Hypothesis (both pinned).
SEED = int(os.environ.get("TEI_FUZZ_SEED", "14"))
MAX_EXAMPLES = int(os.environ.get("TEI_FUZZ_MAX_EXAMPLES", "100"))


def _add_415(spec: dict[str, Any]) -> None:
    """TEI answers 415 to a body sent without a JSON content type (axum's `Json` extractor);
    its document lists no 415. We answer it with TEI's error body."""
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            if "requestBody" not in operation:
                continue
            schema = OPENAI_ERROR if path in OPENAI_PATHS else ERROR
            operation["responses"].setdefault("415", {
                "description": "Body without a JSON content type",
                "content": {"application/json": {"schema": schema}},
            })  # fmt: skip


def _openai_error_type(spec: dict[str, Any]) -> None:
    """TEI's OpenAI-style error serializes `error_type` as `type` (serde rename in
    `router/src/http/types.rs`); its document says `error_type`."""
    schema = spec["components"]["schemas"]["OpenAICompatErrorResponse"]
    schema["properties"]["type"] = schema["properties"].pop("error_type")
    schema["required"] = ["type" if k == "error_type" else k for k in schema["required"]]


AS_SERVED: list[Callable[[dict[str, Any]], None]] = [_add_415, _openai_error_type]


def as_served(spec: dict[str, Any]) -> dict[str, Any]:
    """TEI's document with each departure of TEI's own server (`AS_SERVED`) applied."""
    out = copy.deepcopy(spec)
    for departure in AS_SERVED:
        departure(out)
    return out


CONFIG = SchemathesisConfig.from_dict({
    "seed": SEED,
    "generation": {
        "mode": "all",
        "max-examples": MAX_EXAMPLES,
        # No example database: a run is fixed by its seed alone, and writes nothing.
        "database": "none",
    },
})  # fmt: skip
schema = schemathesis.openapi.from_dict(as_served(SPEC), config=CONFIG)

# TEI's status for each error type (`impl From<&ErrorType> for StatusCode` in its
# router/src/http/server.rs), plus the Validation answers we give where TEI's axum answers in
# plain text: malformed JSON 400, a body over the limit 413, no JSON content type 415.
STATUSES_OF = {
    "Empty": {400}, "Validation": {400, 413, 415, 422}, "Tokenizer": {422}, "Backend": {424},
    "Overloaded": {429}, "Unhealthy": {503},
}  # fmt: skip


def error_type_fits_status(_ctx: CheckContext, response: Response, case: Case[Any]) -> None:
    """An error's type is one TEI answers with that status (the document cannot say so)."""
    status = response.status_code
    if status not in set().union(*STATUSES_OF.values()):
        return
    body = json.loads(response.content)
    openai = case.path in OPENAI_PATHS
    kind = body["type" if openai else "error_type"]
    assert status in STATUSES_OF[kind], f"error type {kind} answered with {status}"
    assert not openai or body["code"] == status, f"code {body['code']} answered with {status}"


CHECKS = [
    not_a_server_error, status_code_conformance, content_type_conformance,
    response_schema_conformance, error_type_fits_status,
]  # fmt: skip


TALLY: Counter[tuple[str, str, int]] = Counter()
"""(server, operation, status) -> cases sent; printed at the end (`pytest -s` shows it)."""


def _print_tally(name: str) -> None:
    rows = sorted((op, status, n) for (server, op, status), n in TALLY.items() if server == name)
    total = sum(n for *_, n in rows)
    print(f"\nfuzzed {name} (seed {SEED}, max examples {MAX_EXAMPLES}): {total} cases")
    for op, status, n in rows:
        print(f"  {op:24} {status}  {n}")


@pytest.fixture(scope="module")
def minilm(minilm_artifact: Path) -> Iterator[Running]:
    r = start(tei_runtime.load(minilm_artifact))
    yield r
    r.stop()
    _print_tally("minilm")


@pytest.fixture(scope="module")
def reranker(tiny_reranker_artifact: Path) -> Iterator[Running]:
    r = start(tei_runtime.load(tiny_reranker_artifact))
    yield r
    r.stop()
    _print_tally("reranker")


def _call_and_check(case: Case[Any], server: Running, name: str) -> None:
    response = case.call(base_url=server.url)
    TALLY[name, f"{case.method.upper()} {case.path}", response.status_code] += 1
    case.validate_response(response, checks=CHECKS)


@schema.parametrize()
def test_fuzz_minilm(case: Case[Any], minilm: Running) -> None:
    _call_and_check(case, minilm, "minilm")


@schema.parametrize()
def test_fuzz_reranker(case: Case[Any], reranker: Running) -> None:
    _call_and_check(case, reranker, "reranker")
