"""The limit: model FLOPs per token (from config.json) and the host's measured GEMM rate.

FLOPs count multiply-adds as 2 and only the matmuls, which are >97% of a BERT encoder's work:
per layer and token, Q/K/V/O projections 4*h*h, the FFN 2*h*i, and attention scores plus the
weighted sum 2*L*h for a sequence of L tokens. Grouped-query decoders (Qwen3) have Q/O of width
a = heads x head_dim and K/V of width k = kv_heads x head_dim (2*h*a + 2*h*k), a gated FFN of
three matrices (3*h*i) and scores over a (2*L*a). Embedding lookups, norms, rotary, softmax and
pooling are left out, so "fraction of the limit" slightly flatters nobody.

The limits: numpy's sgemm (BLAS threads pinned to the engines' count) for fp32, and
onnxruntime's MatMulInteger for int8 (the MLAS kernels every int8 graph here runs on), taking
the faster of its two forms, u8 x s8 and u8 x u8: which one is faster depends on the ISA (VNNI
or not), and quantizers pick per host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np

from bench.records import Model

# Families whose MLP is gated (gate, up and down projections).
GATED_FFN = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"}


def model_shape(checkpoint: Path, name: str, max_length: int, key: str = "") -> Model:
    cfg = json.loads((checkpoint / "config.json").read_text())
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    m = Model(
        name=name,
        key=key,
        layers=int(cfg["num_hidden_layers"]),
        hidden=hidden,
        intermediate=int(cfg["intermediate_size"]),
        max_length=max_length,
        mflops_per_token_at_128=0.0,
        attention_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        ffn_matrices=3 if cfg.get("model_type") in GATED_FFN else 2,
    )
    return msgspec.structs.replace(m, mflops_per_token_at_128=flops_per_token(m, 128) / 1e6)


def flops_per_token(m: Model, seq_len: int) -> float:
    h, i = m.hidden, m.intermediate
    a, k = m.attention_width or h, m.kv_width or h
    per_layer = 2 * h * a + 2 * h * k + m.ffn_matrices * h * i + 2 * seq_len * a
    return 2.0 * m.layers * per_layer


def text_flops(m: Model, tokens: list[int]) -> float:
    """Useful FLOPs of embedding these texts one by one (padding is waste, not work)."""
    return sum(n * flops_per_token(m, n) for n in tokens)


def _best_rate(fn: object, ops: float, repeats: int, min_seconds: float = 1.0) -> float:
    """The best of at least `repeats` runs and `min_seconds`: a ceiling, so the fastest run
    counts; on a shared host one slice without preemption is rare, hence the time floor."""
    assert callable(fn)
    fn()  # warm: thread pool start, page faults
    best = float("inf")
    start = time.perf_counter()
    done = 0
    while done < repeats or (time.perf_counter() - start < min_seconds and done < 200):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        done += 1
    return ops / best / 1e9


def fp32_gemm_gflops(n: int, repeats: int = 5) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return _best_rate(lambda: a @ b, 2.0 * n**3, repeats)


def int8_gemm_model(m: int, k: int, n: int, *, signed_b: bool = True) -> bytes:
    """One onnxruntime MatMulInteger, a [m, k] u8 by b [k, n], s8 (signed_b) or u8, both
    inputs; needs `onnx`."""
    from onnx import TensorProto, helper

    b_type = TensorProto.INT8 if signed_b else TensorProto.UINT8
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "gemm",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k]),
            helper.make_tensor_value_info("b", b_type, [k, n]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def int8_gemm_gops(n: int, threads: int, repeats: int = 5, *, signed_b: bool = True) -> float:
    """onnxruntime's MatMulInteger, u8 x s8 (signed_b) or u8 x u8; needs `onnx`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(
        int8_gemm_model(n, n, n, signed_b=signed_b),
        opts,
        providers=["CPUExecutionProvider"],
    )
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (n, n), dtype=np.uint8)
    b = (rng.integers(-127, 127, (n, n), dtype=np.int8) if signed_b
         else rng.integers(0, 255, (n, n), dtype=np.uint8))  # fmt: skip
    return _best_rate(lambda: sess.run(None, {"a": a, "b": b}), 2.0 * n**3, repeats)


def blas_info() -> str:
    """numpy's BLAS as loaded: library, version, the kernel it picked for this CPU, threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed (the bench extra)"
    parts = []
    for lib in threadpool_info():
        if lib.get("user_api") != "blas":
            continue
        arch = lib.get("architecture") or "?"
        threading = f"{lib.get('threading_layer')}, {lib.get('num_threads')} threads"
        parts.append(f"{lib.get('internal_api')} {lib.get('version')} ({arch} kernel, {threading})")
    return "; ".join(parts) or "no BLAS found by threadpoolctl"


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """One measurement of the host's limits (what `python -m bench.flops` prints)."""

    fp32: float
    int8: float | None  # the faster int8 form
    int8_forms: dict[str, float]
    blas: str
    note: str = ""


def measure_peak(n: int, threads: int) -> Measured:
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
    return msgspec.json.decode(out.strip().splitlines()[-1], type=Measured)


def _main(argv: list[str]) -> None:
    n, threads = int(argv[0]), int(argv[1])
    forms: dict[str, float] = {}
    note = ""
    try:
        for form, signed in (("u8s8", True), ("u8u8", False)):
            forms[form] = int8_gemm_gops(n, threads, signed_b=signed)
    except ImportError as e:
        note = f"int8 GEMM not measured: {e}"
    fp32 = fp32_gemm_gflops(n)
    got = Measured(fp32=fp32, int8=max(forms.values()) if forms else None, int8_forms=forms,
                   blas=blas_info(), note=note)  # fmt: skip
    print(msgspec.json.encode(got).decode())


if __name__ == "__main__":
    _main(sys.argv[1:])
