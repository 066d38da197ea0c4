"""`python -m bench` refuses a bad value before anything is exported, timed or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtypes", "float8"], "unknown dtypes ['float8']"),
        (["--models", "minilm,gpt"], "unknown models ['gpt']"),
        (["--engines", "tei"], "unknown engines ['tei']"),
        (["--models", "minilm,bert-base", "--lengths", "short,medium"],
         "bert-base: unknown lengths ['medium']"),
        (["--device", "tpu"], "--device tpu: cpu or cuda"),
        (["--artifact", "/nonexistent/artifact", "--models", "minilm"], "no manifest.json"),
        (["--artifact", "/nonexistent/artifact"], "--artifact needs exactly one --models"),
    ],
)  # fmt: skip
def test_bad_values_stop_the_run_before_it_starts(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        run.main([*argv, "--out", str(out), "--cache", str(tmp_path / "cache")])
    assert message in str(stopped.value.code)
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "argv", [["--batches", "0"], ["--batches", "8,x"], ["--repeats", "-1"]]
)
def test_numbers_are_checked_by_the_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        run.main(argv)
    assert stopped.value.code == 2
    assert "python -m bench: error: argument" in capsys.readouterr().err


def test_aliases_and_repeats_are_folded() -> None:
    args = run._args(["--models", "minilm,minilm", "--dtypes", "fp32,float32,int8"])
    keys, dtypes, wanted = run.checked_options(args)
    assert (keys, dtypes, wanted) == (["minilm"], ["float32", "int8"], [])


def _artifact_without_plain_graphs(tmp_path: Path) -> Path:
    art = tmp_path / "art"
    art.mkdir()
    (art / "manifest.json").write_text('{"variants": [{"name": "fp32", "precision": "fp32"}]}')
    return art


def test_an_artifact_without_plain_graphs_leaves_out_the_plain_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = _artifact_without_plain_graphs(tmp_path)
    _, _, wanted = run.checked_options(run._args(["--models", "minilm", "--artifact", str(art)]))
    assert wanted and "runtime-fused-fp32" in wanted and "serve-fp32" in wanted
    assert not [e for e in wanted if "plain" in e]
    assert "has no plain graphs" in capsys.readouterr().out


def test_plain_engines_asked_of_an_artifact_without_plain_graphs_are_refused(
    tmp_path: Path,
) -> None:
    art = _artifact_without_plain_graphs(tmp_path)
    argv = ["--models", "minilm", "--artifact", str(art), "--engines", "st,runtime-plain-int8"]
    with pytest.raises(SystemExit, match=r"no plain graphs for \['runtime-plain-int8'\]"):
        run.checked_options(run._args(argv))
