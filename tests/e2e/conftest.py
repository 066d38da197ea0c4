"""E2E fixtures: the real app on uvicorn over loopback, in a thread, with a fake model.

`serve(task=..., **settings)` starts a server on a free port and returns a handle with an
httpx client; every server is stopped at the end of the test. Tests marked `slow` use the
lead's real artifacts (tests/conftest.py) through `tei_runtime.load`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_model import FakeModel, write_tokenizer

from support.loopback_server import Running, start
from tei_runtime.manifest import Task


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture
def serve(tokenizer_json: Path) -> Iterator[Callable[..., Running]]:
    running: list[Running] = []

    def factory(task: Task = Task.EMBED, *, max_input_length: int = 32,
                **settings: Any) -> Running:
        model = FakeModel(tokenizer_json, task, max_input_length=max_input_length)
        r = start(model, **settings)
        running.append(r)
        return r

    yield factory
    for r in running:
        r.model.gate.set()
        r.stop()


@pytest.fixture
def embed_server(serve: Callable[..., Running]) -> Running:
    return serve(Task.EMBED)
