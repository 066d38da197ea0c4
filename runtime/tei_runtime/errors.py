"""Errors the runtime raises, worded to be shown to a user as they are.

`str(error)` is TEI's full text (TEI prefixes validation messages with "Input validation
error: ", tokenizer ones with "Tokenizer error: " ...), so a server can put it in the
`error` field unchanged; `detail` is the message without the prefix. `error_type` is TEI's
error_type name, a hint for the server's mapping to HTTP statuses (it owns that mapping).
Every command-line tool over the runtime catches `TeiRuntimeError` and prints one line.
"""

from __future__ import annotations

from typing import ClassVar


class TeiRuntimeError(RuntimeError):
    """Base of every error the runtime raises on purpose."""

    prefix: ClassVar[str] = ""
    error_type: ClassVar[str] = "Backend"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{self.prefix}{detail}")

    @property
    def message(self) -> str:
        return str(self)


class ManifestError(TeiRuntimeError):
    """The artifact is missing, malformed, of an unknown schema version, or fails a checksum."""


def cannot_read(error: PermissionError) -> ManifestError:
    """An artifact file this user may not read (a 077 umask where it was exported or
    unpacked, a volume owned by another user): one line naming it and what to change."""
    return ManifestError(
        f"{error.filename}: cannot read it ({error.strerror}); an artifact's folders and files "
        "must be readable by the user that loads it (`chmod -R a+rX` the folder, or export "
        "and unpack with a umask of 022)"
    )


class ValidationError(TeiRuntimeError):
    """The caller's input cannot be run as given (too long, unknown prompt, bad dimensions)."""

    prefix = "Input validation error: "
    error_type = "Validation"


class InputTooLongError(ValidationError):
    """An input is longer than the model's limit and truncation was not asked for."""

    def __init__(self, length: int, limit: int) -> None:
        self.length = length
        self.limit = limit
        super().__init__(f"`inputs` must have less than {limit} tokens. Given: {length}")


class TokenizerError(TeiRuntimeError):
    """The tokenizer failed on an input or could not be loaded."""

    prefix = "Tokenizer error: "
    error_type = "Tokenizer"


class BackendError(TeiRuntimeError):
    """Inference failed, or the model cannot run on this host as configured."""

    prefix = "Inference failed: "
    error_type = "Backend"


class OutOfMemoryError(BackendError):
    """A forward asked for more memory than the host has left for the model: that call fails,
    the model and the process stay usable."""


class ProviderError(BackendError):
    """The requested execution provider or precision is not usable on this host.

    Raised at load time, before any request, so its text is for an operator.
    """

    prefix = ""
