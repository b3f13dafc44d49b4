"""Feather inside SGLang (0.5.2x): an entry-point plugin and a runner.

SGLang runs its scheduler in a spawned process, which only an *installed* entry point
reaches (group `sglang.srt.plugins`, name `feather`, see pyproject.toml). The plugin
hooks SGLang's own admission code through its `HookRegistry`; it acts only when enabled by
the settings in `settings.py` (environment variables, inherited by the scheduler process).

    FEATHER_SGLANG_SCHEDULER=feather-static  python -m sglang.launch_server \
        --schedule-policy fcfs ...

    settings.py  the FEATHER_SGLANG_* variables        plugin.py  the entry point
    hooks.py     what is hooked in SGLang, and why      driver.py  our policy at the queue's head
    records.py   per-step / per-request JSON lines      runner.py  `feather run --engine sglang`
    probe.py     the plugin through SGLang's real admission objects, on CPU (tests, GPU boxes)

Only `probe` and `runner` import SGLang, and only when run; the rest is plain Python.
"""
