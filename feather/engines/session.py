"""One interface for a real engine's runs, so that `feather run` drives vLLM and SGLang with
one loop: an engine opens sessions, each serving some of the runs (vLLM: one engine start for
every scheduler and repeat; SGLang: one start per scheduler, its policy being a launch
option), and a session turns a run into a result that writes its own run directory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from feather.engines.runs import EngineRun
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome


class RunOutput(Protocol):
    """One finished run: its summary, and how to write its run directory."""

    summary: dict[str, Any]

    def write(self, out_dir: str | Path) -> Path: ...


class EngineSession(Protocol):
    """A started engine: `run()` as often as needed, then `close()`."""

    def run(self, run: EngineRun, workload: Any) -> RunOutput: ...

    def close(self) -> None: ...


# sessions in the order they are to run, each with the runs it serves; started lazily (an
# iterator) so that one engine is closed before the next starts
SessionGroups = Iterable[tuple[EngineSession, list[EngineRun]]]


def run_dir(out: str | Path, run_prefix: str, run: EngineRun, single: bool) -> Path:
    """Where a run's directory goes: `out` itself for a lone run without a prefix, else
    `out/<prefix><label>__r<repeat>` (the names the pipeline's engine jobs expect)."""
    if single and not run_prefix:
        return Path(out)
    return Path(out) / f"{run_prefix}{run.scheduler}__r{run.repeat}"


def run_all(
    groups: SessionGroups,
    workload: Any,
    *,
    out: str | Path,
    run_prefix: str,
    total: int,
    say: Callable[[str], None],
    protocol: Callable[[str], MeasuringProtocol] | None = None,
) -> list[tuple[EngineRun, dict[str, Any], Path]]:
    """Every run of every session under the measurement protocol (feather/measuring): a
    session's schedulers are the arms, interleaved within each repeat and rotated from repeat
    to repeat, each repeat watched and taken again where the machine was busy; each run is
    written as soon as its repeat is kept, with the protocol's record in its summary's
    `measurement`. Each session is closed after its runs, also when one fails. Returns
    (run, summary, directory) in the order the runs were kept. `protocol(job)` makes the
    protocol (tests give one with fixed probes)."""
    make = protocol or (lambda job: MeasuringProtocol(
        job, label=lambda run: run.scheduler, describe=raw_numbers, say=say))
    finished: list[tuple[EngineRun, dict[str, Any], Path]] = []
    job = f"{Path(out)}/{run_prefix}"
    for session, runs in groups:
        arms = list({run.scheduler: run for run in runs}.values())
        repeats = {arm.scheduler: sorted(r.repeat for r in runs if r.scheduler == arm.scheduler)
                   for arm in arms}
        first, count = min(r[0] for r in repeats.values()), max(len(r) for r in repeats.values())
        if any(r != list(range(first, first + count)) for r in repeats.values()):
            raise ValueError(f"{job}: every scheduler must run the same repeats, got {repeats}")

        def measure(arm: EngineRun, repeat: int, session: EngineSession = session) -> RunOutput:
            return session.run(replace(arm, repeat=repeat), workload)

        def keep(outcome: RepeatOutcome[EngineRun, RunOutput]) -> None:
            for arm, result, record in zip(outcome.order, outcome.values, outcome.records,
                                           strict=True):
                run = replace(arm, repeat=outcome.repeat)
                target = run_dir(out, run_prefix, run, single=total == 1)
                result.summary["measurement"] = record
                result.write(target)
                finished.append((run, result.summary, target))
                summary = result.summary
                say(
                    f"run {len(finished)}/{total}: {run.scheduler} r{run.repeat}: "
                    f"{summary['output_tok_s']:,.1f} output tok/s, prefix-cache hit "
                    f"{summary.get('prefix_cache_hit_rate', float('nan')):.2f}"
                    + (f" (disturbed: {record['disturbed']})" if record["disturbed"] else "")
                    + f" -> {target}"
                )

        try:
            make(job).run(arms, count, measure, keep, first_repeat=first)
        finally:
            session.close()
    return finished


def raw_numbers(result: RunOutput) -> dict[str, Any]:
    """What a discarded attempt keeps of its run: the numbers the claims compare."""
    return {key: result.summary.get(key)
            for key in ("output_tok_s", "decode_only_tok_s", "makespan_s", "wall_s")}
