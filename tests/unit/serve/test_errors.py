"""Error bodies and statuses as TEI answers them."""

from __future__ import annotations

import msgspec
import pytest

from tei_runtime import errors as rt
from tei_serve import errors
from tei_serve.http.errors import render


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (errors.EmptyError("`inputs` cannot be empty"), 400, "Empty"),
        (errors.ValidationError("bad"), 422, "Validation"),
        (errors.BatchSizeError("batch size 40 > maximum allowed batch size 32"), 422,
         "Validation"),
        (errors.TokenizerError("tok"), 422, "Tokenizer"),
        (errors.OverloadedError(), 429, "Overloaded"),
        (errors.BackendError("boom"), 424, "Backend"),
        (errors.ModelTypeError("Backend error: Model is not an embedding model"), 424,
         "Backend"),
        (errors.UnhealthyError(), 503, "Unhealthy"),
        (errors.BodyError("too big", status=413), 413, "Validation"),
    ],
)
def test_render(err: errors.TeiError, status: int, kind: str) -> None:
    resp = render(err, openai=False)
    assert resp.status_code == status
    assert isinstance(resp.content, bytes)
    body = msgspec.json.decode(resp.content)
    assert body == {"error": err.message, "error_type": kind}
    oa = render(err, openai=True)
    assert isinstance(oa.content, bytes)
    assert msgspec.json.decode(oa.content) == {"message": err.message, "code": status,
                                               "type": kind}


def test_overloaded_text() -> None:
    assert errors.OverloadedError().message == "Model is overloaded"


def test_runtime_errors_map() -> None:
    too_long = errors.from_runtime(rt.InputTooLongError(600, 512))
    assert isinstance(too_long, errors.ValidationError)
    assert too_long.message == (
        "Input validation error: `inputs` must have less than 512 tokens. Given: 600"
    )
    assert isinstance(errors.from_runtime(rt.TokenizerError("x")), errors.TokenizerError)
    assert isinstance(errors.from_runtime(rt.BackendError("x")), errors.BackendError)
    assert isinstance(errors.from_runtime(rt.ProviderError("x")), errors.BackendError)


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (errors.EmptyError("x"), errors.GrpcCode.INVALID_ARGUMENT),
        (errors.ValidationError("x"), errors.GrpcCode.INVALID_ARGUMENT),
        (errors.BatchSizeError("x"), errors.GrpcCode.INVALID_ARGUMENT),
        (errors.TokenizerError("x"), errors.GrpcCode.FAILED_PRECONDITION),
        (errors.BackendError("x"), errors.GrpcCode.FAILED_PRECONDITION),
        (errors.ModelTypeError("x"), errors.GrpcCode.FAILED_PRECONDITION),
        (errors.OverloadedError(), errors.GrpcCode.RESOURCE_EXHAUSTED),
        (errors.UnhealthyError(), errors.GrpcCode.UNAVAILABLE),
        (errors.ClientGoneError("x"), errors.GrpcCode.CANCELLED),
    ],
)
def test_grpc_codes_follow_tei(err: errors.TeiError, code: errors.GrpcCode) -> None:
    assert err.grpc_code is code
