"""The `feather` command line: the CHT benchmark's output and argument errors."""

from __future__ import annotations

import json

from feather.cli import main


def test_bench_cht_json_reports_rows_that_agree_with_brute_force(capsys) -> None:
    code = main(
        [
            "bench",
            "cht",
            "--json",
            "--quiet",
            "--sizes",
            "150,300",
            "--groups",
            "5",
            "--prefix-tokens",
            "390",
            "--suffix-tokens",
            "10",
            "--batch-size",
            "10",
            "--brute-budget-s",
            "60",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["benchmark"] == "cht"
    assert [row["waiting"] for row in out["rows"]] == [150, 300]
    for row in out["rows"]:
        assert row["brute_agrees"] is True
        assert row["brute_decisions"] == row["waiting"]  # the budget covered the whole cycle
        assert row["cht_us_per_admit"] > 0 and row["insert_us"] > 0
    assert out["protocol"]["chunk_size"] == 16
    assert out["provenance"]["config"]["sizes"] == [150, 300]


def test_schedulers_lists_the_registry(capsys) -> None:
    assert main(["schedulers", "--json"]) == 0
    names = [row["name"] for row in json.loads(capsys.readouterr().out)]
    assert "feather-qlearn" in names and "lpm" in names


def test_bad_arguments_exit_with_status_2(capsys) -> None:
    assert main(["bench", "cht", "--sizes", "ten"]) == 2
    assert "sizes must be integers" in capsys.readouterr().err
    assert main(["bench", "cht", "--chunk-size", "0"]) == 2
