"""The experiment files' schema (workflow/schemas/experiment.schema.yaml): every experiment the
repository ships satisfies it, and its lists of names are the code's own lists, so a kernel,
engine or cost model added in the code is valid in an experiment file without editing the
schema. (What it refuses, and the one line it names the field with: tests/test_bad_input.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from feather.pipeline.experiment_schema import name_lists, schema, violation
from feather.pipeline.experiments import experiment_files

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", experiment_files(REPO / "experiments"), ids=lambda p: p.stem)
def test_every_shipped_experiment_satisfies_the_schema(path: Path) -> None:
    assert violation(yaml.safe_load(path.read_text())) is None


def test_the_schemas_name_lists_are_the_codes() -> None:
    from feather.engine_limits import ENGINE_MODES
    from feather.kernels.plan import KERNELS

    def enums(node, found):
        if isinstance(node, dict):
            assert "enum_from" not in node  # every list was filled in
            if "enum" in node:
                found.append(node["enum"])
            for value in node.values():
                enums(value, found)
        elif isinstance(node, list):
            for value in node:
                enums(value, found)
        return found

    filled = enums(schema(), [])
    lists = name_lists()
    assert lists["kernels"] == list(KERNELS) and lists["engine_modes"] == list(ENGINE_MODES)
    for names in lists.values():
        assert names in filled  # each list is used somewhere in the schema
    text = yaml.safe_load((REPO / "workflow" / "schemas" / "experiment.schema.yaml").read_text())
    assert set(enums_from(text)) == set(lists)


def enums_from(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["enum_from"]] if "enum_from" in node else []
        return own + [n for value in node.values() for n in enums_from(value)]
    if isinstance(node, list):
        return [n for value in node for n in enums_from(value)]
    return []


def test_a_kernel_the_code_adds_is_valid_without_editing_the_schema(monkeypatch) -> None:
    from feather.pipeline import experiment_schema

    lists = {**name_lists(), "kernels": [*name_lists()["kernels"], "flash-decoding"]}
    monkeypatch.setattr(experiment_schema, "name_lists", lambda: lists)
    experiment_schema.schema.cache_clear()
    try:
        data = yaml.safe_load((REPO / "tests/fixtures/tiny_experiments/c6.yaml").read_text())
        data["runs"][0]["kernel"] = "flash-decoding"
        assert experiment_schema.violation(data) is None
    finally:
        monkeypatch.undo()
        experiment_schema.schema.cache_clear()
    assert "kernel must be one of" in experiment_schema.violation(data)
