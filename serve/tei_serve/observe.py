"""The one record path of an inference request, whichever front-end received it.

`observed` counts the request (te_request_count, te_embed_count ...), awaits its operation,
and then records the answer (te_*_success and the duration histograms through
`Metrics.record`), writes its span (`Tracing.record`, when tracing is on) and logs one line.
A failed request gets its error span here; its `te_request_failure` is counted by the
front-end's error handler, which also sees errors raised before an operation starts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Protocol, TypeVar

from tei_serve.metrics import Family, Method
from tei_serve.serving import Metadata, Serving

log = logging.getLogger("tei_serve.access")


class Measured(Protocol):
    @property
    def metadata(self) -> Metadata: ...


R = TypeVar("R", bound=Measured)


async def observed(
    serving: Serving,
    work: Awaitable[R],
    *,
    handler: str,
    verb: str,
    route: str,
    headers: Mapping[str, str],
    method: Method,
    family: Family,
    n: int,
) -> R:
    """Count, await, record, trace and log one request of `n` inputs.

    `handler` is TEI's name for the operation (its span name: embed, rerank, predict ...);
    `verb` and `route` what the client called (`POST` `/embed`, `gRPC`
    `/tei.v1.Embed/EmbedStream`); `headers` the request's headers or gRPC metadata, where a W3C
    `traceparent` continues the caller's trace.
    """
    started = serving.clock()
    serving.metrics.received(method, family, n)
    tracing = serving.tracing
    try:
        result = await work
    except Exception as e:
        if tracing is not None:
            tracing.record(handler, route, headers, None, serving.clock() - started, error=e)
        raise
    record(serving, result.metadata, handler=handler, verb=verb, route=route, headers=headers,
           method=method, family=family, n=n)  # fmt: skip
    return result


def record(
    serving: Serving,
    meta: Metadata,
    *,
    handler: str,
    verb: str,
    route: str,
    headers: Mapping[str, str],
    method: Method,
    family: Family,
    n: int,
) -> None:
    """Record one answered request (`observed` does this; streams that answer once for many
    messages call it with their summed metadata)."""
    serving.metrics.record(method, family, n, meta)
    if serving.tracing is not None:
        serving.tracing.record(handler, route, headers, meta, meta.total_time_ns / 1e9)
    if log.isEnabledFor(logging.INFO):
        log.info(
            "%s %s inputs=%d tokens=%d total_ms=%.1f queue_ms=%.1f inference_ms=%.1f",
            verb, route, n, meta.compute_tokens, meta.total_time_ns / 1e6, meta.queue_time_ns / 1e6,
            meta.inference_time_ns / 1e6,
        )  # fmt: skip
