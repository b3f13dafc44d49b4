"""The claims' registry (feather/claims): every module there is a row, every experiment file
has its module, and every figure an experiment names is declared by that module - so adding a
claim is an experiment file and a module, and forgetting either fails here, not at the end of
a pipeline run."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import feather.claims as claims
from feather.pipeline.experiments import experiment_files, load_experiment

REPO = Path(__file__).resolve().parents[1]


def test_every_claim_module_is_in_the_registry_in_page_order() -> None:
    modules = {p.stem for p in (REPO / "feather" / "claims").glob("*.py")} - {
        "__init__", "base", "data", "plot"}
    from_modules = {c.figures[0].draw.__module__.rsplit(".", 1)[-1] for c in claims.CLAIMS
                    if c.figures and c.figures[0].draw is not None}
    assert from_modules <= modules
    assert len(claims.CLAIMS) >= len(modules)  # overhead.py declares three rows
    ranks = [c.rank for c in claims.CLAIMS]
    assert ranks == sorted(ranks)
    assert [c.key for c in claims.CLAIMS if c.verdict][:7] == [f"C{i}" for i in range(1, 8)]


def test_every_experiment_has_a_module_declaring_each_figure_it_names() -> None:
    for path in experiment_files(REPO / "experiments"):
        experiment = load_experiment(path)
        claim = claims.for_experiment(experiment.name)
        assert claim is not None, f"{path.name} has no claim module in feather/claims"
        declared = {f.name for f in claim.figures}
        assert set(experiment.figures) <= declared, (path.name, experiment.figures, declared)


def test_a_module_without_a_claim_is_refused(monkeypatch) -> None:
    fake = types.SimpleNamespace(name="stray")
    monkeypatch.setattr(claims.pkgutil, "iter_modules", lambda path: [fake])
    monkeypatch.setattr(claims.importlib, "import_module",
                        lambda name: types.ModuleType(name))
    with pytest.raises(TypeError, match=r"stray\.py declares no CLAIM"):
        claims._discover()


def test_two_modules_with_one_key_are_refused(monkeypatch) -> None:
    names = [types.SimpleNamespace(name="a"), types.SimpleNamespace(name="b")]
    module = types.ModuleType("m")
    module.CLAIM = claims.CLAIMS[0]
    monkeypatch.setattr(claims.pkgutil, "iter_modules", lambda path: names)
    monkeypatch.setattr(claims.importlib, "import_module", lambda name: module)
    with pytest.raises(ValueError, match="same key"):
        claims._discover()


def test_a_figure_without_a_drawer_says_which_rule_draws_it(tmp_path) -> None:
    with pytest.raises(ValueError, match="drawn by the online rule"):
        claims.draw("online_latency", None, tmp_path / "x.png", {})
