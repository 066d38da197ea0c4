"""What the serving core needs from a loaded model: the structural type of `tei_runtime.Model`.

The batching worker needs only the runtime's `Backend` (packing and one forward); the core
adds tokenization and the manifest it reports. Typing against Protocols keeps the server
testable with a fake model and documents the exact surface of the runtime it relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from tei_runtime.backend import Backend
from tei_runtime.data import Encoding, Token
from tei_runtime.manifest import Manifest, Precision

Input = str | tuple[str, str] | Sequence[int]
Direction = Literal["left", "right"]
Array = npt.NDArray[np.float32]


class ServedModel(Backend, Protocol):
    @property
    def manifest(self) -> Manifest: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def max_input_length(self) -> int: ...
    @property
    def dimension(self) -> int:
        """Width of an embedding model's pooled vectors (before `dimensions` truncation)."""
        ...

    def encode(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool = True,
        truncation_direction: Direction = "right",
        prompt_name: str | None = None,
        prompt: str | None = None,
        add_special_tokens: bool = True,
        instruction: str | None = None,
    ) -> Sequence[Encoding]: ...

    def tokenize(
        self,
        inputs: Sequence[str | tuple[str, str]],
        *,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> Sequence[Sequence[Token]]: ...

    def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> Sequence[str]: ...
