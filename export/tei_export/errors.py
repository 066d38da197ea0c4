"""The exporter's one error type: its message is the one line the CLI prints."""

from __future__ import annotations


class ExportError(Exception):
    pass
