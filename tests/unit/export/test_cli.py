"""tei-export's command line: documented options, argument parsing, one-line failures."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tei_export.cards import supported_model_types
from tei_export.cli import main, parser
from tei_runtime.manifest import Precision


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, argparse._HelpAction)]


def test_every_option_is_documented_in_help() -> None:
    p = parser()
    text = p.format_help()
    for action in _options(p):
        assert action.help, f"{action.dest} has no help text"
        for flag in action.option_strings:
            assert flag in text
    for model_type in supported_model_types():
        assert model_type in text


def test_variants_parse_and_default_to_all_three() -> None:
    p = parser()
    assert p.parse_args(["m", "out"]).variants == [Precision.FP32, Precision.FP16, Precision.INT8]
    assert p.parse_args(["m", "out", "--variants", "int8, fp32"]).variants == [
        Precision.INT8,
        Precision.FP32,
    ]
    # the names --dtype takes work here too
    assert p.parse_args(["m", "out", "--variants", "FP16,float32,Int8"]).variants == [
        Precision.FP16,
        Precision.FP32,
        Precision.INT8,
    ]


@pytest.mark.parametrize(("variants", "says"), [
    ("fp8", "a comma-separated list of fp32, fp16, int8"),
    ("", "a comma-separated list of fp32, fp16, int8"),  # not "all three" by accident
    ("fp32,", "a comma-separated list of fp32, fp16, int8"),
    ("fp32,int8,fp32", "a precision is named twice"),
    ("fp16,float16", "a precision is named twice"),
    ("auto", "a comma-separated list of fp32, fp16, int8"),
])  # fmt: skip
def test_a_variant_list_that_is_not_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], variants: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["m", "out", "--variants", variants])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("opset", ["99", "0", "13", "x"])
def test_an_opset_out_of_range_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], opset: str
) -> None:
    """Refused before loading anything (torch would print its whole graph, then fail)."""
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["m", "out", "--opset", opset])
    assert exit_info.value.code == 2
    assert "--opset" in capsys.readouterr().err
    assert parser().parse_args(["m", "out", "--opset", "18"]).opset == 18


def test_hf_token_and_cache_default_from_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path))
    args = parser().parse_args(["m", "out"])
    assert args.hf_token == "hf_secret"
    assert Path(args.cache_dir) == tmp_path


def test_missing_local_folder_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-checkpoint"
    assert main([str(missing), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("tei-export: error:") and str(missing) in err[0]
    assert not (tmp_path / "out").exists()
    a_file = tmp_path / "config.json"
    a_file.write_text("{}")
    assert main([str(a_file), str(tmp_path / "out")]) == 1
    assert "a file, not a model folder" in capsys.readouterr().err


def test_uncached_hub_id_offline_fails_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub.constants

    # The constant is read once at import; set both so test order does not matter.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code = main(["someone/not-cached", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"not in the hub cache ({tmp_path / 'c'})" in err[0]
    assert "no such local folder" in err[0]  # a mistyped relative path reads as a hub id


def test_a_broken_tokenizer_json_fails_the_export_not_the_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runtime loads tokenizer.json with the tokenizers library alone; one it cannot
    load is refused at export, before anything is written."""
    checkpoint = tmp_path / "m"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"model_type": "bert"}')
    (checkpoint / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Word')
    assert main([str(checkpoint), str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer.json: the tokenizers library cannot load it" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize(("name", "content", "says"), [
    ("config.json", "[]", "config.json: expected a JSON object, found a list"),
    ("modules.json", '{"not": "a list"}', "modules.json: expected a list of modules"),
])  # fmt: skip
def test_a_malformed_checkpoint_file_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str, says: str
) -> None:
    checkpoint = tmp_path / "m"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"model_type": "bert"}')
    (checkpoint / "tokenizer.json").write_text(_TINY_TOKENIZER)
    (checkpoint / name).write_text(content)
    assert main([str(checkpoint), str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# A word-level tokenizer the tokenizers library loads: two words and [UNK].
_TINY_TOKENIZER = (
    '{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], '
    '"normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, '
    '"decoder": null, "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1, "b": 2}, '
    '"unk_token": "[UNK]"}}'
)


def test_a_serving_only_install_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every install ships tei_export; without the `export` extra its stack is missing, and
    tei-export says so in one line instead of a traceback."""
    from support.imports import hide_package

    hide_package(monkeypatch, "tei_export.api")
    assert main([str(tmp_path / "ck"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tei-export: error: the exporter needs ")
    assert "pip install '.[export]'" in err[0]


def test_a_system_error_without_a_file_names_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnx's writer raises ENOSPC with no file name: the user still learns where it was
    writing (the CLI's one line, nothing written)."""
    from tei_export.cli import _export

    def full_disk(*_args: object, **_kwargs: object) -> Path:
        raise OSError(28, "No space left on device")

    args = parser().parse_args([str(tmp_path / "model"), str(tmp_path / "out")])
    assert _export(args, full_disk) == 1
    err = capsys.readouterr().err
    assert err == (f"tei-export: error: No space left on device writing {tmp_path / 'out'}; "
                   "nothing was written\n")  # fmt: skip


def test_a_wrong_task_or_pooling_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    for flag, listed in (("--task", "'embed', 'rerank'"), ("--pooling", "'cls', 'mean'")):
        with pytest.raises(SystemExit):
            parser().parse_args(["m", "out", flag, "foo"])
        assert listed in capsys.readouterr().err
