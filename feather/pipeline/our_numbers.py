"""`figures/ours.md`: the headline numbers of each experiment, from this run's results.

figures/README.md states each figure's claim and the paper's number; this file, rewritten by
every pipeline run, gives ours beside them: one row per experiment, its numbers from its
claim module's `headline` (feather/claims).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from feather.atomic import write_text_atomic
from feather.claims import for_experiment
from feather.pipeline.verdicts import evidence_from


def write_ours(
    table_path: str | Path,
    reports: Iterable[str | Path],
    out: str | Path,
    experiments: dict[str, Any],
    sections: Iterable[str | Path] = (),
    fidelity_path: str | Path | None = None,
) -> None:
    """The table of claims vs our numbers; `sections` (markdown files of experiments with
    their own rules, e.g. the overhead report, whose folder holds its tables) are appended as
    they are."""
    sections = list(sections)
    overhead_dir = Path(sections[0]).parent if sections else None
    evidence = evidence_from(table_path, overhead_dir, fidelity_path=fidelity_path,
                             rl_reports=reports)
    rows = ["| figure | claim | paper | ours (this run) |", "|---|---|---|---|"]
    for exp in experiments.values():
        claim = for_experiment(exp.name)
        if claim is None:
            raise ValueError(f"experiments/{exp.name}.yaml has no claim module in "
                             "feather/claims (add one and its CLAIM to the registry)")
        ours = claim.headline(evidence) if claim.headline else ["no headline numbers"]
        rows.append(
            f"| {', '.join(exp.figures)} | {exp.claim} | {exp.paper} | {'<br>'.join(ours)} |"
        )
    table = evidence.table
    revision = table["git_revision"].dropna().unique()
    text = (
        "# Our numbers, from the last pipeline run\n\n"
        "Claim by claim, with a verdict and the rules that give it: `figures/verdicts.md`.\n\n"
        f"Git revision(s): {', '.join(map(str, revision)) or 'unknown'}. Produced by: "
        f"{'; '.join(sorted(table['produced_by'].dropna().unique()))}.\n\n" + "\n".join(rows) + "\n"
    )
    for section in sections:
        text += "\n" + Path(section).read_text()
    write_text_atomic(out, text)
