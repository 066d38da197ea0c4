"""LOG_LEVEL read as TEI's EnvFilter: every value TEI starts with starts us too."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tei_serve.cli import configure_logging
from tei_serve.log_filter import OFF, OUR_LOGGERS, LogFilter, parse_log_filter
from tei_serve.settings import load_settings


@pytest.mark.parametrize(
    ("value", "root"),
    [("trace", logging.DEBUG), ("TRACE", logging.DEBUG), ("debug", logging.DEBUG),
     ("info", logging.INFO), ("Warn", logging.WARNING), ("warning", logging.WARNING),
     ("error", logging.ERROR), ("off", OFF), ("0", OFF), ("5", logging.DEBUG),
     ("", logging.INFO), (" info ", logging.INFO)],
)  # fmt: skip
def test_bare_levels(value: str, root: int) -> None:
    assert parse_log_filter(value) == LogFilter(root=root)


def test_directives_for_tei_crates_set_our_loggers() -> None:
    got = parse_log_filter("warn,text_embeddings_router=debug,tower_http=trace")
    assert got.root == logging.WARNING and got.problem is None
    assert got.ours == logging.DEBUG
    # EnvFilter: only the named targets log when no bare level is given.
    only = parse_log_filter("text_embeddings_backend[embed]=info")
    assert only.root == OFF and only.ours == logging.INFO


@pytest.mark.parametrize("value", ["verbose", "info,=debug", "text_embeddings_router=loud"])
def test_unreadable_values_fall_back_to_info_and_say_so(value: str) -> None:
    got = parse_log_filter(value)
    assert got.root == logging.INFO and got.ours is None
    assert got.problem is not None and repr(value) in got.problem


def test_only_foreign_targets_log_at_info_instead_of_nothing() -> None:
    got = parse_log_filter("tower_http=debug,hyper")
    assert got.root == logging.INFO and got.problem is not None


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ours = {name: logging.getLogger(name).level for name in OUR_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, old in ours.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.usefixtures("restored_logging")
def test_configure_logging_takes_what_tei_takes(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(load_settings([], env={"LOG_LEVEL": "trace"}))
    assert logging.getLogger("tei_serve").getEffectiveLevel() == logging.DEBUG
    configure_logging(load_settings([], env={"LOG_LEVEL": "info,text_embeddings_router=debug"}))
    assert logging.getLogger().level == logging.INFO
    assert logging.getLogger("tei_runtime").getEffectiveLevel() == logging.DEBUG
    configure_logging(load_settings(["--log-level", "nonsense"], env={}))
    assert logging.getLogger().level == logging.INFO
    assert "LOG_LEVEL 'nonsense'" in (err := capsys.readouterr().err) and "logging at info" in err
