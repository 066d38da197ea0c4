"""Typed errors carrying TEI's HTTP status and error_type, and the one place that renders them.

TEI's body is `{"error", "error_type"}`; its OpenAI routes answer `{"message", "code", "type"}`.
Where TEI (axum) would answer plain text (malformed JSON 400, wrong shape 422, no JSON content
type 415, body over the limit 413) we answer the same status with TEI's JSON body.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

if TYPE_CHECKING:
    from tei_serve.metrics import Metrics

log = logging.getLogger("tei_serve")

OPENAI_PATHS = frozenset({"/v1/embeddings", "/embeddings"})


class ErrorType(enum.StrEnum):
    UNHEALTHY = "Unhealthy"
    BACKEND = "Backend"
    OVERLOADED = "Overloaded"
    VALIDATION = "Validation"
    TOKENIZER = "Tokenizer"
    EMPTY = "Empty"


class ErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    error_type: ErrorType


class OpenAIErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    code: int
    type: ErrorType


class TeiError(Exception):
    """Base of every error answered to a client."""

    status: ClassVar[int] = 500
    error_type: ClassVar[ErrorType] = ErrorType.BACKEND
    metric: ClassVar[str | None] = None
    """`te_request_failure{err=...}` label; None when the error is not counted."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_override = status

    @property
    def http_status(self) -> int:
        return self.status_override if self.status_override is not None else self.status


class EmptyError(TeiError):
    status = 400
    error_type = ErrorType.EMPTY
    metric = "validation"


class ValidationError(TeiError):
    status = 422
    error_type = ErrorType.VALIDATION
    metric: ClassVar[str | None] = "validation"


class BatchSizeError(ValidationError):
    metric = "batch_size"


class BodyError(ValidationError):
    """The body is not JSON, not the right shape, too large, or not sent as JSON."""


class RoutingError(BodyError):
    """No such route or method; not counted as a request failure."""

    metric: ClassVar[str | None] = None


class TokenizerError(TeiError):
    status = 422
    error_type = ErrorType.TOKENIZER
    metric = "tokenization"


class OverloadedError(TeiError):
    status = 429
    error_type = ErrorType.OVERLOADED
    metric = "overloaded"

    def __init__(self, message: str = "Model is overloaded") -> None:
        super().__init__(message)


class BackendError(TeiError):
    status = 424
    error_type = ErrorType.BACKEND
    metric = "inference"


class ModelTypeError(BackendError):
    """The route does not fit the loaded model (e.g. /predict on an embedding model)."""

    metric = "model_type"


class UnhealthyError(TeiError):
    status = 503
    error_type = ErrorType.UNHEALTHY
    metric = None

    def __init__(self, message: str = "unhealthy") -> None:
        super().__init__(message)


class UnauthorizedError(Exception):
    """Missing or wrong bearer token: TEI answers 401 with an empty body."""


_json = msgspec.json.Encoder()


def render(err: TeiError, *, openai: bool) -> Response[bytes]:
    body: ErrorResponse | OpenAIErrorResponse
    if openai:
        body = OpenAIErrorResponse(message=err.message, code=err.http_status, type=err.error_type)
    else:
        body = ErrorResponse(error=err.message, error_type=err.error_type)
    return Response(
        content=_json.encode(body), status_code=err.http_status, media_type="application/json"
    )


def _from_http(exc: HTTPException) -> TeiError:
    status = exc.status_code
    if status == 413:
        return BodyError("Payload too large", status=413)
    if status in (404, 405):
        return RoutingError(exc.detail, status=status)
    if status >= 500:
        return BackendError(exc.detail, status=status)
    return BodyError(exc.detail, status=status)


def make_exception_handler(metrics: Metrics) -> object:
    """The app's single handler for every exception (Litestar's `{Exception: handler}`)."""

    def handler(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        if isinstance(exc, UnauthorizedError):
            return Response(content=b"", status_code=401)
        if isinstance(exc, TeiError):
            err = exc
        elif isinstance(exc, HTTPException):
            err = _from_http(exc)
        else:
            log.exception("unhandled error on %s", request.url.path, exc_info=exc)
            err = BackendError(f"internal error: {type(exc).__name__}", status=500)
        if err.metric is not None:
            metrics.failure(err.metric)
        return render(err, openai=request.url.path in OPENAI_PATHS)

    return handler
