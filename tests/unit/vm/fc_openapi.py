"""Check a request against Firecracker's OpenAPI (Swagger 2.0) description.

Used by the unit tests and by the fake Firecracker process
(`fake_firecracker.py`), so both hold the launcher to the same contract:
the path and method exist, a required body is present, every required field
is there, no field the description does not name, types, enums and integer
bounds match, `$ref`s followed, read-only fields never sent.

Test helper only (not shipped). Hand-written: a full OpenAPI validator
(e.g. openapi-core) is far more than this needs and is not a dependency here.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

#: tests/testdata/firecracker/ (copied byte for byte; sources in tests/testdata/SOURCES.md).
TESTDATA = Path(__file__).resolve().parents[2] / "testdata" / "firecracker"
MAIN = TESTDATA / "firecracker.yaml"
RELEASE = TESTDATA / "firecracker-v1.16.1.yaml"
SPECS = (MAIN, RELEASE)


@cache
def load(path: Path = MAIN) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    assert spec["swagger"] == "2.0"
    return spec  # type: ignore[no-any-return]


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/definitions/"), ref
        schema = spec["definitions"][ref.removeprefix("#/definitions/")]
        seen += 1
        assert seen < 32, "reference loop"
    return schema


def find_operation(
    spec: dict[str, Any], method: str, path: str
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The operation for `method path`, and the path parameters it binds."""
    for template, operations in spec["paths"].items():
        pattern = "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
        match = re.match(pattern, path)
        if match and method.lower() in operations:
            return operations[method.lower()], match.groupdict()
    return None


def check_value(spec: dict[str, Any], schema: dict[str, Any], value: Any, where: str) -> list[str]:
    schema = _resolve(spec, schema)
    errors: list[str] = []
    kind = schema.get("type", "object" if "properties" in schema else None)
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required field {name!r}")
        for name, item in value.items():
            if name not in properties:
                errors.append(f"{where}: unknown field {name!r}")
                continue
            prop = properties[name]
            if _resolve(spec, prop).get("readOnly") or prop.get("readOnly"):
                errors.append(f"{where}: read-only field {name!r} sent")
            errors += check_value(spec, prop, item, f"{where}.{name}")
    elif kind == "string":
        if not isinstance(value, str):
            errors.append(f"{where}: expected a string, got {type(value).__name__}")
    elif kind == "integer":
        if type(value) is not int:
            errors.append(f"{where}: expected an integer, got {type(value).__name__}")
        else:
            if "minimum" in schema and value < schema["minimum"]:
                errors.append(f"{where}: {value} is below the minimum {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                errors.append(f"{where}: {value} is above the maximum {schema['maximum']}")
    elif kind == "boolean":
        if type(value) is not bool:
            errors.append(f"{where}: expected a boolean, got {type(value).__name__}")
    elif kind == "array":
        if not isinstance(value, list):
            errors.append(f"{where}: expected an array, got {type(value).__name__}")
        else:
            for i, item in enumerate(value):
                errors += check_value(spec, schema.get("items", {}), item, f"{where}[{i}]")
    else:
        errors.append(f"{where}: schema type {kind!r} is not handled by this checker")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    return errors


def check_request(
    method: str, path: str, body: Any, spec_path: Path = MAIN
) -> list[str]:
    """Every way `method path` with JSON `body` breaks the description; [] if none."""
    spec = load(spec_path)
    found = find_operation(spec, method, path)
    if found is None:
        return [f"{method} {path}: no such operation"]
    operation, path_params = found
    errors: list[str] = []
    params = operation.get("parameters", [])
    for param in params:
        if param["in"] == "path":
            value = path_params.get(param["name"])
            if value is None and param.get("required"):
                errors.append(f"{method} {path}: missing path parameter {param['name']}")
            elif param.get("type") == "string" and not value:
                errors.append(f"{method} {path}: empty path parameter {param['name']}")
    bodies = [p for p in params if p["in"] == "body"]
    if not bodies:
        if body is not None:
            errors.append(f"{method} {path}: takes no body")
        return errors
    (body_param,) = bodies
    if body is None:
        if body_param.get("required"):
            errors.append(f"{method} {path}: body is required")
        return errors
    return errors + check_value(spec, body_param["schema"], body, f"{method} {path} body")
