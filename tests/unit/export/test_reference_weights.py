"""Which weights transformers did not load mean the config does not fit the checkpoint."""

from __future__ import annotations

from tei_export.reference import beyond_the_config

MODEL = [
    "embeddings.word_embeddings.weight",
    "encoder.layer.0.attention.self.query.weight",
    "encoder.layer.1.attention.self.query.weight",
    "encoder.layer.1.output.dense.bias",
]


def test_layers_past_the_config_are_named() -> None:
    unexpected = [
        "encoder.layer.2.attention.self.query.weight",  # a layer config.json lacks
        "encoder.layer.12.output.dense.bias",
        "cls.predictions.transform.dense.weight",  # an MLM head the graph does not use
        "pooler.dense.weight",
        "encoder.layer.1.attention.self.rotary.inv_freq",  # inside a layer that exists
    ]
    assert beyond_the_config(unexpected, MODEL) == [
        "encoder.layer.12.output.dense.bias",
        "encoder.layer.2.attention.self.query.weight",
    ]
    assert beyond_the_config([], MODEL) == []
    assert beyond_the_config(["0.weight"], ["1.weight"]) == ["0.weight"]
