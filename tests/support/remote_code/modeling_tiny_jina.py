"""A small JinaBERT-style encoder (ALiBi attention biases, GLU feed-forward), shipped inside a
test checkpoint as remote code: transformers has no class for it."""

import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, SequenceClassifierOutput

from .configuration_tiny_jina import TinyJinaBertConfig


def alibi_slopes(heads):
    start = 2 ** (-8 / heads)
    return torch.tensor([start ** (i + 1) for i in range(heads)])


class GluFeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.inner = config.intermediate_size
        self.gated_layers = nn.Linear(config.hidden_size, 2 * self.inner, bias=False)
        self.wo = nn.Linear(self.inner, config.hidden_size)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        both = self.gated_layers(x)
        gated, plain = both[..., : self.inner], both[..., self.inner :]
        return self.layernorm(x + self.wo(nn.functional.gelu(gated) * plain))


class AlibiLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = GluFeedForward(config)

    def forward(self, x, bias):
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + bias
        context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, length, width)
        return self.mlp(self.norm(x + self.out(context)))


class TinyJinaBertPreTrainedModel(PreTrainedModel):
    config_class = TinyJinaBertConfig
    base_model_prefix = "bert"

    def _init_weights(self, module):
        if isinstance(module, nn.Linear | nn.Embedding):
            module.weight.data.normal_(0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()


class TinyJinaBertModel(TinyJinaBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.emb_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(AlibiLayer(config) for _ in range(config.num_hidden_layers))
        self.register_buffer("slopes", alibi_slopes(config.num_attention_heads), persistent=False)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        words = self.word_embeddings(input_ids)
        x = self.emb_norm(words + self.token_type_embeddings(token_type_ids))
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        distance = (positions[None, :] - positions[:, None]).abs().to(x.dtype)
        alibi = -self.slopes.to(x.dtype)[:, None, None] * distance[None]
        padding = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        bias = alibi[None] + padding
        for layer in self.layers:
            x = layer(x, bias)
        return BaseModelOutput(last_hidden_state=x)


class TinyJinaBertForSequenceClassification(TinyJinaBertPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.bert = TinyJinaBertModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
        tokens = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        pooled = torch.tanh(self.pooler(tokens[:, 0]))
        return SequenceClassifierOutput(logits=self.classifier(pooled))
