"""Rendering a `TeiError` as TEI's HTTP answer, and the app's one exception handler.

TEI's body is `{"error", "error_type"}`; its OpenAI routes answer `{"message", "code", "type"}`.
Where TEI (axum) would answer plain text (malformed JSON 400, wrong shape 422, no JSON content
type 415, body over the limit 413) we answer the same status with TEI's JSON body. A path no
route has (404) or a method its route lacks (405, with `allow`) is answered as axum's router
answers it: the status alone, no body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.response.base import ASGIResponse

from tei_serve.auth import ApiKey
from tei_serve.errors import (
    BackendError,
    BodyError,
    ErrorType,
    TeiError,
    UnauthorizedError,
)
from tei_serve.observe import log_failure

if TYPE_CHECKING:
    from tei_serve.metrics import MetricFamilies

OPENAI_PATHS = frozenset({"/v1/embeddings", "/embeddings"})
OPENAI_PREFIXES = ("/v1/models", "/models")


def is_openai(path: str) -> bool:
    """The routes that answer errors in OpenAI's shape: its embeddings and models routes."""
    return path in OPENAI_PATHS or path.startswith(OPENAI_PREFIXES)


class ErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    error_type: ErrorType


class OpenAIErrorResponse(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    code: int
    type: ErrorType


_json = msgspec.json.Encoder()


class BareResponse(Response[bytes]):
    """A status with no body and no content-type: what TEI answers with axum's `()` (its health
    routes) and its auth layer's 401; Litestar would label even an empty body
    application/json."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(content=b"", status_code=status_code, headers=headers)

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        response = super().to_asgi_response(*args, **kwargs)
        response.headers.pop("content-type", None)
        return response


def render(
    err: TeiError, *, openai: bool, headers: dict[str, str] | None = None
) -> Response[bytes]:
    body: ErrorResponse | OpenAIErrorResponse
    if openai:
        body = OpenAIErrorResponse(message=err.message, code=err.http_status, type=err.error_type)
    else:
        body = ErrorResponse(error=err.message, error_type=err.error_type)
    return Response(
        content=_json.encode(body), status_code=err.http_status, media_type="application/json",
        headers=headers,
    )  # fmt: skip


def _from_http(exc: HTTPException) -> TeiError:
    status = exc.status_code
    if status == 413:
        return BodyError("Payload too large", status=413)
    if status >= 500:
        return BackendError(exc.detail, status=status)
    return BodyError(exc.detail, status=status)


@dataclass(frozen=True)
class KeyedPaths:
    """The paths `--api-key` guards, and the key."""

    key: ApiKey
    paths: frozenset[str]

    def refuses(self, request: Request[Any, Any, Any]) -> bool:
        sent = request.headers.get("authorization", "")
        return request.url.path in self.paths and not self.key.accepts_header(sent)


_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def axum_allow(allow: str) -> str:
    """A 405's `allow` as TEI's axum writes it: `GET,HEAD`, `POST`. OPTIONS is left out,
    since TEI's CORS layer answers every OPTIONS request before its router."""
    methods = {m.strip().upper() for m in allow.split(",") if m.strip()} - {"OPTIONS"}
    order = {m: i for i, m in enumerate(_METHOD_ORDER)}
    return ",".join(sorted(methods, key=lambda m: (order.get(m, len(order)), m)))


def make_exception_handler(metrics: MetricFamilies, keyed: KeyedPaths | None = None) -> object:
    """The app's single handler for every exception (Litestar's `{Exception: handler}`).
    `keyed`: with --api-key, a method a guarded path lacks is 401 without the key, as TEI's
    auth layer answers before its router (Litestar finds the 405 before any guard runs)."""

    def handler(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        if isinstance(exc, UnauthorizedError):
            return BareResponse(exc.http_status)
        if (keyed is not None and isinstance(exc, HTTPException) and exc.status_code == 405
                and keyed.refuses(request)):  # fmt: skip
            return BareResponse(UnauthorizedError.http_status)
        headers: dict[str, str] | None = None
        unhandled: Exception | None = None
        if isinstance(exc, TeiError):
            err = exc
        elif isinstance(exc, HTTPException):
            headers = dict(exc.headers) if exc.headers else None  # 405's `allow` (RFC 9110)
            if headers and "allow" in headers:
                headers["allow"] = axum_allow(headers["allow"])
            if exc.status_code in (404, 405):  # a path or method no route has is not logged
                return BareResponse(exc.status_code, headers)
            err = _from_http(exc)
        else:
            unhandled = exc
            err = BackendError(f"internal error: {type(exc).__name__}", status=500)
        if err.model is None:
            err.model = request.state.get("model")
        # one line per failure; an unhandled exception's carries its traceback
        log_failure(request.url.path, err, str(err.http_status), cause=unhandled)
        if err.retry_after_s is not None:
            headers = {**(headers or {}), "retry-after": str(err.retry_after_s)}
        if err.failure_label is not None:
            metrics.failure(err.failure_label, model=err.model)
        return render(err, openai=is_openai(request.url.path), headers=headers)

    return handler
