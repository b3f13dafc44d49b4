"""Every figure the suite draws is readable: each figure function, drawn on a small table shaped
like the default run's (tests/figure_tables.py), saves a figure in which no tick labels
collide, no legend covers data or text, and every text stays inside the figure - the rules of
tests/figure_layout.py, checked in the state the figure is saved in. First, the checker itself
must flag deliberately bad figures and pass a clean one.

A figure registered later (a claim module's FigureSpec, feather/claims) is checked here as soon as a
default experiment names it; its table comes from the experiment's own runs.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from figure_layout import SavedFigure, assert_readable, checked_saves, layout_problems
from figure_tables import (
    default_experiments,
    engine_rl_reports,
    kernel_document,
    meta,
    overhead_inputs,
    rl_reports,
    summary_table,
)
from matplotlib.ticker import NullFormatter

from feather.atomic import atomic_target
from feather.bench import kernel_figure
from feather.claims import figures as declared_figures
from feather.claims.rl import draw_rl_policies
from feather.claims.rl_engine import draw_rl_engine
from feather.overhead import figures as overhead_figures

# every figure drawn from the summary table (the learners' figures: from their loaded reports)
FROM_REPORTS = {"rl_policies": (draw_rl_policies, rl_reports),
                "rl_engine": (draw_rl_engine, engine_rl_reports)}
FIGURES = {name: FROM_REPORTS[name][0] if name in FROM_REPORTS else spec.draw
           for name, spec in declared_figures().items() if spec.draw is not None}

PACKAGE = Path(__file__).resolve().parents[1] / "feather"


def kinds(fig: plt.Figure) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for problem in layout_problems(fig):
        found.setdefault(problem.kind, []).append(problem.what)
    plt.close(fig)
    return found


def only_save(draw: Callable[[Path], Any], tmp_path: Path) -> SavedFigure:
    with checked_saves() as saved:
        draw(tmp_path / "figure.png")
    assert len(saved) == 1, [s.path for s in saved]
    return saved[0]


def readable(saved: SavedFigure, name: str) -> None:
    assert not saved.problems, f"{name} is not readable:\n  " + "\n  ".join(
        map(str, saved.problems)
    )


# ---- the checker ---------------------------------------------------------------------------


def test_the_checker_flags_minor_log_labels_colliding() -> None:
    """C1's axis as it was: batch sizes 25-800 on matplotlib's default log labels."""
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    sizes = [25, 50, 100, 200, 400, 800]
    ax.plot(sizes, [1, 2, 3, 4, 5, 6], marker="o")
    ax.set_xscale("log")
    found = kinds(fig)
    assert set(found) == {"ticks"}, found
    assert any("'3x10^1' overlaps" in w and "'4x10^1'" in w for w in found["ticks"]), found


def test_the_checker_flags_long_labels_colliding_on_one_axis() -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(range(5), [1, 2, 3, 4, 5])
    ax.set_xticks(range(5), [f"a long category name {i}" for i in range(5)])
    fig.tight_layout()
    found = kinds(fig)["ticks"]
    for i in range(4):  # each label against its neighbour (and more)
        assert any(f"name {i}' overlaps" in w and f"name {i + 1}'" in w for w in found), found


def test_the_checker_flags_a_legend_on_the_bars() -> None:
    """rl_policies as it was: a legend of long entries over the held-out bars."""
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.bar([0, 1], [1.0, 1.05], label="groups=8,per_group=100,prefix=4000,suffix=100")
    ax.axhline(1.0, color="grey", ls="--")
    ax.legend(loc="upper center")
    fig.tight_layout()
    found = kinds(fig)
    assert set(found) == {"legend-data"}, found
    assert "rectangle" in found["legend-data"][0]


def test_the_checker_flags_a_line_or_markers_under_a_legend() -> None:
    # a segment crossing the legend with both its vertices outside it
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot([0, 10], [0, 10], label="diagonal")
    ax.legend(loc="center")
    assert "line 'diagonal'" in kinds(fig)["legend-data"][0]
    # markers only (no line between them): the one in the middle is under the legend
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot([0, 5, 10], [0, 5, 10], ls="none", marker="o", label="points")
    ax.legend(loc="center")
    assert "line 'points'" in kinds(fig)["legend-data"][0]
    # scatter markers and error bars count too
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter([0, 5, 10], [0, 5, 10], label="scatter")
    ax.errorbar([0, 10], [10, 0], yerr=1, ls="none", label="bars")
    ax.legend(loc="center")
    assert "PathCollection 'scatter'" in kinds(fig)["legend-data"][0]


def test_the_checker_flags_a_legend_reaching_into_the_next_axes() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax in axes:
        ax.bar([0, 1, 2], [3, 3, 3], label="a bar label long enough to reach across")
        ax.set_ylabel("throughput")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.02, 1))  # beside, but no room made
    found = kinds(fig)
    assert any("axes 0 legend covers axes 1" in w for w in found["legend-data"]), found
    assert any("axes 1 y tick label" in w and "axes 0 legend" in w for w in found["text"]), found


def test_the_checker_flags_titles_across_subplots_and_text_outside() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    for ax in axes:
        ax.set_title("a title much too long for half of a six-inch figure")
    fig.suptitle("a figure title that is longer than the whole figure is wide: " * 2)
    found = kinds(fig)
    assert any("axes 0" in w and "axes 1" in w and "title" in w for w in found["text"]), found
    assert any("figure text" in w for w in found["outside"]), found


def test_the_checker_passes_a_clean_figure() -> None:
    """The fixes' patterns: legend beside, sweep points on the log axis, rotated labels that
    are apart although their axis-aligned boxes overlap, a reference line under the legend."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    sizes = [25, 50, 100, 200, 400, 800]
    axes[0].plot(sizes, sizes, marker="o", label="homogeneous")
    axes[0].set_xscale("log")
    axes[0].set_xticks(sizes, [str(s) for s in sizes])
    axes[0].xaxis.set_minor_formatter(NullFormatter())
    axes[0].axhline(400, color="grey", ls="--")
    axes[0].legend(loc="upper left")  # the line passes below it, the axhline through it
    names = [f"feather-static + kernel {i}" for i in range(6)]
    axes[1].bar(names, range(1, 7), label="throughput")
    axes[1].tick_params(axis="x", rotation=30)
    axes[1].legend(title="setup", loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("clean")
    fig.tight_layout()
    assert_readable(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in axes[1].get_xticklabels()]
    assert any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
    plt.close(fig)


def test_checked_saves_checks_each_figure_as_it_is_saved(tmp_path: Path) -> None:
    def draw(path: Path) -> None:
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.bar([0, 1], [1, 1], label="bars")
        ax.legend(loc="center")
        with atomic_target(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)

    saved = only_save(draw, tmp_path)
    assert [p.kind for p in saved.problems] == ["legend-data"]
    assert (tmp_path / "figure.png").stat().st_size > 0  # and the figure is still saved


# ---- the figures ---------------------------------------------------------------------------


@pytest.fixture(
    scope="module",
    params=[{}, {"hardware": ["a100-80gb"]}, {"engine_runs": {"sweep": "full"}}],
    # a panel per profile: 2 or 1; the full sweep's real-engine runs (C2's and C7's backends)
    ids=["default config", "one hardware profile", "full engine sweep"],
)
def experiments(request):
    return default_experiments(**request.param)


@pytest.fixture(scope="module")
def table(experiments):
    return summary_table(experiments)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_pipeline_figure_is_readable(name: str, experiments, table, tmp_path: Path) -> None:
    experiment = next((e for e in experiments.values() if name in e.figures), None)
    assert experiment is not None, f"no default experiment draws {name}"
    data = FROM_REPORTS[name][1](experiment) if name in FROM_REPORTS else table
    readable(only_save(lambda out: FIGURES[name](data, out, meta(experiment)), tmp_path), name)


OVERHEAD = {
    "overhead_vs_prefix": lambda inputs, out: overhead_figures.vs_prefix(inputs[0], out),
    "overhead_vs_waiting": lambda inputs, out: overhead_figures.vs_waiting(inputs[0], out),
    "overhead_speedup": lambda inputs, out: overhead_figures.speedup(inputs[1], out),
    "overhead_fraction": lambda inputs, out: overhead_figures.fraction(inputs[2], out),
}


@pytest.fixture(scope="module")
def overhead():
    return overhead_inputs("default")


def test_every_overhead_figure_is_checked() -> None:
    assert set(OVERHEAD) == set(overhead_figures.FIGURES)


@pytest.mark.parametrize("name", sorted(OVERHEAD))
def test_overhead_figure_is_readable(name: str, overhead, tmp_path: Path) -> None:
    readable(only_save(lambda out: OVERHEAD[name](overhead, out), tmp_path), name)


def test_kernel_figure_is_readable(tmp_path: Path) -> None:
    """This CPU's results and, beside them, a GPU's (torch and Triton) as gpu/kernels.sh
    makes them: three sources in every panel."""
    documents = [
        kernel_document("cpu", "Intel(R) Xeon(R) Processor, torch threads: 1", ["torch"]),
        kernel_document("cuda", "NVIDIA H200", ["torch", "triton"]),
    ]
    readable(only_save(lambda out: kernel_figure.draw(documents, out), tmp_path), "kernels")


@pytest.mark.parametrize("workloads", [1, 3], ids=["default sweep", "full sweep"])
def test_fidelity_figure_is_readable(workloads: int, tmp_path: Path) -> None:
    """One workload (the default) or three (the full fidelity sweep), four schedulers, both
    metrics."""
    import json

    from feather.pipeline.fidelity import draw_fidelity

    rows = []
    shapes = (("leval_slice", 64), ("leval_slice_tight", 36), ("leval_4k_8k_shuffled", 80))
    for w, (workload, blocks) in enumerate(shapes[:workloads]):
        for metric in ("engine_cpu", "wall"):
            for s, scheduler in enumerate(("fcfs", "lpm", "dfs-weight", "feather-static")):
                ratio = 1.0 if scheduler == "fcfs" else 1.5 + 0.8 * s + 0.3 * w
                rows.append({"experiment": "vllm", "workload": workload, "metric": metric,
                             "scheduler": scheduler, "real_ratio_median": ratio,
                             "real_ratio_min": ratio * 0.9, "real_ratio_max": ratio * 1.1,
                             "sim_ratio": ratio * 1.07, "num_blocks": blocks})
    totals = {m: {"within_tolerance": 10, "ratios": 12, "agreeing_pairs": 14, "resolved_pairs": 16}
              for m in ("engine_cpu", "wall")}
    doc = tmp_path / "fidelity.json"
    doc.write_text(json.dumps({"rows": rows, "totals": totals,
                               "definitions": {"tolerance": 0.15}}))
    readable(only_save(lambda out: draw_fidelity(doc, out), tmp_path), "fidelity")


@pytest.mark.parametrize("datasets", [1, 2])
def test_online_figure_is_readable(datasets: int, tmp_path: Path) -> None:
    """The default sweep (one dataset, fcfs + feather-static, two fractions) and the full
    one's shape (two datasets, four schedulers, three fractions)."""
    from test_online_pipeline import online_document

    from feather.pipeline.online_figure import draw_online

    schedulers = ("fcfs", "feather-static") if datasets == 1 else (
        "fcfs", "lpm", "dfs-weight", "feather-static")
    fractions = (0.5, 0.9) if datasets == 1 else (0.3, 0.6, 0.9)
    paths = []
    for d, dataset in enumerate(("leval_online", "prefix-repetition-4x2048+64-out16")[:datasets]):
        path = tmp_path / f"online{d}.json"
        path.write_text(online_document(dataset, schedulers, fractions))
        paths.append(path)
    readable(only_save(lambda out: draw_online(paths, out), tmp_path), "online_latency")


def test_every_module_that_saves_a_figure_is_checked_here() -> None:
    """A new module drawing figures needs its test above (then add it to this list)."""
    saving = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        if any(
            isinstance(node, ast.Attribute) and node.attr == "savefig"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert saving == {
        "feather/claims/plot.py",
        "feather/overhead/figures.py",
        "feather/bench/kernel_figure.py",
    }


def test_every_figure_an_experiment_names_is_registered() -> None:
    """An experiment file naming a figure no function draws fails here, not after an hour of
    simulation in the pipeline's last rule."""
    import yaml

    # fidelity and online_latency: their own rules draw them
    drawn = set(FIGURES) | set(OVERHEAD) | {"fidelity", "online_latency"}
    tests = Path(__file__).resolve().parent
    for path in [*(PACKAGE.parent / "experiments").glob("*.yaml"),
                 *(tests / "fixtures" / "tiny_experiments").glob("*.yaml")]:
        spec = yaml.safe_load(path.read_text())
        named = spec.get("figure", spec.get("figures"))
        names = [named] if isinstance(named, str) else list(named or [])
        assert names, f"{path} names no figure"
        missing = sorted(set(names) - drawn)
        assert not missing, f"{path.name} names figures nothing draws: {missing}"


@pytest.mark.parametrize("name", ["c5_end_to_end", "c5_time_split"])
def test_the_full_sweeps_c5_figures_are_readable(name: str, tmp_path: Path) -> None:
    """`c5: {sweep: full}` draws a panel per workload family x model x GPU: a figure a dozen
    rows tall, whose title tight_layout alone laid over the first row."""
    experiments = default_experiments(c5={"sweep": "full"})
    data = summary_table(experiments)
    assert data[data.experiment == "c5"].workload.nunique() > 10  # buckets, LongBench-format
    readable(only_save(lambda out: FIGURES[name](data, out, meta(experiments["c5"])), tmp_path),
             name)
