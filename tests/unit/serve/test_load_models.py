"""Several --model-id: a clash of default names is refused before anything loads."""

from __future__ import annotations

import pytest

from tei_serve.cli import ModelLoadError, load_models
from tei_serve.settings import load_settings


def test_two_ids_with_one_default_name_are_refused_before_loading() -> None:
    # Neither folder exists: had loading started, the error would be that one could not load.
    settings = load_settings(["--model-id", "/nowhere/a/rr", "--model-id", "/nowhere/b/rr/"],
                             env={})  # fmt: skip
    with pytest.raises(ModelLoadError, match="two models would be served as 'rr'"):
        load_models(settings)
    named = load_settings(["--model-id", "/nowhere/a/rr", "--model-id", "/nowhere/b/rr",
                           "--served-model-name", "one", "two"], env={})  # fmt: skip
    with pytest.raises(ModelLoadError, match="model /nowhere/a/rr could not load"):
        load_models(named)
