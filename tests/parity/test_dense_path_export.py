"""--dense-path exports the Dense module it names, not the one modules.json applies, and the
vectors match sentence-transformers running that module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from support.tiny_models import add_dense_module, build_checkpoint
from tei_runtime.manifest import Precision

pytestmark = pytest.mark.slow

TEXTS = ["hello", "the quick brown fox jumps over the lazy dog", "numbers 1234567890"]


def test_dense_path_picks_the_module(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    import tei_runtime
    from tei_export.api import export_model

    checkpoint = build_checkpoint(tmp_path / "ck", "bert", st_pooling="mean", dense_out=16)
    add_dense_module(checkpoint, "2_Dense_8", 8)
    artifact = export_model(str(checkpoint), tmp_path / "art", quiet=True,
                            precisions=[Precision.FP32], dense_path="2_Dense_8")
    model = tei_runtime.load(artifact, device="cpu")
    assert model.dimension == 8

    # The reference: the same checkpoint with modules.json pointing at 2_Dense_8.
    chosen = shutil.copytree(checkpoint, tmp_path / "ck-8")
    modules = json.loads((chosen / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith("Dense"):
            module["path"] = "2_Dense_8"
    (chosen / "modules.json").write_text(json.dumps(modules))
    st = SentenceTransformer(str(chosen), device="cpu")
    reference = np.concatenate([st.encode([t], normalize_embeddings=True) for t in TEXTS])
    got = model.embed(TEXTS)
    cosines = (got * reference).sum(-1) / np.linalg.norm(got, axis=-1)
    assert cosines.min() >= 0.99999, cosines
