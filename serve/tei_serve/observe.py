"""One answered request's bookkeeping, whichever front-end served it: metrics, span, log line.

`observed` wraps the awaiting of one serving operation: it counts the request in te_* metrics
before it runs (TEI counts before validating), then on success records its `Metadata` in the
duration histograms, writes its span (--otlp-endpoint, with the served `model` name) and its
log line; on failure it writes the span with the error, marks the error with the model and
re-raises (the front-end's error handler counts the failure under that model).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

from tei_serve.errors import ClientGoneError, ErrorType, ShuttingDownError, TeiError
from tei_serve.metrics import Family, Method
from tei_serve.tracing import rust_duration

if TYPE_CHECKING:
    from tei_serve.serving import Metadata, Serving

log = logging.getLogger("tei_serve.access")

_SERVER_SIDE = (ErrorType.BACKEND, ErrorType.UNHEALTHY)


class RequestSpan(msgspec.Struct, frozen=True, kw_only=True):
    """An answered request on its log line (`extra={"span": ...}`): what TEI's JSON logs carry
    in `span` (its handler span's name and recorded fields), so a pipeline that reads
    `span.total_time` or `span.compute_tokens` there reads them here too. Only the JSON
    formatter renders it (`fields`): a text log line costs no formatting of it."""

    name: str
    model: str
    meta: Metadata

    def fields(self) -> dict[str, object]:
        m = self.meta
        return {
            "name": self.name, "model": self.model, "compute_chars": m.compute_chars,
            "compute_tokens": m.compute_tokens, "total_time": rust_duration(m.total_time_ns),
            "tokenization_time": rust_duration(m.tokenization_time_ns),
            "queue_time": rust_duration(m.queue_time_ns),
            "inference_time": rust_duration(m.inference_time_ns),
        }  # fmt: skip


def log_failure(
    route: str, err: TeiError, status: str, *, cause: BaseException | None = None
) -> None:
    """The log line of a request answered with an error, whichever front-end answered it (TEI
    logs each at ERROR): ERROR where the server failed (Backend, Unhealthy), WARNING where
    the request was refused (Validation, Empty, Tokenizer, Overloaded), INFO for a client
    that left before its answer. `status` is the front-end's (HTTP's 422, gRPC's
    INVALID_ARGUMENT); `cause`, an exception no error class describes, adds its traceback."""
    if isinstance(err, ClientGoneError):
        if log.isEnabledFor(logging.INFO):
            log.info("%s model=%s: the client left before its answer (%s)", route,
                     err.model or "-", err.message)  # fmt: skip
        return
    if isinstance(err, ShuttingDownError):  # every shutdown's; its one WARNING has the count
        level = logging.INFO
    else:
        level = logging.ERROR if err.error_type in _SERVER_SIDE else logging.WARNING
    if log.isEnabledFor(level):
        log.log(level, "%s model=%s failed: %s %s: %s", route, err.model or "-",
                err.error_type.value, status, err.message, exc_info=cause)  # fmt: skip


class Measured(Protocol):
    """A serving result that carries what it cost."""

    @property
    def metadata(self) -> Metadata: ...


R = TypeVar("R", bound=Measured)


async def observed(
    serving: Serving,
    work: Awaitable[R],
    *,
    handler: str,
    route: str,
    carrier: Mapping[str, str],
    method: Method,
    family: Family,
    n: int | Callable[[R], int],
) -> R:
    """Await `work` (one operation over `n` inputs) with its metrics, span and log line.

    `handler` is TEI's name for what runs (the span's name: `/` runs `embed`, `rerank` ...);
    `route` is what the caller asked for (the HTTP path or the gRPC method); `carrier` holds
    the caller's W3C trace context (HTTP headers or gRPC metadata).
    """
    started = serving.clock()
    serving.metrics.received(method)
    tracing = serving.tracing
    model = serving.served_model_name
    try:
        result = await work
    except Exception as e:
        if isinstance(e, TeiError) and e.model is None:
            e.model = model  # the front-end counts the failure under this model
        if tracing is not None:
            tracing.record(handler, route, carrier, None, serving.clock() - started, error=e,
                           model=model)  # fmt: skip
        raise
    meta = result.metadata
    if callable(n):  # known only from the answer (a stream's inputs, once it has ended)
        n = n(result)
    serving.metrics.record(method, family, n, meta)
    if tracing is not None:
        tracing.record(handler, route, carrier, meta, meta.total_time_ns / 1e9, model=model)
    if log.isEnabledFor(logging.INFO):
        span = RequestSpan(name=handler, model=model, meta=meta)
        log.info(
            "%s model=%s inputs=%d tokens=%d total_ms=%.1f queue_ms=%.1f inference_ms=%.1f",
            route, model, n, meta.compute_tokens, meta.total_time_ns / 1e6,
            meta.queue_time_ns / 1e6, meta.inference_time_ns / 1e6, extra={"span": span},
        )  # fmt: skip
    return result
