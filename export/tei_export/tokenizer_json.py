"""A checkpoint without tokenizer.json gets one from transformers' fast-tokenizer conversion.

The runtime reads only tokenizer.json (the `tokenizers` library, no transformers at run time),
and TEI refuses a model without one. Older checkpoints ship only the files a Python tokenizer
class reads (BERT's vocab.txt, RoBERTa's vocab.json and merges.txt, a sentencepiece model);
transformers converts those into a fast tokenizer, whose tokenizer.json then goes into a
staged copy of the checkpoint (links to its files, the source folder or hub cache untouched).
The export's parity check feeds both graphs the same token ids, so it does not compare the
conversion with the tokenizer it came from; that is this project's tests' job (per tokenizer
kind: vectors of texts through the converted file against sentence-transformers on the same
folder, tests/parity/test_tokenizer_conversion.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tei_export.errors import ExportError

TOKENIZER_JSON = "tokenizer.json"

# The vocabulary files transformers' tokenizer classes read. Without one, transformers 5 still
# builds a tokenizer (BERT's from nothing: its five special tokens, every word unknown), which
# the export's own parity check cannot catch: the reference would tokenize the same way.
_VOCABULARY_FILES = ("vocab.*", "merges.txt", "*.model", "*.tiktoken", "bpe.codes")


def check_loads(path: Path) -> None:
    """The checkpoint's tokenizer.json loads in the `tokenizers` library, as the runtime will
    load it: a broken one fails the export, not the first start of the artifact (the parity
    check tokenizes with transformers, which may read other files)."""
    import tokenizers

    file = path / TOKENIZER_JSON
    try:
        tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises bare Exception
        raise ExportError(f"{file}: the tokenizers library cannot load it ({e})") from e


def check_fits_vocabulary(path: Path, vocab_size: object) -> list[str]:
    """Every id the tokenizer gives an ordinary text has a row in the model's embedding table
    (config.json's `vocab_size`): a tokenizer from another model validates on random ids
    below that size, then fails on the first real text that reaches a higher id. Added
    tokens past the table that a text gets only by spelling them out (a chat template's
    markers) are allowed, and returned as notes."""
    import tokenizers

    file = path / TOKENIZER_JSON
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or not file.is_file():
        return []
    tokenizer = tokenizers.Tokenizer.from_file(str(file))
    base = tokenizer.get_vocab(with_added_tokens=False)
    framed = tokenizer.encode("a", add_special_tokens=True).ids  # what every text carries
    past = sorted(
        ((i, t) for t, i in base.items() if i >= vocab_size), reverse=True
    ) or [(i, str(tokenizer.id_to_token(i))) for i in framed if i >= vocab_size]
    if past:
        top, token = past[0]
        raise ExportError(
            f"{file}: the tokenizer gives ids up to {top} ({token!r}), but config.json's "
            f"vocab_size is {vocab_size}: the model has no embedding for them (is the "
            f"tokenizer another model's?)"
        )
    added = sorted(t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()
                   if i >= vocab_size)  # fmt: skip
    if not added:
        return []
    return [
        f"added tokens past config.json's vocab_size {vocab_size} ({', '.join(added[:5])}"
        f"{', ...' if len(added) > 5 else ''}): a text that spells one out fails"
    ]


def lowercases(path: Path) -> bool:
    """Whether the checkpoint's tokenizer.json lowercases text itself (a BertNormalizer with
    `lowercase`, or a Lowercase step), so that sentence-transformers' do_lower_case adds
    nothing to it."""
    try:
        data = json.loads((path / TOKENIZER_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False

    def found(step: object) -> bool:
        if not isinstance(step, dict):
            return False
        kind = step.get("type")
        if kind == "Lowercase" or (kind == "BertNormalizer" and step.get("lowercase")):
            return True
        return kind == "Sequence" and any(found(s) for s in step.get("normalizers") or [])

    return isinstance(data, dict) and found(data.get("normalizer"))


def needs_conversion(path: Path) -> bool:
    return (path / "config.json").is_file() and not (path / TOKENIZER_JSON).is_file()


def convert(path: Path, dest: Path) -> None:
    """Write the fast tokenizer of the checkpoint at `path` as `dest`/tokenizer.json."""
    from transformers import AutoTokenizer

    if not any(any(path.glob(pattern)) for pattern in _VOCABULARY_FILES):
        raise ExportError(
            f"{path}: no tokenizer.json and no vocabulary file for transformers to convert "
            f"(vocab.txt, vocab.json + merges.txt, a sentencepiece .model); add the model's "
            f"tokenizer files"
        )
    try:
        # Local files only: the checkpoint is resolved already, and no code of its runs.
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many kinds for a folder it cannot read
        raise ExportError(
            f"{path}: no tokenizer.json, and transformers could not build a fast tokenizer "
            f"from its files ({type(e).__name__}: {e})"
        ) from e
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(
            f"{path}: no tokenizer.json, and transformers has no fast version of its "
            f"tokenizer ({type(tokenizer).__name__}); tei-onnx reads only tokenizer.json"
        )
    with tempfile.TemporaryDirectory(dir=dest, prefix=".tokenizer-") as saved:
        tokenizer.save_pretrained(saved)
        written = Path(saved) / TOKENIZER_JSON
        if not written.is_file():
            raise ExportError(f"{path}: transformers wrote no tokenizer.json for its tokenizer")
        shutil.move(str(written), dest / TOKENIZER_JSON)


def stage_with_tokenizer_json(path: Path, parent: Path) -> Path:
    """A new folder under `parent` (the caller removes it) linking every entry of the
    checkpoint at `path`, plus the tokenizer.json converted from its tokenizer files."""
    staged = Path(tempfile.mkdtemp(dir=parent, prefix=".tei-export-tokenizer-"))
    try:
        for entry in path.iterdir():
            (staged / entry.name).symlink_to(entry.resolve())
        convert(path, staged)
    except OSError as e:
        shutil.rmtree(staged, ignore_errors=True)
        raise ExportError(f"cannot write the staged copy of {path}: {e}") from e
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged
