"""A generative reranker's inputs: (query, document) pairs put into its prompt and tokenized
the way its model card does.

The card tokenizes the system prompt (`prefix`) and the answer opening (`suffix`) on their own,
truncates only the formatted pair to what is left of the input length, and joins the ids; so
does this, so a long document loses its end and never the question asked of the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from tei_runtime.data import Encoding
from tei_runtime.errors import InputTooLongError, ManifestError, ValidationError
from tei_runtime.manifest import AnswerPrompt
from tei_runtime.tokenization import Direction, Input, Tokenizer


def format_pair(prompt: AnswerPrompt, query: str, document: str, instruction: str | None) -> str:
    """The pair's part of the prompt (the card's `format_instruction`)."""
    chosen = prompt.default_instruction if instruction is None else instruction
    return prompt.template.format(instruction=chosen, query=query, document=document)


class PromptedPairs:
    """Encodes (query, document) pairs for one generative reranker; token id lists are taken
    as the whole prompt, as they are."""

    def __init__(self, prompt: AnswerPrompt, tokenizer: Tokenizer) -> None:
        self.prompt = prompt
        self.tokenizer = tokenizer
        self.prefix_ids, self.suffix_ids = tokenizer.ids_without_specials(
            [prompt.prefix, prompt.suffix]
        )
        self.budget = tokenizer.max_input_length - len(self.prefix_ids) - len(self.suffix_ids)
        if self.budget <= 0:
            raise ManifestError(
                f"the reranker prompt takes {len(self.prefix_ids) + len(self.suffix_ids)} tokens, "
                f"no fewer than max_input_length {tokenizer.max_input_length}"
            )

    def encode(
        self,
        inputs: Sequence[Input],
        *,
        instruction: str | None,
        truncate: bool,
        truncation_direction: Direction,
    ) -> list[Encoding]:
        texts: list[str] = []
        for item in inputs:
            if isinstance(item, str):
                raise ValidationError(
                    "a generative reranker scores (query, document) pairs, not single texts"
                )
            if isinstance(item, tuple) and len(item) == 2 and all(isinstance(s, str) for s in item):
                texts.append(format_pair(self.prompt, str(item[0]), str(item[1]), instruction))
        formatted = iter(self.tokenizer.ids_without_specials(texts))
        out: list[Encoding] = []
        for item in inputs:
            if isinstance(item, tuple) and len(item) == 2 and all(isinstance(s, str) for s in item):
                out.append(self._join(next(formatted), truncate, truncation_direction))
            else:
                out.extend(
                    self.tokenizer.encode(
                        [item], truncate=truncate, truncation_direction=truncation_direction
                    )
                )
        return out

    def _join(self, pair: tuple[int, ...], truncate: bool, direction: Direction) -> Encoding:
        if len(pair) > self.budget:
            if not truncate:
                total = len(self.prefix_ids) + len(pair) + len(self.suffix_ids)
                raise InputTooLongError(total, self.tokenizer.max_input_length)
            pair = pair[-self.budget :] if direction == "left" else pair[: self.budget]
        ids = self.prefix_ids + pair + self.suffix_ids
        return Encoding(ids=ids, type_ids=(0,) * len(ids), offsets=((0, 0),) * len(ids))
