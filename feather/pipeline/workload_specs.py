"""The grammar of a built workload's spec (`leval:min=1000,max=2000,order=shuffled`,
`longbench-format:prefix=4000`, either with `load=F`): its options and what each must be, the
file the workload rules build it into, and the `feather workload build` flags of those options.
Synthetic specs (`synthetic:...`) are feather.workloads.synthetic's."""

from __future__ import annotations

import json
import re
from typing import Any


class WorkloadSpecError(ValueError):
    """A built workload's spec that names an unknown kind or option, or a bad value."""


def slug(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-")


def slug_options(text: str) -> dict[str, str]:
    """'min=1000-max=2000' -> {'min': '1000', 'max': '2000'}: the options of a workload file's
    name (the slug `workload_path` writes; its values hold no '-')."""
    return dict(part.split("=", 1) for part in text.replace(",", "-").split("-") if "=" in part)


def workload_path(spec: str, model: str, hardware: str | None = None) -> str | None:
    """The built file of a non-synthetic workload spec (None for synthetic specs).

    A `load=F` option (Poisson arrivals at F x FCFS's offline capacity) makes the file
    depend on the hardware too: data/workloads/load/<hardware>/<base file stem>__load=F.
    """
    if spec.startswith("synthetic:"):
        return None
    kind, _, options = spec.partition(":")
    if kind not in WORKLOAD_OPTIONS:
        raise WorkloadSpecError(
            f"unknown workload kind {kind!r} in {spec!r}: use synthetic:..., "
            "leval:min=..,max=.. or longbench-format:prefix=.."
        )
    _check_workload_options(spec, kind, options)
    base, load = split_load(options)
    stem = f"{kind}__{slug(base) or 'all'}__{model}"
    if load is None:
        return f"data/workloads/{stem}.parquet"
    if hardware is None:
        raise WorkloadSpecError(f"{spec!r}: a load= workload depends on the hardware")
    return f"data/workloads/load/{hardware}/{stem}__load={load}.parquet"


def split_load(options: str) -> tuple[str, str | None]:
    """('order=shuffled,seed=0', '0.5') from 'order=shuffled,seed=0,load=0.5'."""
    parts = [p for p in options.split(",") if p]
    load = [p.partition("=")[2] for p in parts if p.startswith("load=")]
    if len(load) > 1 or (load and not _positive_number(load[0])):
        raise WorkloadSpecError(f"workload options {options!r}: load= takes one number > 0")
    return ",".join(p for p in parts if not p.startswith("load=")), (load[0] if load else None)


def _positive_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def _whole(low: int) -> tuple[str, Any]:
    return (f"a whole number >= {low}", lambda v: re.fullmatch(r"[0-9]+", v) and int(v) >= low)


_ORDERS = ("grouped", "shuffled", "interleaved")
# What the built workloads' options may be (the rules in workflow/rules/workloads.smk turn
# them into `feather workload build` flags): key -> (what it must be, test).
WORKLOAD_OPTIONS: dict[str, dict[str, tuple[str, Any]]] = {
    "leval": {
        "min": _whole(0),
        "max": _whole(0),
        "pergroup": _whole(1),
        "groups": _whole(1),
        "output": (
            "reference or a whole number >= 1",
            lambda v: v == "reference" or _whole(1)[1](v),
        ),
        "order": ("grouped, shuffled or interleaved", lambda v: v in _ORDERS),
        "seed": _whole(0),
        "load": ("a number > 0 (x FCFS's offline capacity)", lambda v: _positive_number(v)),
    },
    "longbench-format": {
        "prefix": _whole(1),
        "order": ("grouped, shuffled or interleaved", lambda v: v in _ORDERS),
        "seed": _whole(0),
        "load": ("a number > 0 (x FCFS's offline capacity)", lambda v: _positive_number(v)),
    },
}


def builder_flags(options: dict[str, str], kind: str = "leval") -> list[str]:
    """`feather workload build` flags for a built workload's slug options pergroup, groups,
    output, order, seed (e.g. pergroup=6); `kind`'s own keys - min/max (leval), prefix
    (longbench-format) - are the rules' to pass."""
    flags = {"groups": ["--max-groups"], "output": ["--output"], "order": ["--order"],
             "seed": ["--seed"], "pergroup": ["--min-per-group", "--max-per-group"]}
    own = {"leval": {"min", "max"}, "longbench-format": {"prefix"}}[kind]
    unknown = set(options) - set(flags) - own
    if unknown:
        raise ValueError(f"{kind} workload option(s) {sorted(unknown)}: known "
                         f"{', '.join(sorted(own))}, {', '.join(flags)}")
    return [a for key, names in flags.items() if key in options
            for name in names for a in (name, options[key])]


def _check_workload_options(spec: str, kind: str, options: str) -> None:
    known = WORKLOAD_OPTIONS[kind]
    given = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise WorkloadSpecError(
                f"workload {spec!r}: option {item!r} is not key=value with a key of "
                f"{', '.join(known)}"
            )
        expected, ok = known[key]
        if not ok(value):
            raise WorkloadSpecError(f"workload {spec!r}: {key}={value!r}: expected {expected}")
        given[key] = value
    if kind == "longbench-format" and "prefix" not in given:
        raise WorkloadSpecError(f"workload {spec!r}: needs prefix=N (words of each context)")
    if "min" in given and "max" in given and int(given["min"]) > int(given["max"]):
        raise WorkloadSpecError(f"workload {spec!r}: min is larger than max")
