"""One interface for a real engine's runs, so that `feather run` drives vLLM and SGLang with
one loop: an engine opens sessions, each serving some of the runs (vLLM: one engine start for
every scheduler and repeat; SGLang: one start per scheduler, its policy being a launch
option), and a session turns a run into a result that writes its own run directory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from feather.engines.runs import EngineRun


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
) -> list[tuple[EngineRun, dict[str, Any], Path]]:
    """Every run of every session, each written as soon as it ends; each session closed
    after its runs, also when one fails. Returns (run, summary, directory) in run order."""
    finished: list[tuple[EngineRun, dict[str, Any], Path]] = []
    for session, runs in groups:
        try:
            for run in runs:
                target = run_dir(out, run_prefix, run, single=total == 1)
                result = session.run(run, workload)
                result.write(target)
                finished.append((run, result.summary, target))
                summary = result.summary
                say(
                    f"run {len(finished)}/{total}: {run.scheduler} r{run.repeat}: "
                    f"{summary['output_tok_s']:,.1f} output tok/s, prefix-cache hit "
                    f"{summary.get('prefix_cache_hit_rate', float('nan')):.2f} -> {target}"
                )
        finally:
            session.close()
    return finished
