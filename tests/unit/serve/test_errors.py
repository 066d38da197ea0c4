"""Error bodies and statuses as TEI answers them."""

from __future__ import annotations

import msgspec
import pytest

from tei_runtime import errors as rt
from tei_serve import errors
from tei_serve.infer import map_runtime_error


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
    resp = errors.render(err, openai=False)
    assert resp.status_code == status
    assert isinstance(resp.content, bytes)
    body = msgspec.json.decode(resp.content)
    assert body == {"error": err.message, "error_type": kind}
    oa = errors.render(err, openai=True)
    assert isinstance(oa.content, bytes)
    assert msgspec.json.decode(oa.content) == {"message": err.message, "code": status,
                                               "type": kind}


def test_overloaded_text() -> None:
    assert errors.OverloadedError().message == "Model is overloaded"


def test_runtime_errors_map() -> None:
    too_long = map_runtime_error(rt.InputTooLongError(600, 512))
    assert isinstance(too_long, errors.ValidationError)
    assert too_long.message == (
        "Input validation error: `inputs` must have less than 512 tokens. Given: 600"
    )
    assert isinstance(map_runtime_error(rt.TokenizerError("x")), errors.TokenizerError)
    assert isinstance(map_runtime_error(rt.BackendError("x")), errors.BackendError)
    assert map_runtime_error(KeyError("x")) is None
