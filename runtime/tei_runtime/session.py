"""OrtBackend: one onnxruntime session; numpy in, numpy out.

On GPU providers outputs are bound on the device through IO binding, so a run copies each
output back once instead of letting onnxruntime stage it; inputs are small int64 arrays and
are bound from host memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from tei_runtime.errors import BackendError, OutOfMemoryError
from tei_runtime.host import memory_available
from tei_runtime.providers import ProviderChoice

log = logging.getLogger("tei_runtime")

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


# The CPU sessions' shared arena may hold this share of the memory available when the first
# session loads. An unfused attention's scores grow with the square of the input: one
# 16384-token text through the Qwen3-0.6B shape asks ~17 GB per score tensor, and past the
# host's memory the kernel kills the whole process, every other request with it. Capped, the
# arena refuses that allocation and the one forward fails instead.
ARENA_SHARE = 0.9
_ARENA_SETUP_ERRORS: tuple[type[BaseException], ...] = (*_ORT_ERRORS, AttributeError, TypeError)
_arena_lock = threading.Lock()
_arena_cap: int | None = None
_arena_tried = False


def shared_cpu_arena() -> int | None:
    """Register the process's capped CPU arena once; its cap in bytes, or None where the
    available memory cannot be read or onnxruntime refuses (sessions keep their own then)."""
    global _arena_cap, _arena_tried
    with _arena_lock:
        if not _arena_tried:
            _arena_tried = True
            available = memory_available()
            if available is not None:
                cap = int(available * ARENA_SHARE)
                try:
                    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                             ort.OrtMemType.DEFAULT)  # fmt: skip
                    ort.create_and_register_allocator(info, ort.OrtArenaCfg({"max_mem": cap}))
                    _arena_cap = cap
                except _ARENA_SETUP_ERRORS as e:
                    log.warning("onnxruntime's CPU arena is not capped (%s): an input too "
                                "long for this host's memory can end the process", e)  # fmt: skip
        return _arena_cap


def session_options(choice: ProviderChoice) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    if choice.provider == CPU_PROVIDER and shared_cpu_arena() is not None:
        opts.add_session_config_entry("session.use_env_allocators", "1")
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
# What onnxruntime's arena says when an allocation would pass its max_mem (bfc_arena.cc).
_ARENA_FULL = "is smaller than requested bytes"
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
            if _ARENA_FULL in str(e) and (cap := shared_cpu_arena()) is not None:
                self._shrink_arena(feeds, outputs)
                raise OutOfMemoryError(
                    f"this forward needs more memory than the {cap / 2**30:.1f} GiB onnxruntime "
                    f"may hold here ({ARENA_SHARE:.0%} of what was available when the model "
                    "loaded): send shorter or fewer inputs, or lower --max-batch-tokens"
                ) from e
            raise BackendError(str(e)) from e
        # fp16 variants keep fp32 outputs; the cast is a no-op then and a guard otherwise.
        return [np.asarray(r).astype(np.float32, copy=False) for r in results]

    def _shrink_arena(
        self, feeds: Mapping[str, npt.NDArray[np.int64]], outputs: Sequence[str]
    ) -> None:
        """Give back what the refused forward had taken: the arena keeps every chunk it grew
        (up to the cap, GBs for a long input) unless a run asks it to shrink, so a one-token
        run does, and the process's memory returns to what short requests use."""
        options = ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        tiny = {name: np.ascontiguousarray(array[:1, :1]) for name, array in feeds.items()}
        try:
            self._session.run(list(outputs), tiny, run_options=options)
        except _ORT_ERRORS as e:  # the refusal is what the caller hears about, not this
            log.warning("could not shrink onnxruntime's CPU arena after a refused forward: %s", e)

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
