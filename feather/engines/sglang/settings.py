"""The settings that enable the plugin, read from the environment.

Environment variables, because SGLang spawns its scheduler process and passes it only its
own server arguments; the environment is inherited. Nothing is set: the plugin registers no
hook and SGLang runs exactly as shipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEDULER_VAR = "FEATHER_SGLANG_SCHEDULER"  # a registry name or package.module:Class
PARAMS_VAR = "FEATHER_SGLANG_PARAMS"  # JSON object of the policy's parameters
SEED_VAR = "FEATHER_SGLANG_SEED"
TRACE_VAR = "FEATHER_SGLANG_TRACE_DIR"  # per-step records go here (also for native policies)
ALL_VARS = (SCHEDULER_VAR, PARAMS_VAR, SEED_VAR, TRACE_VAR)


@dataclass(frozen=True)
class PluginSettings:
    """`scheduler` None: SGLang's own policy orders admission (the baselines);
    `trace_dir` None: no per-step records."""

    scheduler: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    trace_dir: str | None = None

    @property
    def enabled(self) -> bool:
        return self.scheduler is not None or self.trace_dir is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSettings:
        env = os.environ if environ is None else environ
        raw_params = env.get(PARAMS_VAR) or "{}"
        try:
            params = json.loads(raw_params)
        except ValueError as exc:
            raise ValueError(f"{PARAMS_VAR} is not JSON: {raw_params!r} ({exc})") from exc
        if not isinstance(params, dict):
            raise ValueError(f"{PARAMS_VAR} must be a JSON object, got {raw_params!r}")
        return cls(
            scheduler=env.get(SCHEDULER_VAR) or None,
            params=params,
            seed=int(env.get(SEED_VAR) or 0),
            trace_dir=env.get(TRACE_VAR) or None,
        )

    def to_env(self) -> dict[str, str]:
        """The variables that carry these settings into SGLang's processes."""
        env = {PARAMS_VAR: json.dumps(self.params), SEED_VAR: str(self.seed)}
        if self.scheduler is not None:
            env[SCHEDULER_VAR] = self.scheduler
        if self.trace_dir is not None:
            env[TRACE_VAR] = self.trace_dir
        return env
