"""A small validator for the OpenAPI 3.0 schema subset TEI's document uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = json.loads((Path(__file__).parent / "tei-openapi.json").read_text())


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = SPEC["components"]["schemas"][name]
    return schema


def errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    schema = _resolve(schema)
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null not allowed"]
    if "oneOf" in schema:
        matches = [s for s in schema["oneOf"] if not errors(value, s, path)]
        return [] if len(matches) == 1 else [f"{path}: matches {len(matches)} of oneOf"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    out: list[str] = []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        out += [f"{path}: missing {k}" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                out += errors(v, props[k], f"{path}.{k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(v, schema["additionalProperties"], f"{path}.{k}")
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not an array"]
        for i, v in enumerate(value):
            out += errors(v, schema.get("items", {}), f"{path}[{i}]")
    elif kind == "string":
        if not isinstance(value, str):
            out.append(f"{path}: not a string")
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(f"{path}: not an integer")
        elif "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: below minimum")
    elif kind == "number":
        if not isinstance(value, int | float) or isinstance(value, bool):
            out.append(f"{path}: not a number")
    elif kind == "boolean" and not isinstance(value, bool):
        out.append(f"{path}: not a boolean")
    return out


def response_schema(path: str, method: str, status: int) -> dict[str, Any]:
    op = SPEC["paths"][path][method]
    resp = op["responses"][str(status)]
    schema: dict[str, Any] = resp["content"]["application/json"]["schema"]
    return schema
