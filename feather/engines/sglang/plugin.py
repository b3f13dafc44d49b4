"""The entry point SGLang calls in each of its processes (`sglang.srt.plugins`: feather).

It registers our hooks (`hooks.HOOKS`) with SGLang's `HookRegistry` only when a setting
enables the plugin (`settings.py`); SGLang applies them after every plugin ran.
Registration is cheap and each hook is a pass-through for a scheduler without our policy, so
one process may serve both.
"""

from __future__ import annotations

import os

from feather.engines.sglang.settings import ALL_VARS

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "feather"
ENTRY_POINT_VALUE = "feather.engines.sglang.plugin:register"


def register() -> list[str]:
    """Register the hooks if enabled; the targets registered (SGLang ignores the value)."""
    # Any of our variables set enables the hooks; their values are parsed when the scheduler
    # starts, where a bad value stops it (SGLang only logs an entry point's exceptions).
    if not any(os.environ.get(var) for var in ALL_VARS):
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from feather.engines.sglang.hooks import HOOKS

    for target, hook, kind in HOOKS:
        HookRegistry.register(target, hook, HookType[kind])
    return [target for target, _, _ in HOOKS]
