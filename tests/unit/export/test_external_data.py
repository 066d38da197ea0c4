"""When the exporter moves weights into an external data file, and which files it lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tei_export import external
from tei_export.errors import ExportError


def _model(weight: TensorProto) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["x", weight.name], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", weight.dims[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", weight.dims[1]])],
        [weight],
    )  # fmt: skip
    return helper.make_model(graph)


def _external_weight(rows: int, cols: int, location: str) -> TensorProto:
    """A weight that only claims its data lives in `location`: dims without bytes."""
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, cols])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    return t


def test_bytes_count_inline_and_external_weights() -> None:
    inline = numpy_helper.from_array(np.zeros((3, 5), np.float16), "w")
    assert external.initializer_bytes(_model(inline)) == 3 * 5 * 2
    big = _external_weight(2**19, 1024, "w.bin")  # 2 GiB of fp32 that is not on disk
    assert external.initializer_bytes(_model(big)) == 2**31


def test_over_the_limit_or_forced_goes_external(tmp_path: Path) -> None:
    small = tmp_path / "small.onnx"
    onnx.save_model(_model(numpy_helper.from_array(np.ones((4, 4), np.float32), "w")), small)
    assert not external.needs_external_data(small)
    assert external.needs_external_data(small, force=True)
    big = tmp_path / "big.onnx"
    onnx.save_model(_model(_external_weight(2**19, 1024, "w.bin")), big)
    assert external.needs_external_data(big)


def test_save_writes_one_sidecar_and_lists_it(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    dst = tmp_path / "model.fp32.onnx"
    dst.with_name("model.fp32.onnx.data").write_bytes(b"stale bytes onnx would append to")
    external.save(_model(weight), dst, external=True)
    assert external.data_files(dst) == ["model.fp32.onnx.data"]
    assert (tmp_path / "model.fp32.onnx.data").stat().st_size == 4096 * 4
    loaded = onnx.load(str(dst))
    np.testing.assert_array_equal(
        numpy_helper.to_array(loaded.graph.initializer[0]), numpy_helper.to_array(weight)
    )
    external.save(_model(weight), dst, external=False)
    assert external.data_files(dst) == []
    assert not (tmp_path / "model.fp32.onnx.data").exists()


def test_reference_outside_the_folder_is_refused(tmp_path: Path) -> None:
    graph = tmp_path / "m.onnx"
    onnx.save_model(_model(_external_weight(4, 4, "../elsewhere.data")), graph)
    with pytest.raises(ExportError, match="not a file beside it"):
        external.data_files(graph)
    onnx.save_model(_model(_external_weight(4, 4, "missing.data")), graph)
    with pytest.raises(ExportError, match=r"missing\.data"):
        external.data_files(graph)
