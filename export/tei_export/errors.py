"""The exporter's one error type: its message is the one line the CLI prints."""

from __future__ import annotations


class ExportError(Exception):
    pass


class InterruptedAfterWriting(KeyboardInterrupt):
    """Ctrl-C or a stopping signal arrived once the artifact was in place (while the one it
    replaced was removed, or the summary printed): the export is complete, and a caller that
    stops on KeyboardInterrupt still stops. `interrupt` is what arrived."""

    def __init__(self, output_dir: str, interrupt: BaseException) -> None:
        super().__init__(output_dir)
        self.output_dir = output_dir
        self.interrupt = interrupt
