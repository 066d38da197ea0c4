"""fastembed's model folder for a BERT checkpoint, made locally (its hub download is impossible).

fastembed's sentence-transformers/all-MiniLM-L6-v2 comes from the Qdrant/all-MiniLM-L6-v2-onnx
repo: the plain traced ONNX graph of the transformers BertModel (inputs input_ids,
attention_mask, token_type_ids; output last_hidden_state; no offline fusion) beside the hub
checkpoint's config and tokenizer files. This makes the same thing from a checkpoint:
torch.onnx's TorchScript exporter, opset 17, dynamic batch and sequence axes, saved under the
file name the catalogue entry loads. fastembed then loads it through `specific_model_path` with
ORT_ENABLE_ALL (onnxruntime fuses at load) and pools as that entry says: all-MiniLM-L6-v2 mean
pooled and normalized (its PooledNormalizedEmbedding), BAAI/bge-base-en-v1.5 the CLS token,
normalized. For bge-base fastembed would download Qdrant/bge-base-en-v1.5-onnx-Q's
model_optimized.onnx (0.21 GB in its catalogue, half an fp32 BERT-base), which cannot be
fetched or inspected here: the bench gives it the plain fp32 graph of the same random weights.

`python -m bench.fastembed_dir CHECKPOINT OUT FILE` (run in the main venv: it needs torch).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from bench.procs import clean_env

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "vocab.txt")  # fmt: skip
REPO = Path(__file__).resolve().parent.parent


def model_dir(checkpoint: Path, cache: Path, graph_file: str) -> Path:
    """Made once per checkpoint and file name, before anything is timed."""
    key = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:12]
    out = cache / f"fastembed-{checkpoint.name}-{key}"
    if (out / graph_file).exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "bench.fastembed_dir", str(checkpoint), str(tmp),
                    graph_file], cwd=REPO, env=clean_env(), check=True)  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)  # a folder made for another file name
    tmp.rename(out)
    return out


def export(checkpoint: Path, out: Path, graph_file: str) -> None:
    import torch
    import transformers

    out.mkdir(parents=True)
    model = transformers.AutoModel.from_pretrained(checkpoint).eval()
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).long()
    types = torch.zeros_like(ids)

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:  # fmt: skip
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids)  # fmt: skip
            return out.last_hidden_state  # type: ignore[no-any-return]

    axes = {0: "batch_size", 1: "sequence_length"}
    with torch.no_grad():
        torch.onnx.export(
            LastHidden(), (ids, mask, types), str(out / graph_file),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "last_hidden_state": axes},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    for name in FILES:
        if (checkpoint / name).exists():
            shutil.copy(checkpoint / name, out / name)


if __name__ == "__main__":
    export(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
