"""Bad input never ends in a traceback: property tests, one per input surface.

Each test throws malformed and hostile values at one surface and asserts what a user must
see: exit code 2 (the command line) or a stopped workflow parse (config.yaml, experiment
files), exactly one line on stderr naming the input and the field, and no output written.
An unexpected exception escapes `main` and fails the example with its traceback. The CLI is
called in process (`feather.cli.main(argv)`); a few cases run the installed `feather`
script end to end. Examples per surface are set by `max_examples` below (MAX_EXAMPLES).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import subprocess
import sys
import tempfile
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from feather.cli import main
from feather.cli_values import MAX_COUNT, MAX_SEED
from feather.models import ModelProfile
from feather.pipeline import checks
from feather.policies import resolve_scheduler, scheduler_names
from feather.policies.cht_policy import CONSULT
from feather.policies.registry import scheduler_parameters
from feather.sim.hardware import HardwareProfile
from feather.workloads import load_workload, write_workload
from feather.workloads.longbench_synthetic import records as longbench_records
from feather.workloads.longbench_synthetic import write_data_zip
from feather.workloads.schema import sidecar_path

REPO = Path(__file__).resolve().parents[1]
TINY_EXPERIMENTS = REPO / "tests" / "fixtures" / "tiny_experiments"
SYN = "synthetic:groups=2,per_group=3,prefix=32,suffix=4,output=4"
SIM = ["--scheduler", "fcfs", "--hardware", "a100-80gb", "--model", "llama-3.1-8b", "--quiet"]

# Examples per surface (the whole file: ~25 s of CPU, ~90 s wall on a loaded 2-core machine).
MAX_EXAMPLES = {
    "flags": 150,
    "profiles": 100,
    "schedulers": 80,
    "synthetic": 100,
    "workload_files": 50,
    "workload_tables": 100,
    "leval_jsonl": 40,
    "longbench_files": 40,
    "experiments": 120,
    "config": 80,
}


def pick(draw, surface: str, kinds: list[str]) -> str:
    """One kind of bad input, counted (pytest --hypothesis-show-statistics lists the counts)."""
    kind = draw(st.sampled_from(kinds))
    event(f"{surface}: {kind}")
    return kind


def surface(name: str):
    return settings(
        max_examples=MAX_EXAMPLES[name],
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,  # tmp_path: nothing may be written there
        ],
    )


def refused(argv: list[str], out: Path, *names: str) -> str:
    """Run the CLI; assert exit code 2, one line on stderr naming `names`, and nothing new in
    the output's folder (no output, no sidecar, no half-written temporary)."""
    folder = out.parent
    before = sorted(folder.rglob("*")) if folder.exists() else []
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(argv)
    lines = stderr.getvalue().strip().splitlines()
    assert code == 2, (argv, code, stderr.getvalue())
    assert len(lines) == 1, lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    after = sorted(folder.rglob("*")) if folder.exists() else []
    new = [p for p in after if p not in before and not p.is_relative_to(folder / "raw")]
    assert new == [], new  # (raw/: downloads and unpacked archives, inputs of a build)
    return lines[0]


def stopped(call, *names: str) -> str:
    """A workflow parse-time check: it stops with one line naming `names`."""
    with pytest.raises(SystemExit) as stop:
        call()
    message = str(stop.value.code)
    assert isinstance(stop.value.code, str) and "\n" not in message, message
    for name in names:
        assert name in message, (name, message)
    return message


no_digits = st.text(st.characters(exclude_categories=("Nd", "Cs"), exclude_characters="\0"))
fractional = st.one_of(  # finite numbers with a fractional part
    st.integers(-(10**12), 10**12).map(lambda n: n + 0.5),
    st.floats(min_value=1e-300, max_value=0.999),
    st.floats(min_value=-0.999, max_value=-1e-300),
)
non_finite = st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity"])


# ---------------------------------------------------------------------------- 1. CLI flags
def bad_count(low: int, high: int = MAX_COUNT) -> st.SearchStrategy[str]:
    return st.one_of(
        no_digits,
        fractional.map(repr),
        non_finite,
        st.integers(max_value=low - 1).map(str),
        st.integers(min_value=high + 1, max_value=high * 10**6).map(str),
    )


def bad_float(ok) -> st.SearchStrategy[str]:
    return st.one_of(
        no_digits, non_finite, st.floats(allow_nan=False).filter(lambda f: not ok(f)).map(repr)
    )


def bad_choice(choices: list[str]) -> st.SearchStrategy[str]:
    return st.text().filter(lambda t: t not in choices)


def flag_cases() -> st.SearchStrategy[tuple[list[str], str, str]]:
    """(argv without the flag, flag, bad value) for every typed flag of every command; OUT
    stands for the output path."""
    simulate = ["simulate", "--workload", SYN, *SIM, "--out", "OUT"]
    build = ["workload", "build", "--source", SYN, "--quiet", "--out", "OUT.parquet"]
    run = ["run", "--engine", "vllm", "--scheduler", "fcfs", "--workload", "w.parquet"]
    run += ["--model", "tiny-llama", "--out", "OUT"]
    train = ["train", "--learner", "feather-ucb", "--train-workload", SYN, "--hardware"]
    train += ["a100-80gb", "--model", "llama-3.1-8b", "--out", "OUT.json"]
    cht = ["bench", "cht", "--quiet"]
    seed = bad_count(0, MAX_SEED)
    one_seed = seed.filter(lambda v: "," not in v and v.strip())
    cases = [
        *[(simulate, f, bad_count(1)) for f in ("--max-num-seqs", "--num-blocks", "--block-size")],
        (simulate, "--max-num-batched-tokens", bad_count(1)),
        (simulate, "--seed", seed),
        (simulate, "--kernel", bad_choice(["paged", "cascade", "pat"])),
        (simulate, "--engine-mode", bad_choice(["vllm", "sglang"])),
        (simulate, "--sched-time", bad_choice(["model", "zero"])),
        *[(build, f, bad_count(1)) for f in ("--max-context", "--min-per-group", "--max-groups")],
        (build, "--min-prefix-tokens", bad_count(0)),
        (build, "--output-cap", bad_count(1)),
        (build, "--unshared-fraction", bad_float(lambda v: 0 <= v <= 1)),
        (build, "--seed", seed),
        (build, "--order", bad_choice(["grouped", "shuffled", "interleaved"])),
        (build, "--overlength", bad_choice(["truncate", "reject"])),
        *[(run, f, bad_count(1)) for f in ("--repeats", "--max-model-len", "--num-blocks")],
        (run, "--seed", seed),
        (run, "--cascade-attention", bad_choice(["default", "on", "off"])),
        (train, "--train-seeds", seed.filter(lambda v: "," not in v)),
        (train, "--eval-seeds", one_seed.map(lambda v: f"0,{v}")),
        *[(cht, f, bad_count(1)) for f in ("--groups", "--chunk-size", "--batch-size")],
        (cht, "--suffix-tokens", bad_count(0)),
        (cht, "--brute-budget-s", bad_float(lambda v: v > 0)),
        (cht, "--sizes", st.one_of(no_digits, st.integers(max_value=0).map(str))),
    ]
    return st.one_of(
        [st.tuples(st.just(argv), st.just(flag), values) for argv, flag, values in cases]
    )


@surface("flags")
@given(case=flag_cases())
def test_cli_flags(case) -> None:
    argv, flag, value = case
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        argv = [a.replace("OUT", str(out)) for a in argv]
        refused([*argv, f"{flag}={value}"], out, f"argument {flag}")


# ---------------------------------------------------------------------------- 2. profiles
HARDWARE = {
    "name": "user-gpu",
    "memory_bandwidth_bytes_per_s": 1.0e12,
    "l2_bytes": 50 * 2**20,
    "sms": 100,
    "bf16_dense_flops": 5e14,
    "memory_bytes": 80 * 2**30,
    "source": "a test",
}
MODEL = {
    "name": "user-model",
    "layers": 2,
    "hidden": 256,
    "q_heads": 4,
    "kv_heads": 2,
    "head_dim": 64,
    "context_tokens": 4096,
    "weight_bytes": 10**7,
    "source": "a test",
}
INT_FIELDS = {"l2_bytes", "sms", "memory_bytes", "layers", "hidden", "q_heads", "kv_heads"}
INT_FIELDS |= {"head_dim", "context_tokens", "weight_bytes", "l2_partitions"}
FLOAT_FIELDS = {"memory_bandwidth_bytes_per_s", "bf16_dense_flops", "boost_clock_hz"}
FRACTION_FIELDS = {"gpu_memory_utilization", "achievable_bandwidth_fraction"}
not_a_number = st.one_of(
    st.text().filter(lambda t: not _is_number(t)),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def bad_field_value(field: str) -> st.SearchStrategy[Any]:
    if field in ("source", "name"):
        return st.one_of(
            st.integers(), st.just(""), st.just("   "), st.lists(st.text(), max_size=2)
        )
    out_of_range = st.one_of(
        st.integers(max_value=0),
        st.floats(max_value=0, allow_nan=False),
        st.sampled_from([math.nan, math.inf, -math.inf]),
    )
    if field in INT_FIELDS:
        return st.one_of(not_a_number, out_of_range, fractional, st.integers(min_value=2**62 + 1))
    if field in FRACTION_FIELDS:
        return st.one_of(not_a_number, out_of_range, st.floats(min_value=1.0001, max_value=1e6))
    return st.one_of(not_a_number, out_of_range)


@st.composite
def bad_profile(draw) -> tuple[str, str, list[str]]:
    """(flag, JSON text, what the message must name)."""
    flag, base = draw(
        st.sampled_from([("--hardware-profile", HARDWARE), ("--model-profile", MODEL)])
    )
    kind = pick(
        draw,
        "profile",
        ["not-json", "not-object", "no-name", "missing", "unknown", "value", "redefined"],
    )
    if kind == "not-json":
        text = draw(not_json())
        return flag, text, [flag, "not valid JSON"]
    if kind == "not-object":
        value = draw(st.one_of(st.lists(st.integers()), st.integers(), st.text(), st.none()))
        return flag, json.dumps(value), [flag, "not a JSON object"]
    fields = dict(base)
    if kind == "no-name":
        fields["name"] = draw(st.one_of(st.none(), st.integers(), st.just(""), st.just(" ")))
        return flag, json.dumps(fields), [flag, "field name"]
    if kind == "missing":
        field = draw(st.sampled_from([f for f in base if f != "name"]))
        del fields[field]
        return flag, json.dumps(fields), [flag, "missing fields", field]
    if kind == "unknown":
        declared = {f.name for f in dataclasses.fields(HardwareProfile)}
        declared |= {f.name for f in dataclasses.fields(ModelProfile)}
        field = draw(st.text(min_size=1).filter(lambda f: f not in declared))
        fields[field] = draw(st.integers())
        return flag, json.dumps(fields), [flag, "unknown fields"]
    if kind == "value":
        extra = ["l2_partitions", "boost_clock_hz", "gpu_memory_utilization"]
        field = draw(
            st.sampled_from(
                [*[f for f in base if f != "name"], *(extra if base is HARDWARE else [])]
            )
        )
        fields[field] = draw(bad_field_value(field))
        return flag, json.dumps(fields), [flag, f"field {field} = "]
    builtin = "a100-80gb" if base is HARDWARE else "llama-3.1-8b"
    fields = {**base, "name": builtin}  # a known name, other values
    return flag, json.dumps(fields), [flag, f"{builtin!r} is already defined with other values"]


def not_json(min_size: int = 0, newlines: bool = True) -> st.SearchStrategy[str]:
    """Text that is not JSON: anything that fails to parse, or text after a stray brace."""
    text = (
        st.text(min_size=min_size)
        if newlines
        else st.text(
            st.characters(exclude_characters="\n", exclude_categories=("Cs",)),
            min_size=min_size,
        )
    )
    return st.one_of(text.filter(lambda t: not _parses(t)), text.map(lambda t: "}" + t))


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@surface("profiles")
@given(case=bad_profile())
def test_json_profiles(case, tmp_path: Path) -> None:
    flag, text, names = case
    out = tmp_path / "run"
    refused(["simulate", "--workload", SYN, *SIM, f"{flag}={text}", "--out", str(out)], out, *names)


# ---------------------------------------------------------------------------- 3. schedulers
# Parameters with their declared types, written out here (not read from the classes).
PARAMS = {
    # min_batch is `int | None` (None: a fraction of the slots), so "null" is valid for it
    "feather-static": {"min_batch_fraction": float, "min_delta_tokens": int},
    "lpm": {"page_size": int, "in_batch_check_threshold": int},
    "feather-ucb": {"exploration": float, "frozen": bool, "reward_horizon": int},
    "feather-qlearn": {"alpha": float, "gamma": float, "reward_horizon": int},
    "fcfs": {"seed": int},
}
# Values of the right type outside the class's own range: (scheduler, key, value, message)
OUT_OF_RANGE = [
    ("feather-static", "min_batch_fraction", 1.5, "min_batch_fraction must be in (0, 1]"),
    ("feather-static", "min_batch_fraction", 0.0, "min_batch_fraction must be in (0, 1]"),
    ("feather-static", "min_batch", 1, "min_batch must be >= 2"),
    ("feather-static", "max_bypass", 0, "max_bypass must be >= 1"),
    ("feather-static", "consult", "sometimes", "unknown consult 'sometimes'"),
    ("feather-ucb", "exploration", -1.0, "exploration must be >= 0"),
    ("feather-ucb", "reward_horizon", 0, "reward_horizon must be >= 1"),
    ("feather-qlearn", "alpha", 2.0, "alpha must be in [0, 1]"),
    ("lpm", "fcfs_fallback_above", -1, "fcfs_fallback_above must be >= 0"),
]
NOT_POLICIES = ["json:loads", "math:pi", "os.path:join", "feather.cli:main", "collections:deque"]


def wrong_type(kind: type) -> st.SearchStrategy[str]:
    """--param values (JSON where they parse) that are not of `kind`."""
    texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
    strings = texts.filter(lambda t: not _parses(t))  # stay strings
    if kind is bool:
        return st.one_of(strings, st.integers().map(str), st.just("null"), st.just("[1]"))
    if kind is int:
        return st.one_of(
            strings,
            fractional.map(json.dumps),
            st.sampled_from(["true", "null", "[]", "{}", "NaN"]),
        )
    return st.one_of(strings, st.sampled_from(["true", "[1.0]", "{}", "NaN", "Infinity", "null"]))


@st.composite
def bad_scheduler(draw) -> tuple[str, list[str], list[str]]:
    """(scheduler, --param values, what the message must name)."""
    kind = pick(
        draw,
        "scheduler",
        [
            "unknown-name",
            "not-a-policy",
            "unknown-param",
            "type",
            "malformed",
            "repeated",
            "range",
        ],
    )
    if kind == "unknown-name":
        name = draw(st.text(min_size=1).filter(lambda t: ":" not in t))
        name = name if name not in scheduler_names() else f"{name}-x"
        name = name if name.strip() and not name.startswith("-") else f"x{name}"
        return name, [], ["unknown scheduler"]
    if kind == "not-a-policy":
        name = draw(st.sampled_from([*NOT_POLICIES, "no_such_module_xyz:Policy"]))
        return name, [], [f"scheduler {name!r}"]
    scheduler = draw(st.sampled_from(sorted(PARAMS)))
    if kind == "unknown-param":
        accepted = scheduler_parameters(resolve_scheduler(scheduler))  # excluded, not tested
        key = draw(st.text(min_size=1).filter(lambda k: "=" not in k and k.strip()))
        key = key if key not in accepted else f"{key}_x"
        return scheduler, [f"{key}=1"], [f"scheduler {scheduler!r} has no parameter {key!r}"]
    if kind == "type":
        key, type_ = draw(st.sampled_from(sorted(PARAMS[scheduler].items())))
        value = draw(wrong_type(type_))
        return scheduler, [f"{key}={value}"], [f"parameter {key} = ", "--param", "expected"]
    if kind == "malformed":
        item = draw(st.one_of(st.just("novalue"), st.text().map(lambda v: f"={v}")))
        return scheduler, [item], ["--param expects key=value"]
    if kind == "repeated":
        return "feather-static", ["min_batch=8", "min_batch=9"], ["--param min_batch"]
    value = draw(st.integers(max_value=1))
    return "feather-static", [f"min_batch={value}"], ["feather-static", "min_batch must be >= 2"]


@surface("schedulers")
@given(case=bad_scheduler())
def test_scheduler_names_and_parameters(case, tmp_path: Path) -> None:
    scheduler, params, names = case
    out = tmp_path / "run"
    argv = ["simulate", "--workload", SYN, "--scheduler", scheduler]
    argv += ["--hardware", "a100-80gb", "--model", "llama-3.1-8b", "--out", str(out)]
    argv += [f"--param={p}" for p in params]
    refused(argv, out, *names)


# ---------------------------------------------------------------------------- 4. synthetic
SPEC_KEYS = ["groups", "per_group", "prefix", "system", "suffix", "output", "order", "arrival"]
SPEC_KEYS += ["unshared", "vocab", "seed"]


@st.composite
def bad_spec(draw) -> tuple[str, list[str]]:
    kind = pick(
        draw,
        "synthetic",
        [
            "unknown",
            "malformed",
            "twice",
            "int",
            "range",
            "huge",
            "order",
            "arrival",
            "unshared",
            "system",
        ],
    )
    base = "synthetic:groups=2,per_group=3,prefix=32,suffix=4"
    if kind == "unknown":
        key = draw(
            st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1).filter(lambda k: k not in SPEC_KEYS)
        )
        return f"{base},{key}=1", [f"unknown synthetic spec key {key!r}"]
    if kind == "malformed":
        key = draw(st.sampled_from(SPEC_KEYS))
        item = draw(st.sampled_from([key, f"{key}="]))
        return f"synthetic:{item}", ["malformed synthetic spec item"]
    if kind == "twice":
        return f"{base},groups=3", ["'groups' given twice"]
    if kind == "int":
        key = draw(st.sampled_from(["groups", "per_group", "prefix", "suffix", "vocab", "seed"]))
        value = draw(
            st.one_of(no_digits.filter(lambda v: "," not in v and v.strip()), fractional.map(repr))
        )
        return f"synthetic:{key}={value}", ["synthetic spec", key, "expected int"]
    if kind == "range":
        key, low, high = draw(
            st.sampled_from(
                [
                    ("groups", 1, MAX_COUNT),
                    ("output", 1, MAX_COUNT),
                    ("prefix", 0, MAX_COUNT),
                    ("vocab", 4, MAX_COUNT),
                    ("seed", 0, 2**63 - 1),
                ]
            )
        )
        value = draw(st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1)))
        return f"synthetic:{key}={value}", ["synthetic spec", f"{key}={value}"]
    if kind == "huge":  # valid numbers, but more bytes than any machine here has
        groups = draw(st.integers(min_value=10**4, max_value=10**6))
        per_group = draw(st.integers(min_value=10**3, max_value=10**5))
        spec = f"synthetic:groups={groups},per_group={per_group},prefix=10000,suffix=0"
        return spec, ["synthetic spec", "needs about", "of memory"]
    if kind == "order":
        value = draw(
            st.text("abcxyz", min_size=1).filter(
                lambda v: v not in ("grouped", "shuffled", "interleaved")
            )
        )
        return f"{base},order={value}", ["synthetic spec", "order must be"]
    if kind == "arrival":
        value = draw(
            st.sampled_from(
                [
                    "poisson:x",
                    "poisson:-1",
                    "poisson:nan",
                    "poisson:inf",
                    "bursts:0:1",
                    "bursts:2:inf",
                    "bursts:2:-1",
                    "bursts:x:1",
                    "uniform",
                    "poisson",
                ]
            )
        )
        return f"{base},arrival={value}", ["synthetic spec", "arrival must be"]
    if kind == "unshared":
        value = draw(
            st.one_of(
                non_finite,
                st.floats(min_value=1.001, max_value=1e9).map(repr),
                st.floats(max_value=-0.001, min_value=-1e9).map(repr),
            )
        )
        return f"{base},unshared={value}", ["synthetic spec", "unshared"]
    prefix = draw(st.integers(min_value=0, max_value=100))
    return f"synthetic:prefix={prefix},system={prefix + 1}", ["synthetic spec", "system <= prefix"]


@surface("synthetic")
@given(case=bad_spec(), command=st.sampled_from(["simulate", "build"]))
def test_synthetic_specs(case, command, tmp_path: Path) -> None:
    spec, names = case
    out = tmp_path / ("run" if command == "simulate" else "w.parquet")
    if command == "simulate":
        argv = ["simulate", "--workload", spec, *SIM, "--out", str(out)]
    else:
        argv = ["workload", "build", "--source", spec, "--quiet", "--out", str(out)]
    refused(argv, out, *names)


# ---------------------------------------------------------------------------- 5. workload files
@pytest.fixture(scope="module")
def good_workload(tmp_path_factory) -> Path:
    return write_workload(load_workload(SYN), tmp_path_factory.mktemp("good") / "w.parquet")


def _table_fault(table: pa.Table, draw) -> tuple[pa.Table, str]:
    """A table that breaks one invariant of the workload schema, and the column it breaks."""
    rows = table.num_rows
    row = draw(st.integers(0, rows - 1))
    kind = pick(
        draw,
        "workload table",
        [
            "arrival",
            "unsorted",
            "output_len",
            "prompt_len",
            "token",
            "duplicate",
            "empty_id",
            "prefix_levels",
            "shared",
            "missing",
            "type",
            "null",
        ],
    )

    def replace(name: str, values: list, type_: pa.DataType | None = None) -> pa.Table:
        column = pa.array(values, type=type_ or table.schema.field(name).type)
        return table.set_column(table.schema.get_field_index(name), name, column)

    column = {
        "unsorted": "arrival_time_s",
        "token": "prompt_token_ids",
        "duplicate": "request_id",
        "empty_id": "request_id",
        "prefix_levels": "prefix_lens",
        "shared": "shared_prefix_len",
    }.get(kind, kind)
    if kind == "arrival":
        values = table.column("arrival_time_s").to_pylist()
        values[row] = draw(
            st.one_of(
                st.sampled_from([math.nan, math.inf, -math.inf]),
                st.floats(max_value=-1e-9, allow_nan=False),
            )
        )
        return replace("arrival_time_s", values), column
    if kind == "unsorted":
        values = [float(i) for i in range(rows)][::-1]
        return replace("arrival_time_s", values), column
    if kind == "output_len":
        values = table.column("output_len").to_pylist()
        values[row] = draw(st.integers(-(2**31), 0))
        return replace("output_len", values), column
    if kind == "prompt_len":
        values = table.column("prompt_len").to_pylist()
        values[row] += draw(st.integers(1, 1000))
        return replace("prompt_len", values), column
    if kind == "token":
        values = table.column("prompt_token_ids").to_pylist()
        values[row][draw(st.integers(0, len(values[row]) - 1))] = draw(st.integers(-(2**31), -1))
        return replace("prompt_token_ids", values), column
    if kind == "duplicate":
        values = table.column("request_id").to_pylist()
        values[(row + 1) % rows] = values[row]
        return replace("request_id", values), column
    if kind == "empty_id":
        values = table.column("request_id").to_pylist()
        values[row] = ""
        return replace("request_id", values), column
    if kind == "prefix_levels":
        values = table.column("prefix_lens").to_pylist()
        values[row] = values[row] + [0]
        return replace("prefix_lens", values), column
    if kind == "shared":
        values = table.column("shared_prefix_len").to_pylist()
        values[row] += draw(st.integers(1, 100))
        return replace("shared_prefix_len", values), column
    name = draw(st.sampled_from(table.column_names))
    if kind == "missing":
        return table.drop_columns([name]), name
    if kind == "type":  # a non-string column given as (non-numeric) text
        name = draw(st.sampled_from(["group_path", "prefix_lens", "prompt_token_ids",
                                     "prompt_len", "shared_prefix_len", "output_len",
                                     "arrival_time_s"]))  # fmt: skip
        text = [draw(st.text(min_size=1).filter(lambda t: not _is_number(t)))] * rows
        return replace(name, text, pa.string()), name
    values = table.column(name).to_pylist()
    values[row] = None
    return replace(name, values), name


@st.composite
def bad_workload_file(draw, good: Path, folder: Path, table: bool) -> tuple[Path, list[str]]:
    """Write a broken workload (Parquet + sidecar) into folder: its path, what errors name.
    table: a readable Parquet file breaking one of the schema's invariants; else broken bytes
    or a broken sidecar."""
    target = folder / "w.parquet"
    data, side = good.read_bytes(), json.loads(sidecar_path(good).read_text())
    kind = (
        "table"
        if table
        else pick(
            draw,
            "workload file",
            [
                "truncated",
                "garbage",
                "flipped",
                "sidecar-json",
                "sidecar-object",
                "sidecar-sha",
                "sidecar-format",
            ],
        )
    )
    if kind == "table":
        table, column = _table_fault(pq.read_table(good), draw)
        pq.write_table(table, target)
        side["parquet_sha256"] = __import__("hashlib").sha256(target.read_bytes()).hexdigest()
        if draw(st.booleans()):
            sidecar_path(target).write_text(json.dumps(side))
        return target, [str(target), column]
    if kind == "truncated":
        target.write_bytes(data[: draw(st.integers(0, len(data) - 1))])
        return target, [str(target)]
    if kind == "garbage":
        target.write_bytes(draw(st.binary(max_size=2000)))
        return target, [str(target)]
    target.write_bytes(data)
    sidecar = sidecar_path(target)
    if kind == "flipped":  # still Parquet, perhaps; the sidecar's SHA-256 no longer matches
        position = draw(st.integers(0, len(data) - 1))
        flipped = bytearray(data)
        flipped[position] ^= draw(st.integers(1, 255))
        target.write_bytes(bytes(flipped))
        sidecar.write_text(json.dumps(side))
        return target, [str(target)]
    if kind == "sidecar-json":
        sidecar.write_text(draw(not_json()))
        return target, [str(sidecar), "not JSON"]
    if kind == "sidecar-object":
        sidecar.write_text(json.dumps(draw(st.one_of(st.lists(st.integers()), st.text()))))
        return target, [str(sidecar), "not a JSON object"]
    if kind == "sidecar-sha":
        side["parquet_sha256"] = draw(st.text("0123456789abcdef", min_size=64, max_size=64))
        sidecar.write_text(json.dumps(side))
        return target, [str(sidecar), "SHA-256 differs"]
    side["format"] = draw(st.text().filter(lambda t: t != "feather-workload/1"))
    sidecar.write_text(json.dumps(side))
    return target, [str(sidecar), "format"]


@surface("workload_files")
@given(data=st.data(), command=st.sampled_from(["stats", "simulate"]))
def test_workload_files(data, command, good_workload: Path) -> None:
    check_workload_file(data, command, good_workload, table=False)


@surface("workload_tables")
@given(data=st.data(), command=st.sampled_from(["stats", "simulate"]))
def test_workload_tables(data, command, good_workload: Path) -> None:
    check_workload_file(data, command, good_workload, table=True)


def check_workload_file(data, command: str, good: Path, table: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path, names = data.draw(bad_workload_file(good, Path(folder), table))
        out = Path(folder) / "run"
        if command == "stats":
            refused(["workload", "stats", str(path)], out, *names)
        else:
            refused(["simulate", "--workload", str(path), *SIM, "--out", str(out)], out, *names)


# ---------------------------------------------------------------------------- 6. raw files
def bad_record_line(record: dict, fields: dict[str, str], draw) -> tuple[str, list[str]]:
    """A JSONL line that breaks the record format; what the error must name."""
    kind = pick(draw, "record", ["not-json", "not-object", "field"])
    if kind == "not-json":
        line = draw(not_json(min_size=1, newlines=False))
        return line, ["not JSON"]
    if kind == "not-object":
        value = draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text()))
        return json.dumps(value), ["a record is a JSON object"]
    field, expected = draw(st.sampled_from(sorted(fields.items())))
    if expected == "a string":
        value = draw(
            st.one_of(
                st.integers(),
                st.booleans(),
                st.lists(st.text(), max_size=2),
                st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
            )
        )
    else:
        value = draw(
            st.one_of(
                st.text(),
                st.integers(),
                st.lists(st.integers(), min_size=1),
                st.lists(st.one_of(st.none(), st.integers()), min_size=1),
            )
        )
    return json.dumps({**record, field: value}), [f"field {field!r}", f"expected {expected}"]


@pytest.fixture(scope="module")
def leval_lines(leval_dir) -> list[str]:
    return (Path(leval_dir) / "tpo.jsonl").read_text().splitlines()[:3]


@surface("leval_jsonl")
@given(data=st.data())
def test_leval_jsonl(data, leval_lines: list[str]) -> None:
    fields = {
        "input": "a string",
        "instructions": "a list of strings",
        "outputs": "a list of strings",
    }
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        lines = list(leval_lines)
        at = data.draw(st.integers(0, len(lines) - 1))
        if data.draw(st.booleans()):
            lines[at], names = bad_record_line(json.loads(lines[at]), fields, data.draw)
            names = [f"line {at + 1}", *names]
            (root / "data").mkdir()
            (root / "data" / "tpo.jsonl").write_text("\n".join(lines) + "\n")
        else:  # not UTF-8 text
            (root / "data").mkdir()
            (root / "data" / "tpo.jsonl").write_bytes(b"\xff\xfe" + data.draw(st.binary()))
            names = ["not UTF-8"]
        out = root / "w.parquet"
        argv = ["workload", "build", "--source", "leval", "--tasks", "tpo", "--quiet"]
        argv += [
            "--data-dir",
            str(root / "data"),
            "--raw-dir",
            str(root / "raw"),
            "--out",
            str(out),
        ]
        refused(argv, out, str(root / "data" / "tpo.jsonl"), *names)


@surface("longbench_files")
@given(data=st.data())
def test_longbench_jsonl_and_zip(data) -> None:
    fields = {"context": "a string", "input": "a string", "answers": "a list of strings"}
    rows = longbench_records("qasper", [0, 0, 1], context_words=20)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        data_dir = root / "lb"
        kind = pick(data.draw, "longbench", ["jsonl", "zip-member", "not-zip", "escape", "no-task"])
        lines = [json.dumps(r) for r in rows]
        at = data.draw(st.integers(0, len(lines) - 1))
        archive = data_dir / "data.zip"
        if kind in ("jsonl", "zip-member"):
            lines[at], names = bad_record_line(rows[at], fields, data.draw)
            names = [f"line {at + 1}", *names]
            if kind == "jsonl":
                (data_dir / "data").mkdir(parents=True)
                (data_dir / "data" / "qasper.jsonl").write_text("\n".join(lines) + "\n")
                names = [str(data_dir / "data" / "qasper.jsonl"), *names]
            else:
                data_dir.mkdir()
                with zipfile.ZipFile(archive, "w") as zf:
                    zf.writestr("data/qasper.jsonl", "\n".join(lines) + "\n")
                names = ["qasper.jsonl", *names]
        elif kind == "not-zip":
            data_dir.mkdir()
            good = write_data_zip(root / "good", {"qasper": rows}).read_bytes()
            broken = data.draw(
                st.one_of(
                    st.binary(max_size=500), st.integers(0, len(good) - 23).map(lambda n: good[:n])
                )
            )
            archive.write_bytes(broken)
            names = [str(archive), "not a readable zip file"]
        elif kind == "escape":
            data_dir.mkdir()
            with zipfile.ZipFile(archive, "w") as zf:
                zf.writestr("../../evil.jsonl", "{}\n")
            names = [str(archive), "escapes"]
        else:
            write_data_zip(data_dir, {"qmsum": rows})
            names = ["LongBench task 'qasper'", str(archive)]
        out = root / "w.parquet"
        argv = ["workload", "build", "--source", "longbench", "--tasks", "qasper", "--quiet"]
        argv += ["--data-dir", str(data_dir), "--raw-dir", str(root / "raw"), "--out", str(out)]
        refused(argv, out, *names)
        assert not (root.parent / "evil.jsonl").exists()


# ---------------------------------------------------------------------------- 7. experiments
def tiny_config() -> dict[str, Any]:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config.update({"hardware": ["a100-80gb"], "hardware_comparison": ["h200"]})
    config["schedulers"] = {"fcfs": {}, "lpm": {}, "feather-static": {}}
    return config


@st.composite
def bad_experiment(draw) -> tuple[dict, list[str]]:
    """The tiny c6 experiment with one thing wrong; what the error must name."""
    exp = yaml.safe_load((TINY_EXPERIMENTS / "c6.yaml").read_text())
    template = exp["runs"][0]
    kind = pick(
        draw,
        "experiment",
        [
            "kernel",
            "engine_mode",
            "seed",
            "limit",
            "hardware",
            "model",
            "scheduler",
            "param",
            "param-type",
            "params",
            "workload",
            "workload-options",
            "workload-ref",
            "runs",
            "workloads",
            "engine-option",
            "engine-option-choice",
            "engine-repeats",
            "engine-name",
            "training",
            "training-params",
            "training-learner-params",
        ],
    )
    text = st.text(min_size=1, max_size=12)
    if kind in ("kernel", "engine_mode", "hardware", "model"):
        known = {
            "kernel": ["paged", "cascade", "pat"],
            "engine_mode": ["vllm", "sglang"],
            "hardware": [
                "a100-80gb",
                "h200",
                "h100-sxm",
                "rtx-6000-ada",
                "l40s",
                "all",
                "comparison",
            ],
            "model": [],
        }[kind]
        value = draw(
            st.one_of(text, st.integers()).filter(
                lambda v: v not in known and not (kind == "model" and v in _models())
            )
        )
        template[kind] = value
        return exp, ["run template 0", kind]
    if kind == "seed":
        template["seed"] = draw(
            st.one_of(
                st.integers(max_value=-1),
                text.filter(lambda t: t != "all"),
                st.floats(allow_nan=True),
            )
        )
        return exp, ["run template 0", "seed"]
    if kind == "limit":
        key = draw(st.sampled_from(["max_num_seqs", "num_blocks", "block_size"]))
        template[key] = draw(st.one_of(st.integers(max_value=0), text, st.booleans()))
        return exp, ["run template 0", key]
    if kind == "scheduler":
        template["scheduler"] = draw(
            st.one_of(
                st.integers(),
                st.just(""),
                text.filter(
                    lambda t: (
                        ":" not in t
                        and t
                        not in (
                            "all",
                            "fcfs",
                            "lpm",
                            "feather-static",
                            "feather-ucb",
                            "feather-qlearn",
                            "dfs-weight",
                            "batches",
                        )
                    )
                ),
            )
        )
        return exp, ["run template 0"]
    if kind == "param":
        template["scheduler"] = "feather-static"
        key = draw(
            text.filter(
                lambda k: (
                    k not in ("min_batch", "min_delta_tokens", "seed", "chunk_size", "max_bypass")
                )
            )
        )
        template["params"] = {key: [1, 2]}
        return exp, ["run template 0", f"has no parameter {key!r}"]
    if kind == "param-type":
        template["scheduler"] = "feather-static"
        bad = draw(st.one_of(text, st.one_of(fractional, st.just(math.nan)), st.booleans()))
        template["params"] = {"min_batch": [8, bad]}
        return exp, ["run template 0", "parameter min_batch = "]
    if kind == "params":
        template["params"] = draw(st.one_of(st.lists(st.integers(), min_size=1), text))
        return exp, ["run template 0", "params"]
    if kind == "workload":
        key = draw(
            st.text("abcdefghijklmnopqrstuvwxyz", min_size=1).filter(lambda k: k not in SPEC_KEYS)
        )
        exp["workloads"]["unshared"] = f"synthetic:groups=2,{key}=1"
        return exp, ["workload unshared", f"unknown synthetic spec key {key!r}"]
    if kind == "workload-options":  # a built workload's options (L-Eval slices)
        known = ("min", "max", "pergroup", "groups", "order", "output")
        letters = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1).filter(lambda k: k not in known)
        key, value = draw(
            st.one_of(
                st.tuples(st.sampled_from(["min", "max", "pergroup", "groups"]), no_digits),
                st.tuples(st.sampled_from(["pergroup", "groups"]), st.just("0")),
                st.tuples(st.sampled_from(["min", "groups"]), st.sampled_from(["²", "٣", "1.5"])),
                st.tuples(st.sampled_from(["order", "output"]), st.sampled_from(["x", "-1"])),
                st.tuples(letters, st.just("1")),
            )
        )
        value = value.replace(",", "").replace("=", "") or "?"
        exp["workloads"]["unshared"] = f"leval:{key}={value}"
        return exp, ["workload unshared", f"{key}={value!r}" if key in known else "option"]
    if kind == "workload-ref":
        template["workload"] = draw(text.filter(lambda t: t != "unshared"))
        return exp, ["run template 0", "names workload"]
    if kind == "runs":
        exp["runs"] = draw(st.one_of(text, st.lists(st.integers(), min_size=1)))
        return exp, ["runs must be a list of mappings"]
    if kind == "workloads":
        exp["workloads"] = draw(
            st.one_of(st.lists(text, min_size=1), st.dictionaries(text, st.integers(), min_size=1))
        )
        return exp, ["workloads must be a mapping of names to workload specs"]
    engine = {"engine": "vllm", "workload": "unshared", "model": "tiny-llama", "scheduler": "all"}
    if kind == "engine-option":
        engine["options"] = {
            draw(
                text.filter(
                    lambda k: (
                        k
                        not in (
                            "max_num_seqs",
                            "num_blocks",
                            "block_size",
                            "max_num_batched_tokens",
                            "max_model_len",
                            "dtype",
                            "cascade_attention",
                            "attention",
                            "threads",
                        )
                    )
                )
            ): 1
        }
        exp["engine_runs"] = [engine]
        return exp, ["engine_runs entry 0", "option"]
    if kind == "engine-option-choice":
        option, known = draw(
            st.sampled_from([
                ("attention", ("vllm", "cascade", "pat")),
                ("cascade_attention", ("default", "on", "off")),
            ])
        )
        engine["options"] = {option: draw(st.one_of(text.filter(lambda t: t not in known),
                                                    st.integers()))}
        exp["engine_runs"] = [engine]
        return exp, ["engine_runs entry 0", f"option {option}"]
    if kind == "engine-repeats":
        engine["repeats"] = draw(st.one_of(st.integers(max_value=0), text, st.booleans()))
        exp["engine_runs"] = [engine]
        return exp, ["engine_runs entry 0", "repeats"]
    if kind == "engine-name":
        engine["engine"] = draw(text.filter(lambda t: t not in ("sim", "vllm", "sglang")))
        exp["engine_runs"] = [engine]
        return exp, ["engine_runs entry 0", "engine"]
    if kind == "training-params":
        exp["training"] = {
            "learners": ["feather-ucb"],
            "hardware": ["a100-80gb"],
            "train_workloads": [SYN],
            "eval_workloads": [SYN],
            "train_seeds": [0],
            "eval_seeds": [1],
            "params": {"consult": draw(text.filter(lambda t: t not in CONSULT))},
        }
        return exp, ["training.params", "consult"]
    if kind == "training-learner-params":
        # one learner's own parameters: for a learner that does not train here, or of a bad value
        stranger = draw(st.booleans())
        exp["training"] = {
            "learners": ["feather-ucb", "feather-qlearn"] if not stranger else ["feather-ucb"],
            "hardware": ["a100-80gb"],
            "train_workloads": [SYN],
            "eval_workloads": [SYN],
            "train_seeds": [0],
            "eval_seeds": [1],
            "learner_params": {"feather-qlearn": {"gamma": 0.0 if stranger else draw(text)}},
        }
        if stranger:
            return exp, ["training.learner_params", "feather-qlearn"]
        return exp, ["training.learner_params.feather-qlearn", "gamma"]
    exp["training"] = {
        "learners": [
            draw(
                text.filter(
                    lambda t: (
                        ":" not in t
                        and t
                        not in (
                            "feather-ucb",
                            "feather-qlearn",
                            "fcfs",
                            "lpm",
                            "dfs-weight",
                            "feather-static",
                            "batches",
                        )
                    )
                )
            )
        ],
        "hardware": ["a100-80gb"],
        "train_workloads": [SYN],
        "eval_workloads": [SYN],
        "train_seeds": [0],
        "eval_seeds": [1],
    }
    return exp, ["training.learners", "unknown scheduler"]


def _models() -> list[str]:
    from feather.models import model_names

    return model_names()


@surface("experiments")
@given(case=bad_experiment())
def test_experiment_files(case) -> None:
    experiment, names = case
    config = tiny_config()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c6.yaml"
        path.write_text(yaml.safe_dump(experiment))
        stopped(
            lambda: checks.load_experiments(Path(folder), ["c6"], config, {"synthetic"}, {}),
            str(path),
            *names,
        )


def test_the_unbroken_experiment_and_config_pass() -> None:
    """The bases the property tests break are valid: each failure is the one injected."""
    config = tiny_config()
    loaded = checks.load_experiments(TINY_EXPERIMENTS, ["c6"], config, {"synthetic"}, {})
    assert loaded["c6"].runs
    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert checks.schema_error(config, schema) is None
    checks.check_schedulers({"schedulers": {"feather-static": {"params": {"min_batch": 4}}}})


# ---------------------------------------------------------------------------- 8. config.yaml
@st.composite
def bad_config(draw) -> tuple[dict, list[str], str]:
    config = tiny_config()
    kind = pick(
        draw,
        "config",
        [
            "type",
            "enum",
            "unknown-key",
            "scheduler-key",
            "empty",
            "param",
            "param-type",
            "param-range",
            "duplicate",
            "class",
        ],
    )
    text = st.text(min_size=1, max_size=10)
    if kind == "duplicate":
        key = draw(st.sampled_from(["models", "hardware", "engines", "seeds", "experiments"]))
        config[key] = [*config[key], draw(st.sampled_from(config[key]))]
        return config, [f"config.yaml: {key} lists", "twice"], "schema"
    if kind == "param-range":
        scheduler, key, value, says = draw(st.sampled_from(OUT_OF_RANGE))
        config["schedulers"][scheduler] = {"params": {key: value}}
        return config, [f"config.yaml schedulers.{scheduler}.params", says], "schedulers"
    if kind == "type":
        key, wrong = draw(
            st.sampled_from(
                [
                    ("models", st.one_of(text, st.integers())),
                    ("seeds", st.lists(text, min_size=1)),
                    ("require_gpu", text),
                    ("schedulers", st.lists(text, min_size=1)),
                    ("data", text),
                ]
            )
        )
        config[key] = draw(wrong)
        return config, ["config.yaml", key], "schema"
    if kind == "enum":
        config["kernel_bench"] = draw(
            text.filter(lambda t: t not in ("default", "quick", "full", "off"))
        )
        return config, ["config.yaml: kernel_bench", "is not one of"], "schema"
    if kind == "unknown-key":
        key = draw(
            text.filter(
                lambda k: (
                    k not in config
                    and k
                    not in (
                        "hardware_comparison",
                        "model_profiles",
                        "hardware_profiles",
                        "require_gpu",
                        "kernel_bench",
                        "overhead",
                        "experiments_dir",
                        "extra_rules",
                        "extra_runs",
                        "data",
                    )
                )
            )
        )
        config[key] = 1
        return config, ["config.yaml", "Additional properties are not allowed"], "schema"
    if kind == "scheduler-key":
        key = draw(text.filter(lambda k: k not in ("class", "params")))
        config["schedulers"]["fcfs"] = {key: 1}
        return config, ["config.yaml: schedulers.fcfs"], "schema"
    if kind == "empty":
        key = draw(st.sampled_from(["models", "hardware", "engines", "seeds", "experiments"]))
        config[key] = []
        return config, ["config.yaml", key], "schema"
    if kind == "class":
        config["schedulers"]["mine"] = {"class": draw(st.sampled_from(NOT_POLICIES))}
        return config, ["config.yaml: scheduler 'mine'"], "schedulers"
    scheduler = draw(st.sampled_from(sorted(PARAMS)))
    if kind == "param":
        accepted = scheduler_parameters(resolve_scheduler(scheduler))  # excluded, not tested
        key = draw(text.filter(lambda k: k not in accepted))
        config["schedulers"][scheduler] = {"params": {key: 1}}
        return config, [f"config.yaml schedulers.{scheduler}.params", repr(key)], "schedulers"
    key, type_ = draw(st.sampled_from(sorted(PARAMS[scheduler].items())))
    value = json.loads(v) if _parses(v := draw(wrong_type(type_))) else v
    config["schedulers"][scheduler] = {"params": {key: value}}
    return (
        config,
        [f"config.yaml schedulers.{scheduler}.params", f"parameter {key} = "],
        "schedulers",
    )


@surface("config")
@given(case=bad_config())
def test_config_yaml(case) -> None:
    config, names, check = case
    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"
    if check == "schema":
        stopped(lambda: checks.check_config_schema(config, schema), *names)
    else:
        assert checks.schema_error(config, schema) is None  # it gets past the schema
        stopped(lambda: checks.check_schedulers(config), *names)


@pytest.mark.parametrize(("scheduler", "key", "value", "says"), OUT_OF_RANGE)
def test_the_cli_and_config_refuse_a_range_alike(scheduler, key, value, says, tmp_path) -> None:
    """One check, one message: what `--param` refuses, config.yaml refuses at parse time
    (the same sentence from the class), and a produced table file is left for its job."""
    out = tmp_path / "run"
    argv = ["simulate", "--workload", SYN, "--scheduler", scheduler, "--hardware", "a100-80gb"]
    argv += ["--model", "llama-3.1-8b", "--out", str(out), f"--param={key}={json.dumps(value)}"]
    refused(argv, out, "(given in --param)", says)
    config = {"schedulers": {scheduler: {"params": {key: value}}}}
    stopped(lambda: checks.check_schedulers(config), f"schedulers.{scheduler}.params", says)
    produced = {"policy_file": str(tmp_path / "trained-later.json"), "exploration": 0.5}
    checks.check_schedulers({"schedulers": {"feather-ucb": {"params": produced}}})


# ---------------------------------------------------------------------------- feather run
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--scheduler", "{bad"], "--scheduler '{bad': not valid JSON"),
        (["--scheduler", '{"label": 1}'], "label and class must be names"),
        (
            ["--scheduler", '{"label": "x", "class": "lpm", "params": {"page_size": "a"}}'],
            "scheduler 'lpm': parameter page_size = 'a' (given in --scheduler x): expected int",
        ),
        (["--scheduler", "fcfs", "--scheduler", "fcfs"], "labels must be distinct"),
        (
            ["--scheduler", "fcfs", "--num-blocks", str(MAX_COUNT)],
            f"--num-blocks {MAX_COUNT}: a KV cache of {MAX_COUNT} x 128-token blocks of "
            "tiny-llama needs about",
        ),
    ],
    ids=["json", "label", "param", "twice", "kv-cache"],
)
def test_run_refuses_before_the_engine_starts(options, message, good_workload, tmp_path) -> None:
    out = tmp_path / "runs"
    argv = ["run", "--engine", "vllm", "--workload", str(good_workload), "--model", "tiny-llama"]
    refused([*argv, *options, "--out", str(out), "--quiet"], out, message)


# ---------------------------------------------------------------------------- end to end
FEATHER = str(Path(sys.executable).with_name("feather"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "simulate",
                "--workload",
                SYN,
                "--scheduler",
                "feather-static",
                "--param",
                "min_batch=abc",
                "--hardware",
                "a100-80gb",
                "--model",
                "llama-3.1-8b",
            ],
            "feather simulate: scheduler 'feather-static': parameter min_batch = 'abc' "
            "(given in --param): expected int",
        ),
        (
            ["simulate", "--workload", "synthetic:groups=1000000000,per_group=1000", *SIM],
            "of memory, more than the 50% of available memory",
        ),
        (
            ["simulate", "--workload", SYN, *SIM, "--hardware-profile", '{"name": "x"}'],
            "feather simulate: --hardware-profile: HardwareProfile 'x': missing fields",
        ),
        (
            [
                "simulate",
                "--workload",
                SYN,
                *SIM,
                "--hardware-profile",
                json.dumps({**HARDWARE, "name": "a100-80gb", "memory_bandwidth_bytes_per_s": 1}),
            ],
            "hardware 'a100-80gb' is already defined with other values",
        ),
        (["simulate", "--workload", SYN, *SIM, "--seed", "-1"], "argument --seed: '-1'"),
    ],
    ids=["param", "memory", "profile", "redefined", "seed"],
)
def test_the_installed_command_end_to_end(args, message, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [FEATHER, *args, "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not out.exists()


def test_the_installed_command_on_bad_files(tmp_path: Path) -> None:
    garbage = tmp_path / "w.parquet"
    garbage.write_bytes(b"PAR1 not really")
    done = subprocess.run(
        [FEATHER, "workload", "stats", str(garbage)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"feather workload: {garbage} is not a readable Parquet")
    assert done.stderr.count("\n") == 1
    (tmp_path / "leval").mkdir()
    (tmp_path / "leval" / "quality.jsonl").write_text('{"input": 7, "instructions": []}\n')
    out = tmp_path / "b.parquet"
    done = subprocess.run(
        [
            FEATHER,
            "workload",
            "build",
            "--source",
            "leval",
            "--data-dir",
            str(tmp_path / "leval"),
            "--raw-dir",
            str(tmp_path / "raw"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and not out.exists() and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"feather workload: L-Eval quality file {tmp_path / 'leval' / 'quality.jsonl'}, line 1: "
        "field 'input' = 7: expected a string"
    )
