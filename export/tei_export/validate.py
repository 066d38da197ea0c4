"""Each variant against the PyTorch reference, over a grid of batch sizes and lengths.

It runs in a subprocess (`python -m tei_export.validate REQUEST RESULT`) so that torch's and
onnxruntime's thread pools and memory never share a process with the export itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from tei_export.errors import ExportError
from tei_export.plan import ExportPlan
from tei_runtime.lifetime import die_with_parent
from tei_runtime.manifest import Precision

# The longest sequence validated: the model's maximum, capped so that a 32k-context decoder
# validates in minutes; the cap is recorded in the manifest's shapes.
MAX_VALIDATED_LENGTH = 1024


Floats = npt.NDArray[np.float32]

# Below this spread (relative to the scores' size) a single-score model's scores are
# treated as constant, and compared uncentred: centring would divide noise by noise.
_FLAT_SCORES = 1e-6


def _row_cosines(got: Floats, reference: Floats) -> Floats:
    num = (got * reference).sum(axis=-1)
    den = np.linalg.norm(got, axis=-1) * np.linalg.norm(reference, axis=-1)
    return np.asarray(num / np.maximum(den, 1e-12), np.float32)


def min_agreement(got: Sequence[Floats], reference: Sequence[Floats]) -> float:
    """The min cosine a variant is held to, over batches of the vectors users get (one row
    each). A single-score model (rerankers, one-logit classifiers: rows of one column) is
    compared as one vector of every batch's scores, centred on the reference's mean: an
    uncentred cosine of scores that share a sign hides an offset error (a score off by 1.8 on
    a spread of 2 still scored 0.98), and a batch of one would compare signs only. Centred,
    0.98 allows an error of about a fifth of the scores' standard deviation, 0.99999
    about 0.5%."""
    if reference and all(r.shape[-1] == 1 for r in reference):
        ref = np.concatenate([r.reshape(-1) for r in reference]).astype(np.float64)
        out = np.concatenate([g.reshape(-1) for g in got]).astype(np.float64)
        centre = float(ref.mean())
        if float(np.abs(ref - centre).max()) > _FLAT_SCORES * max(1.0, abs(centre)):
            ref, out = ref - centre, out - centre
        den = float(np.linalg.norm(ref) * np.linalg.norm(out))
        return float(ref @ out / max(den, 1e-12))
    return min(float(_row_cosines(g, r).min()) for g, r in zip(got, reference, strict=True))


class VariantFile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    precision: Precision
    path: str


class ValidationRequest(msgspec.Struct, frozen=True, kw_only=True):
    plan: ExportPlan
    checkpoint: str
    vocab_size: int
    trust_remote_code: bool
    variants: list[VariantFile]


class VariantResult(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    precision: Precision
    min_cosine: float
    max_abs_err: float
    shapes: list[tuple[int, int]]


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    lengths: list[int]
    """True lengths of the rows."""
    padding_side: str


def length_grid(plan: ExportPlan) -> list[Batch]:
    """Batches of true lengths: one short, one odd, the maximum, and a padded mix. A decoder's
    padded mix is validated padded on both sides: its graph takes position_ids, so the vectors
    must not depend on where the padding went."""
    longest = min(plan.max_input_length, MAX_VALIDATED_LENGTH)
    short, odd = min(4, longest), min(37, longest)
    side = plan.padding_side
    grid = [Batch(lengths=lengths, padding_side=side) for lengths in ([short], [odd], [longest])]
    mix = [longest, odd, short, odd]
    sides = ("left", "right") if plan.card.decoder else (side,)
    return grid + [Batch(lengths=mix, padding_side=s) for s in sides]


def validate(request: ValidationRequest, workdir: Path) -> list[VariantResult]:
    request_path = workdir / "validation-request.json"
    result_path = workdir / "validation-result.json"
    request_path.write_bytes(msgspec.json.encode(request))
    env = {**os.environ, _PARENT_PID: str(os.getpid())}
    proc = subprocess.run(
        [sys.executable, "-m", "tei_export.validate", str(request_path), str(result_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"validation failed to run: {tail}")
    results = msgspec.json.decode(result_path.read_bytes(), type=list[VariantResult])
    request_path.unlink()
    result_path.unlink()
    return results


def _run(request: ValidationRequest) -> list[VariantResult]:
    import onnxruntime as ort
    import torch

    from tei_export.reference import example_inputs, load_module, pool

    plan = request.plan
    module = load_module(
        plan, Path(request.checkpoint), trust_remote_code=request.trust_remote_code
    )
    grid = length_grid(plan)
    batches = [
        example_inputs(plan, b.lengths, request.vocab_size, padding_side=b.padding_side)
        for b in grid
    ]
    mask_index = plan.inputs.index("attention_mask")

    def compared(outputs: list[Floats], mask: torch.Tensor) -> Floats:
        # The vector a user gets: pooled embedding, pooled sentence embedding, logits, sparse.
        if plan.outputs[0] == "token_embeddings" and len(outputs) == 1:
            assert plan.pooling is not None
            pooled = pool(torch.from_numpy(outputs[0]), mask, plan.pooling)
            return np.asarray(pooled.numpy(), np.float32)
        return outputs[-1]

    with torch.no_grad():
        references = []
        for args in batches:
            out = module(*args)
            outs = [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
            references.append(compared(outs, args[mask_index]))

    results = []
    for variant in request.variants:
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, len(os.sched_getaffinity(0)))
        session = ort.InferenceSession(variant.path, options, providers=["CPUExecutionProvider"])
        got = []
        for args in batches:
            feeds = {name: t.numpy() for name, t in zip(plan.inputs, args, strict=True)}
            outs = [np.asarray(o, dtype=np.float32) for o in session.run(plan.outputs, feeds)]
            got.append(compared(outs, args[mask_index]))
        results.append(
            VariantResult(
                name=variant.name,
                precision=variant.precision,
                min_cosine=min_agreement(got, references),
                max_abs_err=max(
                    float(np.abs(g - r).max()) for g, r in zip(got, references, strict=True)
                ),
                shapes=[(len(b.lengths), max(b.lengths)) for b in grid],
            )
        )
    return results


# The exporter's pid, for the child to end with it (a killed export leaves no validation).
_PARENT_PID = "TEI_EXPORT_PARENT_PID"


def main() -> None:
    parent = os.environ.get(_PARENT_PID)
    die_with_parent(int(parent) if parent and parent.isdigit() else None)
    request_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = msgspec.json.decode(request_path.read_bytes(), type=ValidationRequest)
    result_path.write_bytes(msgspec.json.encode(_run(request)))


if __name__ == "__main__":
    main()
