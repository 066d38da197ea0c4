"""The PyTorch side: load the checkpoint and wrap it into the module the graph is traced from.

The same wrapper is the reference the validation compares against, so trace and validation can
never disagree about what the graph is meant to compute.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from tei_export.cards import Head
from tei_export.errors import ExportError
from tei_export.plan import ExportPlan
from tei_runtime.manifest import Pooling


def pool(tokens: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    weights = mask.to(tokens.dtype)
    if pooling is Pooling.CLS:
        return tokens[:, 0]
    if pooling is Pooling.MEAN:
        summed = (tokens * weights.unsqueeze(-1)).sum(dim=1)
        return summed / weights.sum(dim=1, keepdim=True).clamp(min=1e-9)
    if pooling is Pooling.LAST_TOKEN:
        # Index of the last real token, whichever side the padding is on.
        positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
        last = (positions * mask).argmax(dim=1)
        return tokens[torch.arange(tokens.shape[0], device=tokens.device), last]
    raise ExportError(f"pooling {pooling.value} cannot run before a Dense layer")


class ExportModule(torch.nn.Module):
    """Positional graph inputs in `plan.inputs` order -> the outputs in `plan.outputs`."""

    def __init__(
        self,
        model: torch.nn.Module,
        plan: ExportPlan,
        dense: list[torch.nn.Module],
        answer_head: AnswerHead | None = None,
    ):
        super().__init__()
        self.model = model
        self.answer_head = answer_head
        self.dense = torch.nn.ModuleList(dense)
        self.input_names = list(plan.inputs)
        self.head = plan.head
        self.pooling = plan.pooling
        self.decoder = plan.card.decoder

    def forward(self, *inputs: torch.Tensor) -> Any:
        feeds = dict(zip(self.input_names, inputs, strict=True))
        mask = feeds["attention_mask"]
        out = self.model(**self._model_kwargs(feeds))
        if self.head is Head.SEQUENCE_CLASSIFICATION:
            return out["logits"]
        if self.head is Head.MASKED_LM:
            activations = torch.log1p(torch.relu(out["logits"])) * mask.unsqueeze(-1)
            return activations.max(dim=1).values
        tokens = out["last_hidden_state"]
        if self.answer_head is not None:
            return self.answer_head(pool(tokens, mask, Pooling.LAST_TOKEN))
        if not len(self.dense):
            return tokens
        assert self.pooling is not None
        pooled = pool(tokens, mask, self.pooling)
        for layer in self.dense:
            pooled = layer({"sentence_embedding": pooled})["sentence_embedding"]
        return tokens, pooled

    def _model_kwargs(self, feeds: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Keyword arguments only: transformers 5 signatures put use_cache & co where a
        positional call would land.

        Decoders, one path for every family: no KV cache (nothing in the graph outlives a
        call), and positions counted over real tokens only, so a left-padded row gets the
        positions its unpadded text has. transformers 5 then builds the 4-D mask from the
        2-D one by broadcasting index tensors, which traces with dynamic shapes: while
        tracing it never takes the "no padding, use is_causal" shortcut that would drop
        the mask from the graph.
        """
        if not self.decoder:
            return dict(feeds)
        kwargs: dict[str, Any] = dict(feeds)
        if "position_ids" not in kwargs:
            kwargs["position_ids"] = decoder_positions(feeds["attention_mask"])
        kwargs["use_cache"] = False
        return kwargs


class AnswerHead(torch.nn.Module):
    """A generative reranker's head: the LM head cut to the rows of its two answer tokens, so
    the graph computes two logits per row instead of the whole vocabulary's, and returns
    yes minus no ([batch, 1]) at the last real position."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, lm_head: torch.nn.Module, no_id: int, yes_id: int):
        super().__init__()
        weight = lm_head.weight
        bias = getattr(lm_head, "bias", None)
        assert isinstance(weight, torch.Tensor)
        rows = [no_id, yes_id]
        self.register_buffer("weight", weight.detach()[rows].clone())
        self.register_buffer("bias", None if bias is None else bias.detach()[rows].clone())

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(last, self.weight, self.bias)  # [batch, (no, yes)]
        return logits[:, 1:] - logits[:, :1]


def decoder_positions(mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row, whichever side the padding is on."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def _auto_class(head: Head) -> Any:
    import transformers

    return {
        Head.BASE: transformers.AutoModel,
        Head.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
        Head.MASKED_LM: transformers.AutoModelForMaskedLM,
        Head.CAUSAL_LM: transformers.AutoModelForCausalLM,
    }[head]


def load_module(plan: ExportPlan, path: Path, *, trust_remote_code: bool = False) -> ExportModule:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, loading = _auto_class(plan.head).from_pretrained(
                str(path),
                trust_remote_code=trust_remote_code,
                attn_implementation=plan.card.attn_implementation,
                dtype=torch.float32,
                output_loading_info=True,
            )
    except Exception as e:  # safetensors, pickle and config errors have no common base
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "ignore_mismatched_sizes" in reason:  # "... look at the above report!"
            reason = "a weight's shape does not match config.json (transformers' load report "
            reason += "names it; --quiet hides that report)"
        raise ExportError(f"{path}: cannot load the weights: {reason}") from e
    missing = needed_but_missing(loading.get("missing_keys", ()), plan.head)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ExportError(
            f"{path}: the checkpoint lacks weights the model needs (transformers would fill them "
            f"with random values): {', '.join(missing[:5])}{more}"
        )
    beyond = beyond_the_config(loading.get("unexpected_keys", ()), model.state_dict())
    if beyond:
        blocks = sorted({str(_first_numbered_prefix(k)) for k in beyond}, key=_natural)
        raise ExportError(
            f"{path}: the weights hold layers config.json has no room for, which the export "
            f"would silently drop (does config.json belong to these weights?): "
            f"{', '.join(b + '*' for b in blocks)} ({len(beyond)} weights)"
        )
    _check_finite(path, model)
    _restore_init_buffers(model)
    model.eval()
    answer_head = None
    if plan.generative_rerank is not None:
        # The decoder path as for an embedder, then the two answer rows of the LM head.
        prompt = plan.generative_rerank.prompt
        answer_head = AnswerHead(
            model.get_output_embeddings(), prompt.no_token_id, prompt.yes_token_id
        )
        model = model.base_model
    dense: list[torch.nn.Module] = []
    if plan.dense_dirs:
        from sentence_transformers.sentence_transformer.modules import Dense

        for folder in plan.dense_dirs:
            try:
                dense.append(Dense.load(str(folder)).eval())
            except Exception as e:  # a missing or broken weights file, in any of its forms
                reason = " ".join(str(e).split())
                raise ExportError(f"{folder}: cannot load the Dense module ({reason})") from e
    return ExportModule(model, plan, dense, answer_head).eval()


def _check_finite(path: Path, model: torch.nn.Module) -> None:
    """A NaN or infinite weight (a damaged or badly converted checkpoint) makes every output
    NaN: said here in one line, not as a failure deep in int8 calibration or validation.
    Parameters only: buffers may hold -inf on purpose (causal masks)."""
    damaged = [name for name, weight in model.named_parameters()
               if not bool(torch.isfinite(weight).all())]  # fmt: skip
    if damaged:
        more = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
        raise ExportError(
            f"{path}: the checkpoint's weights hold NaN or infinite values, so the model's "
            f"every output would too: {', '.join(damaged[:3])}{more}"
        )


def needed_but_missing(missing: Iterable[str], head: Head) -> list[str]:
    """The weights transformers reports missing from a checkpoint that the exported graph
    would use. A bare encoder's pooler is not used (pooling reads the hidden states), and
    embedding checkpoints often ship without it."""
    if head is not Head.BASE:
        return sorted(missing)
    return sorted(k for k in missing if ".pooler." not in f".{k}")


_NUMBERED = re.compile(r"(?:^|\.)\d+\.")


def _first_numbered_prefix(key: str) -> str | None:
    """`encoder.layer.7.` of `encoder.layer.7.attention.self.query.weight`."""
    found = _NUMBERED.search(key)
    return key[: found.end()] if found else None


def _natural(name: str) -> list[int | str]:
    """`layer.2.` before `layer.10.`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def beyond_the_config(unexpected: Iterable[str], model_keys: Iterable[str]) -> list[str]:
    """The checkpoint's weights transformers did not load that sit in a numbered block (a
    layer, an expert) the model built from config.json does not have: a config with fewer
    layers than its weights. A head the graph does not use (`cls.predictions.*`, a pooler)
    is unnumbered, and a stray tensor inside an existing layer is left to transformers'
    own report."""
    built = {p for k in model_keys if (p := _first_numbered_prefix(k)) is not None}
    return sorted(
        k for k in unexpected if (p := _first_numbered_prefix(k)) is not None and p not in built
    )


def _restore_init_buffers(model: Any) -> None:
    """transformers 5 builds a model on the meta device and leaves its non-persistent buffers
    to `_init_weights`; modeling code written for transformers 4 (JinaBERT's ALiBi table, ...)
    fills them in `__init__` instead, so they would come back uninitialised. For a checkpoint's
    own code, take them from an instance built the ordinary way."""
    if not type(model).__module__.startswith("transformers_modules"):
        return
    fresh = dict(type(model)(model.config).named_buffers())
    with torch.no_grad():
        for name, buffer in model.named_non_persistent_buffers():
            buffer.copy_(fresh[name])


# An attention implementation name of our own: transformers' sdpa attention with its sdpa mask
# built by broadcasting index tensors, never by vmap.
TRACEABLE_SDPA = "tei_traceable_sdpa"


def _register_traceable_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def traceable_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
        # transformers switches to vmap when a model overlays its own mask function (Gemma 3's
        # bidirectional window, EmbeddingGemma); TorchScript cannot trace vmap. Every overlay
        # the decoder cards meet is a function of the indices, which broadcasting computes
        # the same (checked against PyTorch by the validation and the parity tests).
        kwargs["use_vmap"] = False
        return additive_mask(sdpa_mask(*args, **kwargs), kwargs.get("dtype", torch.float32))

    AttentionInterface.register(TRACEABLE_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(TRACEABLE_SDPA, traceable_sdpa_mask)


# What a masked-out key adds to its score in the traced graph. Large enough that exp() of it
# is 0 in fp32 and fp16, small enough that score + MASKED stays finite in the fp16 variant
# (whose converter clips constants to +-65504, where a score of -20 more overflows to -inf).
MASKED = -1.0e4


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The boolean sdpa mask as 0 / MASKED, built once per forward.

    A boolean mask makes the ONNX export of each layer's attention turn it into 0 / -inf and
    then replace the NaN of a fully masked row (a padding query) by 0: a Where on the mask and
    an IsNaN + Where on every [batch, heads, length, length] weight tensor, ~4% of a Qwen3
    forward at 512 tokens. With a finite mask a padding row's weights are finite (it attends
    evenly and is never pooled), and a real row's masked weights are exp(-1e4) = 0 exactly as
    before.
    """
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.full((), MASKED, dtype=dtype, device=mask.device))


@contextlib.contextmanager
def traceable_attention(module: ExportModule, plan: ExportPlan) -> Iterator[None]:
    """While tracing a decoder, its sdpa attention builds masks in a way TorchScript traces.

    The PyTorch reference the validation compares against keeps transformers' own sdpa.
    """
    if not (plan.card.decoder and plan.card.attn_implementation == "sdpa"):
        yield
        return
    _register_traceable_sdpa()
    model: Any = module.model  # a transformers PreTrainedModel
    model.set_attn_implementation(TRACEABLE_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


def example_inputs(
    plan: ExportPlan, lengths: list[int], vocab_size: int, *, padding_side: str | None = None
) -> list[torch.Tensor]:
    """A right- or left-padded batch of random ids with the given true lengths (padded on
    the plan's side unless `padding_side` says otherwise)."""
    side = padding_side or plan.padding_side
    generator = torch.Generator().manual_seed(sum(lengths) * 7919 + len(lengths))
    batch, width = len(lengths), max(lengths)
    ids = torch.randint(3, max(4, vocab_size - 1), (batch, width), generator=generator)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        if side == "left":
            mask[row, width - length :] = 1
        else:
            mask[row, :length] = 1
    ids = ids * mask
    feeds = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "position_ids": decoder_positions(mask),
    }
    return [feeds[name] for name in plan.inputs]
