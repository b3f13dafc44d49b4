"""The STOP regime's prefix length follows the host's per-core L2 (feather/workloads/
cache_regime.py), and an experiment file's `{l2_prefix}` becomes it on the expanding machine."""

from __future__ import annotations

import pytest
import yaml

from feather.pipeline.experiments import load_experiment
from feather.workloads.cache_regime import PLACEHOLDER, l2_prefix_tokens


def _caches(l2_bytes: int | None) -> list[dict]:
    caches = [{"level": 1, "type": "Data", "size_bytes": 48 << 10},
              {"level": 3, "type": "Unified", "size_bytes": 480 << 20}]
    if l2_bytes is not None:
        caches.append({"level": 2, "type": "Unified", "size_bytes": l2_bytes})
    return caches


@pytest.mark.parametrize(("l2", "tokens"), [
    (2 << 20, 4096),   # the Xeon it was measured on: one head's 4K K+V = 4 MiB = 2 x L2
    (1 << 20, 2048),
    (512 << 10, 1024),
    (3 << 20, 6144),
    (1280 << 10, 3072),  # rounded up to a whole 1,024
    (64 << 10, 1024),  # never below 1,024
    (16 << 20, 8192),  # never above what three documents in stop.yaml's setup hold
])
def test_the_prefix_is_twice_the_l2_in_one_heads_kv(l2, tokens) -> None:
    got, record = l2_prefix_tokens(_caches(l2))
    assert got == tokens
    assert record["size_bytes"] == l2 and record["reported"] and record["cache"] == "L2 per core"
    # one 128-wide head's float32 K and V fill twice the L2, unless capped (and said so)
    assert (2 * 128 * 4 * got >= 2 * l2) != record["capped"]


def test_a_host_reporting_no_l2_falls_back_to_the_measured_hosts_and_says_so() -> None:
    got, record = l2_prefix_tokens(_caches(None))
    assert got == 4096 and not record["reported"]


def test_an_experiment_file_gets_this_machines_prefix(tmp_path, monkeypatch) -> None:
    import feather.workloads.cache_regime as regime

    monkeypatch.setattr(regime, "cpu_caches", lambda: _caches(1 << 20))
    path = tmp_path / "cached.yaml"
    path.write_text(yaml.safe_dump({
        "claim": "STOP", "title": "t", "paper": "p", "figure": "stop_real_engine",
        "workloads": {"w": f"synthetic:groups=2,per_group=2,prefix={PLACEHOLDER},suffix=8"},
        "runs": [{"workload": "w", "scheduler": "fcfs", "hardware": "cpu"}],
    }))
    assert load_experiment(path).workloads["w"] == (
        "synthetic:groups=2,per_group=2,prefix=2048,suffix=8")


@pytest.mark.parametrize(("l2", "spec", "resolved"), [
    (2 << 20, "prefix={l2_prefix*1.5}", "prefix=6144"),
    (1 << 20, "min={l2_prefix*0.9},max={l2_prefix*1.15}", "min=1792,max=2304"),
    (1 << 20, "prefix={l2_prefix*0.01}", "prefix=128"),  # never below one KV block
])
def test_a_scaled_placeholder_gives_whole_blocks_of_this_machines_prefix(l2, spec,
                                                                         resolved) -> None:
    from feather.workloads.cache_regime import resolve_host_placeholders

    assert resolve_host_placeholders(spec, _caches(l2)) == resolved
    with pytest.raises(ValueError, match="write"):
        resolve_host_placeholders("prefix={l2_prefix+2}", _caches(l2))
