"""tei-embed checks every row while planning (fast, no Ray): bad rows are listed together
before anything is recorded, ids follow one rule per file whatever the shard size, and the
output folder's own state (no job record, inputs grown during the run, a full disk) is
said in words that name the right file."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tei_runtime
from tei_corpus import job, rows
from tei_corpus.job import JOB_FILE, CorpusJobError, Fields, plan

FIELDS = Fields(text="text", id="id", id_given=False)


def _jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _refused(paths: list[Path], fields: Fields = FIELDS, shard_rows: int = 10) -> str:
    with pytest.raises(CorpusJobError) as e:
        plan(paths, shard_rows, fields=fields)
    return str(e.value)


def test_every_bad_row_is_named_by_line_and_row(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": 1, "text": "ok"}\n'
        "\n"  # blank: no row, but a line
        '{"id": 2, "text": 12}\n'
        '{"id": 3}\n'
        '{"id": 4, "text": null}\n'
        "[1, 2]\n"
        '{"id": 5, "text": "cut\n'
        '{"id": 6, "text": "emoji \\ud83d"}\n'
        '{"id": 7.5, "text": "ok"}\n'
    )
    said = _refused([corpus])
    assert said.startswith("the corpus cannot be embedded as it is, 7 problems (nothing was")
    for line, row, what in [
        (3, 1, "'text' is a number, not a string"),
        (4, 2, "no 'text' field (--text-field)"),
        (5, 3, "'text' is null, not a string"),
        (6, 4, "a list in JSON, not an object"),
        (7, 5, "not JSON"),
        (8, 6, "'text' is not valid text (a lone surrogate"),
        (9, 7, "'id' is a number: ids are strings or integers"),
    ]:
        assert f"c.jsonl: line {line} (row {row}): {what}" in said, said


def test_only_the_first_bad_rows_are_shown(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": i} for i in range(25)])
    said = _refused([corpus])
    assert said.startswith("the corpus cannot be embedded as it is, 25 problems")
    assert said.endswith("... and 15 more")
    assert said.count("is a number, not a string") == rows.SHOWN


def test_ids_follow_one_rule_per_file_whatever_the_shard_size(tmp_path: Path) -> None:
    """The last row without an id used to fail at --shard-rows 10 and pass (its id the row
    number, which may equal a real string id) at 5."""
    records: list[object] = [{"id": f"doc{i}", "text": "x"} for i in range(25)]
    corpus = _jsonl(tmp_path / "c.jsonl", [*records, {"text": "no id here"}])
    for shard_rows in (5, 10, 26):
        said = _refused([corpus], shard_rows=shard_rows)
        assert "line 26 (row 25): no 'id' (--id-field) where the file's first row has one" in (said)
    late = _jsonl(tmp_path / "late.jsonl", [{"text": "x"}, {"id": "a", "text": "y"}])
    assert "an 'id' (--id-field) where the file's first row has none" in _refused([late])
    mixed = _jsonl(tmp_path / "m.jsonl", [{"id": 1, "text": "x"}, {"id": "2", "text": "y"}])
    assert "'id' is a string where the file's first id is an integer" in _refused([mixed])
    big = _jsonl(tmp_path / "big.jsonl", [{"id": 2**70, "text": "x"}])
    assert "does not fit a 64-bit integer" in _refused([big])
    # Files that each keep the rule pass, with ids or without.
    plan([_jsonl(tmp_path / "ok.jsonl", records)], 5, fields=FIELDS)
    plan([_jsonl(tmp_path / "none.jsonl", [{"text": "x"}] * 3)], 5, fields=FIELDS)


def test_an_id_field_given_that_no_input_has_is_an_error(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": f"d{i}", "text": "x"} for i in range(3)])
    given = Fields(text="text", id="ID", id_given=True)
    assert "--id-field 'ID': no input has it" in _refused([corpus], given)
    plan([corpus], 5, fields=Fields(text="text", id="id", id_given=True))
    # Not given: the default `id` is optional (row numbers).
    plan([corpus], 5, fields=Fields(text="text", id="ID", id_given=False))
    table = pa.table({"ID": [1, 2], "text": ["a", "b"]})
    pq.write_table(table, tmp_path / "p.parquet")
    plan([corpus, tmp_path / "p.parquet"], 5, fields=given)


def test_parquet_columns_are_checked(tmp_path: Path) -> None:
    def refused(table: pa.Table) -> str:
        pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
        return _refused([tmp_path / "t.parquet"])

    assert "no column 'text' (--text-field); it has: id, body" in refused(
        pa.table({"id": [1], "body": ["x"]})
    )
    assert "column 'text' is int64, not text" in refused(pa.table({"text": [1, 2]}))
    assert "t.parquet: row 3: null 'text'" in refused(pa.table({"text": ["a", "b", "c", None]}))
    assert "t.parquet: row 1: null 'id'" in refused(
        pa.table({"id": pa.array([1, None, 3], pa.int64()), "text": ["a", "b", "c"]})
    )
    assert "column 'id' (--id-field) is double: ids are strings or integers" in refused(
        pa.table({"id": [1.5, 2.5], "text": ["a", "b"]})
    )
    huge = pa.array([1, 2, 3, 2**63 + 5], pa.uint64())
    assert "row 3: 'id' 9223372036854775813 does not fit a 64-bit integer" in refused(
        pa.table({"id": huge, "text": ["a", "b", "c", "d"]})
    )
    twice = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    assert "t.parquet: 2 columns named 'text'" in refused(twice)
    # large strings, string views (Polars) and dictionary-encoded texts are text
    for texts in (pa.array(["a", "b", "a"]).dictionary_encode(),
                  pa.array(["a", "b", "c"], pa.large_string()),
                  pa.array(["a", "b", "c"], pa.string_view())):  # fmt: skip
        table = pa.table({"id": pa.array(["x", "y", "z"], pa.string_view()), "text": texts})
        pq.write_table(table, tmp_path / "ok.parquet")
        plan([tmp_path / "ok.parquet"], 2, fields=FIELDS)


def test_a_bad_row_late_in_the_corpus_stops_the_job_before_anything_is_recorded(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """It used to stop after the shards before it, recorded with the file's hash: fixing
    the row then made "another job", and every finished shard was lost."""
    records: list[dict[str, object]] = [{"id": f"d{i}", "text": "x"} for i in range(30)]
    records[25]["text"] = 12
    corpus = _jsonl(tmp_path / "c.jsonl", list(records))
    out = tmp_path / "out"
    with pytest.raises(CorpusJobError, match=r"line 26 \(row 25\): 'text' is a number"):
        job.run(toy_artifact, [corpus], out, shard_rows=10)
    assert not (out / JOB_FILE).exists() and not list(out.glob("*part-*"))


def test_named_files_are_read_by_suffix_in_any_case(tmp_path: Path) -> None:
    upper = _jsonl(tmp_path / "UP.JSONL", [{"text": "a"}])
    nd = _jsonl(tmp_path / "corpus.ndjson", [{"text": "b"}, {"text": "c"}])
    files, shards = plan([upper, nd], 10, fields=FIELDS)
    assert [f.rows for f in files] == [1, 2] and [s.kind for s in shards] == ["jsonl"] * 2


def test_shards_without_a_job_record_are_not_adopted(toy_artifact: Path, tmp_path: Path) -> None:
    """The record deleted to start over (or lost in a copy skipping `_` files): the next
    job, with other options, took the old vectors as its own."""
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": "x"}] * 3)
    out = tmp_path / "out"
    out.mkdir()
    (out / "_part-00000.done").write_bytes(msgspec.json.encode(job.Done(rows=3, seconds=0.1)))
    with pytest.raises(CorpusJobError, match=f"holds finished shards but no {JOB_FILE}"):
        job.run(toy_artifact, [corpus], out, shard_rows=10)


def test_an_input_grown_during_the_job_is_an_error(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": "x"}] * 3)
    files, _ = plan([corpus], 10, fields=FIELDS)
    job.refuse_grown_inputs(files)
    with corpus.open("a") as f:
        f.write(json.dumps({"text": "appended"}) + "\n")
    with pytest.raises(CorpusJobError, match=r"changed while the job ran: .*c\.jsonl \(\d+ -> "):
        job.refuse_grown_inputs(files)
    gone = [msgspec.structs.replace(files[0], path=str(tmp_path / "gone.jsonl"))]
    with pytest.raises(CorpusJobError, match="changed while the job ran"):
        job.refuse_grown_inputs(gone)


def test_a_full_disk_names_the_output_not_the_input(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": "x"}] * 3)
    files, [shard] = plan([corpus], 10, fields=FIELDS)
    out = tmp_path / "out"
    out.mkdir()

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(job, "write_shard", full)
    model = tei_runtime.load(toy_artifact, device="cpu")
    recorded = job.Job(
        inputs=files, artifact_variants={}, model_id="m", text_field="text", id_field="id",
        shard_rows=10, normalize=True,
    )  # fmt: skip
    with pytest.raises(CorpusJobError) as e:
        job.embed_shard(model, recorded, shard, out)
    assert str(e.value) == f"{out}: could not write part-00000.parquet: No space left on device"


def test_shard_names_sort_as_the_rows_past_99999_shards(tmp_path: Path) -> None:
    """Five digits sorted `part-100000` before `part-99999`: `read_parquet(out)` read the
    rows out of order. The width is the last shard's, five at least (older jobs' names)."""
    assert job.name_digits(20) == 5 and job.name_digits(100_000) == 5
    assert job.name_digits(100_001) == 6
    assert [job.part_name(i, 6) for i in (0, 99_999, 100_000)] == [
        "part-000000", "part-099999", "part-100000",
    ]  # fmt: skip
    assert job.part_name(3) == "part-00003"
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": "x"}] * 12)
    _, shards = plan([corpus], 5, fields=FIELDS)
    assert [s.name for s in shards] == ["part-00000", "part-00001", "part-00002"]
    assert job.done_marker(tmp_path, shards[2]) == tmp_path / "_part-00002.done"


def test_any_input_in_the_output_folder_is_refused(tmp_path: Path) -> None:
    """`read_parquet(out)` would read it with the shards (or a shard replace it)."""
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.table({"text": ["a"]}), out / "corpus.parquet")
    with pytest.raises(CorpusJobError, match=r"corpus\.parquet: an input in the output folder"):
        plan([out / "corpus.parquet"], 10, out)
    pq.write_table(pa.table({"text": ["a"]}), out / "part-00000.PARQUET")
    with pytest.raises(CorpusJobError, match="named like the output's shards"):
        plan([out / "part-00000.PARQUET"], 10, out)


def _record(out: Path, files: list[job.InputFile], **kw: object) -> job.Job:
    recorded = job.Job(
        inputs=files, artifact_variants={}, model_id="m", text_field="text", id_field="id",
        shard_rows=1, normalize=True, **kw,
    )  # type: ignore[arg-type]  # fmt: skip
    return recorded


def test_a_job_recorded_with_five_digit_names_resumes_with_them(tmp_path: Path) -> None:
    """Its shards past 99,999 were named `part-100000`, the first `part-00000`: a resume
    naming them with six digits would redo all and leave the rows twice."""
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": "x"}] * 3)
    files, _ = plan([corpus], 1, fields=FIELDS)
    out = tmp_path / "out"
    job.prepare_output(out, _record(out, files))  # as an older tei-embed wrote it
    (out / "_part-00000.done").write_text("{}")
    assert job.prepare_output(out, _record(out, files, shard_digits=6)).shard_digits == 5
    fresh = tmp_path / "fresh"
    assert job.prepare_output(fresh, _record(fresh, files, shard_digits=6)).shard_digits == 6
    assert job.prepare_output(fresh, _record(fresh, files, shard_digits=6)).shard_digits == 6


def test_a_recorded_job_with_an_id_field_no_input_has_still_resumes(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """An older tei-embed numbered the rows where --id-field named a field no input had; the
    same command must still finish (or confirm) that job."""
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}])
    out = tmp_path / "out"
    with pytest.raises(CorpusJobError, match="--id-field 'doc_id': no input has it"):
        job.run(toy_artifact, [corpus], out, id_field="doc_id", shard_rows=1)
    model = tei_runtime.load(toy_artifact, device="cpu")
    files, [shard] = plan([corpus], 1)
    recorded = job.Job(
        inputs=files, artifact_variants={v.name: v.sha256 for v in model.manifest.variants},
        artifact_manifest=job.sha256_file(toy_artifact / "manifest.json"),
        variant=model.variant.name, model_id=model.manifest.source.model_id,
        text_field="text", id_field="doc_id", shard_rows=1, normalize=True,
    )  # fmt: skip
    job.prepare_output(out, recorded)
    job.embed_shard(model, recorded, shard, out)
    counts = job.run(toy_artifact, [corpus], out, id_field="doc_id", shard_rows=1)
    assert counts == {"embedded": 0, "skipped": 1, "total": 1}


def test_blank_texts_are_counted_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Embedded (the model takes them, all as one vector), but seldom what a corpus means."""
    corpus = _jsonl(tmp_path / "c.jsonl", [{"text": ""}, {"text": " \t"}, {"text": "x"}])
    pq.write_table(pa.table({"text": ["", "y", "  "]}), tmp_path / "p.parquet")
    with caplog.at_level("WARNING"):
        plan([corpus, tmp_path / "p.parquet"], 10, fields=FIELDS)
    assert "4 rows have an empty or whitespace-only text" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        plan([_jsonl(tmp_path / "ok.jsonl", [{"text": "x"}])], 10, fields=FIELDS)
    assert "whitespace-only" not in caplog.text
