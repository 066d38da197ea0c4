"""`--api-key` over gRPC: TEI's services want `authorization: Bearer <key>` metadata.

As in TEI, only the `tei.v1` services are guarded; the health service and reflection stay
open (probes and tooling carry no key). A call without the right key ends UNAUTHENTICATED
with TEI's text before its messages are read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from tei_serve.auth import ApiKey
from tei_serve.grpc import tei_pb2

GUARDED_SERVICES = frozenset(
    f"/{service.full_name}/" for service in tei_pb2.DESCRIPTOR.services_by_name.values()
)
"""TEI's interceptor wraps each `tei.v1` service whole: a method it lacks is refused too."""
MESSAGE = "No valid auth token"


async def _refuse(context: aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)


async def _refuse_unary(_request: object, context: aio.ServicerContext[Any, Any]) -> None:
    await _refuse(context)


async def _refuse_stream(
    _request: object, context: aio.ServicerContext[Any, Any]
) -> AsyncIterator[None]:
    await _refuse(context)
    yield  # pragma: no cover - abort raised above; this makes the function a generator


def _refusing(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same response shape as `handler` that aborts UNAUTHENTICATED at once.
    Its requests are always read as a stream: grpc starts a unary-request handler only once
    the message is in, and a call closed without one would wait for its deadline."""
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse_stream)
    return grpc.stream_unary_rpc_method_handler(_refuse_unary)


class BearerAuth(aio.ServerInterceptor):
    def __init__(self, api_key: str) -> None:
        self._key = ApiKey(api_key)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if method[: method.rfind("/") + 1] not in GUARDED_SERVICES:
            return handler
        # Only the first `authorization` value counts, as TEI reads it (`metadata.get`).
        given = next((value for key, value in handler_call_details.invocation_metadata or ()
                      if key == "authorization"), None)  # fmt: skip
        if given is not None and self._key.accepts(
            given if isinstance(given, bytes) else given.encode()
        ):
            return handler
        if handler is None:  # no such method: refused before UNIMPLEMENTED, whatever its shape
            return grpc.stream_stream_rpc_method_handler(_refuse_stream)
        return _refusing(handler)
