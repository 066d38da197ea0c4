"""Every error a front-end answers, typed: TEI's HTTP status, error_type and gRPC status code.

A `TeiError` says what went wrong once; each front-end renders it its own way (the HTTP
adapter as TEI's `{"error", "error_type"}` body with `http_status`, the gRPC adapter as a
status with `grpc_code` and the message). TEI's gRPC mapping: Validation and Empty ->
INVALID_ARGUMENT, Tokenizer and Backend -> FAILED_PRECONDITION, Overloaded ->
RESOURCE_EXHAUSTED, Unhealthy -> UNAVAILABLE. No transport is imported here.
"""

from __future__ import annotations

import enum
from typing import ClassVar, TypeVar

from tei_runtime import errors as rt_errors


class ErrorType(enum.StrEnum):
    UNHEALTHY = "Unhealthy"
    BACKEND = "Backend"
    OVERLOADED = "Overloaded"
    VALIDATION = "Validation"
    TOKENIZER = "Tokenizer"
    EMPTY = "Empty"


class GrpcCode(enum.IntEnum):
    """gRPC status codes (`grpc.StatusCode`'s values), so this module needs no grpc import."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_GRPC_CODE_OF = {
    ErrorType.VALIDATION: GrpcCode.INVALID_ARGUMENT,
    ErrorType.EMPTY: GrpcCode.INVALID_ARGUMENT,
    ErrorType.TOKENIZER: GrpcCode.FAILED_PRECONDITION,
    ErrorType.BACKEND: GrpcCode.FAILED_PRECONDITION,
    ErrorType.OVERLOADED: GrpcCode.RESOURCE_EXHAUSTED,
    ErrorType.UNHEALTHY: GrpcCode.UNAVAILABLE,
}


class TeiError(Exception):
    """Base of every error answered to a client."""

    status: ClassVar[int] = 500
    error_type: ClassVar[ErrorType] = ErrorType.BACKEND
    metric: ClassVar[str | None] = None
    """`te_request_failure{err=...}` label; None when the error is not counted."""
    retry_after_s: ClassVar[int | None] = None
    """HTTP's `retry-after` on the answer: when a retry may find room (TEI sends none; HTTP
    clients with a retry policy, urllib3's `Retry` for one, wait that long on a 429)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_override = status
        self.model: str | None = None
        """The served model whose operation failed (its `model` metric label); None when it
        failed before a model was picked."""
        self.failure_label: str | None = self.metric
        """Its `te_request_failure{err=...}` label: the class's, or the step that failed
        where TEI names that instead ("tokenization" for any input refused while tokenizing)."""

    @property
    def http_status(self) -> int:
        return self.status_override if self.status_override is not None else self.status

    @property
    def grpc_code(self) -> GrpcCode:
        return _GRPC_CODE_OF[self.error_type]


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
    """The body is not JSON, not the right shape, too large, or not sent as JSON. Not counted
    in `te_request_failure`: TEI's extractors refuse these before its handlers count."""

    metric: ClassVar[str | None] = None


class TokenizerError(TeiError):
    status = 422
    error_type = ErrorType.TOKENIZER
    metric = "tokenization"


class OverloadedError(TeiError):
    status = 429
    error_type = ErrorType.OVERLOADED
    metric = "overloaded"
    retry_after_s = 1  # the header's smallest whole value: permits free as batches finish

    def __init__(self, message: str = "Model is overloaded") -> None:
        super().__init__(message)


class BackendError(TeiError):
    status = 424
    error_type = ErrorType.BACKEND
    metric = "inference"


class ModelTypeError(BackendError):
    """The operation does not fit the loaded model (e.g. predict on an embedding model)."""

    metric = "model_type"


class NaNScoreError(BackendError):
    """The model scored an input NaN (a broken graph or fp16 overflow)."""

    def __init__(self) -> None:
        super().__init__("score is NaN")


class UnhealthyError(TeiError):
    status = 503
    error_type = ErrorType.UNHEALTHY
    metric = None

    def __init__(self, message: str = "unhealthy") -> None:
        super().__init__(message)


class ShuttingDownError(UnhealthyError):
    """Refused because the server is stopping (TEI's Unhealthy, 503): expected in every
    shutdown, so logged at INFO, and the shutdown's one WARNING gives the count."""

    def __init__(self, message: str = "server is shutting down") -> None:
        super().__init__(message)


class ModelChoiceError(ValidationError):
    """With several models: the request names none where several could answer, or names one
    that cannot answer its route (422)."""


class UnknownModelError(ValidationError):
    """With several models: the request names a model this server does not serve (404)."""

    status = 404

    @property
    def grpc_code(self) -> GrpcCode:
        return GrpcCode.NOT_FOUND


class MalformedMessageError(BodyError):
    """A gRPC message that is not valid protobuf: INTERNAL, as tonic answers it."""

    @property
    def grpc_code(self) -> GrpcCode:
        return GrpcCode.INTERNAL


class MessageTooLargeError(MalformedMessageError):
    """A gRPC message over the message limit: OUT_OF_RANGE, in the words of tonic 0.11 (the
    version TEI's Cargo.lock pins; later tonic says "decoded message length")."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"Error, message length too large: found {size} bytes, "
            f"the limit is: {limit} bytes"
        )

    @property
    def grpc_code(self) -> GrpcCode:
        return GrpcCode.OUT_OF_RANGE


class ClientGoneError(TeiError):
    """The client went away before its answer was ready; nothing is left queued for it.
    Logged once per request as the client's doing, not as a Backend failure; counted as TEI
    counts it, by the worker: `te_request_failure{err="dropped"}` once per input it did not
    compute because its client had left (nothing where the client left before its inputs
    were queued, or once they ran)."""

    status = 499
    metric = None

    @property
    def grpc_code(self) -> GrpcCode:
        return GrpcCode.CANCELLED


class UnauthorizedError(Exception):
    """Missing or wrong API key: HTTP answers 401 with an empty body, gRPC UNAUTHENTICATED."""

    http_status: ClassVar[int] = 401
    grpc_code: ClassVar[GrpcCode] = GrpcCode.UNAUTHENTICATED


E = TypeVar("E", bound=TeiError)


def refused_while_tokenizing(err: E) -> E:
    """`err` counted as TEI counts what its tokenization step refuses (an empty or too long
    input, an unknown prompt name): `te_request_failure{err="tokenization"}`."""
    err.failure_label = "tokenization"
    return err


def empty_input() -> EmptyError:
    """An empty input of a batch, refused where TEI's tokenization refuses it."""
    return refused_while_tokenizing(EmptyError("Input validation error: `inputs` cannot be empty"))


def from_runtime(exc: rt_errors.TeiRuntimeError) -> TeiError:
    """The served error for a runtime error, its text unchanged and the runtime error its cause."""
    err: TeiError
    if isinstance(exc, rt_errors.ValidationError):
        err = ValidationError(str(exc))
    elif isinstance(exc, rt_errors.TokenizerError):
        err = TokenizerError(str(exc))
    else:
        err = BackendError(str(exc))
    err.__cause__ = exc
    return err
