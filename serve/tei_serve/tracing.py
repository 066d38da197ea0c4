"""OpenTelemetry spans of inference requests, exported over OTLP/gRPC (`--otlp-endpoint`).

Like TEI, one span per request named after its handler (embed, rerank, openai_embed ...),
with child spans for tokenization, queueing and inference, continuing the caller's trace
when it sends a W3C `traceparent` header. The spans are written once the request is
answered, from the timings the x-* headers already carry (so the hot path pays nothing more
when tracing is off); for a batch request the queue and inference children span the
per-input averages, as TEI's headers do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from tei_serve.serving import Metadata

log = logging.getLogger("tei_serve")

_NO_TIMINGS = (0, 0, 0)

FLUSH_SECONDS = 2.0
"""How long a stop waits for the spans still buffered: a collector that does not answer must
not keep the process past an orchestrator's grace (Kubernetes kills it at 30 s; the requests
in flight had 25 of them)."""

_UNITS = ((1_000_000_000, 9, "s"), (1_000_000, 6, "ms"), (1_000, 3, "µs"))


def rust_duration(ns: int) -> str:
    """A duration as TEI's spans write it (Rust's `{:?}` of a Duration): `1.5s`, `12.03ms`,
    `850µs`, `40ns`, every digit the nanoseconds give and no trailing zeros."""
    for scale, digits, unit in _UNITS:
        if ns >= scale:
            whole, part = divmod(ns, scale)
            fraction = f"{part:0{digits}d}".rstrip("0")
            return f"{whole}.{fraction}{unit}" if fraction else f"{whole}{unit}"
    return f"{max(ns, 0)}ns"


class Tracing:
    def __init__(self, endpoint: str, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            shutdown_on_exit=False,  # `shutdown` flushes, within its bound: no unbounded retry
        )
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https:"))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("tei_serve")
        self.propagator = TraceContextTextMapPropagator()

    def record(
        self,
        handler: str,
        route: str,
        headers: Mapping[str, str],
        meta: Metadata | None,
        elapsed: float,
        error: BaseException | None = None,
        model: str | None = None,
    ) -> None:
        """Spans of one answered (or failed) request that has run for `elapsed` seconds; the
        request span is named after the TEI `handler` that ran (TEI's span names) and carries
        the served `model` name. A failed request has no `meta`: its span carries the error
        and no stage children."""
        from opentelemetry import trace

        end = time.time_ns()
        start = end - int(elapsed * 1e9)
        parent = self.propagator.extract(carrier=dict(headers))
        span = self.tracer.start_span(handler, context=parent, start_time=start)
        stages = (
            (meta.tokenization_time_ns, meta.queue_time_ns, meta.inference_time_ns)
            if meta is not None else _NO_TIMINGS
        )  # fmt: skip
        span.set_attributes({
            "http.route": route,
            "total_time": rust_duration(int(elapsed * 1e9)),
            "tokenization_time": rust_duration(stages[0]),
            "queue_time": rust_duration(stages[1]),
            "inference_time": rust_duration(stages[2]),
            "compute_chars": meta.compute_chars if meta is not None else 0,
            "compute_tokens": meta.compute_tokens if meta is not None else 0,
        })  # fmt: skip
        if model is not None:
            span.set_attribute("model", model)
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))
        inside = trace.set_span_in_context(span)
        at = start
        for name, ns in zip(("tokenize", "queue", "inference"), stages, strict=True):
            if ns <= 0:
                continue
            stop = min(end, at + ns)
            self.tracer.start_span(name, context=inside, start_time=at).end(end_time=stop)
            at = stop
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is buffered, for FLUSH_SECONDS at most; the server is stopping. The
        exporter retries an unreachable collector for longer than that, so the flush runs on
        a thread of its own that the process does not wait for."""
        flush = threading.Thread(target=self.provider.shutdown, name="otlp-flush", daemon=True)
        flush.start()
        flush.join(FLUSH_SECONDS)
        if flush.is_alive():
            log.warning(
                "the OTLP collector at %s did not take the last spans within %.0f s of the "
                "stop; they are dropped", self.endpoint, FLUSH_SECONDS,
            )  # fmt: skip


def make_tracing(endpoint: str | None, service_name: str) -> Tracing | None:
    return Tracing(endpoint, service_name) if endpoint else None
