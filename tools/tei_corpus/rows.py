"""Every row of a corpus checked while the job is planned, before any work starts.

An actor that meets a bad row stops the job at that shard; the shards before it are done and
recorded with the file's hash, so fixing the row made the rerun "another job" and every
finished shard was lost, one bad row per round. Checked up front, the job records nothing
until the corpus can be embedded whole, and one error lists the bad rows together. The same
rule for ids holds for a whole file, not per shard: with the rule per shard, a file whose
last row lacked an id failed or passed depending on --shard-rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tei_runtime.tokenization import is_text

if TYPE_CHECKING:
    import pyarrow as pa

SHOWN = 10
"""Bad rows named in the error; the rest are counted."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""What Parquet's int64 id column holds."""


class BadRows:
    """The corpus's problems, each located by file (and line and row, for a row's)."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.count = 0
        self.blank_texts = 0
        """Texts that are empty or only whitespace: no error (the model embeds them, all as
        one vector), but said, since they are seldom what a corpus means."""

    def add(self, where: str, what: str) -> None:
        self.count += 1
        if len(self.shown) < SHOWN:
            self.shown.append(f"{where}: {what}")

    def message(self) -> str:
        more = f"\n  ... and {self.count - len(self.shown)} more" if self.count > SHOWN else ""
        problems = "problem" if self.count == 1 else "problems"
        return (
            f"the corpus cannot be embedded as it is, {self.count} {problems} (nothing was "
            "started or recorded: fix them and run the same command again):\n  "
            + "\n  ".join(self.shown)
            + more
        )


def _json_type(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case list():
            return "a list"
        case dict():
            return "an object"
        case _:
            return "a string"


class JsonlFile:
    """The row checks of one JSONL file, fed line by line by the planner's single pass."""

    def __init__(self, path: Path, text_field: str, id_field: str, bad: BadRows) -> None:
        self.path, self.text_field, self.id_field, self.bad = path, text_field, id_field, bad
        self.has_ids: bool | None = None
        """Whether the file's first row has an id: every row must then, or none."""
        self.id_type: type | None = None

    def check(self, line: bytes, where: str) -> dict[str, Any] | None:
        """The row's record, whatever its problems (added to `bad`, located by `where`);
        None where the line is no JSON object."""
        try:
            record = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
            self.bad.add(where, f"not JSON ({e})")
            return None
        if not isinstance(record, dict):
            self.bad.add(where, f"{_json_type(record)} in JSON, not an object")
            return None
        self._text(where, record)
        self._id(where, record)
        return record

    def _text(self, where: str, record: dict[str, Any]) -> None:
        field = self.text_field
        if field not in record:
            self.bad.add(where, f"no {field!r} field (--text-field)")
        elif not isinstance(text := record[field], str):
            self.bad.add(where, f"{field!r} is {_json_type(text)}, not a string")
        elif not is_text(text):
            self.bad.add(where, f"{field!r} is not valid text (a lone surrogate such as "
                                "\\ud83d, half of an escaped emoji)")  # fmt: skip
        elif not text.strip():
            self.bad.blank_texts += 1

    def _id(self, where: str, record: dict[str, Any]) -> None:
        field = self.id_field
        present = field in record
        if self.has_ids is None:
            self.has_ids = present
        if present != self.has_ids:
            said = "no" if not present else "an"
            first = "has one" if self.has_ids else "has none"
            self.bad.add(where, f"{said} {field!r} (--id-field) where the file's first row "
                         f"{first}: give every row a string or integer id, or none")  # fmt: skip
            return
        if not present:
            return
        value = record[field]
        if not isinstance(value, str | int) or isinstance(value, bool):
            self.bad.add(where, f"{field!r} is {_json_type(value)}: ids are strings or integers")
        elif isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            self.bad.add(where, f"{field!r} {value} does not fit a 64-bit integer (Parquet's "
                                "int64): give it as a string")  # fmt: skip
        elif isinstance(value, str) and not is_text(value):
            self.bad.add(where, f"{field!r} is not valid text (a lone surrogate such as \\ud83d)")
        elif self.id_type is None:
            self.id_type = type(value)
        elif type(value) is not self.id_type:
            kinds = {str: "a string", int: "an integer"}
            self.bad.add(where, f"{field!r} is {kinds[type(value)]} where the file's first id "
                                f"is {kinds[self.id_type]}: one type per file")  # fmt: skip


def check_parquet(path: Path, text_field: str, id_field: str, bad: BadRows) -> bool:
    """The text and id columns of a Parquet file, read a row group at a time; whether it has
    the id column."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    schema = file.schema_arrow
    for field in {text_field, id_field}:
        if schema.names.count(field) > 1:
            bad.add(f"{path}", f"{schema.names.count(field)} columns named {field!r}")
            return False
    if text_field not in schema.names:
        columns = ", ".join(schema.names)
        bad.add(f"{path}", f"no column {text_field!r} (--text-field); it has: {columns}")
        return id_field in schema.names
    if not _is_text_type(schema.field(text_field).type):
        bad.add(f"{path}", f"column {text_field!r} is {schema.field(text_field).type}, not text")
    has_ids = id_field in schema.names
    id_type = schema.field(id_field).type if has_ids else None
    if id_type is not None and not (pa.types.is_integer(id_type) or _is_text_type(id_type)):
        bad.add(f"{path}", f"column {id_field!r} (--id-field) is {id_type}: ids are strings or "
                           "integers")  # fmt: skip
        id_type = None
    read = [text_field] + ([id_field] if id_type is not None else [])
    first = 0
    for group in range(file.metadata.num_row_groups):
        table = file.read_row_group(group, columns=read)
        _nulls(bad, path, first, table.column(text_field), text_field)
        bad.blank_texts += _blank(table.column(text_field))
        if id_type is not None:
            ids = table.column(id_field)
            _nulls(bad, path, first, ids, id_field)
            if pa.types.is_uint64(id_type):
                too_big = pc.greater(ids, pa.scalar(INT64_MAX, pa.uint64()))
                if pc.any(too_big).as_py():
                    row = first + pc.index(too_big, True).as_py()
                    bad.add(f"{path}: row {row}", f"{id_field!r} {ids[row - first].as_py()} does "
                                                  "not fit a 64-bit integer")  # fmt: skip
        first += table.num_rows
    return has_ids


def _is_text_type(kind: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)  # Polars' to_arrow() writes these
    )


def _blank(column: pa.ChunkedArray) -> int:
    """How many of the column's texts are empty or only whitespace."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        texts = column.cast(pa.large_string())
        return int(pc.sum(pc.equal(pc.utf8_trim_whitespace(texts), "")).as_py() or 0)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return 0  # not text: refused above


def _nulls(bad: BadRows, path: Path, first: int, column: pa.ChunkedArray, field: str) -> None:
    import pyarrow.compute as pc

    if column.null_count:
        row = first + pc.index(pc.is_null(column), True).as_py()
        more = f" (one of {column.null_count} in its row group)" if column.null_count > 1 else ""
        bad.add(f"{path}: row {row}", f"null {field!r}{more}")
