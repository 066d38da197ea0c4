"""Fixtures building tiny artifacts (see rt_artifacts for what they hold)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rt_artifacts import ArtifactFactory, Built, Spec, write_artifact


@pytest.fixture
def make_artifact(tmp_path: Path) -> ArtifactFactory:
    counter = iter(range(1000))

    def make(**kwargs: object) -> Built:
        return write_artifact(tmp_path / f"artifact{next(counter)}", Spec(**kwargs))  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def embed_artifact(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return write_artifact(
        tmp_path_factory.mktemp("embed"),
        Spec(prompts={"query": "query : ", "doc": "passage : "}),
    )
