"""`tei-embed`: embed a JSONL or Parquet corpus on Ray Data, resumable shard by shard.

    tei-embed ARTIFACT INPUT... OUTPUT_DIR [--text-field text] [--id-field id] [--shard-rows N]

The input (files, or folders of `*.jsonl` / `*.parquet`) is cut into shards of `--shard-rows`
rows, planned from file metadata and line offsets only, so the driver never holds the corpus.
The shards go through `Dataset.map_batches` to a pool of actors that each load the artifact
once; an actor reads its shard's rows, embeds them and writes `part-NNNNN.parquet` (columns
`id`, `embedding`), then `_part-NNNNN.done`. A rerun after a crash skips every shard with a done
marker; a shard written but not marked is redone. `_tei_embed.json` records what the job was
(inputs, artifact and the graph embedding with, fields, shard size) and, once a shard is done,
a rerun with different ones is refused rather than mixing two jobs' shards. Needs the `ray`
extra (from a checkout: `pip install '.[ray]'`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from tei_bundle import artifact_folder
from tei_corpus.rows import BadRows, JsonlFile, check_parquet
from tei_runtime.checksum import sha256_file
from tei_runtime.errors import TeiRuntimeError
from tei_runtime.manifest import MANIFEST_NAME, read_manifest
from tei_runtime.tokenization import is_text

if TYPE_CHECKING:
    import pyarrow as pa

    from tei_runtime.model import Model

log = logging.getLogger("tei_embed")

JOB_FILE = "_tei_embed.json"
LOCK_FILE = "_tei_embed.lock"
"""Held by the run writing to an output folder: a second run there (other options or the
same) would record its own job over the first's while neither has finished a shard, and
both would write shards."""
RAY_REACH_SECONDS = 5.0
"""How long a Ray address gets to accept a connection: `ray.init` retries one that nothing
answers for ever."""
BUNDLE_CACHE = ".bundle"
SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
NAMED_SUFFIXES = {**SUFFIXES, ".ndjson": "jsonl"}
"""A file named on the command line: these, in any case."""


class CorpusJobError(RuntimeError):
    """The job cannot run as asked; the text says what to change."""


class InputFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str
    kind: str
    """jsonl | parquet"""
    size: int
    rows: int
    sha256: str = ""
    """Of the file's bytes: a file edited in place to the same size is a different input.
    Empty in a job recorded by an older tei-embed, which is then compared without it."""


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an output folder holds; a resumed run must ask for exactly the same."""

    inputs: list[InputFile]
    artifact_variants: dict[str, str]
    """variant name -> graph sha256, of the artifact the vectors come from."""
    model_id: str
    text_field: str
    id_field: str
    shard_rows: int
    normalize: bool
    prompt_name: str | None = None
    variant: str = ""
    """The graph every shard is embedded with (fp32, int8-plain ...): one job, one graph,
    whatever --dtype a rerun asks for or the CPU an actor lands on."""
    artifact_manifest: str = ""
    """sha256 of the artifact's manifest.json: its pooling, prompts, length and tokenizer
    checksums change vectors as much as a graph does. Empty in a job an older tei-embed
    recorded, which is then compared without it."""
    shard_digits: int = 5
    """Digits of its shard names (`name_digits`); 5 in a job an older tei-embed recorded,
    whose names were padded to five whatever the count, and which resumes with them."""


class Shard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    index: int
    path: str
    kind: str
    start: int
    """First row of the shard within its file."""
    rows: int
    offset: int = 0
    """JSONL: byte offset of the first row, so an actor seeks instead of scanning."""
    first_row: int = 0
    """Row number within the whole corpus: the id when the input has no id field."""
    name: str = ""
    """`part-NNNNN`, its output's name (`part_name`)."""


class Done(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    rows: int
    seconds: float


def name_digits(shards: int) -> int:
    """Five, or as many as the last of `shards` needs, so that the names sort as the
    corpus's rows (five sorted `part-100000` before `part-99999`)."""
    return max(5, len(str(shards - 1)))


def part_name(index: int, digits: int = 5) -> str:
    return f"part-{index:0{digits}d}"


# ---- planning: inputs -> shards ----------------------------------------------------------


_SHARD_NAME = re.compile(r"part-\d{5,}\.parquet")


def done_marker(out_dir: Path, shard: Shard) -> Path:
    """`_part-NNNNN.done`: the leading underscore is what pyarrow, pandas and Spark skip when
    they read the folder as one dataset, so the markers do not break `read_parquet(out)`."""
    return out_dir / f"_{shard.name}.done"


def input_files(paths: Sequence[Path], output: Path | None = None) -> list[Path]:
    """The input files in the order given, each once (a file named twice, or also inside a
    folder given, would embed its rows twice). The output folder is no input folder:
    `read_parquet(output)` would read the corpus's files with the shards."""
    files: list[Path] = []
    mine = output.resolve() if output is not None else None
    for path in paths:
        if path.is_dir():
            if path.resolve() == mine:
                raise CorpusJobError(
                    f"{path}: the output folder is also an input folder, where reading the "
                    "shards back as one table would read the corpus with them; give a new "
                    "output folder (one inside it is fine: only a folder's top level is read)"
                )
            # Names from `_` or `.` are skipped unread and unmentioned, as pyarrow and Spark
            # skip them reading a folder: markers, temporaries, macOS's `._x.jsonl` twins.
            entries = [p for p in sorted(path.iterdir()) if not p.name.startswith(("_", "."))]
            found = [p for p in entries if p.suffix in SUFFIXES and p.is_file()]
            skipped = [p.name + ("/" if p.is_dir() else "") for p in entries if p not in found]
            if skipped:
                shown = ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else "")
                log.warning(
                    "%s: %d entries not read (only the *.jsonl and *.parquet files at its top "
                    "level are): %s", path, len(skipped), shown,
                )  # fmt: skip
            if not found:
                raise CorpusJobError(f"{path}: no *.jsonl or *.parquet files in it")
            files += found
        elif path.is_file():
            if path.suffix.lower() not in NAMED_SUFFIXES:
                raise CorpusJobError(f"{path}: not .jsonl, .ndjson or .parquet")
            files.append(path)
        else:
            raise CorpusJobError(f"{path}: no such file or folder")
    for p in files:
        if p.parent.resolve() == mine:
            # `read_parquet(output)` would read it with the shards; one named like a shard
            # would be read, then replaced by the shard of its name.
            shard_like = _SHARD_NAME.fullmatch(p.name.lower())
            like = " named like the output's shards" if shard_like else ""
            raise CorpusJobError(
                f"{p}: an input{like} in the output folder, where reading the shards back as "
                "one table would read it too (or the job write over it); give another output "
                "folder"
            )
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if len(unique) < len(files):
        log.warning("%d input files were named more than once; each is read once",
                    len(files) - len(unique))  # fmt: skip
    return unique


def _written_here(path: Path) -> bool:
    """Whether a Parquet file is a shard tei-embed wrote (its schema records where the ids
    came from), not a user's file that happens to have a shard's name."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
        return False
    return ID_SOURCE_KEY in metadata


def _jsonl_offsets(
    path: Path, shard_rows: int, checker: JsonlFile | None = None
) -> tuple[int, list[int], str, int]:
    """Row count, the byte offset of every shard's first row (blank lines are no rows), the
    file's sha256, hashed in the same pass (which checks every row, given a checker), and
    the bytes read: the size planned, even if rows are appended meanwhile."""
    offsets: list[int] = []
    rows = 0
    position = 0
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for line_number, line in enumerate(f, start=1):
            digest.update(line)
            if line.strip():
                if rows % shard_rows == 0:
                    offsets.append(position)
                if checker is not None:
                    checker.check(line, f"{path}: line {line_number} (row {rows})")
                rows += 1
            position += len(line)
    return rows, offsets, digest.hexdigest(), position


class Fields(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner checks every row for."""

    text: str
    id: str
    id_given: bool
    """--id-field was given: an id field no input has is a typo, not "use row numbers"."""


def plan(
    paths: Sequence[Path], shard_rows: int, output: Path | None = None,
    fields: Fields | None = None,
) -> tuple[list[InputFile], list[Shard]]:  # fmt: skip
    """The inputs and their shards; with `fields`, every row checked too (one error naming
    the bad rows, before anything is recorded)."""
    if shard_rows < 1:
        raise CorpusJobError(f"--shard-rows must be at least 1, got {shard_rows}")
    import pyarrow.parquet as pq

    inputs: list[InputFile] = []
    shards: list[Shard] = []
    corpus_row = 0
    bad = BadRows()
    with_ids = 0
    for path in input_files(paths, output):
        kind = NAMED_SUFFIXES[path.suffix.lower()]
        if kind == "jsonl":
            checker = None if fields is None else JsonlFile(path, fields.text, fields.id, bad)
            rows, offsets, digest, size = _jsonl_offsets(path, shard_rows, checker)
            with_ids += bool(checker is not None and checker.has_ids)
        else:
            size = path.stat().st_size  # before reading: a change while planning shows
            try:
                rows, offsets = pq.ParquetFile(path).metadata.num_rows, []
                if fields is not None:
                    with_ids += check_parquet(path, fields.text, fields.id, bad)
            except (OSError, ValueError, KeyError, NotImplementedError) as e:
                # pyarrow's ArrowInvalid is a ValueError, ArrowNotImplementedError a
                # NotImplementedError
                raise CorpusJobError(f"{path}: not a readable Parquet file ({e})") from e
            digest = sha256_file(path)
        if fields is not None:  # a big corpus takes minutes here: each file said as done
            log.info("%s: %d rows read and checked", path, rows)
        inputs.append(
            InputFile(
                path=str(path.resolve()),
                kind=kind,
                size=size,
                rows=rows,
                sha256=digest,
            )
        )
        for n, start in enumerate(range(0, rows, shard_rows)):
            shards.append(
                Shard(
                    index=len(shards),
                    path=str(path.resolve()),
                    kind=kind,
                    start=start,
                    rows=min(shard_rows, rows - start),
                    offset=offsets[n] if offsets else 0,
                    first_row=corpus_row + start,
                )
            )
        corpus_row += rows
    if bad.count:
        raise CorpusJobError(bad.message())
    if bad.blank_texts:
        log.warning(
            "%d rows have an empty or whitespace-only text: each is embedded as such (all alike)",
            bad.blank_texts,
        )
    if fields is not None and fields.id_given and not with_ids and corpus_row:
        raise CorpusJobError(
            f"--id-field {fields.id!r}: no input has it (a JSONL file's first row, a Parquet "
            "file's columns); leave --id-field out to number the rows"
        )
    return inputs, named(shards, name_digits(len(shards)))


def named(shards: Sequence[Shard], digits: int) -> list[Shard]:
    return [msgspec.structs.replace(s, name=part_name(s.index, digits)) for s in shards]


# ---- one shard: read, embed, write ---------------------------------------------------------


ROW_NUMBER_IDS = "row numbers"
ID_SOURCE_KEY = b"tei_embed.ids"
"""A shard's schema metadata: where its ids come from (the id field, or ROW_NUMBER_IDS)."""


def read_shard(shard: Shard, text_field: str, id_field: str) -> tuple[list[str], list[Any], str]:
    """The shard's texts, ids (the corpus row number where the input has no id field) and
    where the ids come from (`id_field`, or ROW_NUMBER_IDS)."""
    if shard.kind == "jsonl":
        # The planner checked every row; checked again here with the same rules, in case
        # the file was edited since (its hash is compared only when a job resumes).
        bad = BadRows()
        checker = JsonlFile(Path(shard.path), text_field, id_field, bad)
        records: list[dict[str, Any]] = []
        with Path(shard.path).open("rb") as f:
            f.seek(shard.offset)
            for line in f:
                if len(records) == shard.rows:
                    break
                if line.strip():
                    where = f"{shard.path}: row {shard.start + len(records)}"
                    record = checker.check(line, where)
                    if bad.count or record is None:
                        raise CorpusJobError(f"{bad.shown[0]} (rows count from 0, blank "
                                             "lines not counted): the file changed since "
                                             "the job was planned")  # fmt: skip
                    records.append(record)
        rows: list[Any] = records
        texts = [r[text_field] for r in records]
        numbered = not checker.has_ids
        ids = (
            list(range(shard.first_row, shard.first_row + len(records)))
            if numbered
            else [r[id_field] for r in records]
        )
    else:
        import pyarrow.parquet as pq

        table = _parquet_rows(pq.ParquetFile(shard.path), shard.start, shard.rows)
        if text_field not in table.column_names:
            raise CorpusJobError(f"{shard.path}: no column {text_field!r} (--text-field)")
        rows = texts = table.column(text_field).to_pylist()
        numbered = id_field not in table.column_names
        ids = (
            list(range(shard.first_row, shard.first_row + table.num_rows))
            if numbered
            else table.column(id_field).to_pylist()
        )
        if None in ids:
            raise CorpusJobError(
                f"{shard.path}: row {shard.start + ids.index(None)} has a null {id_field!r}"
            )
    if len(rows) != shard.rows:
        raise CorpusJobError(
            f"{shard.path}: changed since the job was planned (shard {shard.index})"
        )
    checked: list[str] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise CorpusJobError(
                f"{shard.path}: row {shard.start + i} has no string field {text_field!r}"
            )
        if not is_text(text):
            raise CorpusJobError(
                f"{shard.path}: row {shard.start + i}'s {text_field!r} is not valid text (a "
                "lone surrogate such as \\ud83d, half of an escaped emoji)"
            )
        checked.append(text)
    return checked, ids, ROW_NUMBER_IDS if numbered else id_field


def id_mismatch(out_dir: Path, shards: Sequence[Shard]) -> str | None:
    """What differs where the shards' ids are not of one type from one source (string ids
    in the first rows and none later; a JSONL file's string ids beside a Parquet file's
    integers): the shards are each right, but cannot be read as one table, or would mix ids
    with row numbers. None where they agree."""
    import pyarrow.parquet as pq

    first: dict[tuple[str, str], str] = {}
    for shard in shards:
        path = out_dir / f"{shard.name}.parquet"
        schema = pq.read_schema(path)
        source = (schema.metadata or {}).get(ID_SOURCE_KEY, b"?").decode()
        first.setdefault((str(schema.field("id").type), source), path.name)
    if len(first) < 2:
        return None
    kinds = "; ".join(f"{name}: {kind} ids from {source}"
                      for (kind, source), name in first.items())  # fmt: skip
    return (
        f"{out_dir}: the shards' ids differ ({kinds}), so one table of them is not what it "
        "seems (pyarrow refuses it, pandas turns integers into strings); "
        "read them shard by shard, or give every row of every input a string or integer id "
        "(one type), or none, and embed again into a new folder"
    )


def _parquet_rows(file: Any, start: int, count: int) -> pa.Table:
    """Rows [start, start+count) reading only the row groups that hold them."""
    import pyarrow as pa

    groups: list[int] = []
    first = 0
    skip = 0
    for g in range(file.metadata.num_row_groups):
        n = file.metadata.row_group(g).num_rows
        if first + n > start and first < start + count:
            if not groups:
                skip = start - first
            groups.append(g)
        first += n
    if not groups:
        return pa.table({})
    table: pa.Table = file.read_row_groups(groups).slice(skip, count)
    return table


def write_shard(
    out_dir: Path, shard: Shard, ids: list[Any], vectors: np.ndarray, seconds: float,
    id_source: str,
) -> Path:  # fmt: skip
    """Parquet first (temp name, then rename), the done marker last: a marker always means a
    complete shard."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dim = int(vectors.shape[1])
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    table = pa.table(
        {
            "id": pa.array(ids),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
    )
    table = table.replace_schema_metadata({ID_SOURCE_KEY: id_source.encode()})
    name = shard.name
    final = out_dir / f"{name}.parquet"
    tmp = out_dir / f".{name}.parquet.tmp-{os.getpid()}"
    pq.write_table(table, tmp)
    tmp.replace(final)
    marker = done_marker(out_dir, shard)
    marker_tmp = out_dir / f".{name}.done.tmp-{os.getpid()}"
    marker_tmp.write_bytes(msgspec.json.encode(Done(rows=len(ids), seconds=seconds)))
    marker_tmp.replace(marker)
    return final


def embed_shard(model: Model, job: Job, shard: Shard, out_dir: Path) -> int:
    started = time.monotonic()
    texts, ids, id_source = read_shard(shard, job.text_field, job.id_field)
    vectors = model.embed(texts, normalize=job.normalize, prompt_name=job.prompt_name)
    try:
        write_shard(out_dir, shard, ids, vectors, time.monotonic() - started, id_source)
    except OSError as e:  # a full disk is the output's, not the input's the error named
        raise CorpusJobError(
            f"{out_dir}: could not write {shard.name}.parquet: {e.strerror or e}"
        ) from e
    return len(ids)


def finished(out_dir: Path, shards: Sequence[Shard]) -> set[int]:
    done: set[int] = set()
    for shard in shards:
        name = shard.name
        marker = done_marker(out_dir, shard)
        if marker.is_file() and (out_dir / f"{name}.parquet").is_file():
            try:
                rows = msgspec.json.decode(marker.read_bytes(), type=Done).rows
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # a torn marker: redo the shard
            if rows == shard.rows:
                done.add(shard.index)
    return done


def refuse_foreign_shards(out_dir: Path) -> None:
    """A `part-NNNNN.parquet` in the output folder that tei-embed did not write (a Spark
    output, a second corpus folder given last by mistake) would be written over by the shard
    of its name: the job stops before it."""
    if not out_dir.is_dir():
        return
    for path in sorted(out_dir.iterdir()):
        if _SHARD_NAME.fullmatch(path.name) and path.is_file() and not _written_here(path):
            raise CorpusJobError(
                f"{path}: not a shard tei-embed wrote, and its shard of that name would "
                f"replace it; is {out_dir} an input given as the output (the output folder "
                "goes last)? Give another output folder"
            )


def refuse_grown_inputs(files: Sequence[InputFile]) -> None:
    """An input whose size changed while the job ran (rows appended to a file being
    written): the rows past the plan were not embedded, which exit 0 would hide."""
    changed = [f"{f.path} ({f.size} -> {size} bytes)" if size >= 0 else f"{f.path} (gone)"
               for f in files if (size := _size(Path(f.path))) != f.size]  # fmt: skip
    if changed:
        raise CorpusJobError(
            f"changed while the job ran: {', '.join(changed)}; the shards hold the rows as "
            "planned (the same command refuses the changed input): embed the new rows into a "
            "new output folder"
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _as_recorded(job: Job, previous: Job) -> Job:
    """`job` as the recorded one was written: an older tei-embed hashed no input and no
    manifest."""
    if not all(f.sha256 for f in previous.inputs):
        inputs = [msgspec.structs.replace(f, sha256="") for f in job.inputs]
        job = msgspec.structs.replace(job, inputs=inputs)
    if not previous.artifact_manifest:
        job = msgspec.structs.replace(job, artifact_manifest="")
    if previous.shard_digits == 5:  # recorded before names grew, or never past five
        job = msgspec.structs.replace(job, shard_digits=5)
    return job


def _changed_inputs(previous: Job, job: Job) -> list[str]:
    """The inputs both jobs name whose bytes differ: the file was edited under the job."""
    before = {f.path: f for f in previous.inputs}
    return [
        f.path
        for f in job.inputs
        if f.path in before and (before[f.path].size, before[f.path].sha256) != (f.size, f.sha256)
    ]


def recorded_job(out_dir: Path) -> Job | None:
    """The job an output folder records; None where it records none or cannot be read."""
    try:
        return msgspec.json.decode((out_dir / JOB_FILE).read_bytes(), type=Job)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def prepare_output(out_dir: Path, job: Job) -> Job:
    """Record the job, or check that a resumed run is the same job; the job in effect (the
    recorded one, as it names its shards)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / JOB_FILE
    if path.is_file():
        try:
            previous = msgspec.json.decode(path.read_bytes(), type=Job)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise CorpusJobError(f"{path}: damaged ({e}); remove {out_dir} to start over") from e
        compared = _as_recorded(job, previous)
        if previous != compared and not any(out_dir.glob("_part-*.done")):
            # The earlier job finished no shard (it failed at once): nothing of it to mix.
            log.info("%s: the earlier job there finished no shard; recording this one", out_dir)
        elif previous != compared:
            fields = [
                f for f in Job.__struct_fields__ if getattr(previous, f) != getattr(compared, f)
            ]
            changed = _changed_inputs(previous, compared)
            raise CorpusJobError(
                f"{out_dir} holds another job's shards (it differs in: {', '.join(fields)})"
                + (f"; changed since: {', '.join(changed)}" if changed else "")
                + "; use a new output folder, or rerun with the same inputs and options"
            )
        else:
            return previous
    elif any(out_dir.glob("_part-*.done")):
        # Shards whose job is unknown (its record deleted to "start over", or lost in a copy
        # that skipped `_` files): adopting them would mix another job's vectors in.
        raise CorpusJobError(
            f"{out_dir} holds finished shards but no {JOB_FILE}, so which job wrote them is "
            "unknown; use a new output folder, or remove the part-* and _part-* files there"
        )
    tmp = out_dir / f".{JOB_FILE}.tmp"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(job), indent=2) + b"\n")
    tmp.replace(path)
    return job


# ---- Ray: one model per actor ----------------------------------------------------------------


class ShardEmbedder:
    """The actor of `map_batches`: loads the artifact once, then embeds whole shards."""

    def __init__(
        self, artifact: str, job: bytes, out_dir: str, device: str, dtype: str, graph: str,
        threads: int,
    ) -> None:  # fmt: skip
        import tei_runtime

        self.job = msgspec.json.decode(job, type=Job)
        self.out_dir = Path(out_dir)
        self.model = tei_runtime.load(
            artifact, device=device, dtype=dtype, graph=graph, intra_op_threads=threads
        )
        if self.model.variant.name != self.job.variant:
            raise CorpusJobError(
                f"this worker runs the {self.model.variant.name} graph where the job embeds "
                f"with {self.job.variant}: run every worker on the same device kind"
            )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        indices: list[int] = []
        rows: list[int] = []
        errors: list[str] = []
        for raw in batch["shard"]:
            shard = msgspec.json.decode(
                bytes(raw, "utf-8") if isinstance(raw, str) else raw, type=Shard
            )
            # The error goes back as data: Ray's wrapping of an exception raised here keeps
            # its text only deep inside its own ("UDF failed to process a data block").
            try:
                rows.append(embed_shard(self.model, self.job, shard, self.out_dir))
                errors.append("")
            except (CorpusJobError, TeiRuntimeError) as e:
                rows.append(-1)
                errors.append(str(e))
            except Exception as e:  # a row json or pyarrow cannot read: its own words
                rows.append(-1)
                errors.append(f"{shard.path}: {type(e).__name__}: {e}")
            indices.append(shard.index)
        return {
            "index": np.array(indices, dtype=np.int64),
            "rows": np.array(rows, np.int64),
            "error": np.array(errors, dtype=object),
        }


def run(
    artifact: Path,
    inputs: Sequence[Path],
    out_dir: Path,
    *,
    text_field: str = "text",
    id_field: str | None = None,
    shard_rows: int = 10_000,
    actors: int = 1,
    threads_per_actor: int = 1,
    device: str = "cpu",
    dtype: str = "auto",
    normalize: bool = True,
    prompt_name: str | None = None,
    address: str | None = None,
) -> dict[str, int]:
    """Embed every unfinished shard; returns counts of shards done now, skipped and total.
    `id_field`: None reads ids from "id" where the inputs have it, else numbers the rows; a
    name given must be in the inputs. `address`: the Ray cluster to run on (else
    RAY_ADDRESS, else a local Ray), reached only once everything else has been checked."""
    if actors < 1 or threads_per_actor < 1:
        raise CorpusJobError("--actors and --threads-per-actor must be at least 1")
    with _output_lock(out_dir):
        return _run_locked(
            artifact, inputs, out_dir,
            fields=Fields(text=text_field, id=id_field or "id", id_given=id_field is not None),
            shard_rows=shard_rows, actors=actors, threads_per_actor=threads_per_actor,
            device=device, dtype=dtype, normalize=normalize, prompt_name=prompt_name,
            address=address,
        )  # fmt: skip


@contextlib.contextmanager
def _output_lock(out_dir: Path) -> Iterator[None]:
    if out_dir.exists() and not out_dir.is_dir():
        raise CorpusJobError(
            f"{out_dir}: a file, not an output folder (tei-embed ARTIFACT INPUT... OUTPUT_DIR: "
            "the output folder goes last)"
        )
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = out_dir / LOCK_FILE
    try:
        with lock.open("a") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CorpusJobError(
                    f"{out_dir}: another tei-embed is writing there (it holds {lock}); wait "
                    "for it to end, or give another output folder"
                ) from None
            yield
    finally:
        if created and [p.name for p in out_dir.iterdir()] == [LOCK_FILE]:
            # A run refused before it recorded anything leaves no folder behind.
            with contextlib.suppress(OSError):
                lock.unlink()
                out_dir.rmdir()


def _run_locked(
    artifact: Path,
    inputs: Sequence[Path],
    out_dir: Path,
    *,
    fields: Fields,
    shard_rows: int,
    actors: int,
    threads_per_actor: int,
    device: str,
    dtype: str,
    normalize: bool,
    prompt_name: str | None,
    address: str | None,
) -> dict[str, int]:
    import ray

    from tei_runtime.loader import planned_variant
    from tei_runtime.providers import Device

    # A bundle is unpacked beside the shards: storage every actor writes to, kept for resumes.
    artifact = artifact_folder(artifact, out_dir / BUNDLE_CACHE)
    manifest = read_manifest(artifact)
    # Here, before Ray starts: a device or dtype that cannot run fails in one line, and the
    # graph this host picks is the one every actor runs.
    kind, variant = planned_variant(artifact, device=device, dtype=dtype)
    graph = variant.graph.value if kind is Device.CPU else "auto"
    if prompt_name is not None and prompt_name not in manifest.prompts.prompts:
        known = ", ".join(sorted(manifest.prompts.prompts)) or "none"
        raise CorpusJobError(f"unknown --prompt-name {prompt_name!r}; the artifact has: {known}")
    before = recorded_job(out_dir)
    if before is not None and before.id_field == fields.id:
        # A recorded job resumed as it was asked (an older tei-embed took an --id-field no
        # input had as "number the rows"): the same command must finish it.
        fields = msgspec.structs.replace(fields, id_given=False)
    files, shards = plan(inputs, shard_rows, out_dir, fields)
    refuse_foreign_shards(out_dir)
    job = Job(
        inputs=files,
        artifact_variants={v.name: v.sha256 for v in manifest.variants},
        artifact_manifest=sha256_file(artifact / MANIFEST_NAME),
        variant=variant.name,
        model_id=manifest.source.model_id,
        text_field=fields.text,
        id_field=fields.id,
        shard_rows=shard_rows,
        normalize=normalize,
        prompt_name=prompt_name,
        shard_digits=name_digits(len(shards)),
    )
    shards = named(shards, prepare_output(out_dir, job).shard_digits)
    done = finished(out_dir, shards)
    todo = [s for s in shards if s.index not in done]
    total_rows = sum(s.rows for s in todo)
    log.info(
        "%d shards: %d already done, %d to embed (%d rows) with %d actor(s)",
        len(shards),
        len(done),
        len(todo),
        total_rows,
        actors,
    )
    if not shards:
        log.warning("the inputs hold no rows: nothing to embed")
    if not todo:
        return {"embedded": 0, "skipped": len(done), "total": len(shards)}
    local = not ray.is_initialized() and not address and not os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        _start_ray(address)
    cpus = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
    check_cpus(threads_per_actor, cpus, local=local)
    items = [{"shard": msgspec.json.encode(s).decode()} for s in todo]
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        ShardEmbedder,
        fn_constructor_kwargs={
            "artifact": str(artifact),
            "job": msgspec.json.encode(job),
            "out_dir": str(out_dir.resolve()),
            "device": device,
            "dtype": dtype,
            "graph": graph,
            "threads": threads_per_actor,
        },
        batch_size=1,  # one shard per call: a crash loses at most one shard per actor
        compute=ray.data.ActorPoolStrategy(size=actors),  # `concurrency=` is deprecated
        num_cpus=threads_per_actor,
        batch_format="numpy",
    )
    embedded = 0
    with ProgressLog(out_dir, todo):
        for row in _rows(dataset):
            if row.get("error"):
                raise CorpusJobError(f"shard {shards[int(row['index'])].name}: {row['error']}")
            embedded += 1
    refuse_grown_inputs(files)
    if mismatch := id_mismatch(out_dir, shards):
        # Every vector is written and right: said loudly, not a failed job.
        log.warning("%s", mismatch)
    return {"embedded": embedded, "skipped": len(done), "total": len(shards)}


PROGRESS_POLL_SECONDS = 1.0


class ProgressLog:
    """Logs each shard as its done marker lands, from a thread watching the output folder.

    Ray Data hands the driver a shard's result only once the next block is buffered, so a
    progress line from the result loop came one shard late (the last ones all at the end);
    the marker is written the moment the shard's vectors are safe. The driver can see the
    markers: it reads them to resume, so the output folder is shared with the actors."""

    def __init__(self, out_dir: Path, todo: Sequence[Shard]) -> None:
        self._out_dir = out_dir
        self._todo = list(todo)
        self._rows = {s.index: s.rows for s in todo}
        self._names = {s.index: s.name for s in todo}
        self._logged: set[int] = set()
        self._logged_rows = 0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tei-embed-progress", daemon=True)

    def __enter__(self) -> ProgressLog:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.poll()  # the last markers, landed since the last look

    def _watch(self) -> None:
        while not self._stop.wait(PROGRESS_POLL_SECONDS):
            self.poll()

    def poll(self) -> None:
        try:  # one listing, not a stat per pending shard: a corpus may have 10^5 shards
            names = {p.name for p in self._out_dir.iterdir()}
        except OSError:
            return
        pending = [
            s
            for s in self._todo
            if s.index not in self._logged and done_marker(self._out_dir, s).name in names
        ]
        for index in sorted(finished(self._out_dir, pending)):
            self._logged.add(index)
            self._logged_rows += self._rows[index]
            rate = self._logged_rows / max(time.monotonic() - self._started, 1e-9)
            log.info(
                "shard %s done: %d/%d shards, %d/%d rows, %.0f rows/s",
                self._names[index],
                len(self._logged),
                len(self._todo),
                self._logged_rows,
                sum(self._rows.values()),
                rate,
            )


def check_cpus(threads_per_actor: int, cpus: float, *, local: bool) -> None:
    """An actor asking for more CPUs than Ray has waits for them forever (Ray only logs that
    no node can fulfil it): on a local Ray, whose CPUs are all it will ever have, that is an
    error now; a cluster may still add nodes, so there it is a warning."""
    if threads_per_actor <= cpus:
        return
    message = (
        f"--threads-per-actor {threads_per_actor} asks each actor for more CPUs than Ray has "
        f"({cpus:g})"
    )
    if local:
        raise CorpusJobError(f"{message}: give at most {int(cpus)}")
    log.warning("%s: the actors wait until the cluster has a node that large", message)


def _start_ray(address: str | None) -> None:
    import ray

    where = address or os.environ.get("RAY_ADDRESS")
    if where:
        _check_reachable(where)
    try:
        ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
        raise CorpusJobError(f"cannot start or reach Ray ({where}): {e}") from e
    if threading.current_thread() is threading.main_thread():
        # Ray's core replaced the SIGTERM handler with one that dumps a stack trace and dies
        # with the signal; a scheduler's stop (Kubernetes, Slurm, systemd) is a stop asked
        # for, as Ctrl-C is: the finished shards are kept and Ray's processes stopped.
        signal.signal(signal.SIGTERM, _terminated)


class Terminated(BaseException):
    """SIGTERM while the job runs (a BaseException, as KeyboardInterrupt is)."""


def _terminated(_signum: int, _frame: object) -> None:
    raise Terminated


def _stop_ray() -> None:
    """Stop what this process started of Ray (a local Ray's agents outlive an interrupted
    driver otherwise, ~180 MB each run); from a cluster it only disconnects."""
    import ray

    with contextlib.suppress(Exception):
        # The thread still reading the dataset's rows would otherwise start a new local Ray
        # when it next calls into Ray (its auto-init), whose agents outlive this process.
        from ray._private import auto_init_hook

        auto_init_hook.enable_auto_connect = False
    # and its failures, once Ray is gone, are no news (Ray Data logged each as a traceback
    # on the way out); its loggers set their own levels, so each is silenced
    for name in list(logging.root.manager.loggerDict):
        if name == "ray" or name.startswith("ray."):
            logging.getLogger(name).disabled = True
    with contextlib.suppress(Exception):
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """A `host:port` Ray address (or `ray://host:port`) that accepts no connection within
    RAY_REACH_SECONDS is one clear error; `auto` and `local` are Ray's own to resolve."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), RAY_REACH_SECONDS).close()
    except OSError as e:
        raise CorpusJobError(
            f"cannot reach Ray at {address} (--address or RAY_ADDRESS): "
            f"{e.strerror or 'no answer'} within {RAY_REACH_SECONDS:.0f} s"
        ) from e


def ray_error_text(error: BaseException) -> str:
    """The words of what failed inside Ray: the innermost cause that has any, else the last
    line of Ray's own text (which holds the original error's)."""
    seen: BaseException | None = error
    found = ""
    while seen is not None:
        text = str(seen).strip()
        if text and not text.startswith("UDF failed") and "Traceback" not in text:
            found = text
        seen = getattr(seen, "cause", None) or seen.__cause__
        if seen is error:
            break
    if found:
        return found
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


ROW_WAIT_SECONDS = 0.5
"""How long the main thread waits for a row at a time: Ctrl-C and SIGTERM land between waits."""


def _rows(dataset: Any) -> Iterator[dict[str, Any]]:
    """The dataset's rows, read by a thread of their own: the main thread only waits on a
    queue, so a signal is acted on within ROW_WAIT_SECONDS. Read on the main thread, Ray's
    iterator held it in a call that Python's signal handlers could not interrupt: a SIGTERM
    sent after three of 20 shards was acted on after the last."""
    arrived: queue.Queue[tuple[str, Any]] = queue.Queue()

    def pump() -> None:
        try:
            for row in dataset.iter_rows():
                arrived.put(("row", row))
            arrived.put(("end", None))
        except BaseException as e:  # handed to the main thread, which raises it
            arrived.put(("error", e))

    threading.Thread(target=pump, name="tei-embed-rows", daemon=True).start()
    while True:
        try:
            kind, value = arrived.get(timeout=ROW_WAIT_SECONDS)
        except queue.Empty:
            continue
        if kind == "end":
            return
        if kind == "error":
            raise value
        yield value


# ---- CLI -----------------------------------------------------------------------------------


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tei-embed",
        # argparse renders `nargs="+"` as "X [X ...]", which reads as repeatable pairs here
        usage="tei-embed [options] ARTIFACT INPUT [INPUT ...] OUTPUT_DIR",
        description="Embed a JSONL/Parquet corpus with a tei-onnx artifact on Ray Data; "
        "writes Parquet shards (id, embedding) and resumes after a crash.",
    )
    p.add_argument(
        "artifact", type=Path,
        help="artifact folder (tei-export), or a tei-bundle tar (unpacked once into "
        f"OUTPUT_DIR/{BUNDLE_CACHE}/)",
    )  # fmt: skip
    p.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="INPUT... OUTPUT_DIR",
        help="*.jsonl / *.parquet files or folders of them, then the output folder",
    )
    p.add_argument("--text-field", default="text", help="field/column with the text (text)")
    p.add_argument(
        "--id-field",
        default=None,
        help="field/column with the id (default: `id` where the inputs have it, else the "
        "corpus row number; a name given must be in the inputs)",
    )
    p.add_argument("--shard-rows", type=_positive, default=10_000,
                   help="rows per output shard (10000)")  # fmt: skip
    p.add_argument("--actors", type=_positive, default=1, help="model replicas (Ray actors, 1)")
    p.add_argument(
        "--threads-per-actor",
        type=_positive,
        default=1,
        help="CPUs reserved per actor and onnxruntime threads (1)",
    )
    p.add_argument("--device", default="cpu", help="cpu|cuda|tensorrt|rocm|openvino|auto")
    p.add_argument("--dtype", default="auto", help="auto|float32|float16|int8 (or fp32, fp16)")
    p.add_argument("--prompt-name", default=None, help="a prompt of the artifact's manifest")
    p.add_argument("--no-normalize", action="store_true", help="keep vectors unnormalised")
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (default: a local Ray, or $RAY_ADDRESS)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if len(args.paths) < 2:
        _parser().error("give at least one INPUT and the OUTPUT_DIR")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        import ray
    except ImportError:
        print(
            "tei-embed: needs Ray: install tei-onnx with its `ray` extra "
            "(from a checkout: pip install '.[ray]')",
            file=sys.stderr,
        )
        return 1
    try:
        counts = run(
            args.artifact,
            args.paths[:-1],
            args.paths[-1],
            text_field=args.text_field,
            id_field=args.id_field,
            shard_rows=args.shard_rows,
            actors=args.actors,
            threads_per_actor=args.threads_per_actor,
            device=args.device,
            dtype=args.dtype,
            normalize=not args.no_normalize,
            prompt_name=args.prompt_name,
            address=args.address,
        )
    except (CorpusJobError, TeiRuntimeError) as e:
        _stop_ray()  # first: Ray Data's thread would log on after the error line
        print(f"tei-embed: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # an output path that is a file, a folder it may not write ...
        _stop_ray()
        where = f"{e.filename}: " if e.filename else ""
        print(f"tei-embed: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as e:
        _stop_ray()
        print(
            "tei-embed: interrupted; finished shards are kept, and the same command resumes",
            file=sys.stderr,
        )
        return 143 if isinstance(e, Terminated) else 130
    except ray.exceptions.RayError as e:
        # An actor could not start or died: the cause's words, not Ray's traceback.
        _stop_ray()
        print(f"tei-embed: error: {ray_error_text(e)}", file=sys.stderr)
        return 1
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
