"""tei-serve raises its soft open-file limit to the hard one (every connection is a file)."""

from __future__ import annotations

import resource

import pytest

from tei_serve import cli


def _limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, *, refuse: bool = False
            ) -> list[tuple[int, int]]:  # fmt: skip
    calls: list[tuple[int, int]] = []

    def setrlimit(kind: int, value: tuple[int, int]) -> None:
        assert kind == resource.RLIMIT_NOFILE
        if refuse:
            raise ValueError("not allowed")
        calls.append(value)

    monkeypatch.setattr(resource, "getrlimit", lambda kind: (soft, hard))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    return calls


def test_the_soft_limit_goes_up_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _limits(monkeypatch, 1024, 524288)
    assert cli.raise_open_file_limit() == 524288
    assert calls == [(524288, 524288)]


def test_a_limit_already_at_the_top_or_a_refusal_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _limits(monkeypatch, 1024, 1024)
    assert cli.raise_open_file_limit() == 1024 and calls == []
    _limits(monkeypatch, 1024, 4096, refuse=True)
    assert cli.raise_open_file_limit() == 1024


def test_this_process_can_do_it() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert cli.raise_open_file_limit() >= soft
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
