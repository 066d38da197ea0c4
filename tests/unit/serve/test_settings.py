"""Settings: TEI's flags, env vars, defaults, precedence and redaction."""

from __future__ import annotations

import pytest

from tei_runtime.manifest import Task
from tei_serve.settings import Settings, SettingsError, load_settings


def test_defaults_match_tei() -> None:
    s = load_settings([], env={})
    assert s.max_concurrent_requests == 512
    assert s.max_batch_tokens == 16384
    assert s.max_batch_requests is None
    assert s.max_client_batch_size == 32
    assert s.auto_truncate is True
    assert s.hostname == "0.0.0.0"
    assert s.port == 3000
    assert s.payload_limit == 2_000_000
    assert s.otlp_service_name == "text-embeddings-inference.server"
    assert s.cors_allow_origin is None
    assert s.json_output is False
    assert s.prometheus_port == 9000 and s.grpc is False


def test_env_vars_use_upper_snake_names() -> None:
    env = {
        "MODEL_ID": "BAAI/bge-small-en-v1.5", "MAX_BATCH_TOKENS": "2048", "PORT": "8080",
        "AUTO_TRUNCATE": "false", "JSON_OUTPUT": "true", "API_KEY": "k",
        "CORS_ALLOW_ORIGIN": "http://a,http://b", "MAX_BATCH_REQUESTS": "8",
        "HF_TOKEN": "hf_x", "DTYPE": "float16", "POOLING": "last_token",
    }
    s = load_settings([], env=env)
    assert s.model_id == "BAAI/bge-small-en-v1.5"
    assert s.max_batch_tokens == 2048 and s.port == 8080 and s.max_batch_requests == 8
    assert s.auto_truncate is False and s.json_output is True
    assert s.cors_allow_origin == ("http://a", "http://b")
    assert s.dtype == "float16" and s.pooling == "last-token"


def test_flags_beat_env() -> None:
    s = load_settings(["--port", "9001", "--auto-truncate", "--json-output"],
                      env={"PORT": "1", "AUTO_TRUNCATE": "false"})
    assert s.port == 9001
    assert s.auto_truncate is True
    assert s.json_output is True


def test_auto_truncate_takes_optional_value() -> None:
    assert load_settings(["--auto-truncate", "false"], env={}).auto_truncate is False


def test_short_port_and_hf_api_token_alias() -> None:
    s = load_settings(["-p", "81", "--hf-api-token", "t"], env={})
    assert s.port == 81 and s.hf_token == "t"
    assert load_settings([], env={"HF_API_TOKEN": "old"}).hf_token == "old"


def test_invalid_hostname_falls_back() -> None:
    assert load_settings([], env={"HOSTNAME": "3f2a9c1d"}).hostname == "0.0.0.0"
    assert load_settings(["--hostname", "127.0.0.1"], env={}).hostname == "127.0.0.1"


def test_bad_env_value_is_an_error() -> None:
    with pytest.raises(SettingsError):
        load_settings([], env={"MAX_BATCH_TOKENS": "lots"})


def test_bad_flag_value_exits() -> None:
    with pytest.raises(SystemExit):
        load_settings(["--max-batch-tokens", "0"], env={})


def test_prompt_name_and_prompt_conflict() -> None:
    with pytest.raises(SettingsError):
        load_settings(["--default-prompt-name", "q", "--default-prompt", "x"], env={})


def test_secrets_redacted_in_repr() -> None:
    s = Settings(api_key="sekret", hf_token="hf_sekret")
    assert "sekret" not in repr(s)
    assert "sekret" not in str(s)
    assert "<redacted>" in repr(s)


def test_compat_flags_accepted_and_named_when_set() -> None:
    s = load_settings(["--uds-path", "/tmp/x", "--prometheus-port", "9001", "--disable-spans",
                       "--otlp-endpoint", "http://o:4317", "--dense-path", "2_Dense"], env={})
    assert s.prometheus_port == 9001 and s.disable_spans is True
    # --dense-path does something now: it picks the Dense module of a first-start export.
    assert s.compatibility_only() == ["--uds-path"] and s.dense_path_of(0) == "2_Dense"
    assert load_settings([], env={}).compatibility_only() == []
    assert load_settings([], env={"UDS_PATH": "/x"}).compatibility_only() == ["--uds-path"]


def test_start_warnings_name_what_does_less_than_it_seems() -> None:
    assert load_settings([], env={}).start_warnings() == []
    warned = load_settings(["--uds-path", "/x", "--disable-spans", "--otlp-endpoint", "http://o",
                            "--max-client-batch-size", "1000"], env={}).start_warnings()
    assert warned[0] == "--uds-path is accepted for compatibility with TEI and has no effect"
    assert warned[1] == "--disable-spans is set: no request spans go to http://o"
    assert "more inputs than 512 is always answered 429" in warned[2] and len(warned) == 3
    both = ["--max-client-batch-size", "1000", "--max-concurrent-requests", "1000"]
    assert load_settings(both, env={}).start_warnings() == []


def test_grpc_flag_and_env() -> None:
    assert load_settings([], env={}).grpc is False
    assert load_settings(["--grpc"], env={}).grpc is True
    assert load_settings([], env={"GRPC": "true"}).grpc is True
    assert load_settings([], env={"GRPC": "0"}).grpc is False
    assert load_settings([], env={"PROMETHEUS_PORT": "0"}).prometheus_port == 0


def test_tokenization_workers_default() -> None:
    assert 1 <= Settings().effective_tokenization_workers() <= 64
    assert Settings(tokenization_workers=3).effective_tokenization_workers() == 3


def test_model_id_repeats_and_names_follow_in_order() -> None:
    s = load_settings(["--model-id", "a/embedder", "--model-id", "b/reranker",
                       "--served-model-name", "emb", "--served-model-name", "rr"], env={})
    assert s.model_ids == ("a/embedder", "b/reranker")
    assert s.served_model_names == ("emb", "rr")
    assert s.model_id == "a/embedder" and s.served_model_name == "emb"


def test_model_id_env_is_a_comma_separated_list() -> None:
    s = load_settings([], env={"MODEL_ID": "a/embedder, b/reranker",
                               "SERVED_MODEL_NAME": "emb,rr"})
    assert s.model_ids == ("a/embedder", "b/reranker")
    assert s.served_model_names == ("emb", "rr")
    assert load_settings(["--model-id", "c"], env={"MODEL_ID": "a,b"}).model_ids == ("c",)
    assert load_settings([], env={"MODEL_ID": ""}).model_ids == ()  # set but empty: none


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [([], {"MODEL_ID": "a,b,c", "SERVED_MODEL_NAME": "x,,z"},
      r"SERVED_MODEL_NAME='x,,z': entry 2 is empty"),
     ([], {"MODEL_ID": "a,,b"}, r"MODEL_ID='a,,b': entry 2 is empty"),
     (["--model-id", "a", "--model-id", ""], {}, "--model-id is empty")],
)  # fmt: skip
def test_an_empty_model_entry_is_refused_not_dropped_or_defaulted(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    """A gap in a comma list shifted every later name onto another model (then failed with a
    miscount); an empty --model-id served all-MiniLM-L6-v2 beside the others."""
    with pytest.raises(SettingsError, match=message):
        load_settings(argv, env=env)


def test_no_model_id_is_the_default_model() -> None:
    s = load_settings([], env={})
    assert s.model_ids == () and s.model_id is None and s.served_model_name is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--model-id", "a", "--model-id", "b", "--served-model-name", "x"], "given 1 times for 2"),
     (["--model-id", "a", "--model-id", "b", "--served-model-name", "x", "--served-model-name",
       "x"], "'x' is given twice")],
)  # fmt: skip
def test_served_model_names_must_match_the_models(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(argv, env={})


@pytest.mark.parametrize(
    ("value", "dtype"),
    [("float32", "float32"), ("float16", "float16"), ("fp32", "float32"), ("FP16", "float16"),
     ("int8", "int8"), ("auto", None), ("AUTO", None)],
)
def test_dtype_takes_tei_and_manifest_names(value: str, dtype: str | None) -> None:
    assert load_settings(["--dtype", value], env={}).dtype == dtype


def test_dtype_revision_and_pooling_are_one_for_all_or_one_per_model() -> None:
    """Given once, a flag applies to every model (as with one model); given per model, in
    --model-id order, with `auto` where a model needs none (an int8 embedder beside an fp32
    reranker, two hub models pinned to their own commits)."""
    two = ["--model-id", "a", "--model-id", "b"]
    once = load_settings([*two, "--dtype", "int8", "--revision", "v1"], env={})
    assert [once.dtype_of(i) for i in (0, 1)] == ["int8", "int8"]
    assert [once.revision_of(i) for i in (0, 1)] == ["v1", "v1"]
    each = load_settings([*two, "--dtype", "int8", "auto", "--revision", "auto", "abc123",
                          "--pooling", "mean", "--pooling", "auto"], env={})  # fmt: skip
    assert [each.dtype_of(i) for i in (0, 1)] == ["int8", None]
    assert [each.revision_of(i) for i in (0, 1)] == [None, "abc123"]
    assert [each.pooling_of(i) for i in (0, 1)] == ["mean", None]
    env = load_settings([], env={"MODEL_ID": "a,b", "DTYPE": "fp32,int8", "POOLING": "cls"})
    assert [env.dtype_of(i) for i in (0, 1)] == ["float32", "int8"]
    assert [env.pooling_of(i) for i in (0, 1)] == ["cls", "cls"]
    with pytest.raises(SettingsError, match=r"--dtype is given 2 times for 3 --model-id"):
        load_settings([*two, "--model-id", "c", "--dtype", "int8", "fp32"], env={})
    assert load_settings([], env={}).dtype is None


def test_unknown_dtype_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SettingsError, match="dtype must be one of"):
        load_settings([], env={"DTYPE": "bfloat16"})
    with pytest.raises(SystemExit):
        load_settings(["--dtype", "bf16"], env={})
    assert "dtype must be one of float32, float16, int8, auto" in capsys.readouterr().err


def test_task_follows_the_models_in_order() -> None:
    s = load_settings(["--model-id", "Qwen/Qwen3-Embedding-0.6B", "--model-id",
                       "Qwen/Qwen3-Reranker-0.6B", "--task", "auto", "--task", "RERANK"],
                      env={})  # fmt: skip
    assert s.tasks == ("auto", "rerank")
    assert s.task_of(0) is None and s.task_of(1) is Task.RERANK
    s = load_settings([], env={"MODEL_ID": "a,b", "TASK": "embed, rerank"})
    assert (s.task_of(0), s.task_of(1)) == (Task.EMBED, Task.RERANK)
    assert load_settings(["--model-id", "a"], env={}).task_of(0) is None


def test_tei_task_env_keeps_its_meaning_beside_task() -> None:
    """TASK=sentence-similarity is TEI's (the `/` route answers /similarity), not a --task."""
    s = load_settings([], env={"TASK": "Sentence-Similarity"})
    assert s.similarity_root and s.tasks == ()
    s = load_settings(["--task", "embed"], env={"TASK": "sentence-similarity"})
    assert s.similarity_root and s.tasks == ("embed",)
    s = load_settings([], env={"TASK": "embed"})
    assert not s.similarity_root and s.tasks == ("embed",)


def test_task_refused_when_unknown_or_not_one_per_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SettingsError, match="given 1 times for 2"):
        load_settings(["--model-id", "a", "--model-id", "b", "--task", "rerank"], env={})
    with pytest.raises(SystemExit):
        load_settings(["--task", "reranker"], env={})
    assert "task must be one of" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "value", "field", "kept"),
    [("TASK", "feature-extraction", "tasks", ()), ("TASK", "text-classification", "tasks", ()),
     ("GRPC", "enabled", "grpc", False), ("DEVICE", "0", "device", "auto")],
)  # fmt: skip
def test_a_common_env_name_ours_alone_holding_something_else_is_ignored(
    name: str, value: str, field: str, kept: object, caplog: pytest.LogCaptureFixture
) -> None:
    """TEI never reads TASK, GRPC or DEVICE, so a hosting platform's value there (Hugging
    Face's TASK=feature-extraction) starts it; it starts us too, with a warning."""
    s = load_settings([], env={name: value})
    assert getattr(s, field) == kept
    [warned] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"env {name}={value!r}" in warned.message and "ignored" in warned.message


def test_ours_alone_given_as_a_flag_or_under_our_own_env_name_stays_strict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        load_settings(["--device", "gpu"], env={})
    assert "unknown device 'gpu'" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="INTRA_OP_THREADS"):
        load_settings([], env={"INTRA_OP_THREADS": "many"})
    assert load_settings([], env={"DEVICE": "cuda:1"}).device == "cuda:1"


def test_an_empty_served_model_name_is_refused() -> None:
    with pytest.raises(SettingsError, match="--served-model-name is empty"):
        load_settings(["--model-id", "a", "--model-id", "b", "--served-model-name", "", "b"],
                      env={})  # fmt: skip
    assert load_settings([], env={"SERVED_MODEL_NAME": " "}).served_model_names == ()


def test_unknown_pooling_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_settings(["--pooling", "CLS"], env={}).pooling == "cls"
    with pytest.raises(SettingsError, match="pooling must be one of"):
        load_settings([], env={"POOLING": "max"})
    with pytest.raises(SystemExit):
        load_settings(["--pooling", "max"], env={})
    assert "pooling must be one of cls, mean, last-token, splade" in capsys.readouterr().err
