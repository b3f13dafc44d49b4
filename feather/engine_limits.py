"""Engine limits and modes shared by the simulator, the real-engine runner, the benches, the
experiment files and the CLI.

`DEFAULT_MAX_NUM_SEQS` is 256 because that is vLLM's default `max_num_seqs` for an offline
engine (EngineArgs' batch defaults for the LLM class: GPUs below 70 GiB and A100s, and CPU
with one worker; H100/H200-class GPUs get 1024 and SchedulerConfig's bare default is 128).
One value here keeps a simulated run, a real run and the command line's default the same.
"""

from __future__ import annotations

DEFAULT_MAX_NUM_SEQS = 256

# how an engine forms batches: the simulator's modes, and the real engines `feather run` drives
ENGINE_MODES = ("vllm", "sglang")
