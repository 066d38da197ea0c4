"""A model with the runtime's surface, real tokenization, and numpy "inference".

Tokenization is the runtime's own `Tokenizer` over a tiny WordLevel tokenizer.json, so
truncation, pairs, ids and offsets behave as in production; the forward passes are
deterministic numpy functions of the ids. Tests can hold batches (`gate`), slow them
(`delay`) or make the next ones fail (`fail_batches`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tei_runtime import errors as rt_errors
from tei_runtime.backend import Output
from tei_runtime.data import Encoding, Token
from tei_runtime.manifest import (
    SCHEMA_VERSION,
    IoNames,
    Manifest,
    Pooling,
    Precision,
    Prompts,
    Source,
    Task,
    Toolchain,
)
from tei_runtime.packing import Packing
from tei_runtime.tokenization import Tokenizer

WORDS = (
    "what", "is", "deep", "learning", "machine", "the", "a", "of", "and", "to", "in", "it",
    "for", "on", "with", "as", "was", "at", "by", "hello", "world", "paris", "france",
    "capital", "city", "big", "small", "cat", "dog", "query", "passage", "warm", "up", "health",
    "good", "bad",
)
HIDDEN = 16


def write_tokenizer(path: Path) -> Path:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for t, i in list(vocab.items())[:4]
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]},
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    path.write_text(json.dumps(spec))
    return path


def make_manifest(task: Task, *, max_input_length: int = 32,
                  labels: dict[int, str] | None = None) -> Manifest:
    pooling = {Task.EMBED: Pooling.MEAN, Task.SPARSE: Pooling.SPLADE}.get(task)
    return Manifest(
        schema_version=SCHEMA_VERSION,
        source=Source(model_id=f"fake/{task.value}"),
        task=task,
        architecture="FakeModel",
        model_type="bert",
        card="fake",
        pooling=pooling,
        normalize=task is Task.EMBED,
        max_input_length=max_input_length,
        hidden_size=HIDDEN,
        io=IoNames(inputs=["input_ids", "attention_mask"], outputs=["token_embeddings"]),
        labels=labels or {},
        prompts=Prompts(prompts={"query": "query "}),
        opset=17,
        toolchain=Toolchain(tei_onnx="0", torch="0", transformers="0", onnx="0",
                            onnxruntime="0"),
        tokenizer_files=["tokenizer.json"],
        tokenizer_sha256={},
        variants=[],
    )


class FakeModel:
    provider = "CPUExecutionProvider"
    precision = Precision.FP32
    dimension = HIDDEN

    def __init__(self, tokenizer_json: Path, task: Task = Task.EMBED, *,
                 max_input_length: int = 32, labels: dict[int, str] | None = None) -> None:
        if task is Task.RERANK and labels is None:
            labels = {0: "LABEL_0"}
        if task is Task.CLASSIFY and labels is None:
            labels = {0: "negative", 1: "neutral", 2: "positive"}
        self.manifest = make_manifest(task, max_input_length=max_input_length, labels=labels)
        self.max_input_length = max_input_length
        # Large enough that the worker hands every batcher batch over whole.
        self.packing = Packing(budget=1 << 30)
        self.tokenizer = Tokenizer(tokenizer_json, max_input_length=max_input_length)
        rng = np.random.default_rng(0)
        self.table = rng.standard_normal((self.tokenizer.vocab_size, HIDDEN)).astype(np.float32)
        self.head = rng.standard_normal((HIDDEN, max(1, len(self.manifest.labels)))).astype(
            np.float32
        )
        self.gate = threading.Event()
        self.gate.set()
        self.delay = 0.0
        self.fail_batches = 0
        self.batches: list[int] = []
        self.at_gate = 0
        """Size of the last batch that reached the gate (held there while it is clear)."""
        self.running = threading.Event()
        """Set while a forward pass is running (after the gate)."""

    def _before(self, batch: Sequence[Encoding]) -> None:
        self.at_gate = len(batch)
        self.running.set()
        self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        self.batches.append(len(batch))
        if self.fail_batches > 0:
            self.fail_batches -= 1
            raise rt_errors.BackendError("fake failure")

    def encode(self, inputs: Sequence[object], *, truncate: bool = True,
               truncation_direction: str = "right", prompt_name: str | None = None,
               prompt: str | None = None, add_special_tokens: bool = True,
               instruction: str | None = None) -> list[Encoding]:
        if instruction is not None:
            raise rt_errors.ValidationError("`instruction` applies to generative rerankers only")
        return self.tokenizer.encode(
            inputs,  # type: ignore[arg-type]
            truncate=truncate,
            truncation_direction=truncation_direction,  # type: ignore[arg-type]
            prefix=self._prefix(prompt_name, prompt),
            add_special_tokens=add_special_tokens,
        )

    def forward(self, batch: Sequence[Encoding], output: Output) -> list[np.ndarray]:
        """Token vectors are rows of a random table; pooling is their mean; logits a random head
        over that; SPLADE is log1p of the token counts."""
        self._before(batch)
        tokens = [self.table[np.asarray(e.ids, dtype=np.int64)] for e in batch]
        match output:
            case Output.TOKENS:
                return tokens
            case Output.EMBEDDING:
                return [t.mean(axis=0) for t in tokens]
            case Output.LOGITS:
                return list(np.stack([t.mean(axis=0) for t in tokens]) @ self.head)
            case Output.SPARSE:
                counts = np.zeros((len(batch), self.tokenizer.vocab_size), dtype=np.float32)
                for row, e in enumerate(batch):
                    np.add.at(counts[row], np.asarray(e.ids, dtype=np.int64), 1.0)
                return list(np.log1p(counts))

    def _prefix(self, prompt_name: str | None, prompt: str | None) -> str | None:
        if prompt_name is None:
            return prompt
        try:
            return self.manifest.prompts.prompts[prompt_name]
        except KeyError as e:
            raise rt_errors.ValidationError(f"prompt `{prompt_name}` not found") from e

    def tokenize(self, inputs: Sequence[str], *, add_special_tokens: bool = True,
                 prompt_name: str | None = None, prompt: str | None = None) -> list[list[Token]]:
        return self.tokenizer.tokens(inputs, add_special_tokens=add_special_tokens,
                                     prefix=self._prefix(prompt_name, prompt))

    def decode(self, ids: Sequence[Sequence[int]], *,
               skip_special_tokens: bool = True) -> list[str]:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
