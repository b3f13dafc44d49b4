"""`feather verdicts diff`: what changed between two runs' verdicts (`results/verdicts.json`),
so a rerun on another day, machine or revision is read for what it changed - a verdict or a
source's grade, a measure that moved beyond the other run's interval, a flag - instead of
comparing two verdict pages by eye.

Rows are matched by claim, a source's grade by (claim, source, where), a measure by that and
its name; where one run repeats a key, its k-th occurrence is matched with the other's k-th.
A real source's measures carry intervals over repeats: a median of one run outside the other
run's interval is a change the repeats can see (a median inside it is noise, not listed). A
simulator's are points and deterministic: any change beyond RELATIVE means the code or the
configuration differed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from feather.claims.base import Measure
from feather.measuring.stats import CONFIDENCE, Interval
from feather.pipeline.verdicts import VERDICTS_FORMAT

DIFF_FORMAT = "feather-verdicts-diff/1"
FILE_NAME = "verdicts.json"
# a simulator's point value that moved by more than this fraction of itself has changed
RELATIVE = 1e-9

# the headings findings are grouped under, in the order they are printed
GRADES, MEASURES, FLAGS = "verdicts and grades", "measures", "flags"
SECTIONS = (GRADES, MEASURES, FLAGS)
# what a finding is about, for the counts line (a verdict: a claim's row; a grade: a source's)
KINDS = ("verdict", "grade", "measure", "flag")

T = TypeVar("T")


@dataclass(frozen=True)
class Finding:
    """One difference: its heading, what it is about (KINDS), where, what each run had (`a`,
    `b`: the documents' own values, None where a run has none) and the line that says it."""

    section: str
    kind: str
    text: str
    claim: str
    source: str | None = None
    where: str | None = None
    measure: str | None = None
    a: Any = None
    b: Any = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Diff:
    """The findings in print order, and how much was matched in both runs (so "no
    differences" can be told from "nothing compared")."""

    findings: tuple[Finding, ...]
    compared: Mapping[str, int]
    revisions: tuple[str, str]

    @property
    def differs(self) -> bool:
        return bool(self.findings)

    def counts(self) -> dict[str, int]:
        return {kind: sum(f.kind == kind for f in self.findings) for kind in KINDS}


# ---- reading: a run's document, checked so a bad one is one line, never a traceback ----


@dataclass(frozen=True)
class _Grade:
    source: str
    where: str
    grade: str
    flag: str | None
    measures: tuple[Measure, ...]


@dataclass(frozen=True)
class _Row:
    claim: str
    verdict: str
    graded_by: str
    grades: tuple[_Grade, ...]


def resolve(path: str | Path) -> Path:
    """A run's verdicts file: the path itself, or <dir>/verdicts.json, or (a checkout or a
    run's root) <dir>/results/verdicts.json."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if not path.is_dir():
        return path
    for candidate in (path / FILE_NAME, path / "results" / FILE_NAME):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{path}: no {FILE_NAME} in this directory or its results/ (a run's "
                     f"pipeline writes results/{FILE_NAME})")


def load(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The resolved file and its document, checked whole (ValueError: what is wrong, where)."""
    file = resolve(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file}: not a text file ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    _parse(data, str(file))
    return file, data


def _parse(data: Any, where: str) -> tuple[str, list[_Row]]:
    """The document's revision and rows; ValueError naming the first thing that is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a {VERDICTS_FORMAT} document (not a JSON object)")
    if data.get("format") != VERDICTS_FORMAT:
        raise ValueError(f"{where}: not a {VERDICTS_FORMAT} document "
                         f"(format: {data.get('format')!r})")
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise ValueError(f"{where}: 'rows' is not a list")
    parsed = [_row(row, f"{where}: row {i + 1}") for i, row in enumerate(rows)]
    return str(data.get("git_revision") or "unknown"), parsed


def _field(data: Mapping[str, Any], key: str, where: str, kinds: tuple[type, ...] = (str,),
           optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        what = " or ".join(k.__name__ for k in kinds)
        found = "missing" if key not in data else "null" if value is None else \
            f"a {type(value).__name__}"
        raise ValueError(f"{where}: {key!r} is {found}, not {what}")
    return value


def _object(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object")
    return data


def _row(data: Any, where: str) -> _Row:
    data = _object(data, where)
    claim = _field(data, "claim", where)
    where = f"{where} ({claim})"
    grades = _field(data, "grades", where, (list,))
    return _Row(claim, _field(data, "verdict", where), _field(data, "graded_by", where,
                                                               optional=True) or "",
                tuple(_grade(g, f"{where}: grade {i + 1}") for i, g in enumerate(grades)))


def _grade(data: Any, where: str) -> _Grade:
    data = _object(data, where)
    measures = _field(data, "measures", where, (list,), optional=True) or []
    return _Grade(_field(data, "source", where), _field(data, "where", where),
                  _field(data, "grade", where), _field(data, "flag", where, optional=True),
                  tuple(_measure(m, f"{where}: measure {i + 1}") for i, m in enumerate(measures)))


def _measure(data: Any, where: str) -> Measure:
    data = _object(data, where)
    name = _field(data, "name", where)
    value = _field(data, "value", f"{where} ({name})", (int, float), optional=True)
    raw = data.get("interval")
    interval = None
    if raw is not None:
        raw = _object(raw, f"{where} ({name}): interval")
        for key in ("median", "low", "high", "coverage"):
            _field(raw, key, f"{where} ({name}): interval", (int, float))
        _field(raw, "n", f"{where} ({name}): interval", (int,))
        interval = Interval.from_json(raw)
    return Measure(name, interval, None if value is None else float(value))


# ---- comparing ----


def _keyed(items: Iterable[T], key: Callable[[T], Any]) -> dict[tuple[Any, int], T]:
    """Items by (key, occurrence): a repeated key's k-th item meets the other run's k-th."""
    out: dict[tuple[Any, int], T] = {}
    seen: dict[Any, int] = {}
    for item in items:
        k = key(item)
        seen[k] = seen.get(k, 0) + 1
        out[(k, seen[k])] = item
    return out


def _union(a: Mapping[T, Any], b: Mapping[T, Any]) -> list[T]:
    """A's keys in A's order, then B's own in B's order: a stable print order."""
    return list(a) + [k for k in b if k not in a]


def _nth(text: str, k: int) -> str:
    return text if k == 1 else f"{text} #{k}"


def interval_text(interval: Interval) -> str:
    """`1.38 [1.35, 1.41] (n=9)`, the coverage shown where it is not the nominal 95% (a
    comma, not Interval.text's dash, between the ends: a negative end stays readable)."""
    shown = "" if interval.coverage >= CONFIDENCE else f", {interval.coverage:.0%} coverage"
    return (f"{interval.median:.4g} [{interval.low:.4g}, {interval.high:.4g}] "
            f"(n={interval.n}{shown})")


def _point_text(value: float) -> str:
    return f"{value:.12g}"


def _measure_text(m: Measure) -> str:
    if m.interval is not None:
        return f"an interval {interval_text(m.interval)}"
    if m.value is not None:
        return f"a point {_point_text(m.value)}"
    return "no value"


def _inside(value: float, interval: Interval) -> bool:
    return interval.low <= value <= interval.high


def points_differ(a: float, b: float, relative: float = RELATIVE) -> bool:
    """A deterministic value changed: beyond `relative` of the larger (NaN equals only NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > relative * max(abs(a), abs(b))


def _compare_measure(label: str, a: Measure, b: Measure, base: dict[str, Any]) -> Finding | None:
    def found(text: str) -> Finding:
        return Finding(MEASURES, "measure", f"{label}: {text}", a=a.to_json(), b=b.to_json(),
                       **base)

    if a.interval is not None and b.interval is not None:
        outside = [f"{x}'s median {m.median:.4g} is outside {y}'s interval"
                   for x, m, y, other in (("A", a.interval, "B", b.interval),
                                          ("B", b.interval, "A", a.interval))
                   if not _inside(m.median, other)]
        if outside:
            return found(" and ".join(outside) + f": A {interval_text(a.interval)}; "
                         f"B {interval_text(b.interval)}")
        return None
    if a.interval is None and b.interval is None:
        if a.value is None and b.value is None:
            return None
        if a.value is not None and b.value is not None:
            if not points_differ(a.value, b.value):
                return None
            change = (f" ({(b.value - a.value) / abs(a.value):+.3g} relative)"
                      if a.value and math.isfinite(a.value) and math.isfinite(b.value) else "")
            return found(f"point {_point_text(a.value)} -> {_point_text(b.value)}{change}")
    return found(f"{_measure_text(a)} in A, {_measure_text(b)} in B")


def _compare_grades(claim: str, a: _Grade | None, b: _Grade | None, k: int) -> list[Finding]:
    grade = a if a is not None else b
    assert grade is not None
    label = f"{claim} / {_nth(f'{grade.source} ({grade.where})', k)}"
    base = {"claim": claim, "source": grade.source, "where": grade.where}
    if a is None or b is None:
        run = "A" if b is None else "B"
        return [Finding(GRADES, "grade", f"{label}: only in {run} (grade: {grade.grade})",
                        a=a.grade if a else None, b=b.grade if b else None, **base)]
    out = []
    if a.grade != b.grade:
        out.append(Finding(GRADES, "grade", f"{label}: grade {a.grade} -> {b.grade}",
                           a=a.grade, b=b.grade, **base))
    measures_a, measures_b = _keyed(a.measures, lambda m: m.name), _keyed(b.measures,
                                                                          lambda m: m.name)
    for key in _union(measures_a, measures_b):
        ma, mb = measures_a.get(key), measures_b.get(key)
        name = _nth(key[0], key[1])
        here = {**base, "measure": key[0]}
        if ma is None or mb is None:
            only = ma or mb
            assert only is not None
            run = "A" if mb is None else "B"
            out.append(Finding(MEASURES, "measure",
                               f"{label} / {name}: only in {run} ({_measure_text(only)})",
                               a=ma.to_json() if ma else None, b=mb.to_json() if mb else None,
                               **here))
            continue
        finding = _compare_measure(f"{label} / {name}", ma, mb, here)
        if finding is not None:
            out.append(finding)
    if a.flag != b.flag:
        if a.flag and b.flag:
            text = f"flag changed: A: {a.flag}; B: {b.flag}"
        else:
            text = f"flag raised in {'A' if a.flag else 'B'} only: {a.flag or b.flag}"
        out.append(Finding(FLAGS, "flag", f"{label}: {text}", a=a.flag, b=b.flag, **base))
    return out


def _headline(row: _Row) -> str:
    return row.verdict + (f" ({row.graded_by})" if row.graded_by else "")


def diff_documents(a: Mapping[str, Any], b: Mapping[str, Any]) -> Diff:
    """Every difference between run A's verdicts document and run B's (verdicts_document's
    shape), grouped by SECTIONS and, within one, in A's order, then B's own."""
    revision_a, rows_a = _parse(a, "A")
    revision_b, rows_b = _parse(b, "B")
    by_a, by_b = _keyed(rows_a, lambda r: r.claim), _keyed(rows_b, lambda r: r.claim)
    findings: list[Finding] = []
    compared = {"claims": 0, "grades": 0, "measures": 0}
    for key in _union(by_a, by_b):
        ra, rb = by_a.get(key), by_b.get(key)
        claim = _nth(key[0], key[1])
        if ra is None or rb is None:
            only = ra or rb
            assert only is not None
            run = "A" if rb is None else "B"
            findings.append(Finding(GRADES, "verdict",
                                    f"{claim}: only in {run} (verdict: {_headline(only)})",
                                    claim=key[0], a=ra.verdict if ra else None,
                                    b=rb.verdict if rb else None))
            continue
        compared["claims"] += 1
        if (ra.verdict, ra.graded_by) != (rb.verdict, rb.graded_by):
            findings.append(Finding(GRADES, "verdict",
                                    f"{claim}: verdict {_headline(ra)} -> {_headline(rb)}",
                                    claim=key[0], a=ra.verdict, b=rb.verdict))
        grades_a = _keyed(ra.grades, lambda g: (g.source, g.where))
        grades_b = _keyed(rb.grades, lambda g: (g.source, g.where))
        for gkey in _union(grades_a, grades_b):
            ga, gb = grades_a.get(gkey), grades_b.get(gkey)
            if ga is not None and gb is not None:
                compared["grades"] += 1
                names_b = _keyed(gb.measures, lambda m: m.name)
                compared["measures"] += sum(
                    k in names_b for k in _keyed(ga.measures, lambda m: m.name))
            findings += _compare_grades(claim, ga, gb, gkey[1])
    ordered = sorted(findings, key=lambda f: SECTIONS.index(f.section))  # stable within one
    return Diff(tuple(ordered), compared, (revision_a, revision_b))


# ---- saying it ----


def counts_line(diff: Diff) -> str:
    """The last line: how many of each difference, and how much was compared."""
    compared = (f"compared {diff.compared['claims']} claims, {diff.compared['grades']} source "
                f"grades, {diff.compared['measures']} measures")
    if not diff.differs:
        return f"no differences ({compared})"
    counts = diff.counts()
    parts = ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in counts.items())
    total = len(diff.findings)
    return f"{total} difference{'' if total == 1 else 's'}: {parts} ({compared})"


def format_text(diff: Diff, name_a: str = "A", name_b: str = "B") -> str:
    """The runs, then one line per finding under its heading (headings with none left out),
    then the counts line."""
    lines = [f"A: {name_a} (git revision {diff.revisions[0]})",
             f"B: {name_b} (git revision {diff.revisions[1]})"]
    for section in SECTIONS:
        mine = [f for f in diff.findings if f.section == section]
        if mine:
            lines += ["", f"{section}:"] + [f"  {f.text}" for f in mine]
    lines += ["", counts_line(diff)]
    return "\n".join(lines) + "\n"


def diff_json(diff: Diff, name_a: str = "A", name_b: str = "B") -> dict[str, Any]:
    """The same findings as data (`feather verdicts diff --json`)."""
    return {"format": DIFF_FORMAT,
            "a": {"path": name_a, "git_revision": diff.revisions[0]},
            "b": {"path": name_b, "git_revision": diff.revisions[1]},
            "differs": diff.differs, "counts": diff.counts(), "compared": dict(diff.compared),
            "findings": [f.to_json() for f in diff.findings]}
