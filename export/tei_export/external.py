"""When and how a graph's weights go into an ONNX external data file.

A protobuf message cannot pass 2 GiB, so a model whose weights come near that (xlm-roberta-large
and bge-m3 in fp32: about 2.2 GB) must keep them in a side file. Every variant of one export
makes the same choice, and the side file is always one file named `<graph file>.data`, listed
with its checksum in the manifest.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from tei_export.errors import ExportError

# The graph structure of these models is a few MB; the margin keeps the rest of the message
# well under protobuf's 2 GiB once the weights are counted.
EXTERNAL_DATA_OVER = 2**31 - 2**27


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of every initializer, inline or external, counted from its dims and type."""
    total = 0
    for tensor in model.graph.initializer:
        count = 1
        for d in tensor.dims:
            count *= d
        total += count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def needs_external_data(graph: Path, *, force: bool = False) -> bool:
    return force or initializer_bytes(onnx.load(str(graph), load_external_data=False)) > (
        EXTERNAL_DATA_OVER
    )


def save(model: onnx.ModelProto, dst: Path, *, external: bool) -> None:
    """Write `model` to `dst`, its weights into `<dst>.data` when `external`."""
    sidecar = dst.with_name(dst.name + ".data")
    sidecar.unlink(missing_ok=True)  # onnx appends to an existing data file
    if external:
        onnx.save_model(
            model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
            location=sidecar.name, size_threshold=1024,
        )  # fmt: skip
    else:
        onnx.save_model(model, str(dst))


def data_files(graph: Path) -> list[str]:
    """The external data files `graph` refers to (names relative to its folder), checked to
    be plain files beside it."""
    model = onnx.load(str(graph), load_external_data=False)
    names: set[str] = set()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        names.add(location)
    for name in sorted(names):
        path = graph.parent / name
        if not name or Path(name).name != name or not path.is_file():
            raise ExportError(
                f"{graph.name} refers to external data {name!r}, not a file beside it"
            )
    return sorted(names)
