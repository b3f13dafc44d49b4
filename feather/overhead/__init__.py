"""Scheduling overhead (claims C3, C4): CPU time to form a batch with Feather's CHT against
SGLang's real radix-tree policies and vLLM's real prefix-cache lookup.

Each implementation runs in its own worker process (`worker.py`), SGLang's in a separate
environment built by `envs.py`; `harness.py` drives them over the same requests
(`scenario.py`), checks they agree on every request's shared prefix, then times them.
"""
