"""tei_runtime: run a tei-export artifact with onnxruntime. No torch, no transformers.

Usage: `model = tei_runtime.load("artifacts/all-MiniLM-L6-v2")`, then
`model.embed(["a sentence", "another one"])` gives a [2, 384] array, L2-normalised where the
model has a Normalize module (all-MiniLM-L6-v2 does), as sentence-transformers gives it.
"""

from __future__ import annotations

import os

# onnxruntime >= 1.29 runs a telemetry uploader on Linux too (DNS lookups of Microsoft's
# collector, an event cache and device id under $XDG_CACHE_HOME or ~/.cache) unless set before it is
# first imported: air-gapped sites must see no network call. ORT_DISABLE_TELEMETRY=0 opts in.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from tei_runtime.backend import Backend, Output
from tei_runtime.data import Encoding, SparseVector, Token
from tei_runtime.errors import (
    BackendError,
    InputTooLongError,
    ManifestError,
    OutOfMemoryError,
    ProviderError,
    TeiRuntimeError,
    TokenizerError,
    ValidationError,
)
from tei_runtime.loader import load
from tei_runtime.manifest import Pooling, Precision, Task
from tei_runtime.model import Model

__all__ = [
    "Backend",
    "BackendError",
    "Encoding",
    "InputTooLongError",
    "ManifestError",
    "Model",
    "OutOfMemoryError",
    "Output",
    "Pooling",
    "Precision",
    "ProviderError",
    "SparseVector",
    "Task",
    "TeiRuntimeError",
    "Token",
    "TokenizerError",
    "ValidationError",
    "load",
]
