"""bench.graph_ab: the fused and plain graphs timed in two worker processes. Times are
measured but never asserted; the rows name the variants each worker really loaded."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from bench import graph_ab


def test_shapes_are_batch_by_tokens() -> None:
    assert graph_ab.parse_shapes("1x16,32x128") == [graph_ab.Shape(1, 16), graph_ab.Shape(32, 128)]
    for bad in ("32", "0x16", "4x", "ax16", "32x128,"):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCHxTOKENS"):
            graph_ab.parse_shapes(bad)


@pytest.mark.slow
def test_each_graph_runs_in_its_own_worker(minilm_artifact: Path) -> None:
    rows = graph_ab.compare(minilm_artifact, "int8", [graph_ab.Shape(2, 8)], blocks=2,
                            seconds_per_block=0.05)  # fmt: skip
    assert len(rows) == 1
    assert re.fullmatch(r"\| int8 \| 2x8 \| [\d.]+ \| [\d.]+ \| [\d.]+x \| int8 / int8-plain \|",
                        rows[0]), rows[0]  # fmt: skip


def test_a_folder_without_a_manifest_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        graph_ab.main([str(tmp_path)])
    assert "no manifest.json" in capsys.readouterr().err
