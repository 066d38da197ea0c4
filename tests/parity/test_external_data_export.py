"""An export with its weights in external data files: listed, checksummed, loaded, bundled.

Real models only need this over ~2 GB; `external_data=True` takes the same path on tiny ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from support.tiny_models import build_checkpoint
from tei_runtime.errors import ManifestError
from tei_runtime.host import Host
from tei_runtime.manifest import read_manifest

pytestmark = pytest.mark.slow

TEXTS = ["hello", "the quick brown fox jumps over the lazy dog", "grüße aus köln"]


def _export(checkpoint: Path, out: Path, **options: object) -> Path:
    from tei_export.api import export_model

    return export_model(str(checkpoint), out, quiet=True, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model_type", "precisions"),
    [("bert", None), ("qwen3", ["fp32", "int8"])],  # with and without the fusion optimizer
)
def test_external_data_export_matches_the_inline_one(
    tmp_path: Path, model_type: str, precisions: list[str] | None
) -> None:
    import tei_runtime

    checkpoint = build_checkpoint(tmp_path / "ck", model_type, st_pooling="mean")
    whole = _export(checkpoint, tmp_path / "inline", precisions=precisions)
    split = _export(checkpoint, tmp_path / "split", precisions=precisions, external_data=True)

    manifest = read_manifest(split)
    listed = {"manifest.json", *manifest.tokenizer_files}
    for variant in manifest.variants:
        sidecar = f"{variant.file}.data"
        assert list(variant.external_data) == [sidecar]
        graph = onnx.load(str(split / variant.file), load_external_data=False)
        inline = [t.name for t in graph.graph.initializer
                  if t.data_location != onnx.TensorProto.EXTERNAL and t.ByteSize() > 2048]
        assert inline == [], f"{variant.file} still holds weights inline"
        assert (split / sidecar).stat().st_size > 0
        listed |= {variant.file, sidecar}
    assert {p.name for p in split.iterdir()} == listed  # no trace folder, no stray tensors
    assert all(not v.external_data for v in read_manifest(whole).variants)

    for variant in manifest.variants:
        dtype = {"fp32": "float32", "fp16": "float16", "int8": "int8"}[variant.precision.value]
        a = tei_runtime.load(whole, device="cpu", dtype=dtype).embed(TEXTS)
        b = tei_runtime.load(split, device="cpu", dtype=dtype).embed(TEXTS)
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_changed_external_data_is_refused_and_bundles_carry_it(tmp_path: Path) -> None:
    import tei_runtime
    from tei_bundle import archive as bundle

    checkpoint = build_checkpoint(tmp_path / "ck", "bert", st_pooling="mean")
    art = _export(checkpoint, tmp_path / "art", precisions=["fp32"], external_data=True)
    unpacked = bundle.unpack(bundle.write_bundle(art, tmp_path / "a.tar"), tmp_path / "unpacked")
    np.testing.assert_allclose(
        tei_runtime.load(unpacked, device="cpu").embed(TEXTS),
        tei_runtime.load(art, device="cpu").embed(TEXTS),
        atol=0,
    )
    # The fused graph's data: the one every CPU class loads (bert.toml names none for plain).
    sidecar = art / "model.fp32.onnx.data"
    data = bytearray(sidecar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx\.data"):
        tei_runtime.load(art, device="cpu", host=Host(providers=("CPUExecutionProvider",)))
