"""The simulator's L2 model and L2-bandwidth bound against the H200 measurements we keep."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def validation_rows() -> list[dict]:
    spec = importlib.util.spec_from_file_location(
        "validate_l2_model", ROOT / "gpu" / "validate_l2_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rows()


def test_l2_model_matches_the_h200_where_the_working_set_fits(validation_rows) -> None:
    assert len(validation_rows) >= 10  # ncu measured every profiled configuration
    for row in validation_rows:
        measured, predicted = row["measured_dram_fraction"], row["predicted_full_l2"]
        if row["fits_l2"]:  # one KV head's distinct data fits the L2: within 1.5 points
            assert abs(predicted - measured) < 0.015, row
        else:  # beyond the cache a real L2 loses more than an ideal LRU: the model is optimistic
            assert predicted <= measured + 0.01, row


def test_l2_bandwidth_bound_reproduces_the_measured_kernel_times(validation_rows) -> None:
    """Kernel time ~ max(DRAM bytes / DRAM rate, requested bytes / L2 rate) within 20%."""
    from feather.sim.hardware import get_hardware

    h200 = get_hardware("h200")
    logical_per_token_bytes = 2 * 8 * 128 * 2  # one layer, Llama-3.1-8B shapes, bf16
    for row in validation_rows:
        if not row["config"].startswith("sweep_") and row["config"] != "unshared_100":
            continue
        requested = {"unshared_100": 100 * 4000}.get(row["config"])
        if requested is None:
            _, p, b = row["config"].split("_")[1:]
            requested = int(b[1:]) * (int(p[1:]) + 100)
        requested *= logical_per_token_bytes
        dram = row["measured_dram_fraction"] * requested
        model_ms = 1e3 * max(dram / 4.21e12, requested / h200.l2_bandwidth_bytes_per_s())
        assert model_ms == pytest.approx(row["kernel_ms"], rel=0.2), row
