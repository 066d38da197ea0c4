"""tei-embed: shard planning, reading, done markers and job checks (fast, no Ray), then the
real thing on a local Ray with the MiniLM artifact, including a resumed run (slow)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tei_runtime
from tei_corpus import job
from tei_corpus import job as job_module
from tei_corpus.job import (
    JOB_FILE,
    CorpusJobError,
    Job,
    Shard,
    embed_shard,
    finished,
    plan,
    prepare_output,
)
from tei_runtime.model import Model

WORDS = ["hello", "world", "the", "cat", "dog", "sat", "on", "mat", "red", "blue", "green"]


def _texts(n: int, *, repeat: int = 1) -> list[str]:
    words = (1 + i % 7 for i in range(n))
    return [
        " ".join(WORDS[(i + k) % len(WORDS)] for k in range(w * repeat))
        for i, w in enumerate(words)
    ]


def _write_jsonl(
    path: Path, n: int, *, start: int = 0, blank_every: int = 0, repeat: int = 1
) -> Path:
    lines = []
    for i, text in enumerate(_texts(n, repeat=repeat)):
        lines.append(json.dumps({"id": f"doc-{start + i}", "text": text}))
        if blank_every and i % blank_every == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_parquet(path: Path, n: int, row_group: int) -> Path:
    table = pa.table({"id": list(range(1000, 1000 + n)), "text": _texts(n)})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def _job(artifact: Path, inputs: list[Path], shard_rows: int, **kw: object) -> Job:
    files, _ = plan(inputs, shard_rows)
    manifest = tei_runtime.load(artifact, device="cpu").manifest
    return Job(
        inputs=files,
        artifact_variants={v.name: v.sha256 for v in manifest.variants},
        model_id=manifest.source.model_id,
        text_field="text",
        id_field="id",
        shard_rows=shard_rows,
        normalize=True,
        **kw,
    )  # type: ignore[arg-type]


def _read_output(out: Path) -> tuple[list[object], np.ndarray]:
    # Per shard: a JSONL shard's ids are strings, a Parquet one's keep the column's type.
    ids: list[object] = []
    vectors: list[list[float]] = []
    for path in sorted(out.glob("part-*.parquet")):
        table = pq.read_table(path)
        ids += table.column("id").to_pylist()
        vectors += table.column("embedding").to_pylist()
    return ids, np.array(vectors, dtype=np.float32)


def test_plan_jsonl_and_parquet(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", 23, blank_every=5)
    b = _write_parquet(tmp_path / "b.parquet", 17, row_group=4)
    files, shards = plan([a, b], 10)
    assert [f.rows for f in files] == [23, 17]
    assert [(s.kind, s.start, s.rows, s.first_row) for s in shards] == [
        ("jsonl", 0, 10, 0), ("jsonl", 10, 10, 10), ("jsonl", 20, 3, 20),
        ("parquet", 0, 10, 23), ("parquet", 10, 7, 33),
    ]  # fmt: skip
    assert [s.index for s in shards] == [0, 1, 2, 3, 4]


def test_read_shard_every_row_once(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", 23, blank_every=4)
    b = _write_parquet(tmp_path / "b.parquet", 17, row_group=3)  # shards cross row groups
    _, shards = plan([a, b], 5)
    texts: list[str] = []
    ids: list[object] = []
    for shard in shards:
        t, i, _ = job.read_shard(shard, "text", "id")
        assert len(t) == shard.rows
        texts += t
        ids += i
    assert texts == _texts(23) + _texts(17)
    assert ids == [f"doc-{i}" for i in range(23)] + list(range(1000, 1017))


def test_missing_id_field_uses_the_corpus_row(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", 4)
    b = _write_parquet(tmp_path / "b.parquet", 6, row_group=2)
    _, shards = plan([a, b], 4)
    ids = [i for s in shards for i in job.read_shard(s, "text", "no-such-field")[1]]
    assert ids == list(range(10))


def _refused_row(path: Path, content: str, match: str) -> None:
    """A one-shard JSONL file whose reading fails with `match`."""
    path.write_text(content)
    _, [shard] = plan([path], 10)
    with pytest.raises(CorpusJobError, match=match):
        job.read_shard(shard, "text", "id")


def test_bad_rows_and_inputs(tmp_path: Path) -> None:
    _refused_row(tmp_path / "bad.jsonl", '{"id": 1, "text": "ok"}\n{"id": 2, "body": "no text"}\n',
                 r"bad\.jsonl: row 1: no 'text' field \(--text-field\)")  # fmt: skip
    (tmp_path / "x.csv").write_text("id,text\n")
    with pytest.raises(CorpusJobError, match=r"not \.jsonl, \.ndjson or \.parquet"):
        plan([tmp_path / "x.csv"], 10)
    with pytest.raises(CorpusJobError, match="no such file"):
        plan([tmp_path / "nope.jsonl"], 10)
    # A file that changed after planning is caught, not half-read.
    _write_jsonl(tmp_path / "c.jsonl", 8)
    _, shards = plan([tmp_path / "c.jsonl"], 5)
    _write_jsonl(tmp_path / "c.jsonl", 6)
    with pytest.raises(CorpusJobError, match="changed since the job was planned"):
        job.read_shard(shards[1], "text", "id")


def test_inputs_named_twice_are_read_once(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    a = _write_jsonl(corpus / "a.jsonl", 7)
    files, shards = plan([a, corpus, a], 5)
    assert [f.rows for f in files] == [7]
    assert sum(s.rows for s in shards) == 7


def test_unreadable_parquet_and_ids_that_cannot_make_a_column(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(CorpusJobError, match=r"broken\.parquet: not a readable Parquet file"):
        plan([broken], 10)
    _refused_row(tmp_path / "mixed.jsonl", '{"id": "a", "text": "x"}\n{"text": "y"}\n',
                 r"row 1: no 'id' \(--id-field\) where the file's first row has one")  # fmt: skip
    _refused_row(tmp_path / "null.jsonl", '{"id": 1, "text": "x"}\n{"id": null, "text": "y"}\n',
                 r"row 1: 'id' is null: ids are strings or integers")  # fmt: skip
    _refused_row(tmp_path / "types.jsonl", '{"id": 1, "text": "x"}\n{"id": "2", "text": "y"}\n',
                 "row 1: 'id' is a string where the file's first id is an integer")  # fmt: skip


def test_an_output_folder_without_finished_shards_takes_a_new_job(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """A run that failed before finishing any shard (a bad option) leaves nothing to mix:
    the corrected rerun is not refused."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
    out = tmp_path / "out"
    prepare_output(out, _job(toy_artifact, [corpus], 5, prompt_name="nope"))
    prepare_output(out, _job(toy_artifact, [corpus], 5))
    (out / "_part-00000.done").write_text("{}")
    with pytest.raises(CorpusJobError, match="differs in: shard_rows"):
        prepare_output(out, _job(toy_artifact, [corpus], 6))


def test_options_are_checked_before_ray_starts(toy_artifact: Path, tmp_path: Path) -> None:
    from tei_runtime.errors import ProviderError

    corpus = _write_jsonl(tmp_path / "a.jsonl", 5)
    out = tmp_path / "out"
    with pytest.raises(ProviderError, match="unknown dtype 'bf16'"):
        job.run(toy_artifact, [corpus], out, dtype="bf16")
    with pytest.raises(CorpusJobError, match="unknown --prompt-name 'query'"):
        job.run(toy_artifact, [corpus], out, prompt_name="query")
    with pytest.raises(CorpusJobError, match="at least 1"):
        job.run(toy_artifact, [corpus], out, actors=0)
    assert not out.exists()  # the folder it made for the run is gone with its lock file
    out.mkdir()
    with pytest.raises(CorpusJobError, match="unknown --prompt-name 'query'"):
        job.run(toy_artifact, [corpus], out, prompt_name="query")
    assert [p.name for p in out.iterdir()] == [job.LOCK_FILE]  # the user's folder is kept


def test_a_second_run_into_a_busy_output_folder_is_refused(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """Two runs with different options both succeeded and mixed their shards (neither had
    finished one when the other recorded its job)."""
    import fcntl

    corpus = _write_jsonl(tmp_path / "a.jsonl", 5)
    out = tmp_path / "out"
    out.mkdir()
    with (out / job.LOCK_FILE).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(CorpusJobError, match="another tei-embed is writing there"):
            job.run(toy_artifact, [corpus], out, normalize=False)
    assert not (out / job.JOB_FILE).exists()


def test_a_ray_address_nothing_answers_is_one_error_not_a_hang(
    toy_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ray.init retried an address that nothing answered for ever (10 minutes and on)."""
    import socket

    import ray

    # As in a fresh `tei-embed` process, whatever Ray another test of this session started.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    corpus = _write_jsonl(tmp_path / "a.jsonl", 5)
    for address in (f"127.0.0.1:{closed}", f"ray://127.0.0.1:{closed}"):
        with pytest.raises(CorpusJobError, match=f"cannot reach Ray at {address}"):
            job.run(toy_artifact, [corpus], tmp_path / "out", address=address)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed}")
    with pytest.raises(CorpusJobError, match="cannot reach Ray at"):
        job.run(toy_artifact, [corpus], tmp_path / "out2")


def test_ray_error_text_digs_out_the_cause() -> None:
    inner = CorpusJobError("a.parquet: no column 'text' (--text-field)")
    outer = RuntimeError("UDF failed to process a data block.")
    outer.__cause__ = inner
    assert job.ray_error_text(outer) == "a.parquet: no column 'text' (--text-field)"
    flat = RuntimeError("Traceback (most recent call last):\n  ...\nValueError: bad row 7")
    assert job.ray_error_text(flat) == "ValueError: bad row 7"


def _twelve_rows_in_three_shards(
    artifact: Path, tmp_path: Path
) -> tuple[Path, Job, list[Shard], Model]:
    """A prepared output folder for 12 JSONL rows in shards of 5: (out, job, shards, model)."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
    out = tmp_path / "out"
    job = _job(artifact, [corpus], 5)
    prepare_output(out, job)
    _, shards = plan([corpus], 5)
    return out, job, shards, tei_runtime.load(artifact, device="cpu")


def test_shards_vectors_markers_and_resume_set(toy_artifact: Path, tmp_path: Path) -> None:
    out, job, shards, model = _twelve_rows_in_three_shards(toy_artifact, tmp_path)
    assert finished(out, shards) == set()
    for shard in shards:
        assert embed_shard(model, job, shard, out) == shard.rows
    assert finished(out, shards) == {0, 1, 2}
    ids, vectors = _read_output(out)
    assert ids == [f"doc-{i}" for i in range(12)]
    np.testing.assert_allclose(vectors, model.embed(_texts(12)), atol=1e-6)
    # The folder reads as one dataset: markers and the job record are names readers skip.
    whole = pq.read_table(out)
    assert whole.column("id").to_pylist() == ids and whole.num_rows == 12
    assert job_module.id_mismatch(out, shards) is None  # one kind of id throughout
    # A shard whose marker is missing or torn (a crash after the rename) is redone.
    (out / "_part-00001.done").unlink()
    (out / "_part-00002.done").write_text("{")
    assert finished(out, shards) == {0}
    assert not list(out.glob(".*tmp*"))


def test_progress_is_logged_as_each_marker_lands(
    toy_artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One line per shard, when its marker lands (not when Ray hands the result back): the
    watcher sees shard 1 while shard 0 is still running, and each shard only once."""
    out, job, shards, model = _twelve_rows_in_three_shards(toy_artifact, tmp_path)
    progress = job_module.ProgressLog(out, shards)
    with caplog.at_level(logging.INFO, logger="tei_embed"):
        embed_shard(model, job, shards[1], out)
        progress.poll()
        assert caplog.messages == ["shard part-00001 done: 1/3 shards, 5/12 rows, " + _rate(caplog)]
        progress.poll()  # nothing new: nothing logged
        (out / "_part-00002.done").write_text("{")  # torn: not done, not logged
        progress.poll()
        assert len(caplog.messages) == 1
        with progress:
            for shard in (shards[0], shards[2]):
                embed_shard(model, job, shard, out)
    lines = [m.split(",")[0] for m in caplog.messages]
    assert lines == [
        "shard part-00001 done: 1/3 shards",
        "shard part-00000 done: 2/3 shards",
        "shard part-00002 done: 3/3 shards",
    ]
    assert "12/12 rows" in caplog.messages[-1]


def _rate(caplog: pytest.LogCaptureFixture) -> str:
    return caplog.messages[-1].rsplit(", ", 1)[-1]


def test_a_different_job_is_refused(toy_artifact: Path, tmp_path: Path) -> None:
    corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
    out = tmp_path / "out"
    prepare_output(out, _job(toy_artifact, [corpus], 5))
    (out / "_part-00000.done").write_text("{}")  # one shard finished: the folder is this job's
    prepare_output(out, _job(toy_artifact, [corpus], 5))  # the same job resumes
    with pytest.raises(CorpusJobError, match=r"another job's shards \(it differs in: shard_rows\)"):
        prepare_output(out, _job(toy_artifact, [corpus], 6))
    _write_jsonl(corpus, 13)
    with pytest.raises(CorpusJobError, match=r"differs in: inputs"):
        prepare_output(out, _job(toy_artifact, [corpus], 5))


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_an_input_edited_in_place_to_the_same_size_is_another_job(
    toy_artifact: Path, tmp_path: Path, kind: str
) -> None:
    """A typo fixed in place keeps the size and row count: only the bytes tell the runs apart,
    and the shards embedded from the old text must not be mixed with the new."""
    if kind == "jsonl":
        corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
        edited = corpus.read_bytes().replace(b"doc-3", b"doc-X")
    else:
        # Plain encoding, no compression: a same-length text keeps the file's size.
        plain = {"row_group_size": 4, "compression": "none", "use_dictionary": False}
        texts = _texts(12)
        corpus = tmp_path / "c.parquet"
        pq.write_table(pa.table({"id": list(range(12)), "text": texts}), corpus, **plain)
        texts[3] = texts[3].upper()
        other = tmp_path / "edited.parquet"
        pq.write_table(pa.table({"id": list(range(12)), "text": texts}), other, **plain)
        edited = other.read_bytes()
    out = tmp_path / "out"
    prepare_output(out, _job(toy_artifact, [corpus], 5))
    (out / "_part-00000.done").write_text("{}")
    size = corpus.stat().st_size
    corpus.write_bytes(edited)
    assert corpus.stat().st_size == size
    with pytest.raises(CorpusJobError, match=r"differs in: inputs\); changed since: .*c\."):
        prepare_output(out, _job(toy_artifact, [corpus], 5))


def test_a_job_recorded_without_input_hashes_still_resumes(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """A folder an older tei-embed started (no sha256 per input) resumes under this one."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
    out = tmp_path / "out"
    job = _job(toy_artifact, [corpus], 5)
    old = msgspec.structs.replace(
        job, inputs=[msgspec.structs.replace(f, sha256="") for f in job.inputs]
    )
    prepare_output(out, old)
    (out / "_part-00000.done").write_text("{}")
    prepare_output(out, job)  # the same job: resumes
    assert msgspec.json.decode((out / JOB_FILE).read_bytes(), type=Job) == old


# ---- slow: a local Ray, the real MiniLM artifact -----------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_job_then_resume(
    minilm_artifact: Path, tmp_path: Path, local_ray: None, caplog: pytest.LogCaptureFixture
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_jsonl(corpus / "a.jsonl", 70)
    _write_parquet(corpus / "b.parquet", 50, row_group=16)
    out = tmp_path / "out"
    caplog.set_level("INFO", logger="tei_embed")
    counts = job.run(minilm_artifact, [corpus], out, shard_rows=20, actors=2)
    assert counts == {"embedded": 7, "skipped": 0, "total": 7}
    assert "7/7 shards, 120/120 rows" in caplog.text  # progress lines
    ids, vectors = _read_output(out)
    texts = _texts(70) + _texts(50)
    assert ids == [f"doc-{i}" for i in range(70)] + list(range(1000, 1050))
    # string ids beside integer ones: every vector is written, and the end says why one
    # table of them cannot be read
    assert "the shards' ids differ" in caplog.text
    expected = tei_runtime.load(minilm_artifact, device="cpu").embed(texts)
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    assert vectors.shape == (120, 384)

    # A crash: two shards never finished (one written but unmarked, one absent). The rerun
    # redoes exactly those and leaves the finished ones' files untouched.
    (out / "_part-00002.done").unlink()
    (out / "part-00005.parquet").unlink()
    (out / "_part-00005.done").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    counts = job.run(minilm_artifact, [corpus], out, shard_rows=20, actors=2)
    assert counts == {"embedded": 2, "skipped": 5, "total": 7}
    for name, stamp in kept.items():
        if name != "part-00002.parquet":
            assert (out / name).stat().st_mtime_ns == stamp, name
    ids2, vectors2 = _read_output(out)
    assert ids2 == ids
    np.testing.assert_allclose(vectors2, vectors, atol=2e-5)
    # Nothing left to do: no Ray work at all.
    assert job.run(minilm_artifact, [corpus], out, shard_rows=20, actors=2) == {
        "embedded": 0, "skipped": 7, "total": 7,
    }  # fmt: skip


@pytest.mark.slow
def test_cli_killed_then_resumed(minilm_artifact: Path, tmp_path: Path) -> None:
    """The real `tei-embed` process killed mid-job, then rerun to completion."""
    # Texts of up to ~200 tokens: each shard is a few tenths of a second of work, so the kill
    # lands long before the last of the 20 (one-to-seven-word texts made the whole job shorter
    # than the progress thread's poll on a fast host: all 20 were done when the kill came).
    corpus = _write_jsonl(tmp_path / "c.jsonl", 200, repeat=28)
    out = tmp_path / "out"
    cmd = [
        str(Path(sys.executable).with_name("tei-embed")),
        str(minilm_artifact),
        str(corpus),
        str(out),
        "--shard-rows",
        "10",
        "--actors",
        "1",
        "--threads-per-actor",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # kill once the first shards are reported done
        if "3/20 shards" in line:
            proc.kill()
            break
    proc.wait(timeout=120)
    assert proc.returncode != 0, "the job finished before it could be killed"
    done_before = len(list(out.glob("*.done")))
    assert 3 <= done_before < 20
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["total"] == 20
    assert counts["skipped"] >= done_before and counts["embedded"] == 20 - counts["skipped"]
    ids, vectors = _read_output(out)
    assert ids == [f"doc-{i}" for i in range(200)]
    expected = tei_runtime.load(minilm_artifact, device="cpu").embed(_texts(200, repeat=28))
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    # The same job asked in int8 would mix two graphs' vectors in one output: refused.
    other = subprocess.run([*cmd, "--dtype", "int8"], capture_output=True, text=True, timeout=600)
    assert other.returncode == 1
    assert "differs in: variant" in other.stderr, other.stderr[-2000:]


@pytest.mark.slow
def test_cli_sigterm_lands_mid_job(minilm_artifact: Path, tmp_path: Path) -> None:
    """A scheduler's stop (SIGTERM) is acted on while the job runs, not once Ray hands the
    driver back control (after the last shard, on a loaded host), and ends quietly: one line,
    exit 143, the finished shards kept."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 400, repeat=28)
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).with_name("tei-embed")), str(minilm_artifact), str(corpus),
           str(out), "--shard-rows", "10", "--actors", "1", "--threads-per-actor", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "3/40 shards" in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 143, rest[-2000:]
    assert rest.strip().endswith(
        "tei-embed: interrupted; finished shards are kept, and the same command resumes"
    )
    assert "Traceback" not in rest, rest[-3000:]  # Ray Data's, once Ray was stopped
    assert 3 <= len(list(out.glob("*.done"))) < 40


def test_a_changed_bundle_is_refused_before_any_work(toy_artifact: Path, tmp_path: Path) -> None:
    from tei_bundle import archive as bundle
    from tei_runtime.errors import ManifestError

    tar = bundle.write_bundle(toy_artifact, tmp_path / "toy.tar")
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tar.write_bytes(bytes(data))
    corpus = _write_jsonl(tmp_path / "a.jsonl", 5)
    with pytest.raises(ManifestError):
        job.run(tar, [corpus], tmp_path / "out", shard_rows=5)
    assert not list((tmp_path / "out").glob("part-*"))


def test_a_parquet_file_tei_embed_did_not_write_in_the_output_is_never_overwritten(
    toy_artifact: Path, tmp_path: Path
) -> None:
    """`tei-embed art spark1 spark2`: a second corpus folder taken as the output. Its own
    `part-00000.parquet` would be replaced by the first shard; the job stops before Ray."""
    corpus = _write_jsonl(tmp_path / "a.jsonl", 5)
    out = tmp_path / "spark2"
    out.mkdir()
    theirs = _write_parquet(out / "part-00000.parquet", 3, row_group=3)
    before = theirs.read_bytes()
    with pytest.raises(CorpusJobError, match=r"part-00000\.parquet: not a shard tei-embed wrote"):
        job.run(toy_artifact, [corpus], out, shard_rows=5)
    assert theirs.read_bytes() == before and not (out / JOB_FILE).exists()
    with pytest.raises(CorpusJobError, match=r"a file, not an output folder"):
        job.run(toy_artifact, [corpus], tmp_path / "a.jsonl", shard_rows=5)  # OUTPUT forgotten


def test_a_changed_manifest_is_another_job(toy_artifact: Path, tmp_path: Path) -> None:
    """The same graphs behind another manifest (a default prompt, a shorter length, other
    tokenizer files) give other vectors: a resume with it is refused, not mixed in."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 12)
    out = tmp_path / "out"
    recorded = _job(toy_artifact, [corpus], 5, artifact_manifest="a" * 64)
    prepare_output(out, recorded)
    (out / "_part-00000.done").write_text("{}")
    other = msgspec.structs.replace(recorded, artifact_manifest="b" * 64)
    with pytest.raises(CorpusJobError, match=r"differs in: artifact_manifest"):
        prepare_output(out, other)
    older = tmp_path / "older"  # recorded before manifests were: compared without it
    prepare_output(older, msgspec.structs.replace(recorded, artifact_manifest=""))
    (older / "_part-00000.done").write_text("{}")
    prepare_output(older, other)


@pytest.mark.slow
def test_a_bad_row_found_by_an_actor_is_the_error_shown(
    minilm_artifact: Path, tmp_path: Path
) -> None:
    """What an actor raises reaches the user in one line (Ray alone says only "UDF failed to
    process a data block"). Every row is checked while planning, so the actor's error here is
    an input cut short between the plan and the read."""
    corpus = _write_jsonl(tmp_path / "c.jsonl", 8)
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("tei-embed")), str(minilm_artifact), str(corpus),
         str(tmp_path / "out"), "--shard-rows", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:  # planned, Ray not yet started (that takes seconds)
        lines.append(line)
        if "0 already done" in line:
            _write_jsonl(corpus, 3)
            break
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=600) == 1
    last = lines[-1].strip()
    assert last.startswith("tei-embed: error: shard part-0000"), "".join(lines)[-2000:]
    assert "c.jsonl: changed since the job was planned" in last


@pytest.mark.slow
def test_ray_job_from_a_bundle(minilm_artifact: Path, tmp_path: Path, local_ray: None) -> None:
    from tei_bundle import archive as bundle

    tar = bundle.write_bundle(minilm_artifact, tmp_path / "minilm.tar")
    corpus = _write_jsonl(tmp_path / "a.jsonl", 30)
    out = tmp_path / "out"
    assert job.run(tar, [corpus], out, shard_rows=10, actors=1) == {
        "embedded": 3, "skipped": 0, "total": 3,
    }  # fmt: skip
    [unpacked] = (out / job.BUNDLE_CACHE).iterdir()
    assert (unpacked / "manifest.json").is_file()
    _, vectors = _read_output(out)
    expected = tei_runtime.load(minilm_artifact, device="cpu").embed(_texts(30))
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    # The same bundle again is the same job: nothing to redo, the unpack is reused.
    assert job.run(tar, [corpus], out, shard_rows=10, actors=1)["skipped"] == 3


def test_a_bad_line_and_a_lone_surrogate_name_their_row(tmp_path: Path) -> None:
    _refused_row(tmp_path / "bad.jsonl",
                 '{"text": "ok"}\n\n{"text": "ok"}\n{"text": "cut\n{"text": "ok"}\n',
                 r"bad\.jsonl: row 2: not JSON .* \(rows count from 0, blank lines not "
                 r"counted\): the file changed since the job was planned")  # fmt: skip
    # valid JSON, not text
    _refused_row(tmp_path / "half.jsonl", '{"text": "ok"}\n{"text": "emoji \\ud83d"}\n',
                 r"half\.jsonl: row 1: 'text' is not valid text")  # fmt: skip
    # valid JSON, not an object; ids Parquet cannot hold
    _refused_row(
        tmp_path / "list.jsonl",
        '{"text": "ok"}\n[1, 2]\n',
        r"list\.jsonl: row 1: a list in JSON, not an object",
    )
    big = f'{{"id": 1, "text": "a"}}\n{{"id": {2**70}, "text": "b"}}\n'
    _refused_row(tmp_path / "big.jsonl", big,
                 r"big\.jsonl: row 1: 'id' \d+ does not fit a 64-bit integer")  # fmt: skip
    _refused_row(tmp_path / "sid.jsonl", '{"id": "\\ud83d", "text": "a"}\n',
                 r"sid\.jsonl: row 0: 'id' is not valid text")  # fmt: skip


def test_an_input_folder_as_the_output_is_refused(tmp_path: Path) -> None:
    """`tei-embed art corpus corpus`: `read_parquet(corpus)` would read the corpus's own files
    with the shards (a JSONL corpus: an error; a Parquet one: rows without vectors)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_jsonl(corpus / "a.jsonl", 5)
    with pytest.raises(CorpusJobError, match="the output folder is also an input folder"):
        plan([corpus], 10, corpus)
    files, _ = plan([corpus], 10, corpus / "out")  # inside it: only the top level is read
    assert [Path(f.path).name for f in files] == ["a.jsonl"]


def test_a_users_file_named_like_a_shard_in_the_output_folder_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Read as an input, then written over by the shard of its name: 100 rows were lost."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_jsonl(corpus / "notes.jsonl", 5)
    users = _write_parquet(corpus / "part-00000.parquet", 3, row_group=3)
    with pytest.raises(CorpusJobError, match="named like the output's shards"):
        plan([users, corpus / "notes.jsonl"], 10, corpus)
    # Beside that: what a folder holds and is not read is said, not skipped in silence.
    (corpus / "b.jsonl.gz").write_bytes(b"")
    (corpus / "year=2021").mkdir()
    (corpus / "_SUCCESS").write_text("")
    with caplog.at_level("WARNING"):
        plan([corpus], 10, tmp_path / "out")
    [warning] = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert "2 entries" in warning and "b.jsonl.gz" in warning and "year=2021/" in warning


def test_hidden_and_underscored_files_in_a_folder_are_not_inputs(tmp_path: Path) -> None:
    """As pyarrow reads a folder: macOS's `._a.jsonl` (binary AppleDouble, not JSON) and a
    `_tmp.jsonl` beside the corpus are skipped, where they used to end the job on row 0."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write_jsonl(corpus / "a.jsonl", 5)
    (corpus / "._a.jsonl").write_bytes(b"\x00\x05\x16\x07Mac OS X")
    _write_jsonl(corpus / "_tmp.jsonl", 2)
    files, shards = plan([corpus], 10, tmp_path / "out")
    assert [Path(f.path).name for f in files] == ["a.jsonl"] and sum(s.rows for s in shards) == 5
    named, _ = plan([corpus / "_tmp.jsonl"], 10)  # named on the command line: read
    assert [Path(f.path).name for f in named] == ["_tmp.jsonl"]


def test_shards_whose_ids_differ_are_named(toy_artifact: Path, tmp_path: Path) -> None:
    """String ids in the first rows and none later (or integers, then none): each shard is
    consistent, the corpus is not, and one table of it cannot be read (or mixes ids with
    row numbers). The job ends with a warning saying so."""
    corpus = tmp_path / "c.jsonl"
    rows = [{"id": f"d{i}", "text": "x"} for i in range(3)] + [{"text": "y"}] * 3
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    out.mkdir()
    _, shards = plan([corpus], 3)
    model = tei_runtime.load(toy_artifact, device="cpu")
    for shard in shards:
        embed_shard(model, _job(toy_artifact, [corpus], 3), shard, out)
    said = job.id_mismatch(out, shards)
    assert said is not None and "one table of them is not what it seems" in said
    assert ("part-00000.parquet: string ids from id; part-00001.parquet: int64 ids from row "
            "numbers") in said  # fmt: skip


def test_more_cpus_per_actor_than_ray_has(caplog: pytest.LogCaptureFixture) -> None:
    """Ray waits forever for an actor no node can hold: a local Ray's CPUs are all it has."""
    with pytest.raises(CorpusJobError, match=r"--threads-per-actor 4 .* Ray has \(2\)"):
        job.check_cpus(4, 2.0, local=True)
    job.check_cpus(2, 2.0, local=True)
    job.check_cpus(4, 2.0, local=False)
    assert "wait until the cluster has a node that large" in caplog.text


def test_cli_errors_are_one_line(toy_artifact: Path, tmp_path: Path) -> None:
    corpus = _write_jsonl(tmp_path / "a.jsonl", 3)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    run = subprocess.run(
        [sys.executable, "-m", "tei_corpus.job", str(toy_artifact), str(corpus), str(a_file)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("tei-embed: error: ")
