from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import numpy as np
import pytest
from rt_artifacts import ArtifactFactory, Built

from tei_runtime import BackendError, TokenizerError, load
from tei_runtime.manifest import Precision
from tei_runtime.providers import Device, ProviderChoice
from tei_runtime.session import (
    OrtBackend,
    disabled_optimizers,
    inference_session,
    session_options,
)
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


def _residual_norm_graph(path: Path, hidden: int) -> None:
    """x + skip -> LayerNormalization: what onnxruntime rewrites into SkipLayerNormalization."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape: list[int | str] = ["batch", "seq", hidden]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "skip"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], axis=-1),
        ],
        "residual_norm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "skip")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [
            numpy_helper.from_array(np.linspace(0.5, 1.5, hidden, dtype=np.float32), "gamma"),
            numpy_helper.from_array(np.linspace(-0.1, 0.1, hidden, dtype=np.float32), "beta"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _loaded_ops(tmp_path: Path, choice: ProviderChoice, name: str) -> set[str]:
    import onnx

    src = tmp_path / "residual_norm.onnx"
    if not src.exists():
        _residual_norm_graph(src, 16)
    options = session_options(choice)
    options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
    session = inference_session(src, choice, options)
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    (y,) = session.run(["y"], {"x": x, "skip": x})
    assert np.isfinite(y).all()
    return {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}


def test_cpu_sessions_keep_residual_add_and_layer_norm_apart(tmp_path: Path) -> None:
    """SkipLayerNormalization's CPU kernel is the slow form; GPU providers keep the fusion."""
    assert disabled_optimizers(_choice()) == ["SkipLayerNormFusion"]
    cuda = _choice(provider="CUDAExecutionProvider", device=Device.CUDA)
    assert disabled_optimizers(cuda) == []
    assert "SkipLayerNormalization" not in _loaded_ops(tmp_path, _choice(), "cpu")
    # The same load with the rewrite left on (as a GPU choice has it) does fuse the pair,
    # so the check above can fail.
    fused = ProviderChoice(**{**msgspec.structs.asdict(_choice()), "provider": "Other"})
    assert "SkipLayerNormalization" in _loaded_ops(tmp_path, fused, "default")


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


_CAPPED = """
import json, sys
import numpy as np
import tei_runtime.session as session
session.memory_available = lambda: int(sys.argv[2])  # before the first session registers
from tei_runtime import OutOfMemoryError, load
model = load(sys.argv[1])
before = model.embed(["hello world"])
try:
    model.embed(["hello world again and again"] * 2000, batch_tokens=10**7)
    refused = ""
except OutOfMemoryError as e:
    refused = str(e)
after = model.embed(["hello world"])
print(json.dumps({"cap": session.shared_cpu_arena(), "refused": refused,
                  "same": bool(np.array_equal(before, after))}))
"""


def test_a_forward_past_the_memory_cap_fails_alone(embed_artifact: Built) -> None:
    """The CPU arena is capped at a share of the memory available at load: a forward that
    would pass it raises OutOfMemoryError (the kernel would otherwise kill the process), and
    the same model answers the next call as before. In a process of its own: the cap is
    registered once per process."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CAPPED, str(embed_artifact.root), "400000"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cap"] == 360000  # 90% of the 400 kB said to be available
    # 2000 texts x 16 tokens x 8 floats of activations in one forward: past 0.36 MB
    assert "needs more memory than the 0.0 GiB" in got["refused"]
    assert "--max-batch-tokens" in got["refused"]
    assert got["same"]


def test_a_cpu_session_takes_the_shared_capped_arena() -> None:
    from tei_runtime import session

    opts = session_options(_choice())
    cap = session.shared_cpu_arena()  # this process's, registered by its first CPU session
    assert cap is not None and cap > 0
    assert opts.get_session_config_entry("session.use_env_allocators") == "1"

