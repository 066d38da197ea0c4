"""OrtBackend: one onnxruntime session; numpy in, numpy out.

On GPU providers outputs are bound on the device through IO binding, so a run copies each
output back once instead of letting onnxruntime stage it; inputs are small int64 arrays and
are bound from host memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from tei_runtime.errors import BackendError
from tei_runtime.providers import ProviderChoice

# onnxruntime's C++ errors surface as these classes (all plain Exception subclasses), and
# its Python layer raises RuntimeError/ValueError for bad feeds.
_ORT_ERRORS: tuple[type[BaseException], ...] = (
    *(
        cls
        for name in (
            "Fail",
            "InvalidArgument",
            "RuntimeException",
            "EPFail",
            "NotImplemented",
            "InvalidGraph",
            "InvalidProtobuf",
            "NoSuchFile",
            "NoModel",
            "EngineError",
        )
        if isinstance(cls := getattr(_ort_state, name, None), type)
    ),
    RuntimeError,
    ValueError,
)


def session_options(choice: ProviderChoice) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = choice.intra_op_threads
    opts.inter_op_num_threads = choice.inter_op_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # ENABLE_ALL is applied at load time on this host only; never serialised, because its
    # layout transforms are specific to the machine they ran on.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns pay off for fixed shapes only; every batch here has a new shape.
    opts.enable_mem_pattern = False
    # Smaller, dynamically sized work blocks in the intra-op pool: BERT-base fp32 at 1 x 16
    # tokens 7.7% faster (18.3 vs 19.8 ms, medians of 5), 1 x 128 2.6%; all-MiniLM-L6-v2
    # (1 x 16, 32 x 16), BERT-base 8 x 128 and the Qwen3-0.6B shape at 1 x 16 unchanged within
    # noise (Session.run alone, 2-core AMD EPYC Zen 4; README, Benchmarks).
    opts.add_session_config_entry("session.dynamic_block_base", "2")
    return opts


CPU_PROVIDER = "CPUExecutionProvider"
# onnxruntime's load-time rewrite of Add + LayerNormalization into SkipLayerNormalization (and
# its RMSNorm form). On the CPU provider that contrib kernel is a scalar per-element loop while
# LayerNormalization is vectorized: 3.4-5.3x slower at 2048 rows of 384-1024 (all-MiniLM-L6-v2's
# fused fp32 graph 1.00-1.10x faster at batch 32 without it, AMD EPYC Zen 4 with AVX-512;
# README, Benchmarks), so CPU sessions skip it. GPU providers keep it: their fused kernel is
# the fast one there.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def disabled_optimizers(choice: ProviderChoice) -> list[str]:
    return list(CPU_DISABLED_OPTIMIZERS) if choice.provider == CPU_PROVIDER else []


def inference_session(
    model_path: Path, choice: ProviderChoice, options: ort.SessionOptions | None = None
) -> ort.InferenceSession:
    """The session the runtime runs `model_path` in for `choice` (the bench's profiles and
    floors open theirs here too, so they time the same graph)."""
    return ort.InferenceSession(
        str(model_path),
        sess_options=options if options is not None else session_options(choice),
        providers=choice.providers,
        disabled_optimizers=disabled_optimizers(choice),
    )


class OrtBackend:
    def __init__(self, model_path: Path, choice: ProviderChoice) -> None:
        self.choice = choice
        try:
            self._session = inference_session(model_path, choice)
        except _ORT_ERRORS as e:
            raise BackendError(f"{model_path}: onnxruntime cannot load it ({e})") from e
        active = list(self._session.get_providers())
        if choice.provider not in active:
            # onnxruntime only logs when a provider fails to initialise (missing CUDA or
            # cuDNN libraries, ...) and carries on with the rest; we refuse instead.
            raise BackendError(
                f"onnxruntime could not initialise {choice.provider} (active: "
                f"{', '.join(active)}); check the GPU driver and the CUDA/cuDNN/TensorRT "
                "libraries it needs, or choose another device"
            )
        self.input_names: tuple[str, ...] = tuple(i.name for i in self._session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in self._session.get_outputs())
        # Static last dimension of each output (None when symbolic), e.g. a Dense layer's width.
        self.output_dims: dict[str, int | None] = {
            o.name: o.shape[-1] if o.shape and isinstance(o.shape[-1], int) else None
            for o in self._session.get_outputs()
        }
        self.active_providers: tuple[str, ...] = tuple(active)

    def run(
        self, feeds: Mapping[str, npt.NDArray[np.int64]], outputs: Sequence[str]
    ) -> list[npt.NDArray[np.float32]]:
        try:
            if self.choice.io_binding is None:
                results = self._session.run(list(outputs), dict(feeds))
            else:
                results = self._run_bound(feeds, outputs)
        except _ORT_ERRORS as e:
            raise BackendError(str(e)) from e
        # fp16 variants keep fp32 outputs; the cast is a no-op then and a guard otherwise.
        return [np.asarray(r).astype(np.float32, copy=False) for r in results]

    def _run_bound(
        self, feeds: Mapping[str, npt.NDArray[np.int64]], outputs: Sequence[str]
    ) -> list[npt.NDArray[np.float32]]:
        binding = self._session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in outputs:
            binding.bind_output(name, self.choice.io_binding, self.choice.device_id)
        self._session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())
