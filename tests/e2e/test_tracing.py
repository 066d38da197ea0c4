"""--otlp-endpoint: request spans reach an OTLP/gRPC collector, inside the caller's trace."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from support.loopback_server import Running
from tei_runtime.manifest import Task

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = threading.Event()

    def Export(  # noqa: N802 (the gRPC method's name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, Any]]:
        """(service.name, span) for everything received."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((attrs.get("service.name", ""), span) for span in ss.spans)
        return out


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    servicer = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None)


def test_request_spans_are_exported_in_the_callers_trace(
    serve: Callable[..., Running], collector: tuple[Collector, int]
) -> None:
    servicer, port = collector
    r = serve(Task.EMBED, otlp_endpoint=f"http://127.0.0.1:{port}", otlp_service_name="emb-test")
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    ok_reply = r.client.post("/embed", json={"inputs": ["hello world"]}, headers=headers)
    assert ok_reply.status_code == 200
    assert r.client.post("/embed", json={"inputs": [""]}).status_code == 400
    assert r.client.post("/", json={"inputs": "via the root route"}).status_code == 200
    r.stop()  # shutdown flushes the batch processor
    assert servicer.arrived.wait(10), "no spans reached the collector"

    spans = servicer.spans()
    assert {service for service, _ in spans} == {"emb-test"}
    by_name: dict[str, list[Any]] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    embeds = by_name["embed"]
    assert len(embeds) == 3  # `/` runs TEI's embed handler on an embedding model
    routes = sorted({a.key: a.value for a in s.attributes}["http.route"].string_value
                    for s in embeds)  # fmt: skip
    assert routes == ["/", "/embed", "/embed"]
    ok = next(s for s in embeds if s.trace_id.hex() == TRACE_ID)
    assert ok.parent_span_id.hex() == PARENT_ID
    attrs = {a.key: a.value for a in ok.attributes}
    # TEI's attribute names and its Rust `{:?}` durations (`1.203ms`, `850µs`)
    assert attrs["compute_tokens"].int_value == 4  # [CLS] hello world [SEP]
    assert attrs["compute_chars"].int_value == len("hello world")
    assert re.fullmatch(r"\d+(\.\d+)?(s|ms|µs|ns)", attrs["total_time"].string_value)
    assert attrs["model"].string_value == "fake/embed"  # the served model's name
    stages = {s.name: s for s in spans_of(by_name, ok.span_id)}
    assert set(stages) == {"tokenize", "queue", "inference"}
    assert ok.start_time_unix_nano <= stages["tokenize"].start_time_unix_nano
    assert stages["inference"].end_time_unix_nano <= ok.end_time_unix_nano

    failed = next(s for s in embeds if s.status.code != 0)
    assert failed.trace_id.hex() != TRACE_ID  # no traceparent: a trace of its own
    assert failed.status.code == 2  # STATUS_CODE_ERROR
    assert "cannot be empty" in failed.status.message


def spans_of(by_name: dict[str, list[Any]], parent: bytes) -> list[Any]:
    return [s for spans in by_name.values() for s in spans if s.parent_span_id == parent]


def test_no_endpoint_means_no_tracing(serve: Callable[..., Running]) -> None:
    r = serve(Task.EMBED)
    assert r.serving.tracing is None
    assert r.client.post("/embed", json={"inputs": ["hello"]}).status_code == 200


def test_disable_spans_exports_nothing(
    serve: Callable[..., Running], collector: tuple[Collector, int]
) -> None:
    servicer, port = collector
    r = serve(Task.EMBED, otlp_endpoint=f"http://127.0.0.1:{port}", disable_spans=True)
    assert r.client.post("/embed", json={"inputs": ["hello world"]}).status_code == 200
    r.stop()  # a tracer would flush its spans here, before stop returns
    assert r.serving.tracing is None
    assert servicer.requests == []
