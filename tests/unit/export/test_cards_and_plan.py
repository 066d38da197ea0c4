"""Model cards, checkpoint reading and export planning: pure logic on JSON files, no torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from tei_export.cards import (
    CardError,
    Head,
    PlainGraphCpus,
    find_card,
    load_cards,
    supported_model_types,
)
from tei_export.checkpoint import read_checkpoint
from tei_export.errors import ExportError
from tei_export.fuse import check_fusion, expected_counts
from tei_export.plan import detect_task, make_plan
from tei_runtime.host import CpuClass
from tei_runtime.manifest import Pooling, Precision, Task

ISSUE_FAMILIES = {
    "bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "modernbert",
    "qwen2", "qwen3", "mistral", "gemma3", "deberta-v2",
}


def test_every_required_family_has_a_card() -> None:
    families = {card.family for card in load_cards()}
    assert families >= ISSUE_FAMILIES


@pytest.mark.parametrize("family", ["bert", "roberta", "xlm-roberta", "modernbert"])
def test_sequence_classification_heads(family: str) -> None:
    card = next(c for c in load_cards() if c.family == family)
    assert Head.SEQUENCE_CLASSIFICATION in card.heads


def test_bert_has_the_masked_lm_head_for_splade() -> None:
    assert Head.MASKED_LM in find_card("bert", "BertForMaskedLM").heads


def test_plain_graph_classes_per_precision() -> None:
    # bert.toml: the fused graphs were measured faster on both classes (AVX2 under the bench's
    # CPUID mask), so no class loads the plain one.
    bert = find_card("bert", "BertModel").fusion.plain_graph_cpus
    assert [bert.for_precision(p) for p in Precision] == [[], [], []]
    plain = msgspec.convert({"fp32": ["avx2"], "int8": ["avx2"]}, PlainGraphCpus)
    assert plain.for_precision(Precision.FP32) == [CpuClass.AVX2]
    assert plain.for_precision(Precision.INT8) == [CpuClass.AVX2]
    assert plain.for_precision(Precision.FP16) == []  # GPUs keep the fused graph
    with pytest.raises(msgspec.ValidationError, match="int8 classes need fp32 classes"):
        msgspec.convert({"int8": ["avx512"]}, PlainGraphCpus)


def test_model_types_are_unique_across_cards() -> None:
    types = [t for card in load_cards() for t in card.model_types]
    assert len(types) == len(set(types))


def test_cards_without_attention_fusion_say_why() -> None:
    for card in load_cards():
        expects_attention = any("Attention" in op for op in card.fusion.expected_per_layer)
        assert expects_attention or card.fusion.attention_unfused_reason, card.family


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    with pytest.raises(CardError) as info:
        find_card("gpt2", "GPT2Model")
    message = str(info.value)
    assert "GPT2Model" in message
    for model_type in supported_model_types():
        assert model_type in message


@pytest.mark.parametrize(
    ("architecture", "labels", "pooling", "task"),
    [
        ("BertForSequenceClassification", {0: "LABEL_0"}, None, Task.RERANK),
        ("BertForSequenceClassification", {}, None, Task.RERANK),
        ("RobertaForSequenceClassification", {0: "neg", 1: "pos"}, None, Task.CLASSIFY),
        ("BertForMaskedLM", {}, Pooling.SPLADE, Task.SPARSE),
        ("BertForMaskedLM", {}, None, Task.EMBED),
        ("BertModel", {}, Pooling.MEAN, Task.EMBED),
        ("Qwen3ForCausalLM", {}, Pooling.LAST_TOKEN, Task.EMBED),
    ],
)
def test_detect_task_follows_tei(
    architecture: str, labels: dict[int, str], pooling: Pooling | None, task: Task
) -> None:
    assert detect_task(architecture, labels, pooling) is task


def test_splade_needs_a_masked_lm() -> None:
    with pytest.raises(ExportError, match="ForMaskedLM"):
        detect_task("BertModel", {}, Pooling.SPLADE)


def _folder(
    root: Path,
    config: dict[str, object],
    *,
    tokenizer: bool = True,
    files: dict[str, object] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    for name, content in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(content))
    return root


BERT = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 384,
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "max_position_embeddings": 512,
}


def _st_files(pooling_key: str, *, dense: bool = False) -> dict[str, object]:
    modules: list[dict[str, object]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]
    files: dict[str, object] = {
        "1_Pooling/config.json": {"word_embedding_dimension": 384, pooling_key: True},
        "sentence_bert_config.json": {"max_seq_length": 256},
        "config_sentence_transformers.json": {
            "prompts": {"query": "query: ", "document": "passage: "},
            "default_prompt_name": "query",
        },
    }
    if dense:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        )
        files["2_Dense/config.json"] = {"in_features": 384, "out_features": 128}
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Normalize",
         "type": "sentence_transformers.models.Normalize"}
    )
    files["modules.json"] = modules
    return files


@pytest.mark.parametrize(("name", "content", "says"), [
    ("config.json", [], "config.json: expected a JSON object, found a list"),
    ("modules.json", {"not": "a list"}, "modules.json: expected a list of modules"),
    ("modules.json", ["Pooling"], "modules.json: expected a list of modules"),
    ("config_sentence_transformers.json", {"prompts": ["query: "]},
     "`prompts`: expected an object of names to strings"),
    ("config_sentence_transformers.json",
     {"prompts": {"query": "q: "}, "default_prompt_name": "nope"},
     "default_prompt_name 'nope' is not one of its prompts (query)"),
    ("config_sentence_transformers.json", {"default_prompt_name": "query"},
     "default_prompt_name 'query' is not one of its prompts (none)"),
    ("sentence_bert_config.json", "256", "expected a JSON object, found a string"),
    ("tokenizer_config.json", [1], "expected a JSON object, found a list"),
])  # fmt: skip
def test_malformed_files_are_named_errors(
    tmp_path: Path, name: str, content: object, says: str
) -> None:
    folder = _folder(tmp_path / "m", BERT)
    (folder / name).write_text(json.dumps(content))
    with pytest.raises(ExportError, match=re.escape(says)):
        read_checkpoint(folder)


def test_labels_must_map_class_numbers_to_names(tmp_path: Path) -> None:
    for id2label in ({"zero": "a"}, {"0": 1}, ["a", "b"]):
        folder = _folder(tmp_path / str(len(list(tmp_path.iterdir()))),
                         {**BERT, "id2label": id2label})  # fmt: skip
        with pytest.raises(ExportError, match="id2label"):
            read_checkpoint(folder)


def test_reads_sentence_transformers_files(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", BERT, files=_st_files("pooling_mode_mean_tokens", dense=True))
    checkpoint = read_checkpoint(folder)
    assert checkpoint.st_pooling is Pooling.MEAN
    assert checkpoint.normalize
    assert checkpoint.max_seq_length == 256
    assert checkpoint.prompts == {"query": "query: ", "document": "passage: "}
    assert checkpoint.default_prompt_name == "query"
    assert [p.name for p in checkpoint.dense_dirs] == ["2_Dense"]

    plan = make_plan(checkpoint)
    assert plan.task is Task.EMBED
    assert plan.pooling is Pooling.MEAN
    assert plan.max_input_length == 256
    assert plan.hidden_size == 128  # the Dense output, not the encoder's width
    assert plan.encoder_hidden_size == 384
    assert plan.outputs == ["token_embeddings", "sentence_embedding"]
    assert plan.pooling_in_graph


@pytest.mark.parametrize(
    ("key", "pooling"),
    [
        ("pooling_mode_cls_token", Pooling.CLS),
        ("pooling_mode_mean_tokens", Pooling.MEAN),
        ("pooling_mode_lasttoken", Pooling.LAST_TOKEN),
    ],
)
def test_pooling_modes(tmp_path: Path, key: str, pooling: Pooling) -> None:
    checkpoint = read_checkpoint(_folder(tmp_path / "m", BERT, files=_st_files(key)))
    assert checkpoint.st_pooling is pooling


def _st6_files(pooling_mode: object, **pooling: object) -> dict[str, object]:
    """What sentence-transformers 6.x saves: modules named by class path, one `pooling_mode`
    key, the length limit in tokenizer_config.json only."""
    kinds = {"": "base.modules.transformer.Transformer",
             "1_Pooling": "sentence_transformer.modules.pooling.Pooling",
             "2_Dense": "base.modules.dense.Dense",
             "3_Normalize": "base.modules.normalize.Normalize",
             "4_Extra": "sentence_transformer.modules.layer_norm.LayerNorm"}  # fmt: skip
    return {
        "modules.json": [{"idx": i, "name": str(i), "path": path,
                          "type": f"sentence_transformers.{kind}"}
                         for i, (path, kind) in enumerate(kinds.items())],
        "1_Pooling/config.json": {"embedding_dimension": 384, "pooling_mode": pooling_mode,
                                  **pooling},
        "2_Dense/config.json": {"in_features": 384, "out_features": 64},
        "sentence_bert_config.json": {"transformer_task": "feature-extraction"},
        "tokenizer_config.json": {"model_max_length": 200},
        "config_sentence_transformers.json": {"prompts": {"query": "query: "}},
    }


def test_reads_what_sentence_transformers_6_saves(tmp_path: Path) -> None:
    checkpoint = read_checkpoint(_folder(tmp_path / "m", BERT, files=_st6_files("mean")))
    assert checkpoint.st_pooling is Pooling.MEAN and checkpoint.pools_prompt
    assert checkpoint.normalize
    assert [p.name for p in checkpoint.dense_dirs] == ["2_Dense"]
    assert checkpoint.max_seq_length == 200
    assert checkpoint.ignored_modules == [
        "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm"]
    plan = make_plan(checkpoint)
    assert (plan.pooling, plan.max_input_length, plan.hidden_size) == (Pooling.MEAN, 200, 64)
    for mode, pooling in (("cls", Pooling.CLS), (["lasttoken"], Pooling.LAST_TOKEN)):
        folder = _folder(tmp_path / str(pooling), BERT, files=_st6_files(mode))
        assert read_checkpoint(folder).st_pooling is pooling
    no_prompt = read_checkpoint(
        _folder(tmp_path / "p", BERT, files=_st6_files("mean", include_prompt=False)))
    assert not no_prompt.pools_prompt


@pytest.mark.parametrize("mode", ["max", "weightedmean", ["cls", "mean"]])
def test_unsupported_pooling_is_an_error_unless_pooling_is_given(
    tmp_path: Path, mode: object
) -> None:
    checkpoint = read_checkpoint(_folder(tmp_path / "m", BERT, files=_st6_files(mode)))
    assert checkpoint.st_pooling is None
    with pytest.raises(ExportError, match=r"is not supported.*--pooling"):
        make_plan(checkpoint)
    assert make_plan(checkpoint, pooling=Pooling.MEAN).pooling is Pooling.MEAN


def test_the_tokenizer_limit_applies_when_it_is_a_real_one(tmp_path: Path) -> None:
    for limit, expected in ((100, 100), (10**30, 512), (0, 512)):
        files = {"tokenizer_config.json": {"model_max_length": limit}}
        folder = _folder(tmp_path / str(limit), BERT, files=files)
        assert make_plan(read_checkpoint(folder)).max_input_length == expected
    both = {"tokenizer_config.json": {"model_max_length": 100},
            "sentence_bert_config.json": {"max_seq_length": 256}}  # fmt: skip
    # sentence_bert_config.json's limit wins, as in sentence-transformers; positions cap it.
    assert make_plan(read_checkpoint(_folder(tmp_path / "b", BERT, files=both))
                     ).max_input_length == 256  # fmt: skip


@pytest.mark.parametrize("task", [Task.RERANK, Task.CLASSIFY])
def test_a_head_task_on_a_model_without_one_is_refused(tmp_path: Path, task: Task) -> None:
    checkpoint = read_checkpoint(_folder(tmp_path / "m", BERT))
    with pytest.raises(ExportError, match=r"BertModel has no classification head"):
        make_plan(checkpoint, task=task)


def test_a_task_the_head_cannot_answer_is_refused_at_plan_time(tmp_path: Path) -> None:
    """A several-label classifier is no reranker (TEI serves it as a classifier), and SPLADE
    needs the masked-LM head: both refused before any weight is loaded."""
    labels = {"id2label": {"0": "neg", "1": "neu", "2": "pos"}}
    cls = {**BERT, "architectures": ["BertForSequenceClassification"], **labels}
    checkpoint = read_checkpoint(_folder(tmp_path / "cls", cls))
    with pytest.raises(ExportError, match=r"one-label head.*3 labels.*--task classify"):
        make_plan(checkpoint, task=Task.RERANK)
    assert make_plan(checkpoint, task=Task.CLASSIFY).task is Task.CLASSIFY
    one = {**BERT, "architectures": ["BertForSequenceClassification"],
           "id2label": {"0": "LABEL_0"}}  # fmt: skip
    assert make_plan(read_checkpoint(_folder(tmp_path / "rr", one)), task=Task.RERANK).task is (
        Task.RERANK)
    with pytest.raises(ExportError, match=r"BertModel has no masked-LM head"):
        make_plan(read_checkpoint(_folder(tmp_path / "m", BERT)), task=Task.SPARSE)


def test_a_pooling_module_without_its_config_is_refused(tmp_path: Path) -> None:
    """modules.json naming a Pooling folder that is not there: sentence-transformers refuses
    to load it, so no family default stands in for it."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    folder = _folder(tmp_path / "m", BERT, files={"modules.json": modules})
    with pytest.raises(ExportError, match=r"1_Pooling/config.json: modules.json lists a Pooling"):
        read_checkpoint(folder)


def test_pooling_flag_overrides_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = read_checkpoint(
        _folder(tmp_path / "m", BERT, files=_st_files("pooling_mode_mean_tokens"))
    )
    assert make_plan(checkpoint, pooling=Pooling.CLS).pooling is Pooling.CLS


def test_card_default_pooling_without_sentence_transformers_files(tmp_path: Path) -> None:
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", BERT)))
    assert plan.pooling is find_card("bert", "BertModel").default_pooling
    assert plan.max_input_length == 512
    assert not plan.normalize


def test_roberta_positions_lose_the_padding_offset(tmp_path: Path) -> None:
    config = {**BERT, "model_type": "roberta", "architectures": ["RobertaModel"],
              "max_position_embeddings": 514}
    assert make_plan(read_checkpoint(_folder(tmp_path / "m", config))).max_input_length == 512


def test_distilbert_aliases(tmp_path: Path) -> None:
    config = {"model_type": "distilbert", "architectures": ["DistilBertModel"], "dim": 768,
              "n_heads": 12, "n_layers": 6, "max_position_embeddings": 512}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)))
    assert (plan.hidden_size, plan.num_attention_heads, plan.num_hidden_layers) == (768, 12, 6)
    assert plan.inputs == ["input_ids", "attention_mask"]


def test_classifier_keeps_its_labels_and_drops_pooling(tmp_path: Path) -> None:
    config = {**BERT, "architectures": ["BertForSequenceClassification"],
              "id2label": {"0": "negative", "1": "neutral", "2": "positive"}}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)))
    assert plan.task is Task.CLASSIFY
    assert plan.labels == {0: "negative", 1: "neutral", 2: "positive"}
    assert plan.pooling is None
    assert plan.outputs == ["logits"]
    assert plan.notes == []
    # an explicit --pooling is not followed by a head that scores: said, as TEI warns
    for pooling in (Pooling.MEAN, Pooling.SPLADE):
        told = make_plan(read_checkpoint(_folder(tmp_path / "m", config)), pooling=pooling)
        assert told.pooling is None and told.task is Task.CLASSIFY
        assert told.notes == [f"--pooling {pooling.value} ignored: a classify model pools itself"]


@pytest.mark.parametrize(("count", "task"), [(3, Task.CLASSIFY), (1, Task.RERANK)])
def test_a_label_count_without_names_gets_transformers_names(
    tmp_path: Path, count: int, task: Task
) -> None:
    """A hand-written config (remote-code checkpoints ship them) may give only num_labels:
    the head has that many outputs, named as transformers names them."""
    config = {**BERT, "architectures": ["BertForSequenceClassification"], "num_labels": count}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)))
    assert plan.task is task
    assert plan.labels == {i: f"LABEL_{i}" for i in range(count)}


def test_a_classifier_saved_with_transformers_default_labels_has_two(tmp_path: Path) -> None:
    """transformers 5 writes no id2label or num_labels for its default of two labels: the
    head is a two-class classifier, never a reranker with no labels."""
    config = {**BERT, "architectures": ["DebertaV2ForSequenceClassification"],
              "model_type": "deberta-v2"}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)))
    assert plan.task is Task.CLASSIFY
    assert plan.labels == {0: "LABEL_0", 1: "LABEL_1"}


def _sparse_encoder(root: Path, splade: dict[str, object] | None) -> Path:
    """A sentence-transformers SparseEncoder folder: MLMTransformer, then SpladePooling."""
    modules = [
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.models.SpladePooling"},
    ]  # fmt: skip
    files: dict[str, object] = {"modules.json": modules}
    if splade is not None:
        files["1_SpladePooling/config.json"] = splade
    folder = _folder(root, {**BERT, "architectures": ["BertForMaskedLM"]}, files=files)
    (folder / "1_SpladePooling").mkdir(exist_ok=True)
    return folder


@pytest.mark.parametrize(
    "splade", [None, {"pooling_strategy": "max", "activation_function": "relu"}]
)
def test_a_sparse_encoder_folder_is_exported_sparse(
    tmp_path: Path, splade: dict[str, object] | None
) -> None:
    plan = make_plan(read_checkpoint(_sparse_encoder(tmp_path / "m", splade)))
    assert plan.task is Task.SPARSE and plan.pooling is Pooling.SPLADE
    assert plan.outputs == ["sparse_embedding"]


def test_a_splade_pooling_tei_lacks_is_refused(tmp_path: Path) -> None:
    folder = _sparse_encoder(tmp_path / "m", {"pooling_strategy": "sum"})
    with pytest.raises(ExportError, match=r"SpladePooling sum/relu"):
        make_plan(read_checkpoint(folder))


def test_tokenizer_json_sides_apply_where_the_tokenizer_config_names_none(
    tmp_path: Path,
) -> None:
    """transformers pads and truncates where tokenizer.json says unless tokenizer_config.json
    says otherwise, and sentence-transformers follows it."""
    folder = _folder(tmp_path / "m", BERT)
    own = {"truncation": {"direction": "Left", "max_length": 8, "strategy": "LongestFirst",
                          "stride": 0}, "padding": None}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(own))
    assert read_checkpoint(folder).truncation_side == "left"
    assert make_plan(read_checkpoint(folder)).truncation_side == "left"
    (folder / "tokenizer_config.json").write_text(json.dumps({"truncation_side": "right"}))
    assert read_checkpoint(folder).truncation_side == "right"


def test_task_override(tmp_path: Path) -> None:
    config = {**BERT, "architectures": ["BertForMaskedLM"]}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)), task=Task.SPARSE)
    assert plan.task is Task.SPARSE
    assert plan.pooling is Pooling.SPLADE
    assert plan.outputs == ["sparse_embedding"]


def test_head_missing_from_the_card_is_an_error(tmp_path: Path) -> None:
    config = {**BERT, "model_type": "mpnet", "architectures": ["MPNetForSequenceClassification"]}
    with pytest.raises(ExportError, match="head is not supported"):
        make_plan(read_checkpoint(_folder(tmp_path / "m", config)))


def test_decoder_padding_side_comes_from_the_tokenizer_config(tmp_path: Path) -> None:
    config = {"model_type": "qwen3", "architectures": ["Qwen3Model"], "hidden_size": 64,
              "num_attention_heads": 4, "num_hidden_layers": 2, "max_position_embeddings": 256}
    folder = _folder(tmp_path / "m", config,
                     files={"tokenizer_config.json": {"padding_side": "right"}})
    plan = make_plan(read_checkpoint(folder))
    assert plan.padding_side == "right"
    assert plan.pooling is Pooling.LAST_TOKEN
    assert "position_ids" in plan.inputs


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"no tokenizer\.json"):
        read_checkpoint(_folder(tmp_path / "m", BERT, tokenizer=False))


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(ExportError, match=r"no config\.json"):
        read_checkpoint(tmp_path / "empty")


def test_broken_json_names_the_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", BERT)
    (folder / "modules.json").write_text("{not json")
    with pytest.raises(ExportError, match=r"modules\.json"):
        read_checkpoint(folder)


def test_remote_code_needs_the_flag(tmp_path: Path) -> None:
    config = {
        **BERT, "architectures": ["CustomBertModel"],
        "auto_map": {"AutoModel": "modeling_custom.CustomBertModel"},
    }  # fmt: skip
    checkpoint = read_checkpoint(_folder(tmp_path / "m", config))
    assert checkpoint.trust_remote_code_needed and not checkpoint.own_code_skipped
    with pytest.raises(ExportError, match="--trust-remote-code"):
        make_plan(checkpoint)
    assert make_plan(checkpoint, trust_remote_code=True).task is Task.EMBED


def test_an_auto_map_beside_a_native_class_traces_the_native_class(tmp_path: Path) -> None:
    """gte-Qwen2-style: config.json names transformers' own class and carries an auto_map;
    as TEI, the native implementation is used, the model's code only when asked for."""
    config = {**BERT, "auto_map": {"AutoModel": "modeling_custom.BertModel"}}
    checkpoint = read_checkpoint(_folder(tmp_path / "m", config))
    assert checkpoint.own_code_skipped and not checkpoint.trust_remote_code_needed
    assert make_plan(checkpoint).task is Task.EMBED


def test_a_decoder_asking_for_bidirectional_attention_is_refused(tmp_path: Path) -> None:
    config = {
        "model_type": "qwen2", "architectures": ["Qwen2Model"], "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
        "vocab_size": 100, "is_causal": False,
    }  # fmt: skip
    checkpoint = read_checkpoint(_folder(tmp_path / "m", config))
    with pytest.raises(ExportError, match="is_causal false"):
        make_plan(checkpoint)
    checkpoint = read_checkpoint(_folder(tmp_path / "c", {**config, "is_causal": True}))
    assert make_plan(checkpoint).task is Task.EMBED


def test_unsupported_model_type_in_a_plan(tmp_path: Path) -> None:
    config = {**BERT, "model_type": "gpt2", "architectures": ["GPT2Model"]}
    with pytest.raises(CardError, match="supported families"):
        make_plan(read_checkpoint(_folder(tmp_path / "m", config)))


def test_fusion_check_counts_per_layer(tmp_path: Path) -> None:
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", BERT)))
    want = expected_counts(plan)
    assert want == {"Attention": 6, "LayerNormalization": 12, "EmbedLayerNormalization": 1}
    check_fusion(plan, {**want, "BiasGelu": 6})
    with pytest.raises(ExportError, match="Attention 5/6"):
        check_fusion(plan, {**want, "Attention": 5})


def test_fusion_check_refuses_a_graph_without_attention(tmp_path: Path) -> None:
    config = {**BERT, "model_type": "mpnet", "architectures": ["MPNetModel"]}
    plan = make_plan(read_checkpoint(_folder(tmp_path / "m", config)))
    # mpnet's card declares its attention unfused, with a reason: its norms alone pass.
    check_fusion(plan, expected_counts(plan))
    bert_plan = make_plan(read_checkpoint(_folder(tmp_path / "b", BERT)))
    with pytest.raises(ExportError):
        check_fusion(bert_plan, {"LayerNormalization": 12, "EmbedLayerNormalization": 1})


def test_unsupported_pooling_names_the_folder_modules_json_gives(tmp_path: Path) -> None:
    files = _st6_files("max")
    files["1_Pool/config.json"] = files.pop("1_Pooling/config.json")
    modules = files["modules.json"]
    assert isinstance(modules, list)
    modules[1]["path"] = "1_Pool"
    folder = _folder(tmp_path / "m", BERT, files=files)
    with pytest.raises(ExportError) as refused:
        make_plan(read_checkpoint(folder))
    assert str(refused.value).startswith(f"{folder / '1_Pool' / 'config.json'}: pooling max ")


def test_an_opset_below_the_cards_floor_is_refused_with_its_reason(tmp_path: Path) -> None:
    modernbert = {**BERT, "model_type": "modernbert", "architectures": ["ModernBertModel"]}
    checkpoint = read_checkpoint(_folder(tmp_path / "m", modernbert))
    with pytest.raises(ExportError, match=r"modernbert needs --opset 17 or higher \(given 16\): "
                                          r"below opset 17"):  # fmt: skip
        make_plan(checkpoint, opset=16)
    assert make_plan(checkpoint, opset=17).opset == 17
    assert make_plan(read_checkpoint(_folder(tmp_path / "b", BERT)), opset=14).opset == 14
