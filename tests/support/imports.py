"""Making an installed package look absent, for the code paths of an install without it."""

from __future__ import annotations

import builtins
import importlib.util
from typing import Any

import pytest


def hide_package(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Every later `import package...` raises ImportError, and `importlib.util.find_spec`
    finds nothing, as where it is not installed."""
    real_import = builtins.__import__
    real_find_spec = importlib.util.find_spec

    def hidden(name: str) -> bool:
        return name == package or name.startswith(f"{package}.")

    def hiding_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if hidden(name):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    def hiding_find_spec(name: str, package_name: str | None = None) -> Any:
        return None if hidden(name) else real_find_spec(name, package_name)

    monkeypatch.setattr(builtins, "__import__", hiding_import)
    monkeypatch.setattr(importlib.util, "find_spec", hiding_find_spec)
