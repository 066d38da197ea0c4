"""The limit: model FLOPs per token (from config.json) and the host's measured GEMM rate.

FLOPs count multiply-adds as 2 and only the matmuls, which are >97% of a BERT encoder's work:
per layer and token, Q/K/V/O projections 4*h*h, the FFN 2*h*i, and attention scores plus the
weighted sum 2*L*h for a sequence of L tokens. Embedding lookups, layer norms, softmax and
pooling are left out, so "fraction of peak" slightly flatters nobody.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.records import Model


def model_shape(checkpoint: Path, name: str, max_length: int) -> Model:
    cfg = json.loads((checkpoint / "config.json").read_text())
    m = Model(
        name=name,
        layers=int(cfg["num_hidden_layers"]),
        hidden=int(cfg["hidden_size"]),
        intermediate=int(cfg["intermediate_size"]),
        max_length=max_length,
        mflops_per_token_at_128=0.0,
    )
    return Model(
        name=m.name,
        layers=m.layers,
        hidden=m.hidden,
        intermediate=m.intermediate,
        max_length=m.max_length,
        mflops_per_token_at_128=flops_per_token(m, 128) / 1e6,
    )


def flops_per_token(m: Model, seq_len: int) -> float:
    h, i = m.hidden, m.intermediate
    return 2.0 * m.layers * (4 * h * h + 2 * h * i + 2 * seq_len * h)


def text_flops(m: Model, tokens: list[int]) -> float:
    """Useful FLOPs of embedding these texts one by one (padding is waste, not work)."""
    return sum(n * flops_per_token(m, n) for n in tokens)


def _best_rate(fn: object, ops: float, repeats: int) -> float:
    assert callable(fn)
    fn()  # warm: thread pool start, page faults
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return ops / best / 1e9


def fp32_gemm_gflops(n: int, repeats: int = 5) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return _best_rate(lambda: a @ b, 2.0 * n**3, repeats)


def int8_gemm_gops(n: int, threads: int, repeats: int = 5) -> float:
    """onnxruntime's MatMulInteger (u8 x s8), the op our int8 variant runs; needs `onnx`."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "gemm",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [n, n]),
            helper.make_tensor_value_info("b", TensorProto.INT8, [n, n]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(
        model.SerializeToString(),
        opts,
        providers=["CPUExecutionProvider"],
    )
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (n, n), dtype=np.uint8)
    b = rng.integers(-127, 127, (n, n), dtype=np.int8)
    return _best_rate(lambda: sess.run(None, {"a": a, "b": b}), 2.0 * n**3, repeats)


def measure_peak(n: int, threads: int) -> tuple[float, float | None, str]:
    """Run the GEMMs in a fresh process whose BLAS is pinned to `threads` threads."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    out = subprocess.run(
        [sys.executable, "-m", "bench.flops", str(n), str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return float(got["fp32"]), got["int8"], str(got["note"])


def _main(argv: list[str]) -> None:
    n, threads = int(argv[0]), int(argv[1])
    int8: float | None
    note = ""
    try:
        int8 = int8_gemm_gops(n, threads)
    except ImportError as e:
        int8, note = None, f"int8 GEMM not measured: {e}"
    print(json.dumps({"fp32": fp32_gemm_gflops(n), "int8": int8, "note": note}))


if __name__ == "__main__":
    _main(sys.argv[1:])
