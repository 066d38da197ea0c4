"""tei_export: a Hugging Face checkpoint in, a tei-onnx artifact out."""

# Imported first so that onnxruntime, wherever this package imports it, never starts its
# telemetry (tei_runtime sets ORT_DISABLE_TELEMETRY before onnxruntime loads).
import tei_runtime as _tei_runtime  # noqa: F401
