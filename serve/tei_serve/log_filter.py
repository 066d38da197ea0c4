"""TEI's LOG_LEVEL read the way TEI reads it, as a tracing `EnvFilter`, onto Python's loggers.

TEI accepts a bare level (`trace`, `debug`, `info`, `warn`, `error`, `off`, or 0-5) and
comma-separated directives (`info,text_embeddings_router=debug`), and anything it cannot
parse leaves it at `info`: no LOG_LEVEL stops TEI from starting, so none stops us. A
directive for one of TEI's own crates applies to our packages; directives for other targets
name Rust crates we do not have and are ignored. As in EnvFilter, with directives for TEI's
crates but no bare level, everything else is off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

OFF = logging.CRITICAL + 10

_LEVELS = {
    "trace": logging.DEBUG,  # Python has no level below debug that anything here logs at
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": OFF,
    "0": OFF,
    "1": logging.ERROR,
    "2": logging.WARNING,
    "3": logging.INFO,
    "4": logging.DEBUG,
    "5": logging.DEBUG,
}

# TEI's crates, whose directives set the level of what does their work here.
_TEI_TARGETS = ("text_embeddings", "tei_")
OUR_LOGGERS = ("tei_serve", "tei_runtime", "tei_embed")


@dataclass(frozen=True)
class LogFilter:
    root: int
    ours: int | None = None
    """The level of OUR_LOGGERS where a directive names one of TEI's crates; None: root's."""
    problem: str | None = None
    """Why the value was not understood (it then reads as `info`, as in TEI)."""

    def apply(self) -> None:
        logging.getLogger().setLevel(self.root)
        for name in OUR_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET if self.ours is None else self.ours)


def _level(text: str) -> int | None:
    return _LEVELS.get(text.strip().lower())


def parse_log_filter(value: str) -> LogFilter:
    directives = [d.strip() for d in value.split(",") if d.strip()]
    if not directives:
        return LogFilter(root=logging.INFO)
    root: int | None = None
    ours: int | None = None
    for directive in directives:
        target, sep, level_text = directive.rpartition("=")
        if not sep:
            target, level_text = "", directive
        level = _level(level_text)
        if level is None and not sep:
            # A bare target enables everything it logs (EnvFilter's `target` alone).
            target, level = directive, logging.DEBUG
        if level is None or (sep and not target):
            return LogFilter(
                root=logging.INFO,
                problem=f"LOG_LEVEL {value!r}: cannot read {directive!r}; logging at info",
            )
        # A span or field filter (`target[span]=level`) is kept for its target alone.
        target = target.split("[", 1)[0]
        if not target:
            root = level
        elif target.startswith(_TEI_TARGETS):
            ours = level if ours is None else min(ours, level)
    if ours is None:
        if root is None:
            # EnvFilter would log nothing at all here (only other crates are named); a
            # server that says nothing about why is worse than one that logs at info.
            return LogFilter(
                root=logging.INFO,
                problem=f"LOG_LEVEL {value!r} names no level and none of TEI's crates "
                "(text_embeddings_router, ...); logging at info",
            )
        return LogFilter(root=root)
    return LogFilter(root=OFF if root is None else root, ours=ours)
