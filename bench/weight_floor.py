"""The floor under a batch-1 forward: the model's weight products alone, in onnxruntime fp32.

A short text at batch 1 (16 tokens) is a GEMM with 16 rows against every weight matrix of the
model. Each matrix is read from memory once per forward (a 0.6B model's do not fit in any cache)
and 16 rows are too few to reach the big-GEMM rate `flops.py` measures, so neither limit says
how fast such a forward can be. This one is measured: one ONNX graph holding exactly the
model's projection matrices (per layer Q, K, V, O and the feed-forward's two or three, at the
widths `bench.records.Model` gives; random values, all distinct, so nothing is shared in cache)
as constant initializers, each in its own MatMul with an `rows`-row input, run on the CPU
provider with the runtime's own session options. Attention scores, norms, embeddings and
everything else the real graph does are left out, so the real forward cannot be faster than
this, whatever its graph: a batch-1 target below it is out of reach in fp32 on the host.

`python -m bench.weight_floor '<Model as JSON>' ROWS THREADS` prints a `Floor` as JSON; the
bench runs it in a fresh process because a 0.6B model's matrices hold GBs until it exits.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

from bench.records import Floor, Model

REPEATS = 9
WARMUPS = 2


def weight_shapes(m: Model) -> list[tuple[int, int]]:
    """(in, out) of every projection matrix of the model, layer by layer."""
    h, i = m.hidden, m.intermediate
    a, k = m.attention_width or h, m.kv_width or h
    per_layer = [(h, a), (h, k), (h, k), (a, h)] + [(h, i)] * (m.ffn_matrices - 1) + [(i, h)]
    return per_layer * m.layers


def weight_params(m: Model) -> int:
    return sum(n_in * n_out for n_in, n_out in weight_shapes(m))


def _graph_file(m: Model, rows: int, folder: Path) -> Path:
    """The graph, its matrices in one external-data file (a 0.6B model's fp32 matrices come
    near protobuf's 2 GB message limit)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    widths = sorted({n_in for n_in, _ in weight_shapes(m)})
    inputs = [helper.make_tensor_value_info(f"x{w}", TensorProto.FLOAT, [rows, w]) for w in widths]
    nodes, weights, outputs = [], [], []
    for j, (n_in, n_out) in enumerate(weight_shapes(m)):
        w = rng.standard_normal((n_in, n_out), dtype=np.float32)
        w *= 0.02
        weights.append(numpy_helper.from_array(w, f"w{j}"))
        nodes.append(helper.make_node("MatMul", [f"x{n_in}", f"w{j}"], [f"y{j}"]))
        outputs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, [rows, n_out]))
    graph = helper.make_graph(nodes, "weight_floor", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "weights.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.data")  # fmt: skip
    return path


def measure(m: Model, rows: int, threads: int) -> Floor:
    from tei_runtime.manifest import Precision
    from tei_runtime.providers import Device, ProviderChoice
    from tei_runtime.session import inference_session

    cpu = "CPUExecutionProvider"
    choice = ProviderChoice(provider=cpu, device=Device.CPU, precision=Precision.FP32,
                            providers=[(cpu, {})], intra_op_threads=threads)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tei-bench-floor-") as tmp:
        path = _graph_file(m, rows, Path(tmp))
        sess = inference_session(path, choice)
    rng = np.random.default_rng(1)
    # Inputs and outputs bound once: a real forward returns one small tensor, so copying every
    # product out to numpy per run (22 MB for Qwen3-0.6B) would be time no graph spends.
    binding = sess.io_binding()
    feeds = {i.name: rng.standard_normal((rows, int(i.shape[1])), dtype=np.float32)
             for i in sess.get_inputs()}  # fmt: skip
    for name, value in feeds.items():  # `feeds` holds the arrays the binding points into
        binding.bind_cpu_input(name, value)
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cpu")
    for _ in range(WARMUPS):
        sess.run_with_iobinding(binding)
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        sess.run_with_iobinding(binding)
        times.append(time.perf_counter() - t)
    params = weight_params(m)
    median = statistics.median(times)
    return Floor(rows=rows, params=params, median_ms=median * 1e3, best_ms=min(times) * 1e3,
                 gflops=2.0 * rows * params / median / 1e9, threads=threads)  # fmt: skip


def run_floor(m: Model, rows: int, threads: int, env: dict[str, str], cwd: Path) -> Floor | None:
    """`measure` in a fresh process; None (and its error printed) when it fails, so a host
    short of memory for a big model's matrices loses this line, not the run."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.weight_floor", msgspec.json.encode(m).decode(), str(rows),
         str(threads)],
        cwd=cwd, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"bench: weight floor of {m.name} not measured: {tail}", flush=True)
        return None
    return msgspec.json.decode(done.stdout.strip().splitlines()[-1], type=Floor)


def _main(argv: list[str]) -> None:
    m = msgspec.json.decode(argv[0], type=Model)
    print(msgspec.json.encode(measure(m, int(argv[1]), int(argv[2]))).decode())


if __name__ == "__main__":
    _main(sys.argv[1:])
