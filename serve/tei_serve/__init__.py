"""tei_serve: TEI's HTTP and gRPC APIs over tei_runtime."""

# Imported first so that onnxruntime, wherever this package imports it, never starts its
# telemetry (tei_runtime sets ORT_DISABLE_TELEMETRY before onnxruntime loads).
import tei_runtime as _tei_runtime  # noqa: F401
