"""Making an installed package look absent, for the code paths of an install without it."""

from __future__ import annotations

import builtins
from typing import Any

import pytest


def hide_package(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Every later `import package...` raises ImportError, as where it is not installed."""
    real_import = builtins.__import__

    def hiding_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == package or name.startswith(f"{package}."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hiding_import)
