"""A generative reranker's inputs: (query, document) pairs put into its prompt and tokenized
the way its model card does.

The card tokenizes the system prompt (`prefix`) and the answer opening (`suffix`) on their own,
truncates only the formatted pair to what is left of the input length, and joins the ids; so
does this. Cut at the right (the card's way), a long document loses its end; cut at the left,
it loses its start, and the instruction and query before it stay (keeping the pair's last
tokens would cut those first). Where the instruction and query alone fill the input, the
pair is cut at its end whichever the side, so the document is gone: the card does the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tei_runtime.data import Encoding
from tei_runtime.errors import InputTooLongError, ManifestError, ValidationError
from tei_runtime.manifest import AnswerPrompt
from tei_runtime.tokenization import Direction, Input, Tokenizer, is_pair

log = logging.getLogger(__name__)

ROOM_WARNED_BELOW = 64
"""Tokens left for query and document (default instruction) under which a load warns: a
query and a document of ordinary length will not both fit, and the document is cut first."""


def format_pair(prompt: AnswerPrompt, query: str, document: str, instruction: str | None) -> str:
    """The pair's part of the prompt (the card's `format_instruction`)."""
    chosen = prompt.default_instruction if instruction is None else instruction
    return prompt.template.format(instruction=chosen, query=query, document=document)


def document_start(prompt: AnswerPrompt, query: str, instruction: str | None) -> int:
    """Where the document begins in `format_pair`'s text, in characters."""
    chosen = prompt.default_instruction if instruction is None else instruction
    head = prompt.template.partition("{document}")[0]
    return len(head.format(instruction=chosen, query=query))


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
                f"no fewer than the {tokenizer.max_input_length} an input may have "
                "(max_input_length, or a server's --max-batch-tokens where lower)"
            )
        # What the template and the default instruction take: what is left is for the query
        # and the document, and the document is what truncation cuts.
        [empty] = tokenizer.ids_without_specials([format_pair(prompt, "", "", None)])
        room = self.budget - len(empty)
        if room <= 0:
            raise ManifestError(
                f"the reranker prompt with its default instruction takes "
                f"{tokenizer.max_input_length - room} tokens, no fewer than the "
                f"{tokenizer.max_input_length} an input may have, so no document would be "
                "scored (max_input_length, or a server's --max-batch-tokens where lower)"
            )
        if room < ROOM_WARNED_BELOW:
            log.warning(
                "%s: the reranker prompt with its default instruction leaves %d of %d tokens "
                "for the query and the document: longer ones lose the document's text first, "
                "so such documents all score alike (raise --max-batch-tokens)",
                tokenizer.name, room, tokenizer.max_input_length,
            )  # fmt: skip

    def encode(
        self,
        inputs: Sequence[Input],
        *,
        instruction: str | None,
        truncate: bool,
        truncation_direction: Direction,
    ) -> list[Encoding]:
        texts: list[str] = []
        starts: list[int] = []
        for item in inputs:
            if isinstance(item, str):
                raise ValidationError(
                    "a generative reranker scores (query, document) pairs, not single texts"
                )
            if is_pair(item):
                query, document = str(item[0]), str(item[1])
                said = instruction
                if not truncate:  # refused before tokenizing, as any input is (TEI's rule)
                    self.tokenizer.check_chars((query, document))
                else:
                    # A megabyte-long document would take a second to tokenize whole, and the
                    # query and instruction go with every document. Both come before the
                    # document and truncation keeps them from their start (`_join`), so a
                    # cut on the right to the budget changes no kept token.
                    document = self.tokenizer.cut_long(document, truncation_direction, self.budget)
                    query = self.tokenizer.cut_long(query, "right", self.budget)
                    if said is not None:
                        said = self.tokenizer.cut_long(said, "right", self.budget)
                texts.append(format_pair(self.prompt, query, document, said))
                starts.append(document_start(self.prompt, query, said))
        formatted = iter(zip(self.tokenizer.encode_without_specials(texts), starts, strict=True))
        out: list[Encoding] = []
        for item in inputs:
            if is_pair(item):
                pair, start = next(formatted)
                out.append(self._join(pair, start, truncate, truncation_direction))
            else:
                out.extend(
                    self.tokenizer.encode(
                        [item], truncate=truncate, truncation_direction=truncation_direction
                    )
                )
        return out

    def _join(
        self, pair: Encoding, document_start: int, truncate: bool, direction: Direction
    ) -> Encoding:
        kept = pair.ids
        if len(kept) > self.budget:
            if not truncate:
                total = len(self.prefix_ids) + len(kept) + len(self.suffix_ids)
                raise InputTooLongError(total, self.tokenizer.max_input_length)
            # The tokens wholly before the document: a byte-level BPE token that starts at
            # the space before it ("Ġthe") is the document's first word, cut with the rest.
            head = sum(1 for _, end in pair.offsets if end <= document_start)
            if direction == "left" and head < self.budget:
                kept = kept[:head] + kept[len(kept) - (self.budget - head) :]
            else:
                kept = kept[: self.budget]
        ids = self.prefix_ids + kept + self.suffix_ids
        return Encoding(ids=ids, type_ids=(0,) * len(ids), offsets=((0, 0),) * len(ids))
