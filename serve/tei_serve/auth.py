"""`--api-key`: the one check both front-ends make, in constant time (`hmac.compare_digest`)."""

from __future__ import annotations

import hmac


class ApiKey:
    """Accepts exactly the `authorization` value `Bearer <key>`, as TEI does."""

    def __init__(self, key: str) -> None:
        self._expected = f"Bearer {key}".encode()

    def __repr__(self) -> str:
        return "ApiKey(<redacted>)"

    def accepts(self, authorization: bytes) -> bool:
        # Constant time in the key: the time taken says nothing about how much of it matched.
        return hmac.compare_digest(authorization, self._expected)

    def accepts_header(self, authorization: str) -> bool:
        """An HTTP `authorization` value as the ASGI server decoded it (latin-1, which gives
        back the bytes sent)."""
        return self.accepts(authorization.encode("latin-1"))
