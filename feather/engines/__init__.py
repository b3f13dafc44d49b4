"""Real serving engines running our policies: vLLM V1 (`feather.engines.vllm`).

Each engine package imports its engine lazily, so `import feather` works without them.
"""
