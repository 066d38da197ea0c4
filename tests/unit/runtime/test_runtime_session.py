from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from rt_artifacts import ArtifactFactory, Built

from tei_runtime import BackendError, TokenizerError, load
from tei_runtime.manifest import Precision
from tei_runtime.providers import Device, ProviderChoice
from tei_runtime.session import OrtBackend, session_options
from tei_runtime.tokenization import Tokenizer


def _choice(**kw: object) -> ProviderChoice:
    base: dict[str, object] = {
        "provider": "CPUExecutionProvider",
        "device": Device.CPU,
        "precision": Precision.FP32,
        "providers": [("CPUExecutionProvider", {})],
        "intra_op_threads": 1,
    }
    return ProviderChoice(**{**base, **kw})  # type: ignore[arg-type]


def test_session_options() -> None:
    import onnxruntime as ort

    opts = session_options(_choice(intra_op_threads=3))
    assert opts.intra_op_num_threads == 3
    assert opts.inter_op_num_threads == 1
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.enable_mem_pattern is False
    assert opts.get_session_config_entry("session.dynamic_block_base") == "2"
    assert opts.optimized_model_filepath == ""  # never serialise an ENABLE_ALL graph


def test_a_provider_onnxruntime_dropped_is_an_error(embed_artifact: Built) -> None:
    """onnxruntime only logs when a provider fails to start; the backend refuses to go on."""
    choice = _choice(provider="CUDAExecutionProvider", device=Device.CUDA)
    with pytest.raises(BackendError, match="could not initialise CUDAExecutionProvider"):
        OrtBackend(embed_artifact.root / "model.fp32.onnx", choice)


def test_unloadable_graph_and_failed_run_are_backend_errors(
    tmp_path: Path, embed_artifact: Built
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a graph")
    with pytest.raises(BackendError, match=r"bad\.onnx: onnxruntime cannot load it"):
        OrtBackend(bad, _choice())
    backend = OrtBackend(embed_artifact.root / "model.fp32.onnx", _choice())
    ids = np.array([[10_000]], dtype=np.int64)  # outside the embedding table
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}
    with pytest.raises(BackendError, match="Inference failed"):
        backend.run(feeds, ["token_embeddings"])


def test_malformed_tokenizer_is_a_tokenizer_error(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: cannot load tokenizer"):
        Tokenizer(path, max_input_length=8)


def test_model_is_safe_across_threads(embed_artifact: Built) -> None:
    m = load(embed_artifact.root, intra_op_threads=1)
    texts = [f"w{i} w{i + 1} cat" * (i % 3 + 1) for i in range(24)]
    want = m.embed(texts)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: m.embed([t])[0], texts))
    np.testing.assert_allclose(np.stack(got), want, atol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "precision"),
    [("float32", Precision.FP32), ("fp32", Precision.FP32), ("FP16", Precision.FP16),
     ("float16", Precision.FP16), ("int8", Precision.INT8), ("qint8", Precision.INT8)],
)
def test_load_takes_tei_and_manifest_dtype_names(
    make_artifact: ArtifactFactory, dtype: str, precision: Precision
) -> None:
    """TEI's --dtype names and the manifest's precision names pick the same variant."""
    built = make_artifact(precisions=(Precision.FP32, Precision.FP16, Precision.INT8))
    assert load(built.root, device="cpu", dtype=dtype).precision is precision
