"""The experiment files' schema (workflow/schemas/experiment.schema.yaml), with its lists of
names filled in from the code that owns them, and its first violation as one line naming the
field the way an experiment file's reader sees it ("run template 2: kernel 'x' is not ...")."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "experiment.schema.yaml"


def name_lists() -> dict[str, list[str]]:
    """The schema's `enum_from` lists: each owned by one module, written nowhere else."""
    from feather.engine_limits import ENGINE_MODES
    from feather.engines.runs import ATTENTION_CHOICES, CASCADE_CHOICES, PREFIX_CACHE_CHOICES
    from feather.engines.selection import ENGINES
    from feather.kernels.plan import KERNELS
    from feather.sim.sched_measured import COST_MODELS

    return {
        "kernels": list(KERNELS),
        "engine_modes": list(ENGINE_MODES),
        "cost_models": list(COST_MODELS),
        "engines": list(ENGINES),
        "cascade": list(CASCADE_CHOICES),
        "attention": list(ATTENTION_CHOICES),
        "prefix_cache": list(PREFIX_CACHE_CHOICES),
    }


@functools.cache
def schema() -> dict[str, Any]:
    data = yaml.safe_load(SCHEMA_PATH.read_text())
    lists = name_lists()

    def fill(node: Any) -> None:
        if isinstance(node, dict):
            if "enum_from" in node:
                node["enum"] = lists[node.pop("enum_from")]
            for value in node.values():
                fill(value)
        elif isinstance(node, list):
            for value in node:
                fill(value)

    fill(data)
    return data


_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator(root: dict[str, Any]) -> Any:
    """The schema's validator, built once per schema (`schema()` may be rebuilt)."""
    import jsonschema

    built = _VALIDATORS.get(id(root))
    if built is not None and built[0] is root:
        return built[1]
    draft = jsonschema.validators.validator_for(root)
    # a whole number is an int in YAML's reading: 2.0 is not a seed or a block count
    whole = draft.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    validator = jsonschema.validators.extend(draft, type_checker=whole)(root)
    _VALIDATORS[id(root)] = (root, validator)
    return validator


def violation(data: Any) -> str | None:
    """The experiment's first violation of the schema, in one line, or None."""
    import jsonschema

    root = schema()
    error = jsonschema.exceptions.best_match(_validator(root).iter_errors(data))
    if error is None:
        return None
    path = list(error.absolute_path)
    instance = error.instance
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(instance) - set(allowed))
        return f"{_where(path)}: unknown keys {unknown}; allowed: {allowed}"
    if error.validator == "required":
        missing = sorted(set(error.validator_value) - set(instance))
        return f"{_where(path)}: missing {missing}"
    if error.validator == "type" and path and isinstance(_parent(root, path), dict):
        # a member of the wrong kind (a run template that is a number): the container is wrong
        container = _parent(root, path)
        assert container is not None
        path = path[:-1]
        return f"{_where(path)} must be {_describe(root, container)}, got {_value(path, data)}"
    return f"{_where(path)} must be {_describe(root, _node(root, path))}, got {instance!r}"


def _where(path: list[Any]) -> str:
    """runs/3/kernel -> 'run template 3: kernel'; engine_runs/0/options/dtype ->
    'engine_runs entry 0: option dtype'; training/params -> 'training.params'."""
    if not path:
        return "the top level"
    parts: list[str] = []
    head = ""
    rest = list(path)
    if len(rest) >= 2 and rest[0] in ("runs", "engine_runs") and isinstance(rest[1], int):
        head = ("run template " if rest[0] == "runs" else "engine_runs entry ") + str(rest[1])
        rest = rest[2:]
    for i, part in enumerate(rest):
        if isinstance(part, int):
            continue  # a list's item: the message quotes the value
        if i > 0 and rest[i - 1] == "options":
            parts[-1] = f"option {part}"
        else:
            parts.append(str(part))
    tail = ".".join(parts)
    if head and tail:
        return f"{head}: {tail}"
    return head or tail


def _value(path: list[Any], data: Any) -> str:
    for part in path:
        data = data[part]
    return repr(data)


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target = node["$ref"].removeprefix("#/$defs/")
        node = {**root["$defs"][target], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _node(root: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    """The schema that describes the value at `path` (the branch of an anyOf that fits it)."""
    node = _resolve(root, root)
    for part in path:
        node = _member(root, node, part) or {}
    return node


def _parent(root: dict[str, Any], path: list[Any]) -> dict[str, Any] | None:
    """The container schema of the value at `path` where that value is a list item or a
    mapping's value (not a named field), else None."""
    if not path:
        return None
    container = _node(root, path[:-1])
    named = isinstance(path[-1], str) and path[-1] in container.get("properties", {})
    return None if named else container


def _member(root: dict[str, Any], node: dict[str, Any], part: Any) -> dict[str, Any] | None:
    node = _resolve(root, node)
    for branch in [node, *(_resolve(root, b) for b in node.get("anyOf", []))]:
        if isinstance(part, int) and "items" in branch:
            return _resolve(root, branch["items"])
        if isinstance(part, str):
            if part in branch.get("properties", {}):
                return _resolve(root, branch["properties"][part])
            if isinstance(branch.get("additionalProperties"), dict):
                return _resolve(root, branch["additionalProperties"])
    return None


def _describe(root: dict[str, Any], node: dict[str, Any]) -> str:
    """What a value must be: the schema's description, and the names where it is a list."""
    node = _resolve(root, node)
    branches = [_resolve(root, b) for b in node.get("anyOf", [])]
    names = next((b["enum"] for b in [node, *branches] if "enum" in b), None)
    text = next(b["description"] for b in [node, *branches] if "description" in b)
    if names:
        return f"one of {', '.join(map(str, names))} ({text})"
    return text
