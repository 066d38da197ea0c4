"""ExportPlan: everything the export decides before touching torch. Pure, unit-tested."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tei_export.cards import Head, ModelCard, find_card
from tei_export.checkpoint import Checkpoint
from tei_export.errors import ExportError
from tei_runtime.manifest import Pooling, Precision, Task

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
    chosen_pooling = pooling or checkpoint.st_pooling
    detected = detect_task(checkpoint.architecture, checkpoint.labels, chosen_pooling)
    task = task or detected
    if task is Task.SPARSE:
        chosen_pooling = Pooling.SPLADE
    head = _head(task)
    if head not in card.heads:
        supported = ", ".join(h.value for h in card.heads)
        raise ExportError(
            f"{card.family}: the {head.value} head is not supported (card has: {supported})"
        )
    if task is Task.EMBED:
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
        padding_side=checkpoint.padding_side or card.padding_side,
        truncation_side=checkpoint.truncation_side or "right",
        labels=checkpoint.labels if task in (Task.RERANK, Task.CLASSIFY) else {},
        precisions=list(precisions or ALL_PRECISIONS),
        opset=opset,
        dense_dirs=[str(folder) for folder in dense],
    )


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
