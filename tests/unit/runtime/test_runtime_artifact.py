from __future__ import annotations

import json
from pathlib import Path

import pytest
from rt_artifacts import ArtifactFactory

from tei_runtime import ManifestError, ProviderError, load


def test_loads_and_reports_choice(make_artifact: ArtifactFactory) -> None:
    m = load(make_artifact().root, intra_op_threads=1)
    assert m.provider == "CPUExecutionProvider"
    assert m.precision.value == "fp32"
    assert m.choice.intra_op_threads == 1
    assert m.max_input_length == 16


def test_tampered_model_is_a_checksum_error_naming_the_file(make_artifact: ArtifactFactory) -> None:
    built = make_artifact()
    with (built.root / "model.fp32.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx: sha256 mismatch"):
        load(built.root)


def test_tampered_tokenizer_file_is_named(make_artifact: ArtifactFactory) -> None:
    built = make_artifact()
    (built.root / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ManifestError, match=r"tokenizer_config\.json: sha256 mismatch"):
        load(built.root)


@pytest.mark.parametrize("name", ["model.fp32.onnx", "tokenizer.json"])
def test_missing_file_is_named(make_artifact: ArtifactFactory, name: str) -> None:
    built = make_artifact()
    (built.root / name).unlink()
    with pytest.raises(ManifestError, match=rf"{name}: missing"):
        load(built.root)


def test_missing_manifest_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"manifest\.json: missing"):
        load(tmp_path)
    with pytest.raises(ManifestError, match="not a folder") as missing:
        load(tmp_path / "nope")
    assert "tei-bundle" not in str(missing.value)
    (tmp_path / "minilm.tar").write_bytes(b"")  # a bundle passed as it came
    with pytest.raises(ManifestError, match=r"a bundle: `tei-bundle unpack .*minilm\.tar FOLDER`"):
        load(tmp_path / "minilm.tar")


def test_unknown_schema_version_names_the_manifest(make_artifact: ArtifactFactory) -> None:
    built = make_artifact()
    path = built.root / "manifest.json"
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"manifest\.json: schema_version 99 is not supported"):
        load(built.root)


def test_only_the_chosen_variant_is_verified(make_artifact: ArtifactFactory) -> None:
    from tei_runtime.manifest import Precision

    built = make_artifact(precisions=(Precision.FP32, Precision.INT8))
    (built.root / "model.int8.onnx").write_bytes(b"broken")
    assert load(built.root).precision is Precision.FP32
    with pytest.raises(ManifestError, match=r"model\.int8\.onnx: sha256 mismatch"):
        load(built.root, dtype="int8")


def test_missing_provider_is_an_error_not_a_fallback(make_artifact: ArtifactFactory) -> None:
    with pytest.raises(ProviderError, match="onnxruntime-gpu"):
        load(make_artifact().root, device="cuda")
    with pytest.raises(ProviderError, match="no fp16 variant"):
        load(make_artifact().root, dtype="float16")


def test_bad_load_arguments(make_artifact: ArtifactFactory) -> None:
    root = make_artifact().root
    with pytest.raises(ProviderError, match="intra_op_threads"):
        load(root, intra_op_threads=0)
    with pytest.raises(ProviderError, match="max_batch_tokens"):
        load(root, max_batch_tokens=0)


def test_graph_and_manifest_inputs_must_agree(make_artifact: ArtifactFactory) -> None:
    built = make_artifact(manifest_inputs=("input_ids", "attention_mask"))
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx: graph inputs"):
        load(built.root)


def test_bad_padding_side_is_refused(make_artifact: ArtifactFactory) -> None:
    with pytest.raises(ManifestError, match="padding_side"):
        load(make_artifact(padding_side="middle").root)


def test_external_data_files_are_verified(make_artifact: ArtifactFactory) -> None:
    import msgspec

    from tei_runtime.checksum import sha256_file
    from tei_runtime.manifest import decode_manifest, encode_manifest

    built = make_artifact()
    data = built.root / "model.fp32.onnx.data"
    data.write_bytes(b"weights")
    path = built.root / "manifest.json"
    manifest = decode_manifest(path.read_bytes())
    variant = msgspec.structs.replace(
        manifest.variants[0], external_data={data.name: sha256_file(data)}
    )
    path.write_bytes(encode_manifest(msgspec.structs.replace(manifest, variants=[variant])))
    load(built.root)
    data.write_bytes(b"other weights")
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx\.data: sha256 mismatch"):
        load(built.root)
    data.unlink()
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx\.data: missing"):
        load(built.root)


def _denied(path: Path) -> PermissionError:
    return PermissionError(13, "Permission denied", str(path))


def test_an_unreadable_file_is_one_error_naming_it(
    make_artifact: ArtifactFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files another user exported under a 077 umask: a ManifestError naming the file and
    the fix, never a bare PermissionError from deep inside the load (root reads anything,
    so the kernel's refusal is stood in for here)."""
    import tei_runtime.artifact as artifact_module

    built = make_artifact()
    real_read_bytes = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "manifest.json":
            raise _denied(self)
        return real_read_bytes(self)

    with monkeypatch.context() as m:
        m.setattr(Path, "read_bytes", read_bytes)
        with pytest.raises(ManifestError, match=r"manifest\.json: cannot read it \(Permission "
                                                r"denied\); .*chmod -R a\+rX"):  # fmt: skip
            load(built.root)
    real_sha = artifact_module.sha256_file

    def sha256_file(path: Path) -> str:
        if path.name == "model.fp32.onnx":
            raise _denied(path)
        return real_sha(path)

    monkeypatch.setattr(artifact_module, "sha256_file", sha256_file)
    with pytest.raises(ManifestError, match=r"model\.fp32\.onnx: cannot read it"):
        load(built.root)
