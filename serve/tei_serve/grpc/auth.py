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

GUARDED_PREFIX = "/tei.v1."
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
    """A handler of the same shape as `handler` that aborts UNAUTHENTICATED at once."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse_unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse_stream)
    return grpc.unary_unary_rpc_method_handler(_refuse_unary)


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
        if handler is None or not handler_call_details.method.startswith(GUARDED_PREFIX):
            return handler
        for key, value in handler_call_details.invocation_metadata or ():
            given = value if isinstance(value, bytes) else value.encode()
            if key == "authorization" and self._key.accepts(given):
                return handler
        return _refusing(handler)
