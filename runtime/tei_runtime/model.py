"""Model: tokenization, one-batch forwards (the `Backend` protocol), and batching calls for
Python users."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar, assert_never

import msgspec
import numpy as np
import numpy.typing as npt

from tei_runtime import pooling
from tei_runtime.answer_prompt import PromptedPairs
from tei_runtime.backend import Output
from tei_runtime.data import Encoding, SparseVector, Token
from tei_runtime.errors import ManifestError, ValidationError
from tei_runtime.manifest import Manifest, Pooling, Precision, Task, Variant
from tei_runtime.packing import Packing, run_packed
from tei_runtime.providers import TRT_MAX_BATCH, Device, ProviderChoice
from tei_runtime.session import OrtBackend
from tei_runtime.tokenization import Direction, Input, TextInput, Tokenizer, check_direction

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
T = TypeVar("T")

TOKEN_EMBEDDINGS = "token_embeddings"
SENTENCE_EMBEDDING = "sentence_embedding"
SPARSE_EMBEDDING = "sparse_embedding"
LOGITS = "logits"
# CPU runs fastest on small batches: all-MiniLM-L6-v2 on 2 cores did ~95 texts/s packed
# by 1024 tokens against ~48 by 16384 (the cache, not padding: batches are length-sorted).
CPU_BATCH_TOKENS = 1024
# ... and on little padding: the same texts packed with at most 10% padding per forward ran
# 1.3x faster (fp32) than by the budget alone. GPUs pay little for padding and much per run.
CPU_MAX_PADDING = 0.1
KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids"})


class Model:
    """A loaded artifact. Thread-safe: the server may call it from several threads."""

    def __init__(
        self,
        *,
        manifest: Manifest,
        variant: Variant,
        tokenizer: Tokenizer,
        backend: OrtBackend,
        choice: ProviderChoice,
        max_batch_tokens: int,
        artifact_dir: Path,
    ) -> None:
        self.manifest = manifest
        self.variant = variant
        self.choice = choice
        self.provider: str = choice.provider
        self.precision: Precision = choice.precision
        self.max_input_length: int = tokenizer.max_input_length
        """The manifest's, or lower where the loader was asked to cut it."""
        self.max_batch_tokens = max_batch_tokens
        cpu = choice.device in (Device.CPU, Device.OPENVINO)
        self.packing = Packing(
            budget=min(max_batch_tokens, CPU_BATCH_TOKENS) if cpu else max_batch_tokens,
            max_rows=TRT_MAX_BATCH if choice.device is Device.TENSORRT else None,
            max_padding=CPU_MAX_PADDING if cpu else None,
        )
        """How the high-level calls (embed, predict ...) cut their forwards on this device;
        a server's batcher should cut its batches the same way."""
        self.artifact_dir = artifact_dir
        self.tokenizer = tokenizer
        self._backend = backend
        graph = artifact_dir / variant.file
        unknown = set(backend.input_names) - KNOWN_INPUTS
        if unknown:
            raise ManifestError(f"{graph}: inputs this runtime cannot build: {sorted(unknown)}")
        if set(backend.input_names) != set(manifest.io.inputs):
            raise ManifestError(
                f"{graph}: graph inputs {list(backend.input_names)} differ from the manifest's "
                f"io.inputs {manifest.io.inputs}"
            )
        missing = set(manifest.io.outputs) - set(backend.output_names)
        if missing:
            raise ManifestError(f"{graph}: lacks the outputs the manifest lists: {sorted(missing)}")
        if (
            manifest.task is Task.EMBED
            and manifest.pooling_in_graph
            and SENTENCE_EMBEDDING not in backend.output_names
        ):
            raise ManifestError(
                f"{graph}: pooling_in_graph is set but there is no {SENTENCE_EMBEDDING}"
            )
        for side in ("padding_side", "truncation_side"):
            if getattr(manifest, side) not in ("left", "right"):
                raise ManifestError(f"manifest {side} must be left or right")
        self._inputs = backend.input_names
        self._outputs = frozenset(backend.output_names)
        self._left_pad = manifest.padding_side == "left"
        self._truncation_side: Direction = "left" if manifest.truncation_side == "left" else "right"
        self.dimension: int = backend.output_dims.get(SENTENCE_EMBEDDING) or manifest.hidden_size
        """Width of forward_embed's vectors (before any matryoshka truncation)."""
        generative = manifest.generative_rerank
        self._pairs = None if generative is None else PromptedPairs(generative.prompt, tokenizer)
        """A generative reranker's prompt: every pair is tokenized through it."""

    # ---- tokenization -------------------------------------------------------------------

    def _prefix(self, prompt_name: str | None, prompt: str | None) -> str | None:
        if prompt is not None and prompt_name is not None:
            raise ValidationError("pass `prompt` or `prompt_name`, not both")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValidationError(f"`prompt` must be a string; got {type(prompt).__name__}")
            return prompt
        if prompt_name is not None and not isinstance(prompt_name, str):
            raise ValidationError(
                f"`prompt_name` must be a string; got {type(prompt_name).__name__}"
            )
        prompts = self.manifest.prompts
        name = prompt_name if prompt_name is not None else prompts.default_prompt_name
        if name is None:
            return None
        try:
            return prompts.prompts[name]
        except KeyError:
            raise ValidationError(_unknown_prompt(name, list(prompts.prompts))) from None

    def encode(
        self,
        inputs: Sequence[Input],
        *,
        truncate: bool = True,
        truncation_direction: Direction | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        add_special_tokens: bool = True,
        instruction: str | None = None,
    ) -> list[Encoding]:
        """Tokenize: strings, (query, passage) pairs, or token id lists (decoded and tokenized
        again, as TEI does, so a prompt goes before them too).

        truncation_direction None means the manifest's truncation_side. A generative reranker
        puts each pair into its prompt, with `instruction` (default: the model card's).
        """
        if instruction is not None and not isinstance(instruction, str):
            raise ValidationError(
                f"`instruction` must be a string; got {type(instruction).__name__}"
            )
        direction = truncation_direction or self._truncation_side
        if self._pairs is not None:
            if prompt_name is not None or prompt is not None:
                raise ValidationError(
                    "a generative reranker takes an `instruction`, not a prompt: its pairs "
                    "go into the model card's template"
                )
            check_direction(direction)  # its template path never reaches Tokenizer.encode's
            return self._pairs.encode(
                inputs, instruction=instruction, truncate=truncate, truncation_direction=direction
            )
        if instruction is not None:
            raise ValidationError(
                "`instruction` applies to generative rerankers (Qwen3-Reranker) only; "
                "this model does not take one"
            )
        return self.tokenizer.encode(
            inputs,
            truncate=truncate,
            truncation_direction=direction,
            prefix=self._prefix(prompt_name, prompt),
            add_special_tokens=add_special_tokens,
        )

    def tokenize(
        self,
        inputs: Sequence[TextInput],
        *,
        add_special_tokens: bool = True,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> list[list[Token]]:
        """TEI's /tokenize view of each input, prompted as `encode` prompts it with a prompt
        name or text. A generative reranker's template is not applied: these are the texts'
        own tokens, where `encode` puts each pair inside the model card's prompt."""
        return self.tokenizer.tokens(
            inputs,
            add_special_tokens=add_special_tokens,
            prefix=self._prefix(prompt_name, prompt),
        )

    def decode(
        self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> list[str]:
        """One text per list of token ids (`[[101, 7592, 102]]`, not a flat list)."""
        if isinstance(ids, str | bytes) or not all(
            isinstance(row, Sequence | np.ndarray) and not isinstance(row, str | bytes)
            for row in ids
        ):
            raise ValidationError(
                "`ids` must be a list of token id lists, one per text (e.g. [[101, 7592, 102]])"
            )
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- one padded batch -------------------------------------------------------------

    def _feeds(self, batch: Sequence[Encoding]) -> tuple[dict[str, IntArray], IntArray]:
        if not batch:
            raise ValidationError("a batch needs at least one input")
        n = len(batch)
        width = max(1, max(len(e) for e in batch))
        ids = np.full((n, width), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        for row, enc in enumerate(batch):
            k = len(enc)
            cols = slice(width - k, width) if self._left_pad else slice(0, k)
            ids[row, cols] = enc.ids
            mask[row, cols] = 1
            types[row, cols] = enc.type_ids
        feeds: dict[str, IntArray] = {}
        for name in self._inputs:
            if name == "input_ids":
                feeds[name] = ids
            elif name == "attention_mask":
                feeds[name] = mask
            elif name == "token_type_ids":
                feeds[name] = types
            else:  # position_ids; right for left and right padding alike
                feeds[name] = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        return feeds, mask

    def _run(self, batch: Sequence[Encoding], output: str) -> tuple[FloatArray, IntArray]:
        if output not in self._outputs:
            raise ValidationError(self._missing_output(output))
        feeds, mask = self._feeds(batch)
        (result,) = self._backend.run(feeds, [output])
        return result, mask

    def _missing_output(self, output: str) -> str:
        task = self.manifest.task.value
        if output == LOGITS:
            return f"this model has no classification head (task {task}); use an embedding call"
        if output == SPARSE_EMBEDDING:
            return f"this model has no sparse (SPLADE) output (task {task})"
        return f"this model gives no embeddings (task {task}); use predict"

    def forward(self, batch: Sequence[Encoding], output: Output) -> Sequence[FloatArray]:
        """One padded forward (the `Backend` protocol): a row per encoding, in order."""
        match output:
            case Output.EMBEDDING:
                return list(self.forward_embed(batch))
            case Output.TOKENS:
                return self.forward_tokens(batch)
            case Output.SPARSE:
                return list(self.forward_sparse(batch))
            case Output.LOGITS:
                return list(self.forward_logits(batch))
            case _:
                assert_never(output)

    def forward_embed(self, batch: Sequence[Encoding]) -> FloatArray:
        """[n, dim] pooled embeddings as the manifest says, not normalised."""
        if self.manifest.pooling is Pooling.SPLADE:
            raise ValidationError("SPLADE models give sparse embeddings only; use embed_sparse")
        if self.manifest.pooling_in_graph and SENTENCE_EMBEDDING in self._outputs:
            out, mask = self._run(batch, SENTENCE_EMBEDDING)
        else:
            if self.manifest.pooling is None:
                raise ValidationError(self._missing_output(TOKEN_EMBEDDINGS))
            tokens, mask = self._run(batch, TOKEN_EMBEDDINGS)
            out = pooling.pool(tokens, mask, self.manifest.pooling)
        return _zero_empty_rows(out, mask)

    def forward_tokens(self, batch: Sequence[Encoding]) -> list[FloatArray]:
        """Per input [len_i, hidden] token embeddings, padding removed."""
        tokens, mask = self._run(batch, TOKEN_EMBEDDINGS)
        width = mask.shape[1]
        rows: list[FloatArray] = []
        for row, enc in enumerate(batch):
            k = len(enc)
            cols = slice(width - k, width) if self._left_pad else slice(0, k)
            rows.append(np.ascontiguousarray(tokens[row, cols]))
        return rows

    def forward_sparse(self, batch: Sequence[Encoding]) -> FloatArray:
        """[n, vocab] SPLADE activations."""
        if SPARSE_EMBEDDING in self._outputs:
            out, mask = self._run(batch, SPARSE_EMBEDDING)
        elif self.manifest.pooling is Pooling.SPLADE:
            logits, mask = self._run(batch, TOKEN_EMBEDDINGS)
            out = pooling.pool(logits, mask, Pooling.SPLADE)
        else:
            raise ValidationError(self._missing_output(SPARSE_EMBEDDING))
        return _zero_empty_rows(out, mask)

    def forward_logits(self, batch: Sequence[Encoding]) -> FloatArray:
        """[n, labels] raw classifier/reranker logits."""
        out, _ = self._run(batch, LOGITS)
        return out

    # ---- batching calls for Python users ------------------------------------------------

    def _map(
        self,
        encodings: Sequence[Encoding],
        forward: Callable[[Sequence[Encoding]], Sequence[T]],
        batch_tokens: int | None,
    ) -> list[T]:
        """Run `forward` over budget-packed, length-sorted batches; results in input order."""
        rule = self.packing
        if batch_tokens is not None:
            if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or (
                batch_tokens < 1
            ):
                raise ValidationError(f"`batch_tokens` must be at least 1; got {batch_tokens!r}")
            rule = msgspec.structs.replace(rule, budget=batch_tokens)
        return run_packed(encodings, forward, rule)

    def _stack(self, rows: list[FloatArray], width: int) -> FloatArray:
        if not rows:
            return np.zeros((0, width), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    def embed(
        self,
        texts: Sequence[Input],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        truncate: bool = True,
        truncation_direction: Direction | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_tokens: int | None = None,
    ) -> FloatArray:
        """[n, dim] sentence embeddings, like sentence-transformers' encode: L2-normalised
        where the model's modules.json has a Normalize module (the manifest's `normalize`),
        unless `normalize` says otherwise (TEI's server normalises unless told not to)."""
        if normalize is None:
            normalize = self.manifest.normalize
        elif isinstance(normalize, np.bool_):
            normalize = bool(normalize)
        elif not isinstance(normalize, bool):
            raise ValidationError(
                f"`normalize` must be True, False or None; got {type(normalize).__name__}"
            )
        encodings = self.encode(
            texts,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
            prompt=prompt,
        )
        rows = self._map(encodings, _rows(self.forward_embed), batch_tokens)
        out = self._stack(rows, self.dimension)
        out = pooling.truncate_dimensions(out, dimensions)
        return pooling.normalize(out) if normalize else out

    def embed_all(
        self,
        texts: Sequence[Input],
        *,
        truncate: bool = True,
        truncation_direction: Direction | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_tokens: int | None = None,
    ) -> list[FloatArray]:
        """Per input [len_i, hidden] token embeddings (special tokens included)."""
        encodings = self.encode(
            texts,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
            prompt=prompt,
        )
        return self._map(encodings, self.forward_tokens, batch_tokens)

    def embed_sparse(
        self,
        texts: Sequence[Input],
        *,
        truncate: bool = True,
        truncation_direction: Direction | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_tokens: int | None = None,
    ) -> list[SparseVector]:
        encodings = self.encode(
            texts,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
            prompt=prompt,
        )

        def forward(batch: Sequence[Encoding]) -> list[SparseVector]:
            return pooling.to_sparse(self.forward_sparse(batch))

        return self._map(encodings, forward, batch_tokens)

    def predict(
        self,
        inputs: Sequence[Input],
        *,
        raw_scores: bool = False,
        truncate: bool = True,
        truncation_direction: Direction | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_tokens: int | None = None,
        instruction: str | None = None,
    ) -> FloatArray:
        """[n, labels] scores: sigmoid for one label, softmax for several, logits if raw.

        A generative reranker's one score is sigmoid(yes - no) (raw: yes - no), for
        (query, document) pairs put into its prompt with `instruction`.
        """
        encodings = self.encode(
            inputs,
            truncate=truncate,
            truncation_direction=truncation_direction,
            prompt_name=prompt_name,
            prompt=prompt,
            instruction=instruction,
        )
        rows = self._map(encodings, _rows(self.forward_logits), batch_tokens)
        return pooling.scores(
            self._stack(rows, max(1, len(self.manifest.labels))), raw_scores=raw_scores
        )


def _rows(
    forward: Callable[[Sequence[Encoding]], FloatArray],
) -> Callable[[Sequence[Encoding]], list[FloatArray]]:
    def run(batch: Sequence[Encoding]) -> list[FloatArray]:
        return list(forward(batch))

    return run


def _zero_empty_rows(out: FloatArray, mask: IntArray) -> FloatArray:
    """An input of no tokens (an empty string without special tokens) pools to zeros.

    Its row is all padding, where a graph's attention may well produce NaN.
    """
    empty = mask.sum(axis=1) == 0
    if empty.any():
        out = out.copy()
        out[empty] = 0.0
    return out


def _unknown_prompt(name: str, known: list[str]) -> str:
    """TEI's words for a prompt name the model lacks (TEI says `default-prompt-name` whether
    the name came from that flag or from a request's `prompt_name`; clients match the text)."""
    if not known:
        return (f"`default-prompt-name` is set to `{name}` but no prompts were found in the "
                "Sentence Transformers configuration")  # fmt: skip
    listed = ", ".join(json.dumps(k, ensure_ascii=False) for k in known)
    return (f"`default-prompt-name` is set to `{name}` but it was not found in the Sentence "
            f"Transformers prompts. Available prompts: [{listed}]")  # fmt: skip
