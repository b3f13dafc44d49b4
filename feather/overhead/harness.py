"""Drive every implementation over the same cases: check agreement, then time interleaved.

Each implementation lives in its own worker process (`worker.py`), started with the Python of
the environment it needs (SGLang's own venv, or ours), so imports and caches never mix. Per
case: all workers prepare the same requests and report each request's shared prefix, which
must equal the scenario's answer for every one of them before anything is timed; then the
repeats run under the measurement protocol (feather/measuring): round-robin over
(implementation, variant), the order rotated from repeat to repeat, a repeat taken beside a
busy process taken again; the row keeps the median, the spread and every repeat's value.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import feather
from feather.measuring.protocol import MeasuringProtocol, RepeatOutcome
from feather.overhead.scenario import Case, expected_matches


class AgreementError(RuntimeError):
    """Two implementations computed different shared prefixes for the same request."""


class WorkerError(RuntimeError):
    """A worker process failed; the message names the implementation."""


@dataclass(frozen=True)
class ImplSpec:
    """How to start one implementation: its family, its Python, its options."""

    family: str  # feather | vllm | sglang
    python: str = sys.executable
    tree: str = "python"
    page_size: int = 1
    env_name: str = "main"  # the environment that provides it (for labels and skips)

    @property
    def key(self) -> str:
        return f"{self.family}:{self.env_name}:{self.tree}"


def _package_root_link() -> Path:
    """A directory holding only a link to our package, for another environment's path: the
    package's parent may be a site-packages full of this environment's libraries."""
    link_dir = Path(tempfile.mkdtemp(prefix="feather-pkg-"))
    (link_dir / "feather").symlink_to(Path(feather.__file__).resolve().parent)
    return link_dir


class Worker:
    def __init__(self, spec: ImplSpec, package_link: Path) -> None:
        self.spec = spec
        env = dict(os.environ)
        if Path(spec.python).absolute() != Path(sys.executable).absolute():
            # another environment (its python may resolve to the same interpreter binary:
            # venvs share it, so compare the paths as given, not resolved)
            env["PYTHONPATH"] = str(package_link)
        args = [spec.python, "-m", "feather.overhead.worker", spec.family,
                "--tree", spec.tree, "--page-size", str(spec.page_size)]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, bufsize=1,
        )
        self.facts: dict[str, Any] = {}
        self.variants: list[str] = []

    def handshake(self) -> None:
        """Wait for the worker's imports ("ready", or why it could not start), ask its facts."""
        self.receive()
        answer = self.call({"op": "facts"})
        self.facts, self.variants = answer["facts"], answer["variants"]

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise WorkerError(f"{self.spec.key} worker died:\n{err[-3000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise WorkerError(f"{self.spec.key}: {answer['error']}\n{answer.get('traceback', '')}")
        return answer

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "exit"}\n')  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@dataclass
class Harness:
    """Workers for a set of implementations; `run` sweeps cases over all of them."""

    specs: Sequence[ImplSpec]
    progress: Callable[[str], None] = lambda message: None
    workers: list[Worker] = field(default_factory=list)

    def __enter__(self) -> Harness:
        link = _package_root_link()
        try:
            for spec in self.specs:  # imports run in parallel; they take most of a start
                self.workers.append(Worker(spec, link))
            for worker in self.workers:
                worker.handshake()
                self.progress(f"started {worker.spec.key}: {worker.facts['impl']}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []

    def check_agreement(self, case: Case, found: dict[str, list[int]]) -> None:
        expected = expected_matches(case)
        for key, matches in found.items():
            if len(matches) != len(expected):
                raise AgreementError(
                    f"{key} answered for {len(matches)} waiting requests of {case.key}, "
                    f"not {len(expected)}"
                )
            if matches != expected:
                first = next(i for i, (a, b) in enumerate(zip(matches, expected, strict=True))
                             if a != b)
                raise AgreementError(
                    f"{key} finds a {matches[first]}-token shared prefix for waiting request "
                    f"{first} of {case.key}; the requests share {expected[first]} tokens "
                    f"(and so do the other implementations)"
                )

    def run_case(self, case: Case, repeats: int) -> list[dict[str, Any]]:
        for worker in self.workers:  # every worker builds its requests at the same time
            worker.send({"op": "prepare", "case": case.to_json()})
        prepared = {worker.spec.key: worker.receive() for worker in self.workers}
        self.check_agreement(case, {k: p["matches"] for k, p in prepared.items()})
        timings: dict[tuple[str, str], list[dict[str, Any]]] = {}
        arms = [(worker, variant) for worker in self.workers for variant in worker.variants]

        def keep(outcome: RepeatOutcome) -> None:
            for (worker, variant), answer, record in zip(outcome.order, outcome.values,
                                                         outcome.records, strict=True):
                timings.setdefault((worker.spec.key, variant), []).append(
                    {**answer, "repeat": outcome.repeat, "measurement": record})
            self.progress(f"{case.key}: repeat {outcome.repeat + 1}/{repeats}"
                          + (f" (disturbed: {outcome.disturbed})" if outcome.disturbed else ""))

        # the measurement protocol (feather/measuring): every implementation and variant
        # within each repeat, the order rotated, a repeat taken beside a busy process again
        MeasuringProtocol(
            case.key, label=lambda arm: f"{arm[0].spec.key}/{arm[1]}",
            describe=lambda answer: {"seconds": answer["seconds"]}, say=self.progress,
        ).run(arms, repeats, lambda arm, _: arm[0].call({"op": "measure", "variant": arm[1]}),
              keep)
        for worker in self.workers:
            worker.call({"op": "release"})
        rows = []
        for worker in self.workers:
            for variant in worker.variants:
                runs = timings[(worker.spec.key, variant)]
                seconds = [r["seconds"] for r in runs]
                decisions = statistics.median(r["decisions"] for r in runs)
                median = statistics.median(seconds)
                rows.append({
                    **case.to_json(),
                    **worker.facts,
                    "variant": variant,
                    "env": worker.spec.env_name,
                    "batch_s": median,
                    "batch_s_min": min(seconds),
                    "batch_s_max": max(seconds),
                    "repeats": len(seconds),
                    # every repeat's raw CPU seconds and how it was measured (feather/measuring)
                    "batch_s_by_repeat": seconds,
                    "disturbed_by_repeat": [bool(r["measurement"]["disturbed"]) for r in runs],
                    "disturbed_repeats": sum(1 for r in runs if r["measurement"]["disturbed"]),
                    "others_cores_max": max(r["measurement"]["activity"]["others_cores"]
                                            for r in runs),
                    "decisions": decisions,
                    "admitted": statistics.median(r["admitted"] for r in runs),
                    "us_per_decision": median / decisions * 1e6 if decisions else None,
                    "arrival_s_per_request": prepared[worker.spec.key]["arrival_s_per_request"],
                    "arrival_cpu_s_per_request":
                        prepared[worker.spec.key].get("arrival_cpu_s_per_request"),
                    "arrival_hashes_cpu_s_per_request":
                        prepared[worker.spec.key].get("arrival_hashes_cpu_s_per_request"),
                    "agreed": True,
                })
        return rows

    def run(self, cases: Sequence[Case], repeats: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for n, case in enumerate(cases, 1):
            self.progress(f"case {n}/{len(cases)}: {case.key}")
            rows.extend(self.run_case(case, repeats))
        return rows
