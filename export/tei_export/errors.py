"""The exporter's one error type: its message is the one line the CLI prints."""

from __future__ import annotations


class ExportError(Exception):
    pass


class Terminated(BaseException):
    """SIGTERM (docker stop, a batch job's kill) or SIGHUP (the terminal or SSH session
    closed) arrived: unwinds like Ctrl-C, so the export's partial folder is removed. A
    BaseException, so no `except Exception` on the way (a fallback, a retry) takes it for a
    failure to work around. The CLI's handler raises it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class InterruptedAfterWriting(KeyboardInterrupt):
    """Ctrl-C or a stopping signal arrived once the artifact was in place (while the one it
    replaced was removed, or the summary printed): the export is complete, and a caller that
    stops on KeyboardInterrupt still stops. `interrupt` is what arrived."""

    def __init__(self, output_dir: str, interrupt: BaseException) -> None:
        super().__init__(output_dir)
        self.output_dir = output_dir
        self.interrupt = interrupt
