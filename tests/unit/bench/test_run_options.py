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
        (["--models", "bert-base", "--engines", "serve-fp32,fastembed"],
         "bert-base: none of --engines runs on it"),
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
