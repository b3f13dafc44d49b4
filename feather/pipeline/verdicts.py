"""`figures/verdicts.md`: claim by claim, the paper's number, what each source measured and a
verdict - written from this run's results by the rules stated on the page, never by hand.

The rows are the claims of feather/claims with a verdict, in the registry's order; each is
graded on every source that ran, and the headline is the most real source's grade.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from feather.atomic import write_json_atomic, write_text_atomic
from feather.claims import CLAIMS, load_reports
from feather.claims.base import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOISE,
    NOT_REPRODUCED,
    PAPER_GPUS,
    PARTLY,
    REPRODUCED,
    SOURCES,
    UNTESTABLE,
    Evidence,
    Verdict,
)
from feather.claims.c5 import SCALE as C5_SCALE
from feather.claims.overhead import C3_SCALE, C4_SCALE, FEATHER_SHARE
from feather.claims.stop import STOP_PAYS, STOP_REPEATS
from feather.pipeline.job_status import describe, failures

DEFINITIONS = f"""\
Each claim is graded separately on every source that ran, most real first: {", ".join(SOURCES)}.
The **verdict** is the most real source's grade; where sources disagree the row says so. A
simulator's grade is a prediction for the hardware it models, not a measurement.

The grade (one rule for every claim and source, applied to the claim's own measure):
- **{REPRODUCED}**: the paper's sign and at least half its effect, in a regime the paper's
  setup plausibly had: one prefix's requests not already arriving together (not `grouped`),
  the KV pool the device's memory leaves (not a swept, hypothetical pool) and, for the
  simulator's GPU profiles, the paper's GPUs ({", ".join(PAPER_GPUS)}). The line names the
  regime. Claims of "no worse" (C6), "matches" (C7) and "below 1%" (C4's second part) must
  hold in every plausible regime measured.
- **{PARTLY}**: the paper's sign, beyond noise ({NOISE:.0%}), but less than half its effect;
  or only part of the claim (C4: one of its two parts; C5: against some of its baselines).
- **{NOT_REPRODUCED}**: no effect (within {NOISE:.0%}) or the opposite sign.
- **{UNTESTABLE}**: no source produced data for it in a plausible regime (the reason is given).

A real source (a GPU, an engine, real code, a kernel) is measured under one protocol
(`feather/measuring`): the arms compared run interleaved within each repeat, their order
rotated from repeat to repeat; each repeat records what else ran on the machine (other
processes' CPU time and our threads' wait for a core, from /proc) and a reference probe
before and after, and a repeat taken on a busy machine is taken again (at most twice). Its
line shows each ratio as **median [interval] (n)**: ratios paired within a repeat where the
arms shared an engine start (else the ratio of medians with a wider, unpaired interval), the
interval distribution-free (order statistics; its coverage shown where n is too small for
95%). It is graded from the interval: **{REPRODUCED}** (or **{HOLDS}**) only where the
interval's lower end clears the bar, **{NOT_REPRODUCED}** (or **{DOES_NOT_HOLD}**) only where
the interval excludes the effect, otherwise **{INCONCLUSIVE} (interval a-b spans the bar)**.
Repeats that stayed disturbed are left out of the interval and the line says **unstable:
another process used N% of a core during k of n repeats**. The simulator is deterministic (a
rerun with the same seed gives the same numbers): its sources keep point grades.

Half the paper's effect, per claim: C1 homogeneous / mixed throughput {1.5}x (paper ~2x); C2
one divergent request leaves 0.67 of the throughput (a 1.5x cut; paper ~2x); C3 radix-tree
detection {C3_SCALE.half:.0%} of step latency (paper 50-90%); C4 CHT speedup
{C4_SCALE.half:.0f}x (paper up to 1000x) and Feather's share below {FEATHER_SHARE:.0%} of a
step; C5 best Feather policy {C5_SCALE.half}x each baseline (paper 2-10x); C6 worst Feather
policy >= 0.99x FCFS (0.95-0.99: partly); C7 feather-static + a plain kernel >= 0.95x FCFS +
the PAT-style kernel (0.75-0.95: partly). The STOP row is the paper's mechanism: it **holds**
where a rule that stops a batch (feather-static, feather-reference) has a median throughput
at least {STOP_PAYS}x both FCFS's and Feather without STOP's, same workload and attention,
over at least {STOP_REPEATS} interleaved repeats. The online row is not a claim of the paper:
it **holds** when every Feather policy's TTFT tail is within 1.1x of FCFS's at every load
below saturation, served over HTTP - paired per repeat at p99, or where a repeat has too few
requests for a p99 of its own (fewer than 300), at the highest percentile with at least 3
requests above it (p90 for 36).
"""


def verdicts(evidence: Evidence) -> list[Verdict]:
    return [claim.verdict(evidence) for claim in CLAIMS if claim.verdict is not None]


def with_failures(rows: Iterable[Verdict], failed: Iterable[dict[str, Any]]) -> list[Verdict]:
    """Each claim's row names the jobs of that claim that failed on this machine: what its
    verdict could not see. A failure's `claim` is its experiment's ("C5", "STOP", ...), or
    several ("C1 C2 C7": the kernel bench)."""
    failed = list(failed)
    out = []
    for row in rows:
        key = row.claim.split()[0]
        mine = [f for f in failed if key in str(f.get("claim", "")).split()]
        if mine:
            row = replace(row, notes=row.notes + tuple(
                f"not testable here: {describe(f)}" for f in mine))
        out.append(row)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def row_markdown(v: Verdict) -> str:
    sources = "<br>".join(_cell(g.line()) for g in v.grades) or "no source ran"
    if v.notes:
        sources += "<br>" + "<br>".join(_cell(n) for n in v.notes)
    verdict = f"**{v.headline}**" + (f" ({v.graded_by})" if v.graded_by else "")
    mechanism = "; ".join(x for x in (v.disagreement(), v.mechanism) if x)
    return "| " + " | ".join((_cell(v.claim), _cell(v.paper), verdict, sources,
                              _cell(mechanism))) + " |"


def markdown(
    rows: Iterable[Verdict],
    revision: str,
    failed: Iterable[dict[str, Any]] = (),
    not_planned: Iterable[str] = (),
) -> str:
    lines = [
        "# Verdicts: the paper's claims against this run's results",
        "",
        f"Written by the pipeline from `results/` (git revision {revision}); never edited by "
        "hand. Figures: `figures/README.md`; every number: `figures/ours.md`, "
        "`results/summary.csv`.",
        "",
        DEFINITIONS,
        "| claim | paper | verdict (source) | each source: what it measured - its grade | "
        "mechanism |",
        "|---|---|---|---|---|",
    ]
    lines += [row_markdown(v) for v in rows]
    failed, not_planned = list(failed), list(not_planned)
    if failed or not_planned:
        lines += ["", "## What this run did not measure", ""]
        lines += [f"- {describe(f)}" for f in failed]
        lines += [f"- not planned: {reason}" for reason in not_planned]
    return "\n".join(lines) + "\n"


def evidence_from(
    table_path: str | Path,
    overhead_dir: str | Path | None = None,
    kernel_files: Iterable[str | Path] = (),
    fidelity_path: str | Path | None = None,
    online_files: Iterable[str | Path] = (),
    rl_reports: Iterable[str | Path] = (),
) -> Evidence:
    """What a pipeline run produced, read once for the verdicts and our numbers."""
    fidelity = (pd.read_csv(fidelity_path)
                if fidelity_path and Path(fidelity_path).is_file() else None)
    return Evidence(pd.read_parquet(table_path), Path(overhead_dir) if overhead_dir else None,
                    tuple(Path(p) for p in kernel_files), fidelity,
                    tuple(Path(p) for p in online_files), load_reports(rl_reports))


VERDICTS_FORMAT = "feather-verdicts/1"


def verdicts_document(rows: Iterable[Verdict], revision: str) -> dict[str, Any]:
    """The page's rows as data (`results/verdicts.json`): what `feather verdicts diff`
    compares between two runs."""
    return {"format": VERDICTS_FORMAT, "git_revision": revision, "rows": [
        {"claim": v.claim, "verdict": v.headline, "graded_by": v.graded_by,
         "grades": [g.to_json() for g in v.grades], "notes": list(v.notes)} for v in rows]}


def write_verdicts(
    table_path: str | Path,
    out: str | Path,
    overhead_dir: str | Path | None = None,
    kernel_files: Iterable[str | Path] = (),
    fidelity_path: str | Path | None = None,
    online_files: Iterable[str | Path] = (),
    not_planned: Iterable[str] = (),
    guarded: Iterable[str | Path] = (),
    rl_reports: Iterable[str | Path] = (),
    json_out: str | Path | None = None,
) -> list[Verdict]:
    """not_planned: what the configuration asked for and this run did not plan, with why;
    guarded: the outputs where a job that failed on this machine left its record
    (feather/pipeline/job_status.py); json_out: the rows as data as well."""
    evidence = evidence_from(table_path, overhead_dir, kernel_files, fidelity_path,
                             online_files, rl_reports)
    failed_jobs = failures(guarded)
    rows = with_failures(verdicts(evidence), failed_jobs)
    revision = ", ".join(map(str, evidence.table["git_revision"].dropna().unique())) or "unknown"
    write_text_atomic(out, markdown(rows, revision, failed_jobs, not_planned))
    if json_out is not None:
        write_json_atomic(json_out, verdicts_document(rows, revision))
    return rows
