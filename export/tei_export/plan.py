"""ExportPlan: everything the export decides before touching torch. Pure, unit-tested."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tei_export.cards import Head, ModelCard, RerankerPrompt, find_card, load_cards
from tei_export.checkpoint import Checkpoint
from tei_export.errors import ExportError
from tei_runtime.manifest import AnswerPrompt, GenerativeRerank, Pooling, Precision, Task

ALL_PRECISIONS = (Precision.FP32, Precision.FP16, Precision.INT8)


class ExportPlan(msgspec.Struct, frozen=True, kw_only=True):
    card: ModelCard
    task: Task
    head: Head
    pooling: Pooling | None
    pooling_in_graph: bool
    normalize: bool
    max_input_length: int
    hidden_size: int
    """Width of the vectors the model returns (the last Dense layer's, if any)."""
    encoder_hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    inputs: list[str]
    outputs: list[str]
    padding_side: str
    truncation_side: str
    labels: dict[int, str]
    precisions: list[Precision]
    opset: int
    dense_dirs: list[str]
    """Dense module folders, applied in order after pooling."""
    generative_rerank: GenerativeRerank | None = None
    """A causal LM exported as a reranker: its prompt and answer token ids."""
    notes: list[str] = []
    """What the export says about options it did not follow (shown, not fatal)."""


def detect_task(architecture: str, labels: dict[int, str], pooling: Pooling | None) -> Task:
    """TEI's rule: a sequence-classification head with one label is a reranker, with more a
    classifier; a masked-LM head with splade pooling is sparse; everything else embeds."""
    if architecture.endswith("ForSequenceClassification"):
        return Task.RERANK if len(labels) <= 1 else Task.CLASSIFY
    if pooling is Pooling.SPLADE:
        if not architecture.endswith("ForMaskedLM"):
            raise ExportError(f"--pooling splade needs a *ForMaskedLM model, not {architecture}")
        return Task.SPARSE
    return Task.EMBED


def is_generative_reranker(architecture: str, task: Task) -> bool:
    """A causal LM is a generative reranker only when asked for (`--task rerank`): TEI's rule
    makes every *ForCausalLM an embedder, and Qwen3-Embedding and Qwen3-Reranker share one
    architecture name, so nothing in the checkpoint tells them apart reliably."""
    return task is Task.RERANK and architecture.endswith("ForCausalLM")


def answer_prompt(prompt: RerankerPrompt, tokenizer_json: Path) -> AnswerPrompt:
    """The card's prompt with its answer tokens resolved by the checkpoint's tokenizer (as the
    model card's `convert_tokens_to_ids("yes")`)."""
    import tokenizers  # type: ignore[import-untyped,unused-ignore]

    try:
        prompt.template.format(instruction="", query="", document="")
    except (KeyError, IndexError, ValueError) as e:
        raise ExportError(
            f"generative reranker template {prompt.template!r}: only the placeholders "
            f"{{instruction}}, {{query}} and {{document}} are allowed ({e!r})"
        ) from e
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    for marker in prompt.prompt_tokens:
        if tokenizer.token_to_id(marker) is None:
            raise ExportError(
                f"{tokenizer_json}: the prompt token {marker!r} is not in the vocabulary; the "
                f"family's generative reranker prompt needs "
                f"{', '.join(map(repr, prompt.prompt_tokens))} as single tokens (a "
                f"Qwen3-Reranker-style tokenizer), else its scores mean nothing"
            )
    ids = {}
    for token in (prompt.yes_token, prompt.no_token):
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ExportError(
                f"{tokenizer_json}: the answer token {token!r} is not in the vocabulary; a "
                f"generative reranker answers with single {prompt.yes_token!r} / "
                f"{prompt.no_token!r} tokens"
            )
        ids[token] = int(found)
    return AnswerPrompt(
        prefix=prompt.prefix,
        template=prompt.template,
        suffix=prompt.suffix,
        default_instruction=prompt.default_instruction,
        yes_token=prompt.yes_token,
        no_token=prompt.no_token,
        yes_token_id=ids[prompt.yes_token],
        no_token_id=ids[prompt.no_token],
    )


def _generative_rerank(card: ModelCard, checkpoint: Checkpoint) -> GenerativeRerank:
    if card.generative_reranker is None:
        having = [c.family for c in load_cards() if c.generative_reranker is not None]
        raise ExportError(
            f"--task rerank on {checkpoint.architecture}: the {card.family} card has no "
            f"generative reranker prompt (families with one: {', '.join(having) or 'none'})"
        )
    prompt = answer_prompt(card.generative_reranker, checkpoint.path / "tokenizer.json")
    return GenerativeRerank(prompt=prompt)


def _head(task: Task) -> Head:
    if task in (Task.RERANK, Task.CLASSIFY):
        return Head.SEQUENCE_CLASSIFICATION
    if task is Task.SPARSE:
        return Head.MASKED_LM
    return Head.BASE


def _int(config: dict[str, object], key: str, what: str) -> int:
    value = config.get(key)
    if not isinstance(value, int):
        raise ExportError(f"config.json has no integer {key!r} ({what})")
    return value


def _padding_side(asked: str | None, card: ModelCard, notes: list[str]) -> str:
    """Where the batch pads. An encoder pads on the right whatever its tokenizer says:
    sentence-transformers' vectors do not depend on the side (positions and masks follow
    the tokens), but the fused Attention's mask and the validation's reference are written
    for right padding. A decoder takes its tokenizer's side (last-token pooling reads it)."""
    if card.decoder or asked in (None, "right"):
        return asked or card.padding_side
    notes.append(
        f"the tokenizer pads on the {asked}; this encoder's batches pad on the right (the "
        "vectors are the same either way)"
    )
    return "right"


def make_plan(
    checkpoint: Checkpoint,
    *,
    task: Task | None = None,
    pooling: Pooling | None = None,
    precisions: list[Precision] | None = None,
    trust_remote_code: bool = False,
    opset: int = 17,
    dense_path: str | None = None,
) -> ExportPlan:
    if checkpoint.trust_remote_code_needed and not trust_remote_code:
        raise ExportError(
            f"{checkpoint.path}: {checkpoint.architecture} exists only as the model's own code "
            f"(auto_map in config.json) and has no native mapping; review that code and pass "
            f"--trust-remote-code to run it"
        )
    card = find_card(
        checkpoint.model_type,
        checkpoint.architecture,
        remote_code=checkpoint.trust_remote_code_needed,
    )
    if card.fusion.min_opset is not None and opset < card.fusion.min_opset:
        raise ExportError(
            f"{card.family} needs --opset {card.fusion.min_opset} or higher (given {opset}): "
            f"{card.fusion.min_opset_reason}"
        )
    remote_runs = trust_remote_code and (
        checkpoint.trust_remote_code_needed or checkpoint.own_code_skipped
    )
    if (
        card.decoder
        and checkpoint.config.get("is_causal") is False
        and not checkpoint.config.get("use_bidirectional_attention")
        and not remote_runs
    ):
        raise ExportError(
            f"{checkpoint.path}: config.json sets is_causal false (bidirectional attention), "
            f"which transformers' {checkpoint.architecture} does not have: its vectors would "
            f"not be the model's; --trust-remote-code runs the model's own code if it ships one"
        )
    notes: list[str] = []
    chosen_pooling = pooling or checkpoint.st_pooling
    detected = detect_task(checkpoint.architecture, checkpoint.labels, chosen_pooling)
    task = task or detected
    scored = task in (Task.RERANK, Task.CLASSIFY)
    if pooling is not None and (scored or (task is Task.SPARSE and pooling is not Pooling.SPLADE)):
        # TEI warns and goes on the same way: a head's scores and SPLADE pool themselves.
        notes.append(f"--pooling {pooling.value} ignored: a {task.value} model pools itself")
    if task is Task.SPARSE:
        chosen_pooling = Pooling.SPLADE
    generative = is_generative_reranker(checkpoint.architecture, task)
    if (
        task in (Task.RERANK, Task.CLASSIFY)
        and not generative
        and checkpoint.architecture != "unknown"
        and not checkpoint.architecture.endswith("ForSequenceClassification")
    ):
        # transformers would load a fresh random head: every score would be noise.
        raise ExportError(
            f"{checkpoint.path}: {checkpoint.architecture} has no classification head; "
            f"--task {task.value} needs a *ForSequenceClassification checkpoint"
        )
    if task is Task.RERANK and not generative and len(checkpoint.labels) > 1:
        # TEI serves a one-label head as a reranker and a several-label one as a classifier;
        # a reranker's score is one relevance logit, so label 0 alone would be a wrong score.
        raise ExportError(
            f"{checkpoint.path}: --task rerank needs a one-label head (a relevance logit); "
            f"this one has {len(checkpoint.labels)} labels: export it with --task classify"
        )
    if (
        task is Task.SPARSE
        and checkpoint.architecture != "unknown"
        and not checkpoint.architecture.endswith("ForMaskedLM")
    ):
        raise ExportError(
            f"{checkpoint.path}: {checkpoint.architecture} has no masked-LM head; --task "
            f"sparse (SPLADE) needs a *ForMaskedLM checkpoint"
        )
    generative_rerank = _generative_rerank(card, checkpoint) if generative else None
    head = Head.CAUSAL_LM if generative else _head(task)
    if head not in card.heads:
        supported = ", ".join(h.value for h in card.heads)
        raise ExportError(
            f"{card.family}: the {head.value} head is not supported (card has: {supported})"
        )
    if task is Task.EMBED:
        if pooling is None and checkpoint.st_pooling_unsupported is not None:
            raise ExportError(
                f"{checkpoint.st_pooling_file or checkpoint.path / '1_Pooling'}: pooling "
                f"{checkpoint.st_pooling_unsupported} is not supported; tei-onnx pools by cls, "
                f"mean or last-token (pass --pooling to choose one)"
            )
        if chosen_pooling is Pooling.SPLADE:
            raise ExportError("splade pooling needs --task sparse and a *ForMaskedLM model")
        chosen_pooling = chosen_pooling or card.default_pooling
    elif task in (Task.RERANK, Task.CLASSIFY):
        chosen_pooling = None

    config = checkpoint.config
    aliases = card.aliases
    hidden = _int(config, aliases.hidden_size, "hidden size")
    heads = _int(config, aliases.num_attention_heads, "attention heads")
    layers = _int(config, aliases.num_hidden_layers, "layers")
    positions = _int(config, aliases.max_position_embeddings, "max positions")
    max_len = positions - card.position_offset
    if checkpoint.max_seq_length:
        max_len = min(max_len, checkpoint.max_seq_length)
    if generative and card.generative_reranker and card.generative_reranker.max_length:
        max_len = min(max_len, card.generative_reranker.max_length)

    if dense_path is not None and task is not Task.EMBED:
        raise ExportError(f"--dense-path applies to embedding models, not to task {task.value}")
    if task is not Task.EMBED:
        dense = []
    elif dense_path is not None:
        dense = [choose_dense(checkpoint.path, dense_path)]
    else:
        dense = checkpoint.dense_dirs
    pooling_in_graph = bool(dense) or task is Task.SPARSE
    if task is Task.EMBED:
        outputs = ["token_embeddings"] + (["sentence_embedding"] if dense else [])
    elif task is Task.SPARSE:
        outputs = ["sparse_embedding"]
    else:
        outputs = ["logits"]

    return ExportPlan(
        card=card,
        task=task,
        head=head,
        pooling=chosen_pooling,
        pooling_in_graph=pooling_in_graph,
        normalize=checkpoint.normalize if task is Task.EMBED else False,
        max_input_length=max_len,
        hidden_size=_dense_out_features(dense[-1]) if dense else hidden,
        encoder_hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        inputs=list(card.inputs),
        outputs=outputs,
        padding_side=_padding_side(checkpoint.padding_side, card, notes),
        truncation_side=checkpoint.truncation_side or "right",
        labels=_labels(checkpoint, task, generative_rerank),
        precisions=list(precisions or ALL_PRECISIONS),
        opset=opset,
        dense_dirs=[str(folder) for folder in dense],
        generative_rerank=generative_rerank,
        notes=notes,
    )


def _labels(
    checkpoint: Checkpoint, task: Task, generative: GenerativeRerank | None
) -> dict[int, str]:
    if generative is not None:
        # One score, the probability of the "yes" answer.
        return {0: generative.prompt.yes_token}
    return checkpoint.labels if task in (Task.RERANK, Task.CLASSIFY) else {}


def choose_dense(root: Path, dense_path: str) -> Path:
    """The one Dense folder `--dense-path` names (stella-style checkpoints ship several,
    2_Dense_256, 2_Dense_1024, ...; modules.json lists the one applied by default)."""
    folder = root / dense_path
    if folder.resolve().is_relative_to(root.resolve()) and _is_dense(folder):
        return folder
    present = sorted(p.name for p in root.iterdir() if _is_dense(p))
    raise ExportError(
        f"--dense-path {dense_path}: {folder} is not a Dense module (a folder whose "
        f"config.json has out_features); Dense modules present: {', '.join(present) or 'none'}"
    )


def _is_dense(folder: Path) -> bool:
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "out_features" in config


def _dense_out_features(folder: Path) -> int:
    import json

    try:
        return int(json.loads((folder / "config.json").read_text())["out_features"])
    except (OSError, KeyError, ValueError) as e:
        raise ExportError(f"{folder}: unreadable Dense config ({e})") from e
