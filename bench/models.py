"""The models a run measures: all-MiniLM-L6-v2 (real weights) and two random-weight models with
the shapes people serve, built from a transformers config (nothing is downloaded).

- `bert-base`: BAAI/bge-base-en-v1.5's config (12 layers, 768 wide, 12 heads, 3072 FFN, 512
  positions, vocab 30522), CLS pooling, normalized. Its tokenizer is all-MiniLM-L6-v2's, which
  is bert-base-uncased's WordPiece: the same 30522-entry vocab bge-base ships.
- `qwen3-0.6b`: Qwen/Qwen3-Embedding-0.6B's config (28 layers, hidden 1024, 16 query and 8 KV
  heads of 128, 3072 SwiGLU FFN, vocab 151669), last-token pooling, left padding, normalized.
  Its tokenizer is that same WordPiece (ids < 30522, all inside the 151669-row embedding table)
  with an end token appended, as Qwen3-Embedding appends <|endoftext|>: Qwen's own 151k BPE
  cannot be fetched here. Texts are cut to exact token counts with the model's own tokenizer,
  so the work per text is what the shape says; only which ids are looked up differs.

Checkpoints are saved as sentence-transformers folders (modules.json, pooling, Normalize) under
`<cache>/checkpoints/<key>-<digest>`, the digest covering the recipe below and the transformers
version, so both sentence-transformers and `tei-export` read the same random weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec

MODEL_KEYS = ("minilm", "bert-base", "qwen3-0.6b")


class BenchModel(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # minilm | bert-base | qwen3-0.6b: the results folder and --models name
    name: str  # what tables call it
    # Timed lengths: target tokens per text (special tokens included); "mixed" is always added
    # (log-normal, see texts.py) and, when not timed, still embedded for the cosine check.
    targets: dict[str, int]
    timed_mixed: bool  # whether the mixed pool is a timed length
    max_tokens: int  # texts are never longer (the model may accept more)
    # The small model: the full sizes (4 and 16 clients, 3 repeats) and both CPU graphs forced
    # by default; the big shapes run one repeat, one client and the runtime's own graph.
    full_stack: bool
    # fastembed's catalogue entry whose folder fastembed_dir.py makes from this checkpoint, and
    # the graph file that entry loads; "" where fastembed does not run the model.
    fastembed_name: str = ""
    fastembed_file: str = ""
    config: dict[str, Any]  # transformers config kwargs; empty for the bundled checkpoint
    pooling: str  # sentence-transformers pooling: cls | mean | lasttoken
    decoder: bool


BERT_BASE = {  # BAAI/bge-base-en-v1.5 config.json
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}

QWEN3_0_6B = {  # Qwen/Qwen3-Embedding-0.6B config.json; pad/bos/eos are the WordPiece's ids
    "model_type": "qwen3",
    "vocab_size": 151669,
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 101,
    "eos_token_id": 102,
}

MODELS = {
    "minilm": BenchModel(
        key="minilm",
        name="all-MiniLM-L6-v2",
        targets={"short": 16, "medium": 128, "long": 256},
        timed_mixed=True,
        max_tokens=256,
        full_stack=True,
        fastembed_name="sentence-transformers/all-MiniLM-L6-v2",
        fastembed_file="model.onnx",
        config={},
        pooling="mean",
        decoder=False,
    ),
    "bert-base": BenchModel(
        key="bert-base",
        name="BERT-base (bge-base-en-v1.5 shape, random weights)",
        targets={"short": 16, "long": 512},
        timed_mixed=False,
        max_tokens=512,
        full_stack=False,
        # fastembed's bge-base-en-v1.5 entry pools the CLS token and normalizes, as this
        # checkpoint does, so fastembed meets it on the same random weights.
        fastembed_name="BAAI/bge-base-en-v1.5",
        fastembed_file="model_optimized.onnx",
        config=BERT_BASE,
        pooling="cls",
        decoder=False,
    ),
    "qwen3-0.6b": BenchModel(
        key="qwen3-0.6b",
        name="Qwen3-0.6B shape (Qwen3-Embedding-0.6B config, random weights)",
        targets={"short": 16, "long": 512},
        timed_mixed=False,
        max_tokens=512,
        full_stack=False,
        # No fastembed entry: its Qwen3 one was not tried on the stand-in WordPiece tokenizer.
        # infinity-torch serves it (sentence-transformers' last-token pooling); its optimum
        # engine pools mean or CLS only.
        config=QWEN3_0_6B,
        pooling="lasttoken",
        decoder=True,
    ),
}


def recipe_digest(model: BenchModel, transformers_version: str) -> str:
    """Names the checkpoint folder: a changed config or transformers builds a new one."""
    blob = json.dumps([model.config, model.pooling, model.decoder, transformers_version, 2],
                      sort_keys=True)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def checkpoint(model: BenchModel, cache: Path, wordpiece_dir: Path) -> Path:
    """The model's sentence-transformers folder, built once into the cache."""
    import transformers

    out = cache / "checkpoints" / f"{model.key}-{recipe_digest(model, transformers.__version__)}"
    if (out / "modules.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_weights(model, tmp)
    _save_tokenizer(model, tmp, wordpiece_dir)
    _save_sentence_transformers(model, tmp)
    tmp.rename(out)
    return out


def _save_weights(model: BenchModel, dest: Path) -> None:
    import torch
    import transformers

    kwargs = dict(model.config)
    config = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    # The config's own initializer (normal, std 0.02): a trained model's scale, not a trained
    # model's values. Speed does not depend on the values; int8 error does (reported as such).
    net = transformers.AutoModel.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    net = net.eval()
    net.save_pretrained(dest)


def _save_tokenizer(model: BenchModel, dest: Path, wordpiece_dir: Path) -> None:
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(wordpiece_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    cfg = json.loads((wordpiece_dir / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = int(model.config["max_position_embeddings"])
    if model.decoder:
        sep = tok.token_to_id("[SEP]")
        # Decoder embedders append one end token and pool it (Qwen3-Embedding: <|endoftext|>).
        tok.post_processor = processors.TemplateProcessing(
            single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1", special_tokens=[("[SEP]", sep)]
        )
        cfg["padding_side"] = "left"
        cfg["model_input_names"] = ["input_ids", "attention_mask"]
        # transformers 5 rebuilds a BertTokenizer's template ([CLS] ... [SEP]) over the
        # tokenizer.json above: sentence-transformers then saw [CLS] that tei_runtime (like
        # TEI, reading tokenizer.json) does not, and the 2026-12-04 run's cosines were ~0.3.
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("vocab.txt", "special_tokens_map.json"):
        if (wordpiece_dir / name).exists():
            shutil.copy(wordpiece_dir / name, dest / name)


def _save_sentence_transformers(model: BenchModel, dest: Path) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (dest / "modules.json").write_text(json.dumps(modules, indent=1))
    modes = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}
    pooling: dict[str, Any] = {"word_embedding_dimension": int(model.config["hidden_size"])}
    pooling |= {f"pooling_mode_{m}": k == model.pooling for k, m in modes.items()}
    (dest / "1_Pooling").mkdir()
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=1))
    (dest / "2_Normalize").mkdir()
    st_config = {"max_seq_length": int(model.config["max_position_embeddings"]),
                 "do_lower_case": False}  # fmt: skip
    (dest / "sentence_bert_config.json").write_text(json.dumps(st_config))
