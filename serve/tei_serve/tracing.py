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

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from tei_serve.serving import Metadata

_NO_TIMINGS = (0, 0, 0)

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
            "total_time": _ms(elapsed),
            "tokenization_time": _ms(stages[0] / 1e9),
            "queue_time": _ms(stages[1] / 1e9),
            "inference_time": _ms(stages[2] / 1e9),
            "inputs.characters": meta.compute_chars if meta is not None else 0,
            "inputs.tokens": meta.compute_tokens if meta is not None else 0,
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
        """Export what is buffered; the server is stopping."""
        self.provider.shutdown()


def make_tracing(endpoint: str | None, service_name: str) -> Tracing | None:
    return Tracing(endpoint, service_name) if endpoint else None
