"""The descriptor pool server reflection answers from, able to find a method's file.

`grpcurl describe tei.v1.Embed.Embed` asks reflection for the file that holds the method's
full name. Python protobuf's pool finds services, messages, fields and enums by name, not
methods, so grpcio's reflection answered NOT_FOUND where TEI's (tonic) answers with tei.proto.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor


class MethodSymbolPool:
    """A pool that delegates to `pool`, and finds a method's file through its service."""

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool if pool is not None else descriptor_pool.Default()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:  # noqa: N802 - the pool's name
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            try:
                service = self._pool.FindServiceByName(service_name)
            except KeyError:
                raise KeyError(f"Couldn't find symbol {symbol}") from None
            if method not in service.methods_by_name:
                raise
            return service.file
