"""--dense-path: which Dense module goes into the graph. Pure logic on JSON files, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tei_export.checkpoint import read_checkpoint
from tei_export.cli import parser
from tei_export.errors import ExportError
from tei_export.plan import make_plan
from tei_runtime.manifest import Task

BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 384,
        "num_attention_heads": 12, "num_hidden_layers": 6, "max_position_embeddings": 512}
RERANKER = {**BERT, "architectures": ["BertForSequenceClassification"], "num_labels": 1}


def _stella_like(root: Path, config: dict[str, object] = BERT) -> Path:
    """modules.json applies 2_Dense_1024; 2_Dense_256 and 2_Dense_768 sit beside it unused."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text("{}")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense_1024",
         "type": "sentence_transformers.models.Dense"},
    ]
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    for width in (256, 768, 1024):
        (root / f"2_Dense_{width}").mkdir()
        (root / f"2_Dense_{width}" / "config.json").write_text(
            json.dumps({"in_features": 384, "out_features": width})
        )
    return root


def test_default_follows_modules_json(tmp_path: Path) -> None:
    plan = make_plan(read_checkpoint(_stella_like(tmp_path / "m")))
    assert [Path(d).name for d in plan.dense_dirs] == ["2_Dense_1024"]
    assert plan.hidden_size == 1024


def test_dense_path_picks_one_module(tmp_path: Path) -> None:
    plan = make_plan(read_checkpoint(_stella_like(tmp_path / "m")), dense_path="2_Dense_256")
    assert [Path(d).name for d in plan.dense_dirs] == ["2_Dense_256"]
    assert plan.hidden_size == 256
    assert plan.encoder_hidden_size == 384
    assert plan.outputs == ["token_embeddings", "sentence_embedding"]


@pytest.mark.parametrize("wanted", ["2_Dense_512", "1_Pooling", "../m", ""])
def test_missing_dense_path_lists_the_modules_present(tmp_path: Path, wanted: str) -> None:
    checkpoint = read_checkpoint(_stella_like(tmp_path / "m"))
    with pytest.raises(ExportError) as info:
        make_plan(checkpoint, dense_path=wanted)
    message = str(info.value)
    assert f"--dense-path {wanted}:" in message
    assert "2_Dense_1024, 2_Dense_256, 2_Dense_768" in message


def test_dense_path_is_for_embedders_only(tmp_path: Path) -> None:
    checkpoint = read_checkpoint(_stella_like(tmp_path / "m", RERANKER))
    assert make_plan(checkpoint).task is Task.RERANK
    with pytest.raises(ExportError, match="embedding models"):
        make_plan(checkpoint, dense_path="2_Dense_256")


def test_cli_flag() -> None:
    assert parser().parse_args(["m", "out"]).dense_path is None
    assert parser().parse_args(["m", "out", "--dense-path", "2_Dense_256"]).dense_path == (
        "2_Dense_256"
    )
