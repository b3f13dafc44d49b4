"""The GPU scripts' parts that run without a GPU: every script parses, and gpu/vllm_c5.sh's
simulator step takes `feather simulate`'s flags (the engine limits the engine run recorded),
not the `feather run` flags the script was given."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_gpu_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _function(script: Path, name: str) -> str:
    text = script.read_text()
    match = re.search(rf"^{name}\(\) {{\n.*?^}}\n", text, re.M | re.S)
    assert match, f"{script.name} defines no {name}()"
    return match.group(0)


def _simulate_loop(script: Path) -> str:
    text = script.read_text()
    match = re.search(r'^for s in "\$\{SCHEDULERS\[@\]\}"; do\n  "\$VENV/bin/feather" simulate'
                      r".*?^done\n", text, re.M | re.S)
    assert match, "vllm_c5.sh has no simulate loop"
    return match.group(0)


def test_vllm_c5_simulates_with_the_engine_runs_own_limits(tmp_path: Path) -> None:
    script = REPO / "gpu" / "vllm_c5.sh"
    summary = tmp_path / "fcfs__r0" / "summary.json"
    summary.parent.mkdir()
    engine = {"block_size": 16, "num_blocks": 256, "max_num_seqs": 8,
              "max_num_batched_tokens": 2048, "async_scheduling": False}
    summary.write_text(json.dumps({"provenance": {"engine": engine}}))
    workload = "synthetic:groups=2,per_group=4,prefix=512,suffix=16,output=8,seed=0"
    venv = Path(sys.executable).parent.parent
    program = "\n".join([
        "set -euo pipefail",
        f"VENV={venv}", f"WORKLOAD='{workload}'", "MODEL=llama-3.1-8b", "HARDWARE=h100-sxm",
        f"OUT={tmp_path}", "SCHEDULERS=(fcfs feather-static)",
        _function(script, "sim_limits"),
        f'read -r -a SIM_ARGS <<< "$(sim_limits {summary})"',
        'echo "SIM_ARGS=${SIM_ARGS[*]}"',
        _simulate_loop(script),
    ])
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("SIM_ARGS=--block-size 16 --num-blocks 256 --max-num-seqs 8 "
            "--max-num-batched-tokens 2048") in done.stdout
    for scheduler in ("fcfs", "feather-static"):
        result = json.loads((tmp_path / "sim_h100-sxm" / scheduler / "summary.json").read_text())
        assert result["provenance"]["config"]["num_blocks"] == 256
