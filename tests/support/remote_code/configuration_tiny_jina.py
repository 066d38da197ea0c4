"""A small JinaBERT-style config, shipped inside a test checkpoint as remote code."""

from transformers import PretrainedConfig


class TinyJinaBertConfig(PretrainedConfig):
    model_type = "bert"  # as jina-embeddings-v2 publishes it

    def __init__(
        self,
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        type_vocab_size=2,
        max_position_embeddings=128,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.type_vocab_size = type_vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.layer_norm_eps = layer_norm_eps
        super().__init__(pad_token_id=pad_token_id, **kwargs)
