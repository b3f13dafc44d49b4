"""The `feather` command line: the CHT benchmark's output and argument errors."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil

import pytest

import feather.cli
from feather.cli import build_parser, main


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


TRAIN = ["train", "--learner", "feather-ucb", "--train-workload", "synthetic:groups=2",
         "--hardware", "a100-80gb", "--model", "llama-3.1-8b", "--out", "policy.json"]


@pytest.mark.parametrize(
    "flag", ["--max-num-seqs", "--max-num-batched-tokens", "--num-blocks", "--block-size"]
)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_train_refuses_engine_limits_below_one(flag, value, capsys) -> None:
    """train's engine limits are positive_int, as simulate's and run's (it took 0 before)."""
    assert main([*TRAIN, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feather train: argument ") and flag in err and "\n" not in err[:-1]


def _verb_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(feather.cli.__path__) if m.name != "common"
    )


def test_every_verb_module_registers_a_parser_build_parser_reaches(capsys) -> None:
    """Each module under feather/cli adds its verbs through `register`, and build_parser()
    gathers all of them: a verb module left out of build_parser would be unreachable."""
    commands = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    assert {"bench", "calibrate", "run", "schedulers", "simulate", "train", "vllm",
            "workload"} <= set(_verb_modules())
    for name in _verb_modules():
        scratch = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"feather.cli.{name}").register(scratch)
        assert scratch.choices, f"feather.cli.{name}.register added no parser"
        for verb in scratch.choices:
            assert verb in commands.choices, f"{verb} ({name}.py) is not in build_parser()"
            if verb == "vllm":  # vLLM's flags are vLLM's: main() passes them on unparsed
                continue
            subs = [a for a in commands.choices[verb]._actions
                    if isinstance(a, argparse._SubParsersAction)]
            for argv in [[verb]] + [[verb, sub] for a in subs for sub in a.choices]:
                with pytest.raises(SystemExit) as done:
                    build_parser().parse_args([*argv, "--help"])
                assert done.value.code == 0, argv
                assert capsys.readouterr().out.startswith(f"usage: feather {' '.join(argv)}")
