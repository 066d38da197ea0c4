"""Read docker-bake.hcl and docker/Dockerfile into plain data for the image tests.

python-hcl2 keeps HCL string quotes and leaves `${VAR}` / bare variable references as text;
`bake_targets` strips the quotes, applies `inherits` and substitutes variable defaults, as
`docker buildx bake` does for the parts this project uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

ROOT = Path(__file__).resolve().parents[2]
BAKE = ROOT / "docker-bake.hcl"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _unquote(value: Any) -> Any:
    if isinstance(value, str):
        return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items() if k != "__is_block__"}
    return value


def _blocks(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for block in doc.get(kind, []):
        for name, body in _unquote(block).items():
            out[name] = body
    return out


@dataclass
class Bake:
    variables: dict[str, str]
    groups: dict[str, list[str]]
    targets: dict[str, dict[str, Any]]
    raw_targets: dict[str, dict[str, Any]] = field(default_factory=dict)


def _substitute(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, str):
        if value in variables:  # a bare reference: VERSION = VERSION
            return variables[value]
        return re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], value)
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    return value


def load_bake(path: Path = BAKE, overrides: dict[str, str] | None = None) -> Bake:
    with path.open() as f:
        doc = hcl2.load(f)
    variables = {k: str(v["default"]) for k, v in _blocks(doc, "variable").items()}
    variables.update(overrides or {})
    groups = {k: list(v["targets"]) for k, v in _blocks(doc, "group").items()}
    raw = _blocks(doc, "target")

    def merged(name: str) -> dict[str, Any]:
        body = raw[name]
        out: dict[str, Any] = {}
        for parent in body.get("inherits", []):
            for key, value in merged(parent).items():
                out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
        for key, value in body.items():
            if key == "inherits":
                continue
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
        return out

    targets = {
        name: _substitute(merged(name), variables) for name in raw if not name.startswith("_")
    }
    return Bake(variables=variables, groups=groups, targets=targets, raw_targets=raw)


@dataclass
class Stage:
    name: str
    base: str
    args: dict[str, str | None]
    instructions: list[tuple[str, str]]
    """(INSTRUCTION, rest of the logical line), continuations joined, comments dropped."""

    def all(self, instruction: str) -> list[str]:
        return [rest for ins, rest in self.instructions if ins == instruction]


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: dict[str, Stage]


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    return lines


def _arg(rest: str) -> tuple[str, str | None]:
    name, _, default = rest.partition("=")
    return name.strip(), default.strip().strip('"') if default else None


def load_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in _logical_lines(path.read_text()):
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match, line
            stage = Stage(name=match.group(2) or "", base=match.group(1), args={}, instructions=[])
            stages[stage.name] = stage
        elif stage is None:
            if instruction == "ARG":
                key, default = _arg(rest)
                global_args[key] = default
        else:
            if instruction == "ARG":
                key, default = _arg(rest)
                stage.args[key] = default
            stage.instructions.append((instruction, rest))
    return Dockerfile(global_args=global_args, stages=stages)
