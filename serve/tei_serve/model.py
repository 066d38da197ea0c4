"""What the server needs from a loaded model: the structural type of `tei_runtime.Model`.

Typing against a Protocol keeps the server testable with a fake model and documents the
exact surface of the runtime it relies on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from tei_runtime.batching import Packing
from tei_runtime.data import Encoding, Token
from tei_runtime.manifest import Manifest

Input = str | tuple[str, str] | Sequence[int]
Direction = Literal["left", "right"]
Array = npt.NDArray[np.float32]


class ModelLike(Protocol):
    @property
    def manifest(self) -> Manifest: ...
    @property
    def provider(self) -> str: ...
    @property
    def precision(self) -> Any: ...
    @property
    def max_input_length(self) -> int: ...
    @property
    def packing(self) -> Packing:
        """How one forward should be cut on this device (the runtime's own rule)."""
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
    ) -> Sequence[Encoding]: ...

    def forward_embed(self, batch: Sequence[Encoding]) -> Array: ...
    def forward_tokens(self, batch: Sequence[Encoding]) -> Sequence[Array]: ...
    def forward_sparse(self, batch: Sequence[Encoding]) -> Array: ...
    def forward_logits(self, batch: Sequence[Encoding]) -> Array: ...

    def tokenize(
        self,
        inputs: Sequence[str | tuple[str, str]],
        *,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
    ) -> Sequence[Sequence[Token]]: ...

    def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> Sequence[str]: ...
