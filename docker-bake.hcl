// tei-onnx images: one Dockerfile (docker/Dockerfile), one target per hardware.
//   docker buildx bake                 # the serving images (group "default")
//   docker buildx bake grpc            # the same images serving TEI's gRPC API (tei-serve --grpc)
//   docker buildx bake export          # torch + the exporter
//   VERSION=0.2.0 REGISTRY=ghcr.io/me/tei-onnx docker buildx bake cuda   # ghcr.io/me/tei-onnx:0.2.0-cuda
// Serving targets differ only in build args: the base image and the onnxruntime build
// (versions pinned in constraints.txt). Tags are <REGISTRY>:<VERSION>-<target>, REGISTRY
// being the whole image repository.

variable "VERSION" {
  default = "0.1.0"
}

variable "REGISTRY" {
  default = "tei-onnx"
}

group "default" {
  targets = ["cpu", "cuda", "tensorrt", "rocm", "openvino"]
}

group "grpc" {
  targets = ["cpu-grpc", "cuda-grpc", "tensorrt-grpc", "rocm-grpc", "openvino-grpc"]
}

target "_common" {
  context    = "."
  dockerfile = "docker/Dockerfile"
  platforms  = ["linux/amd64"]
}

target "_serve" {
  inherits = ["_common"]
  target   = "serve"
}

target "cpu" {
  inherits = ["_serve"]
  args = {
    VERSION     = VERSION
    TARGET      = "cpu"
    BASE_IMAGE  = "ubuntu:24.04"
    ORT_PACKAGE = "onnxruntime"
  }
  labels = { "ai.tei-onnx.target" = "cpu", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-cpu"]
}

target "cuda" {
  inherits = ["_serve"]
  args = {
    VERSION     = VERSION
    TARGET      = "cuda"
    BASE_IMAGE  = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
    ORT_PACKAGE = "onnxruntime-gpu"
  }
  labels = { "ai.tei-onnx.target" = "cuda", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-cuda"]
}

target "tensorrt" {
  inherits = ["_serve"]
  args = {
    VERSION         = VERSION
    TARGET          = "tensorrt"
    BASE_IMAGE      = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
    ORT_PACKAGE     = "onnxruntime-gpu"
    EXTRA_PACKAGES  = "tensorrt-cu12-libs"
    EXTRA_INDEX_URL = "https://pypi.nvidia.com"
  }
  labels = { "ai.tei-onnx.target" = "tensorrt", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-tensorrt"]
}

target "rocm" {
  inherits = ["_serve"]
  args = {
    VERSION     = VERSION
    TARGET      = "rocm"
    BASE_IMAGE  = "rocm/dev-ubuntu-24.04:6.4.1"
    ORT_PACKAGE = "onnxruntime-rocm"
  }
  labels = { "ai.tei-onnx.target" = "rocm", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-rocm"]
}

target "openvino" {
  inherits = ["_serve"]
  args = {
    VERSION     = VERSION
    TARGET      = "openvino"
    BASE_IMAGE  = "ubuntu:24.04"
    ORT_PACKAGE = "onnxruntime-openvino"
  }
  labels = { "ai.tei-onnx.target" = "openvino", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-openvino"]
}

// One -grpc target per hardware: its serving target's build, stage serve-grpc on top.
target "cpu-grpc" {
  inherits = ["cpu"]
  target   = "serve-grpc"
  args     = { TARGET = "cpu-grpc" }
  labels   = { "ai.tei-onnx.target" = "cpu-grpc" }
  tags     = ["${REGISTRY}:${VERSION}-cpu-grpc"]
}

target "cuda-grpc" {
  inherits = ["cuda"]
  target   = "serve-grpc"
  args     = { TARGET = "cuda-grpc" }
  labels   = { "ai.tei-onnx.target" = "cuda-grpc" }
  tags     = ["${REGISTRY}:${VERSION}-cuda-grpc"]
}

target "tensorrt-grpc" {
  inherits = ["tensorrt"]
  target   = "serve-grpc"
  args     = { TARGET = "tensorrt-grpc" }
  labels   = { "ai.tei-onnx.target" = "tensorrt-grpc" }
  tags     = ["${REGISTRY}:${VERSION}-tensorrt-grpc"]
}

target "rocm-grpc" {
  inherits = ["rocm"]
  target   = "serve-grpc"
  args     = { TARGET = "rocm-grpc" }
  labels   = { "ai.tei-onnx.target" = "rocm-grpc" }
  tags     = ["${REGISTRY}:${VERSION}-rocm-grpc"]
}

target "openvino-grpc" {
  inherits = ["openvino"]
  target   = "serve-grpc"
  args     = { TARGET = "openvino-grpc" }
  labels   = { "ai.tei-onnx.target" = "openvino-grpc" }
  tags     = ["${REGISTRY}:${VERSION}-openvino-grpc"]
}

target "export" {
  inherits = ["_common"]
  target   = "export"
  args = {
    VERSION         = VERSION
    TARGET          = "export"
    TORCH_INDEX_URL = "https://download.pytorch.org/whl/cpu"
  }
  labels = { "ai.tei-onnx.target" = "export", "org.opencontainers.image.version" = VERSION }
  tags   = ["${REGISTRY}:${VERSION}-export"]
}
