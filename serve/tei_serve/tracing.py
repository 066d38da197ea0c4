"""OpenTelemetry spans of inference requests, exported over OTLP/gRPC (`--otlp-endpoint`).

Like TEI, one span per request named after its handler (embed, rerank, openai_embed ...),
with child spans for tokenization, queueing and inference, continuing the caller's trace
when it sends a W3C `traceparent` header. The spans are written once the request is
answered, from the timings the x-* headers already carry (so the hot path pays nothing more
when tracing is off); for a batch request the queue and inference children span the
per-input averages, as TEI's headers do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tei_serve.infer import Meta

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}ms"


class Tracing:
    def __init__(self, endpoint: str, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": service_name})
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
        meta: Meta,
        elapsed: float,
        error: BaseException | None = None,
    ) -> None:
        """Spans of one answered (or failed) request that has run for `elapsed` seconds; the
        request span is named after the TEI `handler` that ran (TEI's span names)."""
        from opentelemetry import trace

        end = time.time_ns()
        start = end - int(elapsed * 1e9)
        parent = self.propagator.extract(carrier=dict(headers))
        span = self.tracer.start_span(handler, context=parent, start_time=start)
        span.set_attributes({
            "http.route": route,
            "total_time": _ms(elapsed),
            "tokenization_time": _ms(meta.tokenization),
            "queue_time": _ms(meta.queue),
            "inference_time": _ms(meta.inference),
            "inputs.characters": meta.chars,
            "inputs.tokens": meta.tokens,
        })  # fmt: skip
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))
        inside = trace.set_span_in_context(span)
        at = start
        for name, seconds in (
            ("tokenize", meta.tokenization), ("queue", meta.queue), ("inference", meta.inference)
        ):  # fmt: skip
            if seconds <= 0:
                continue
            stop = min(end, at + int(seconds * 1e9))
            self.tracer.start_span(name, context=inside, start_time=at).end(end_time=stop)
            at = stop
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is buffered; the server is stopping."""
        self.provider.shutdown()


def make_tracing(endpoint: str | None, service_name: str) -> Tracing | None:
    return Tracing(endpoint, service_name) if endpoint else None
