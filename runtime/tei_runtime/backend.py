"""The Backend protocol: what a batching server needs from a loaded model, and no more.

A server tokenizes on its own, queues `Encoding`s, cuts a batch by `packing` and calls
`forward` for the `Output` its model's task gives (`output_for_task`). `tei_runtime.Model`
implements it; tests implement it with numpy.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, assert_never

import numpy as np
import numpy.typing as npt

from tei_runtime.data import Encoding
from tei_runtime.manifest import Task
from tei_runtime.packing import Packing

FloatArray = npt.NDArray[np.float32]


class Output(enum.Enum):
    """What one forward returns per input."""

    EMBEDDING = "embedding"
    """The pooled vector, not normalized."""
    TOKENS = "tokens"
    """One vector per token, padding removed."""
    SPARSE = "sparse"
    """The vocabulary-sized SPLADE vector."""
    LOGITS = "logits"
    """The classifier / reranker head's logits."""


def output_for_task(task: Task) -> Output:
    """The forward a model of this task serves (its requests, health probe and warm-up)."""
    match task:
        case Task.EMBED:
            return Output.EMBEDDING
        case Task.SPARSE:
            return Output.SPARSE
        case Task.CLASSIFY | Task.RERANK:
            return Output.LOGITS
        case _:
            assert_never(task)


class Backend(Protocol):
    @property
    def packing(self) -> Packing:
        """How one forward should be cut on this device (budget, rows, padding)."""
        ...

    def forward(self, batch: Sequence[Encoding], output: Output) -> Sequence[FloatArray]:
        """One padded forward over `batch`: a row per encoding, in order.

        Raises `tei_runtime.errors.TeiRuntimeError` (a `BackendError` when the session fails).
        """
        ...
